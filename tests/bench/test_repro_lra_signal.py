"""benchmarks/lra_signal.py: the cheap non-Transformer checks that the LRA stand-ins carry signal."""

import json
import math

import numpy as np


def test_binomial_test_against_the_majority_class(benchmark_script):
    script = benchmark_script("lra_signal")
    at = script.above_majority(0.5, 0.5, 1000)
    assert at["z"] == 0 and math.isclose(at["p"], 0.5) and not at["signal"]
    above = script.above_majority(0.55, 0.5, 1000)  # z = 0.05 / sqrt(0.25 / 1000) = 3.16
    assert math.isclose(above["z"], 0.05 / math.sqrt(0.25 / 1000)) and above["signal"]


def test_tfidf_vectors_are_unit_length_and_tell_texts_apart(benchmark_script):
    script = benchmark_script("lra_signal")
    vec = script.Tfidf([b"the cat sat", b"a dog ran far"], max_len=64)
    a, b = vec(b"the cat sat"), vec(b"a dog ran far")
    assert math.isclose(float(np.linalg.norm(a)), 1.0, rel_tol=1e-5)
    assert float(a @ a) > float(a @ b)
    assert script.ngram_counts(b"abc", 64).sum() == 3 + 2 + 1  # three 1-grams, two 2-grams, one 3-gram


def test_quick_run_writes_to_the_smoke_folder(benchmark_script, monkeypatch, tmp_path):
    script = benchmark_script("lra_signal")
    monkeypatch.setattr(script, "smoke_dir", lambda name: tmp_path)
    before = script.DOC.read_text() if script.DOC.exists() else None
    results = script.main(["--quick"])
    assert set(results) == {"text", "retrieval"} and all(r["signal"] for r in results.values())
    assert json.loads((tmp_path / "lra-signal.json").read_text()) == json.loads(json.dumps(results))
    assert (script.DOC.read_text() if script.DOC.exists() else None) == before  # the published page untouched
