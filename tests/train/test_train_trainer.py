"""The Trainer: accumulation, exact resume after SIGKILL, DDP under torchrun, logging, errors."""

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _toy_train import HERE, ToyLM, ToyTask, script_env
from _toy_train import run as run_toy

from qkv.train import TrainConfig, Trainer, load_model_state, schedules

SCRIPT = str(HERE / "_toy_train.py")


def _config(tmp_path, **kw):
    base = dict(steps=6, batch_size=4, lr=1e-2, warmup=2, schedule="constant", grad_clip=None, log_every=1,
                eval_every=0, eval_batches=1, save_every=0, seed=1, out_dir=str(tmp_path), device="cpu",
                progress=False, tensorboard=False)
    base.update(kw)
    return TrainConfig(**base)


def _losses(out_dir):
    records = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["event"] == "train"}


def _resumed_from(out_dir):
    records = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if r["event"] == "resume"]


def _fresh_model(dropout=0.0):
    torch.manual_seed(0)
    return ToyLM(dropout=dropout, tied=True)


def test_grad_accumulation_2x_half_equals_one_full_batch(tmp_path):
    full, accum = _fresh_model(), _fresh_model()
    Trainer(full, ToyTask(), _config(tmp_path / "a", batch_size=8, grad_accum=1, grad_clip=1.0)).fit()
    Trainer(accum, ToyTask(), _config(tmp_path / "b", batch_size=4, grad_accum=2, grad_clip=1.0)).fit()
    for (name, a), b in zip(full.state_dict().items(), accum.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    la, lb = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert la.keys() == lb.keys() == set(range(1, 7))
    assert max(abs(la[s] - lb[s]) for s in la) < 1e-5, (la, lb)


def test_metrics_log_and_eval_and_final_checkpoint(tmp_path):
    model = _fresh_model()
    result = Trainer(model, ToyTask(), _config(tmp_path, steps=20, lr=3e-2, log_every=5, eval_every=10)).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["event"] == "train"]
    evals = [r for r in records if r["event"] == "eval"]
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    assert [r["step"] for r in evals] == [10, 20]
    assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= train[0].keys()
    assert {"valid_loss", "accuracy"} <= evals[0].keys()
    assert train[-1]["loss"] < train[0]["loss"]
    assert result["accuracy"] == evals[-1]["accuracy"] and result["loss"] == train[-1]["loss"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-00000020.safetensors"
    assert json.loads((tmp_path / "train_config.json").read_text())["steps"] == 20
    with pytest.raises(ValueError, match="already holds checkpoints"):
        Trainer(_fresh_model(), ToyTask(), _config(tmp_path, steps=20)).fit()


class _CrashingTask(ToyTask):
    """Raises when asked for the batch of update ``crash_at`` (a crash after some checkpoints)."""

    def __init__(self, crash_at):
        super().__init__()
        self.crash_at = crash_at

    def get_batch(self, split, batch_size, step, **kw):
        if step == self.crash_at:
            raise RuntimeError("simulated crash")
        return super().get_batch(split, batch_size, step, **kw)


def test_resume_in_process_after_crash_matches_uninterrupted(tmp_path):
    """Crash at update 7 (checkpoint at 4), resume with a differently initialised model and a
    disturbed RNG: the losses of all 10 steps equal an uninterrupted run's."""
    kw = dict(steps=10, save_every=4, schedule="cosine", eval_every=3)
    Trainer(_fresh_model(0.2), ToyTask(), _config(tmp_path / "ref", **kw)).fit()
    with pytest.raises(RuntimeError, match="simulated crash"):
        Trainer(_fresh_model(0.2), _CrashingTask(crash_at=6), _config(tmp_path / "cut", **kw)).fit()
    assert max(_losses(tmp_path / "cut")) == 6
    torch.manual_seed(99)
    other = ToyLM(dropout=0.2, tied=True)
    Trainer(other, ToyTask(), _config(tmp_path / "cut", **kw)).fit(resume=True)
    ref, cut = _losses(tmp_path / "ref"), _losses(tmp_path / "cut")
    assert _resumed_from(tmp_path / "cut") == [4]
    assert ref == cut


def test_resume_with_more_steps_follows_the_new_schedule(tmp_path):
    """Extending a finished cosine run: the lr after resuming follows the cosine over the new
    total (the config governs the schedule)."""
    kw = dict(schedule="cosine", warmup=2, lr=1e-2)
    Trainer(_fresh_model(), ToyTask(), _config(tmp_path, steps=4, **kw)).fit()
    Trainer(_fresh_model(), ToyTask(), _config(tmp_path, steps=8, **kw)).fit(resume=True)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["lr"] for r in records if r["event"] == "train"}
    multiplier = schedules.WarmupCosineMultiplier(warmup=2, total=8)
    assert sorted(lrs) == list(range(1, 9))
    for step in range(5, 9):
        assert lrs[step] == pytest.approx(1e-2 * multiplier(step - 1))


