"""The shared benchmark helpers: log–log fits, peak-memory measurement, machine description."""

import math

import pytest
import torch

from qkv.bench import common


@pytest.mark.parametrize("exponent", [0.5, 1.0, 2.0, 3.0])
def test_fit_loglog_recovers_exponent(exponent):
    xs = [256 * 2 ** i for i in range(6)]
    ys = [3e-7 * x ** exponent for x in xs]
    fit = common.fit_loglog(xs, ys)
    assert fit["exponent"] == pytest.approx(exponent, abs=1e-9)
    assert fit["coefficient"] == pytest.approx(3e-7, rel=1e-6)
    assert fit["r2"] == pytest.approx(1.0)


def test_fit_loglog_with_noise_and_lower_order_term():
    # a n^2 + b n with multiplicative noise: the slope over long lengths approaches 2.
    gen = torch.Generator().manual_seed(0)
    xs = [1024 * 2 ** i for i in range(5)]
    noise = (1 + 0.03 * torch.randn(len(xs), generator=gen)).tolist()
    ys = [(1e-9 * x * x + 1e-7 * x) * e for x, e in zip(xs, noise)]
    assert common.fit_loglog(xs, ys)["exponent"] == pytest.approx(2.0, abs=0.1)


@pytest.mark.parametrize("xs, ys", [([1.0], [1.0]), ([1.0, 2.0], [1.0, 0.0]), ([2.0, 2.0], [1.0, 3.0]), ([1, 2], [1])])
def test_fit_loglog_rejects_bad_points(xs, ys):
    with pytest.raises(ValueError):
        common.fit_loglog(xs, ys)


def test_peak_memory_sees_bigger_allocation():
    cpu = torch.device("cpu")

    def allocate(n):
        def step():
            x = torch.ones(n, n)  # n * n * 4 bytes live at once with y
            y = x * 2
            return float(y.sum())
        return step

    small, big = common.peak_memory(allocate(64), cpu), common.peak_memory(allocate(512), cpu)
    assert small >= 2 * 64 * 64 * 4
    assert big >= 2 * 512 * 512 * 4
    assert big > 32 * small


def test_peak_memory_counts_quadratic_activations_not_views():
    cpu = torch.device("cpu")
    q = torch.randn(1, 1, 256, 16, requires_grad=True)

    def explicit():  # (L, L) scores and weights, saved for backward
        ((q @ q.transpose(-1, -2)).softmax(-1) @ q).sum().backward()

    def views_only():
        q.transpose(-1, -2).reshape(1, 1, 16, 256)[..., :3]

    assert common.peak_memory(explicit, cpu) >= 2 * 256 * 256 * 4
    assert common.peak_memory(views_only, cpu) == 0


def test_time_steps_counts_repeats():
    calls = []
    timing = common.time_steps(lambda: calls.append(1), torch.device("cpu"), warmup=2, min_repeats=3,
                               max_repeats=4, target_seconds=0.0)
    assert len(timing.times) == 3 and len(calls) == 5
    assert timing.median >= 0 and math.isfinite(timing.median)


def test_machine_description_names_cpu_and_torch():
    machine = common.describe_machine(torch.device("cpu"))
    line = common.machine_line(machine)
    assert machine["torch"] == torch.__version__ and machine["cores"] >= 1
    assert machine["cpu"] in line and torch.__version__ in line


def test_resolve_device_rejects_unknown():
    with pytest.raises(ValueError, match="--device"):
        common.resolve_device("tpu")


def test_round_ratio_is_the_median_of_the_ratios_within_rounds():
    from qkv.bench.common import Timing, round_ratio

    # the machine is twice as slow in round 2 for both sides, and a burst hits a alone in round 3:
    # within rounds a takes half of b's time twice; the ratio of the medians says 4/3
    a, b = Timing([1.0, 4.0, 10.0]), Timing([2.0, 8.0, 3.0])
    assert round_ratio(a, b) == pytest.approx(0.5)
    assert a.median / b.median == pytest.approx(4 / 3)
    with pytest.raises(ValueError, match="same rounds"):
        round_ratio(Timing([1.0]), Timing([1.0, 2.0]))


@pytest.mark.parametrize("write", ["markdown", "json", "figure"])
def test_reports_are_written_atomically(tmp_path, monkeypatch, write):
    """A run killed while writing its report (here: the rename fails) leaves the old file whole and
    no temporary file beside it."""
    import os

    from qkv._plot import pyplot, save_figure

    path = tmp_path / {"markdown": "r.md", "json": "r.json", "figure": "r.png"}[write]
    path.write_bytes(b"old report")

    def write_it():
        if write == "markdown":
            common.write_markdown(path, "t", common.describe_machine(torch.device("cpu")), "cmd", "date", ["a section"])
        elif write == "json":
            common.write_json(path, {"a": 1})
        else:
            fig = pyplot().figure()
            fig.gca().plot([0, 1], [0, 1])
            save_figure(fig, path)

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_it()
    assert path.read_bytes() == b"old report" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    monkeypatch.undo()
    write_it()
    assert path.read_bytes() != b"old report" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    if write == "figure":
        assert path.read_bytes()[:4] == b"\x89PNG"
