"""benchmarks/repro_cost.py: the efficient-attention papers' cost claims (smoke run, and its parts)."""

import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "docs" / "reproductions" / "claims.json"


def test_quick_run_fits_every_kernel_and_publishes_nothing(benchmark_script, capsys):
    before = CLAIMS.read_text()
    page = ROOT / "docs" / "reproductions" / "cost.md"
    published = page.read_text() if page.exists() else None
    script = benchmark_script("repro_cost")
    results = script.main(["--quick", "--seeds", "1"])
    out = capsys.readouterr().out
    for c in script.CLAIMS:
        assert f"| `{c.kernel}`" in out and c.id in results["kernels"]
        exponents = results["kernels"][c.id][0]["exponents"]
        assert all(math.isfinite(exponents[key]) for key in ("time", "memory"))
    assert "| `softmax` (bidirectional)" in out and "| `softmax` (causal)" in out
    assert CLAIMS.read_text() == before  # a smoke run records no claim
    assert (page.read_text() if page.exists() else None) == published  # nor touches the published page
    # Counted FLOPs are exact: kernels whose knobs do not change with n over the quick ladder grow as n^1.
    for claim_id in ("efficient-attention-cost", "performer-cost"):
        assert results["kernels"][claim_id][0]["exponents"]["flops"] == pytest.approx(1.0, abs=0.02)


def test_the_bounds_sit_between_each_order_and_quadratic(benchmark_script):
    """A bound is the paper's order's slope over 1,024 ... 16,384 plus 0.2, and below exact attention's 2."""
    script = benchmark_script("repro_cost")
    slope = {"O(n)": 1.0, "O(n log n)": 1 + math.log((16384 * math.log(16384)) / (1024 * math.log(1024)) / 16) / math.log(16),
             "O(n sqrt n)": 1.5}
    for c in script.CLAIMS:
        assert c.bound == pytest.approx(round(slope[c.order] + 0.2, 1), abs=0.051) and c.bound < 2.0


def test_bad_seeds_are_refused(benchmark_script, capsys):
    script = benchmark_script("repro_cost")
    with pytest.raises(SystemExit):
        script.main(["--seeds", "0"])
    assert "--seeds must be a positive int, got 0" in capsys.readouterr().err