def test_bf16_autocast_trains(tmp_path):
    model = _fresh_model()
    result = Trainer(model, ToyTask(), _config(tmp_path, steps=3, precision="bf16")).fit()
    assert torch.isfinite(torch.tensor(result["loss"]))
    assert next(model.parameters()).dtype == torch.float32


def test_config_and_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="precision"):
        _config(tmp_path, precision="fp8")
    with pytest.raises(ValueError, match="schedule"):
        _config(tmp_path, schedule="step")
    with pytest.raises(TypeError, match="grad_accum"):
        _config(tmp_path, grad_accum=1.5)
    with pytest.raises(ValueError, match="steps"):
        _config(tmp_path, steps=0)
    with pytest.raises(TypeError, match="task"):
        Trainer(_fresh_model(), object(), _config(tmp_path))
    with pytest.raises(TypeError, match="QKVModel"):  # the hooks the trainer calls are declared there
        Trainer(torch.nn.Linear(2, 2), ToyTask(), _config(tmp_path))
    with pytest.raises(TypeError, match="config"):
        Trainer(_fresh_model(), ToyTask(), {"steps": 3})


def test_sigkill_mid_training_then_resume_matches_uninterrupted(tmp_path):
    """SIGKILL a training subprocess after its first checkpoint; resuming it logs the same
    per-step losses (dropout on, so the RNG states matter) as a run never interrupted."""
    steps, args = 24, ["--steps", "24", "--save-every", "5", "--dropout", "0.2"]
    env = script_env()
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, SCRIPT, "--out", str(killed), "--sleep", "0.15", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 60
    while not latest.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    logged_before_kill = max(_losses(killed))
    assert 5 <= logged_before_kill < steps, "the run must die part-way"

    run_toy(str(killed), steps=steps, save_every=5, dropout=0.2, resume=True)  # resume it in-process
    run_toy(str(tmp_path / "ref"), steps=steps, save_every=5, dropout=0.2)  # in-process reference
    resumed, ref = _losses(killed), _losses(tmp_path / "ref")
    (resumed_at,) = _resumed_from(killed)
    assert resumed_at % 5 == 0 and 5 <= resumed_at <= logged_before_kill
    assert sorted(resumed) == list(range(1, steps + 1))
    assert max(abs(resumed[s] - ref[s]) for s in ref) <= 1e-6
    _, a = load_model_state(killed / "final")
    _, b = load_model_state(tmp_path / "ref" / "final")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


TORCHRUN = Path(sys.executable).parent / "torchrun"


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available() and TORCHRUN.exists()),
                    reason="needs torch.distributed with gloo and torchrun")
