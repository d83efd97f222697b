"""benchmarks/repro_gpt.py --quick on fake Wikipedia and BBC data (the ``byte_data`` fixture): the
pre-training, the fine-tuning from it and the from-scratch run go through ``qkv.runs``; the page,
plot and results go to the folder given, never to docs/reproductions nor claims.json; the page
shows the results' numbers."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_writes_its_page_elsewhere(benchmark_script, byte_data):
    published = [ROOT / "docs" / "reproductions" / name for name in ("gpt.md", "claims.json")]
    before = [p.read_text() if p.exists() else None for p in published]
    out = byte_data / "out"
    results = benchmark_script("repro_gpt").main(["--quick", "--out", str(out)])
    assert json.loads((out / "gpt.json").read_text()) == json.loads(json.dumps(results))
    assert (out / "img" / "gpt_pretrain_finetune.png").stat().st_size > 0
    seed = results["per_seed"][0]
    assert "--init" in seed["finetune"]["command"] and "--init" not in seed["scratch"]["command"]
    fine = json.loads((out / "runs" / "seed0" / "finetune" / "run.json").read_text())["model_config"]
    assert (fine["head"], fine["num_labels"], fine["max_len"]) == ("classification", 5, 64)
    page = (out / "gpt.md").read_text()
    assert "Smoke run" in page and f"| 0 | {seed['finetune']['test']['accuracy']:.3f} |" in page
    assert f"{seed['pretrain']['valid']['bpc']:.3f}" in page and "no verdict" in page
    assert 0 < results["levels"]["unigram_bpc"] < 8 and 0 < results["levels"]["majority"] <= 1
    assert [p.read_text() if p.exists() else None for p in published] == before
    # a larger fine-tuning budget reuses the pre-trained runs: two new runs per seed, a row on the page
    more = benchmark_script("repro_gpt").main(["--quick", "--out", str(out), "--budgets", "12"])
    assert set(more["budgets"]["12"]) == {"finetune", "scratch"} and len(more["budgets"]["12"]["finetune"]) == 1
    assert (out / "runs" / "seed0" / "finetune-12" / "run.json").is_file()
    assert "| 12 |" in (out / "gpt.md").read_text()
    assert [p.read_text() if p.exists() else None for p in published] == before
