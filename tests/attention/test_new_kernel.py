"""A new kernel needs no edit outside its own file (issue 24): registered here, a toy kernel with a
knob that has no default and a head argument is benchmarked by ``qkv bench complexity``, built and
run by the contract and property tests and pictured by ``qkv viz --pattern`` — each finds its knobs
through the kernel's own ``default_knobs``, ``head_kwargs`` and ``knob_choices``, no table elsewhere."""

import json
import math

import pytest
import test_kernel_properties
import test_kernels

from qkv import registry, viz
from qkv.attention import SoftmaxAttention
from qkv.bench import main as bench

NAME = "test-tempered"


@pytest.fixture
def tempered(monkeypatch):
    """Register the toy kernel in a copy of the registry that the test's end restores."""
    monkeypatch.setattr(registry, "_REGISTRIES", {**registry._REGISTRIES,
                                                  "attention": dict(registry._REGISTRIES["attention"])})

    @registry.register("attention", NAME)
    class TemperedAttention(SoftmaxAttention):
        """Softmax attention at temperature ``tau``: ``softmax(Q K^T / (tau sqrt(d_head))) V``."""

        exact = False
        exact_kwargs = {"tau": 1.0}

        def __init__(self, *, d_head: int, tau: float, causal: bool = False, dropout: float = 0.0) -> None:
            super().__init__(causal=causal, dropout=dropout, scale=1.0 / (tau * math.sqrt(d_head)))
            self.d_head, self.tau = d_head, tau

        @classmethod
        def head_kwargs(cls, n_heads, d_head):
            return {"d_head": d_head}

        @classmethod
        def default_knobs(cls, max_len, n_heads, d_head):
            return {**super().default_knobs(max_len, n_heads, d_head), "tau": max_len / 8}

        @classmethod
        def knob_choices(cls):
            return {"tau": (0.5, 1.0, 4.0)}

    return TemperedAttention


def test_the_toy_needs_its_knobs(tempered):
    with pytest.raises(TypeError, match="tau"):
        tempered(d_head=8)  # so a builder that did not ask the kernel could not build it


def test_bench_complexity_builds_it_with_its_own_knobs(tempered, tmp_path):
    out = tmp_path / "cx"
    assert bench(["complexity", "--attention", NAME, "--lengths", "16", "32", "--heads", "2", "--head-dim", "8",
                  "--target-seconds", "0", "--budget-seconds", "1e6", "--threads", "1", "--no-plot",
                  "--out", str(out)]) == 0
    record = json.loads((out / "complexity.json").read_text())["kernels"][NAME]
    assert record["kwargs"] == {"d_head": 8, "tau": 4.0}  # default_knobs(32, 2, 8)
    assert [p["length"] for p in record["points"]] == [16, 32] and not record["stopped"]


def test_the_contract_tests_build_and_pass_it(tempered):
    kernel = test_kernels.build(NAME)
    assert (kernel.d_head, kernel.tau) == (8, test_kernels.KNOB_LENGTH / 8)
    for causal in (False, True):
        test_kernels.test_exact_kernels_match_literal_reference(NAME, causal)  # through exact_kwargs
    test_kernels.test_stepwise_equals_parallel(NAME, [3, 1, 4, 2])
    test_kernels.test_gradients_flow_and_gradcheck(NAME)
    test_kernel_properties.test_knob_choices_are_the_kernels_own_knobs(NAME)
    test_kernel_properties.test_kernel_properties(NAME)  # knobs drawn from its knob_choices


def test_viz_pictures_it(tempered, tmp_path):
    kernel, allowed, how = viz.kernel_pattern(NAME, 16, causal=True)
    assert (kernel.d_head, kernel.tau) == (16, 2.0) and how == "pattern"
    assert allowed.equal(allowed.new_ones(16, 16).tril())
    assert viz.plot_kernel_pattern(NAME, 16, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_registry_is_restored():
    assert NAME not in registry.names("attention")
