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


@pytest.mark.parametrize("argv, message", [(["--seeds", "0"], "--seeds must be >= 1, got 0"),
                                           (["--steps", "-3"], "--steps must be >= 1, got -3"),
                                           (["--threads", "0"], "--threads must be >= 1, got 0"),
                                           (["--steps", "many"], "--steps: invalid int value: 'many'")])
def test_bad_options_are_refused_before_any_work(benchmark_script, monkeypatch, capsys, argv, message):
    script = benchmark_script("repro_bahdanau_length")
    monkeypatch.setattr(script, "run", lambda args: pytest.fail("trained despite a bad option"))
    with pytest.raises(SystemExit) as exit_:
        script.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def _runs(chrf: float) -> dict:
    bucket = {"n": 3, "bleu": 1.0, "chrf": chrf, "char_accuracy": 0.5}
    run = {"seed": 0, "train_seconds": 1.0, "buckets": {k: bucket for k in ("1-49", "50-69", "70-84", "85-100", "1-100")}}
    return {"no attention": [run], "Bahdanau": [run]}


def _write_forever(script, doc):
    import argparse

    args = argparse.Namespace(steps=20, seeds=1)
    while True:
        for chrf in (11.0, 22.0):
            script.write_section(doc, _runs(chrf), args, "v" * 100000, "img/x.png")  # a long verdict: a slow write


def test_kill_9_while_writing_the_page_leaves_the_old_or_the_new_one(benchmark_script, tmp_path):
    import multiprocessing
    import random
    import time

    script = benchmark_script("repro_bahdanau_length")
    doc = tmp_path / "rnn-attention.md"
    doc.write_text("# page\n\n" + ("filler line\n" * 20000) + "## 5. Pointer network\n")
    ctx, rng = multiprocessing.get_context("fork"), random.Random(0)
    for _ in range(5):
        proc = ctx.Process(target=_write_forever, args=(script, doc))
        proc.start()
        time.sleep(0.3 + rng.random() * 0.3)
        proc.kill()
        proc.join()
        text = doc.read_text()
        assert text.count("filler line\n") == 20000 and text.rstrip().endswith("## 5. Pointer network")
        if "<!-- bible-length -->" in text:  # the section whole, before its anchor, once
            section = text[text.index("<!-- bible-length -->"):text.index("<!-- /bible-length -->")]
            assert section.count("v" * 100000) == 1 and text.count("<!-- bible-length -->") == 1
        assert all(p.name.startswith(".rnn-attention.md.") for p in tmp_path.iterdir() if p != doc)