def test_torchrun_two_process_ddp_equals_one_process_combined_batch(tmp_path):
    """2 ranks x batch 2 x accum 2 (gloo) == 1 process x batch 8: same final parameters."""
    env = script_env()
    common = ["--steps", "6", "--dropout", "0.0", "--save-every", "3"]
    ddp = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node", "2", SCRIPT, "--out", str(tmp_path / "ddp"),
                          "--batch-size", "2", "--grad-accum", "2", *common], env=env, capture_output=True, timeout=120)
    assert ddp.returncode == 0, ddp.stderr.decode()[-3000:]
    run_toy(str(tmp_path / "one"), steps=6, batch_size=8, dropout=0.0, save_every=3)  # in-process reference
    _, a = load_model_state(tmp_path / "ddp" / "final")
    _, b = load_model_state(tmp_path / "one" / "final")
    for name in b:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)
    la, lb = _losses(tmp_path / "ddp"), _losses(tmp_path / "one")
    assert la.keys() == lb.keys() and max(abs(la[s] - lb[s]) for s in la) < 1e-5
    # only rank 0 logs: one train record per step, one eval record (at the end)
    lines = (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6 + 1


@pytest.mark.parametrize("field,value", [("lr", float("inf")), ("lr", float("nan")), ("lr", 0.0), ("weight_decay", float("nan")),
                                         ("weight_decay", -1.0), ("grad_clip", float("nan")), ("grad_clip", float("inf")),
                                         ("eps", float("nan")), ("betas", (float("nan"), 0.9))])
def test_non_finite_or_negative_hyperparameters_are_refused(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        _config(tmp_path, **{field: value})


def test_checkpoints_by_default_at_every_evaluation(tmp_path):
    assert TrainConfig().save_every is None  # None: at every evaluation
    Trainer(_fresh_model(), ToyTask(), _config(tmp_path, eval_every=2, save_every=None, steps=20)).fit()
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*.safetensors"))
    assert saved == ["step-00000016.safetensors", "step-00000018.safetensors", "step-00000020.safetensors"]
    evals = [json.loads(r)["step"] for r in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"eval"' in r]
    assert evals == list(range(2, 21, 2))


def test_progress_bar_shows_training_loss_and_validation_apart():
    from qkv.train.trainer import _postfix

    shown = _postfix({"loss": 1.0, "tokens_per_s": 10.0}, {"valid_loss": 2.0, "loss": 2.0, "bpc": 3.0})
    assert shown["loss"] == "1.0000" and shown["val_loss"] == "2.0000" and shown["val_bpc"] == "3"


def test_resume_skips_a_corrupt_newest_checkpoint(tmp_path):
    Trainer(_fresh_model(), ToyTask(), _config(tmp_path, steps=4, save_every=2)).fit()
    newest = tmp_path / "checkpoints" / "step-00000004.safetensors"
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0x10
    newest.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="checksum"):
        Trainer(_fresh_model(), ToyTask(), _config(tmp_path, steps=6, save_every=2)).fit(resume=True)
    assert _resumed_from(tmp_path) == [2]


def test_progress_bar_shows_a_real_loss_from_the_first_update(tmp_path, monkeypatch):
    """Issue 20: with evaluations more frequent than train records the bar showed ``loss=nan``."""
    from qkv.train import trainer as trainer_module

    shown = []
    postfix = trainer_module._postfix

    def keep(record, eval_metrics):
        shown.append(postfix(record, eval_metrics))
        return shown[-1]

    monkeypatch.setattr(trainer_module, "_postfix", keep)
    Trainer(_fresh_model(), ToyTask(), _config(tmp_path, steps=5, log_every=4, eval_every=2)).fit()
    assert shown, "the bar was never given a loss"
    assert shown[0]["loss"] != "nan" and "val_loss" not in shown[0]  # after the first update
    assert all(s["loss"] != "nan" and float(s["loss"]) > 0 for s in shown), shown
    assert [s["loss"] for s in shown if "val_loss" in s][0] == shown[1]["loss"]  # step 2's loss beside its evaluation


@pytest.mark.parametrize("clean", [True, False])
def test_teardown_waits_for_every_rank_only_after_a_clean_run(monkeypatch, clean):
    """A clean run collects the DDP reducers and meets the other ranks at a barrier before the
    group is destroyed; after an error it destroys at once (the other ranks may never arrive)."""
    from qkv.train import distributed

    calls = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda: calls.append("destroy"))
    monkeypatch.setattr(distributed.gc, "collect", lambda: calls.append("collect"))
    ctx = distributed.DistContext(rank=1, world_size=2, local_rank=1, device=torch.device("cpu"), owns_group=True)
    distributed.teardown(ctx, clean=clean)
    assert calls == (["collect", "barrier", "destroy"] if clean else ["destroy"])
    calls.clear()
    distributed.teardown(dataclasses.replace(ctx, owns_group=False), clean=clean)
    assert calls == []


def test_a_task_metric_named_loss_does_not_hide_the_train_loss(tmp_path):
    """CLI audit: show-attend-tell's evaluation returns its own "loss", which replaced the last
    train loss in what ``fit`` returns (and ``qkv train`` prints)."""

    class LossTask(ToyTask):
        def evaluate(self, model, split="test", max_examples=None):
            return {"loss": 123.0, "accuracy": 0.5}

    out = Trainer(_fresh_model(), LossTask(), _config(tmp_path, steps=2, eval_every=2, log_every=1)).fit()
    assert out["loss"] != 123.0 and out["eval_loss"] == 123.0 and out["accuracy"] == 0.5 and "valid_loss" in out
