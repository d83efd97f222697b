"""A model with nothing to train is evaluated, not crashed on (issue 14, item 7)."""

import json

import pytest
import torch
from _toy_train import ToyLM, ToyTask

from qkv.cli import main
from qkv.train import TrainConfig, Trainer


def test_frozen_model_is_evaluated_once(tmp_path):
    model = ToyLM()
    model.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = TrainConfig(steps=5, batch_size=4, eval_batches=1, out_dir=str(tmp_path), device="cpu",
                         progress=False, tensorboard=False)
    with pytest.warns(UserWarning, match="no trainable parameters"):
        metrics = Trainer(model, ToyTask(), config).fit()
    assert "valid_loss" in metrics
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["event"], r["step"]) for r in records] == [("eval", 0)]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


def test_fixed_kernel_nadaraya_watson_trains_from_the_cli(tmp_path, capsys):
    run = tmp_path / "nw"
    argv = ["train", "nadaraya-watson", "--task", "nw-regression", "--set", "kernel=fixed", "--out", str(run),
            "--steps", "3", "--progress", "false", "--tensorboard", "false"]
    with pytest.warns(UserWarning, match="nothing to train"):
        assert main(argv) == 0
    assert (run / "model" / "config.json").is_file()
    assert main(["eval", str(run)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["mse"] < 1.0
