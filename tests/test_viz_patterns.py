"""qkv viz --pattern: which keys each query sees, for every registered kernel."""

import pytest
import torch

import qkv
from qkv import masks, viz
from qkv.cli import main

NAMES = list(qkv.list_attention())


@pytest.mark.parametrize("name", NAMES)
def test_every_kernel_has_a_picture(name, tmp_path):
    kernel, allowed, how = viz.kernel_pattern(name, 16)
    assert allowed.shape == (16, 16) and allowed.dtype == torch.bool
    assert allowed.any(-1).all()  # every query sees something
    path = viz.plot_kernel_pattern(name, 16, tmp_path / f"{name}.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_patterns_are_the_papers():
    _, allowed, how = viz.kernel_pattern("strided", 36, causal=True)
    assert how == "pattern" and torch.equal(allowed, masks.materialize(masks.strided(6, causal=True), 36, 36))
    _, allowed, _ = viz.kernel_pattern("fixed", 36, causal=True, overrides={"stride": 4, "c": 1})
    assert torch.equal(allowed, masks.materialize(masks.fixed(4, 1, causal=True), 36, 36))
    kernel, allowed, _ = viz.kernel_pattern("local-2d", 64, causal=True)
    assert torch.equal(allowed, masks.materialize(masks.local_2d((8, 8), (2, 4), (2, 2, 2)), 64, 64))
    _, allowed, _ = viz.kernel_pattern("softmax", 8, causal=True)
    assert torch.equal(allowed, torch.ones(8, 8, dtype=torch.bool).tril())


def test_cli(tmp_path, capsys):
    out = tmp_path / "p.png"
    assert main(["viz", "--pattern", "local-2d", "--length", "36", "--causal", "--kernel-kwargs",
                 "image_size=(4,9),block=(2,3)", "--out", str(out)]) == 0
    assert out.is_file()
    assert main(["viz", "--pattern", "efficient", "--causal", "--out", str(out)]) == 2
    assert "cannot be causal" in capsys.readouterr().err
    assert main(["viz"]) == 2
