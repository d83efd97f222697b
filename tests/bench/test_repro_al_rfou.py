"""benchmarks/repro_al_rfou.py --quick: both arms train and are scored, the page and its picture are
written to the smoke folder, never to docs/ nor claims.json; bad numbers are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_writes_the_smoke_page_only(benchmark_script, monkeypatch):
    claims_before = (ROOT / "docs" / "reproductions" / "claims.json").read_text()
    script = benchmark_script("repro_al_rfou")
    script.main(["--quick", "--budgets", "700"])
    page = script.DOC.read_text()
    assert script.DOC.parent != ROOT / "docs" / "reproductions"
    assert "| auxiliary losses | 6 |" in page and "| auxiliary losses | 8 |" in page
    assert (script.IMG / "al-rfou-bpc.png").stat().st_size > 0
    assert (ROOT / "docs" / "reproductions" / "claims.json").read_text() == claims_before


@pytest.mark.parametrize("argv,match", [(["--seeds", "0"], "--seeds must be a positive integer"),
                                        (["--steps", "100", "--budgets", "50"], "--budgets must be larger")])
def test_bad_numbers_are_refused(benchmark_script, argv, match, capsys):
    with pytest.raises(SystemExit):
        benchmark_script("repro_al_rfou").main(argv)
    assert match in capsys.readouterr().err
