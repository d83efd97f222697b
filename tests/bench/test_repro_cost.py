"""benchmarks/repro_cost.py: the efficient-attention papers' cost claims (smoke run, and its parts)."""

import json
import math
import multiprocessing
import random
import sys
import time
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


@pytest.mark.parametrize("argv, expected", [
    (["--seeds", "0"], "--seeds must be a positive int, got 0"),
    (["--seeds", "-2"], "--seeds must be a positive int, got -2"),
    (["--seeds", "three"], "argument --seeds: invalid int value: 'three'"),
    (["--seeds"], "argument --seeds: expected one argument"),
    (["--lengths", "8"], "unrecognized arguments: --lengths 8"),
])
def test_bad_options_are_refused_before_any_measurement(benchmark_script, capsys, monkeypatch, argv, expected):
    script = benchmark_script("repro_cost")
    monkeypatch.setattr(script, "run", lambda args: pytest.fail("measured before refusing"))
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and expected in err and len(err.strip().splitlines()[-1]) < 200


def _write_forever(script, results, out):
    import copy

    old, new = copy.deepcopy(results), copy.deepcopy(results)
    old["date"], new["date"] = "2001-01-01T00:00:00", "2002-02-02T00:00:00"
    while True:
        for version in (old, new):
            script.atomic_write_text(out / "cost.json", json.dumps(version, indent=1))
            script.write_page(version, out, script.CLAIMS)


@pytest.mark.skipif(sys.platform == "win32", reason="fork and SIGKILL are POSIX")
def test_kill_9_while_the_page_is_written_leaves_whole_files(benchmark_script, tmp_path, monkeypatch):
    """cost.json, cost.md and img/cost.png are each replaced whole: a kill -9 at any moment leaves
    the old file or the new one, never a truncated one."""
    script = benchmark_script("repro_cost")
    monkeypatch.setattr(script, "smoke_dir", lambda name: tmp_path)
    results = script.main(["--quick", "--seeds", "1"])
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(0)
    for _ in range(5):
        proc = ctx.Process(target=_write_forever, args=(script, results, tmp_path))
        proc.start()
        time.sleep(0.4 + rng.random() * 0.6)
        proc.kill()
        proc.join()
        saved = json.loads((tmp_path / "cost.json").read_text())  # a truncated file is not JSON
        assert saved["date"][:4] in ("2001", "2002", results["date"][:4]) and set(saved["kernels"]) == \
            {c.id for c in script.CLAIMS}
        page = (tmp_path / "cost.md").read_text()
        assert page.startswith("# The cost of efficient attention") and page.rstrip().endswith("its time still grows as n^2.")
        assert (tmp_path / "img" / "cost.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # Besides them only a killed writer's hidden temporary file (qkv._io.atomic_path), never a visible one.
        visible = {p.name for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith(".")}
        assert visible == {"cost.json", "cost.md", "cost.png"}, visible
        assert all(p.name.endswith(".tmp") for p in tmp_path.rglob(".*") if p.is_file())
