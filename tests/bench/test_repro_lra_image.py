"""benchmarks/lra_image.py: why the Image stand-in favours linformer (the arms, and the page's reading)."""

import pytest
import torch

from qkv.tasks.data import is_cached


def _task():
    from qkv.bench import lra

    return lra.build_lra_task("fashion-mnist-seq", lra.PLAN["fashion-mnist-seq"].options)


@pytest.mark.skipif(not is_cached("fashion-mnist"), reason="needs `qkv data fetch fashion-mnist`")
def test_frozen_linformer_trains_everything_but_its_position_maps(benchmark_script):
    script = benchmark_script("lra_image")
    task = _task()
    trained = script.encoder("linformer", task, 0)
    frozen = script.encoder("linformer", task, 0, frozen=True)
    maps = [n for n, _ in frozen.named_parameters() if n.endswith((".E", ".F"))]
    assert len(maps) == 4  # E and F in each of the two layers
    assert all(not p.requires_grad for n, p in frozen.named_parameters() if n in maps)
    assert all(p.requires_grad for n, p in frozen.named_parameters() if n not in maps)
    # the same initialisation: only what is trained differs
    assert all(torch.equal(a, b) for a, b in zip(trained.state_dict().values(), frozen.state_dict().values()))
    softmax = script.encoder("softmax", task, 0)
    assert sum(p.numel() for p in frozen.parameters() if p.requires_grad) == sum(p.numel() for p in softmax.parameters())
    with pytest.raises(ValueError, match="no E / F projections"):
        script.encoder("softmax", task, 0, frozen=True)


def test_page_reads_the_arms_it_was_given(benchmark_script):
    script = benchmark_script("lra_image")

    def arm(accs, params):
        return {"per_seed": accs, "mean": sum(accs) / len(accs), "sd": 0.01, "trained_parameters": params,
                "seconds": [1.0] * len(accs)}

    res = {"steps": 250, "long": 4, "batch": 32, "lr": 1e-3, "seeds": [0, 1, 2], "test_examples": 1000, "n": 784,
           "k": 196, "minutes": 40.0,
           "arms": {"softmax": arm([0.33, 0.35, 0.34], 143242), "linformer": arm([0.69, 0.70, 0.68], 757898),
                    "linformer-frozen": arm([0.66, 0.67, 0.65], 143242), "softmax-long": arm([0.55, 0.56, 0.57], 143242),
                    "pixels": arm([0.72, 0.73, 0.71], 7850)}}
    table, reading, _ = script.page(res)
    assert "| `linformer`, E and F frozen at initialisation, 250 updates | 66.0, 67.0, 65.0 | 66.0 ± 1.0 | 143,242 |" in table
    assert "| `softmax`, 1000 updates | 55.0, 56.0, 57.0 |" in table
    assert "614,656 of its 757,898 trained parameters" in reading
    assert "66.0 % against 69.0 % trained (+3.0 points)" in reading
    assert "56.0 % (+22.0 points over 250 updates)" in reading and "reaches 72.0 %" in reading


def test_bad_options_are_refused_before_any_training(benchmark_script, monkeypatch, capsys):
    script = benchmark_script("lra_image")
    monkeypatch.setattr(script, "train_encoder", lambda *a, **k: pytest.fail("trained despite a bad option"))
    monkeypatch.setattr(script, "train_pixels", lambda *a, **k: pytest.fail("trained despite a bad option"))
    for argv, said in ((["--seeds", "0"], "--seeds must be >= 1, got 0"), (["--long", "0"], "--long must be >= 1"),
                       (["--threads", "-1"], "--threads must be >= 1"), (["--steps", "0"], "--steps must be >= 1"),
                       (["--seeds", "two"], "invalid int value: 'two'")):
        with pytest.raises(SystemExit):
            script.main(argv)
        assert said in capsys.readouterr().err

