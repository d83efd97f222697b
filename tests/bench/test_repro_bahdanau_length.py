"""benchmarks/repro_bahdanau_length.py (issue 38, item 5): Bahdanau's quality-against-length curve on
bible-en-es with seeds — a smoke run trains both arms per seed, writes the seeded section and its
plot into the smoke folder, and records no claim."""

import json
from pathlib import Path

import pytest

from qkv.tasks import data

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "docs" / "reproductions" / "claims.json"


@pytest.mark.skipif(not data.is_cached("bible"), reason="run `qkv data fetch bible`")
def test_quick_run_writes_the_seeded_length_section_and_no_claim(benchmark_script, monkeypatch, tmp_path):
    script = benchmark_script("repro_bahdanau_length")
    monkeypatch.setattr(script, "smoke_dir", lambda name: tmp_path)
    before, page = CLAIMS.read_text(), script.DOC.read_text()
    per_seed = script.main(["--quick"])
    assert set(per_seed) == {"no attention", "Bahdanau"}
    for runs in per_seed.values():
        assert [r["seed"] for r in runs] == [0, 1]
        assert all(set(r["buckets"]) == {"1-49", "50-69", "70-84", "85-100", "1-100"} for r in runs)
    text = (tmp_path / "rnn-attention.md").read_text()
    section = text[text.index("<!-- bible-length -->"):text.index("<!-- /bible-length -->")]
    assert "| chrF Bahdanau |" in section and "±" in section and "no verdict from 2 seeds" in section
    assert (tmp_path / "img" / "rnn-bible-length-20-seeds.png").stat().st_size > 0
    saved = json.loads((tmp_path / "bahdanau-length-quick.json").read_text())
    assert saved["seeds"] == 2 and saved["per_seed"]["Bahdanau"][1]["buckets"]["85-100"]["chrf"] >= 0
    assert CLAIMS.read_text() == before and script.DOC.read_text() == page  # nothing published


def test_bad_counts_are_refused(benchmark_script):
    script = benchmark_script("repro_bahdanau_length")
    with pytest.raises(SystemExit):
        script.main(["--seeds", "0"])
