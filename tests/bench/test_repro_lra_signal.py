"""benchmarks/lra_signal.py: the cheap non-Transformer checks that the LRA stand-ins carry signal."""

import json
import math

import numpy as np
import pytest


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
    results = script.main(["--quick", "--pathfinder-sizes", "16"])
    assert set(results) == {"text", "retrieval", "pathfinder 16x16"}
    assert results["text"]["signal"] and results["retrieval"]["signal"]
    path = results["pathfinder 16x16"]  # a smoke run: five updates, no signal expected, the fields there
    assert path["options"]["size"] == 16 and path["train_size"] == 64 and len(path["per_seed"]) == 1
    assert "pathfinder 16x16" in (tmp_path / "lra-signal.md").read_text()
    assert json.loads((tmp_path / "lra-signal.json").read_text()) == json.loads(json.dumps(results))
    assert (script.DOC.read_text() if script.DOC.exists() else None) == before  # the published page untouched


def test_path_cnn_pools_down_to_a_receptive_field_that_covers_the_image(benchmark_script):
    import torch

    script = benchmark_script("lra_signal")
    torch.manual_seed(0)
    model = script.path_cnn(8, 32)
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in model) == 3  # after the 2nd, 4th and 6th convolution
    assert model(torch.zeros(3, 1, 32, 32)).shape == (3, 2)
    x = torch.rand(1, 1, 32, 32, requires_grad=True)  # a feature at the far corner sees pixel (0, 0)
    model[:-3](x)[0, :, -1, -1].sum().backward()
    assert x.grad[0, 0, 0, 0] != 0
    shallow = script.path_cnn(2, 32)  # two convolutions see 5 x 5 pixels: the corner cannot
    y = torch.rand(1, 1, 32, 32, requires_grad=True)
    shallow[:-3](y)[0, :, -1, -1].sum().backward()
    assert y.grad[0, 0, 0, 0] == 0


BAD_OPTIONS = [
    (["--pathfinder-sizes", "20"], "--pathfinder-sizes: expected sides among [16, 32], got 20"),
    (["--pathfinder-steps", "0"], "--pathfinder-steps must be >= 1, got 0"),
    (["--seeds", "0"], "--seeds must be >= 1, got 0"),
    (["--pathfinder-train", "-5"], "--pathfinder-train must be >= 1, got -5"),
    (["--pathfinder-layers", "0"], "--pathfinder-layers must be >= 1, got 0"),
    (["--text-len", "0"], "--text-len must be >= 1, got 0"),
    (["--train-pairs", "x"], "--train-pairs: invalid int value: 'x'"),
]


@pytest.mark.parametrize("argv, message", BAD_OPTIONS)
def test_bad_options_are_refused_before_any_work(benchmark_script, monkeypatch, tmp_path, capsys, argv, message):
    script = benchmark_script("lra_signal")
    monkeypatch.setattr(script, "smoke_dir", lambda name: tmp_path)
    worked = []
    monkeypatch.setattr(script, "text_signal", lambda *a, **k: worked.append("text"))
    with pytest.raises(SystemExit) as exit_:
        script.main(["--quick", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert worked == [] and list(tmp_path.iterdir()) == []  # refused before any check ran or any file was written
