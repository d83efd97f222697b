"""Training checkpoints and model directories: round trips, tied weights, atomicity, corruption."""

import os
import random

import numpy as np
import pytest
import torch
from _toy_train import ToyLM, ToyTask
from safetensors.torch import save_file

from qkv.train import CheckpointError, CheckpointManager, load_checkpoint, load_model_state, save_checkpoint, save_model
from qkv.train import checkpoint as ckpt
from qkv.train import schedules


def _trained(seed=0, steps=3):
    """A toy model, its AdamW and schedule after a few updates."""
    torch.manual_seed(seed)
    model = ToyLM(dropout=0.1, tied=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.98))
    sched = schedules.warmup_cosine(opt, warmup=2, total=10)
    task = ToyTask()
    for step in range(steps):
        model(**task.get_batch("train", 4, step)).loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def test_round_trip_restores_everything_and_continues_identically(tmp_path):
    model, opt, sched = _trained()
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, sched, step=3, extra={"note": "x"})

    model2, opt2, sched2 = _trained(seed=1, steps=1)
    meta = load_checkpoint(path, model2, opt2, sched2)
    assert meta["step"] == 3 and meta["extra"] == {"note": "x"}
    assert _same_state(model, model2)
    assert model2.head.weight is model2.embed.weight  # the tie survives loading
    assert sched2.state_dict() == sched.state_dict()
    assert opt2.param_groups[0]["betas"] == (0.9, 0.98)

    # the same next update from both
    task = ToyTask()
    for m, o, s in ((model, opt, sched), (model2, opt2, sched2)):
        torch.manual_seed(9)
        m(**task.get_batch("train", 4, 3)).loss.backward()
        o.step()
        s.step()
    assert _same_state(model, model2)


def test_rng_states_restored(tmp_path):
    model, opt, sched = _trained()
    torch.manual_seed(123)
    np.random.seed(5)
    random.seed(7)
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, sched, step=3)
    draws = (torch.rand(3), float(np.random.rand()), random.random())
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    load_checkpoint(path, model, opt, sched)
    again = (torch.rand(3), float(np.random.rand()), random.random())
    assert torch.equal(draws[0], again[0]) and draws[1:] == again[1:]


def test_tied_weights_stored_once_in_model_directory(tmp_path):
    model, _, _ = _trained()
    save_model(model, {"d_model": 8}, tmp_path / "m")
    config, state = load_model_state(tmp_path / "m")
    assert config == {"d_model": 8}
    assert state["head.weight"] is state["embed.weight"]
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m" / "model.safetensors"), framework="pt") as f:
        assert "head.weight" not in set(f.keys()) or "embed.weight" not in set(f.keys())
    fresh = ToyLM(tied=True)
    fresh.load_state_dict(state, strict=True)
    assert fresh.head.weight is fresh.embed.weight
    assert _same_state(fresh, model)


def test_manager_keeps_last_k_and_points_latest(tmp_path):
    model, opt, sched = _trained()
    manager = CheckpointManager(tmp_path, keep_last=2)
    assert manager.latest() is None
    for step in (1, 2, 3, 4):
        manager.save(step, model, opt, sched)
    assert [p.name for p in manager.checkpoints()] == ["step-00000003.safetensors", "step-00000004.safetensors"]
    assert manager.latest().name == "step-00000004.safetensors"
    assert (tmp_path / "latest").read_text().strip() == "step-00000004.safetensors"


def test_crash_between_temp_write_and_rename_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, sched = _trained(steps=2)
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(2, model, opt, sched)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    model(**ToyTask().get_batch("train", 4, 9)).loss.backward()
    opt.step()

    def crash(src, dst):
        raise KeyboardInterrupt("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        manager.save(3, model, opt, sched)
    monkeypatch.undo()

    assert manager.latest().name == "step-00000002.safetensors"
    assert not manager.path_for(3).exists()
    restored = ToyLM(dropout=0.1, tied=True)
    meta = load_checkpoint(manager.latest(), restored)
    assert meta["step"] == 2
    assert all(torch.equal(restored.state_dict()[k], before[k]) for k in before)


def test_crash_after_checkpoint_before_latest_pointer(tmp_path, monkeypatch):
    """A death between the checkpoint's rename and the pointer's leaves a complete newer file; the
    pointer still names a complete older one."""
    model, opt, sched = _trained(steps=2)
    manager = CheckpointManager(tmp_path, keep_last=3)
    manager.save(2, model, opt, sched)

    def die(path, text):
        raise KeyboardInterrupt("simulated crash before the pointer")

    monkeypatch.setattr(ckpt, "atomic_write_text", die)
    with pytest.raises(KeyboardInterrupt):
        manager.save(3, model, opt, sched)
    monkeypatch.undo()
    assert manager.latest().name == "step-00000002.safetensors"
    load_checkpoint(manager.latest(), ToyLM(tied=True), strict=True)
    load_checkpoint(manager.path_for(3), ToyLM(tied=True), strict=True)


def test_killed_writer_leftover_temp_file_is_ignored_and_cleaned(tmp_path):
    model, opt, sched = _trained(steps=1)
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save(1, model, opt, sched)
    good = manager.path_for(1).read_bytes()
    stale = tmp_path / ".step-00000002.safetensors.abc123.tmp"
    stale.write_bytes(good[: len(good) // 2])  # what SIGKILL mid-write leaves behind
    assert manager.latest().name == "step-00000001.safetensors"
    load_checkpoint(manager.latest(), ToyLM(tied=True))
    manager.save(2, model, opt, sched)
    assert not stale.exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_or_truncated_checkpoint_raises_naming_the_file(tmp_path, damage):
    model, opt, sched = _trained(steps=1)
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, sched, step=1)
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) - 100], "garbage": b"\x07" * 64, "empty": b""}[damage])
    with pytest.raises(CheckpointError, match="c.safetensors"):
        load_checkpoint(path, ToyLM(tied=True), opt, sched)


def test_non_checkpoint_and_mismatch_errors(tmp_path):
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(CheckpointError, match="not a qkv training checkpoint"):
        load_checkpoint(plain, ToyLM())
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors", ToyLM())
    path = save_checkpoint(tmp_path / "c.safetensors", ToyLM(d_model=8), step=0)
    with pytest.raises(CheckpointError, match="does not fit the model"):
        load_checkpoint(path, ToyLM(d_model=4))
    with pytest.raises(CheckpointError, match="no optimizer state"):
        load_checkpoint(path, ToyLM(d_model=8), torch.optim.AdamW(ToyLM().parameters()))
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(tmp_path / "d.safetensors", ToyLM(), step=-1)
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)


def test_never_unpickles():
    from qkv import _modelfile

    for module in (ckpt, _modelfile):
        source = open(module.__file__).read()
        assert "torch.load(" not in source and "pickle" not in source


def test_checksum_catches_a_flipped_bit(tmp_path):
    model, opt, sched = _trained()
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, sched, step=3)
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(path, ToyLM(dropout=0.1, tied=True))
    save_model(model, {"x": 1}, tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x80
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        load_model_state(tmp_path / "m")


def test_latest_intact_keeps_the_previous_one(tmp_path):
    model, opt, sched = _trained()
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        manager.save(step, model, opt, sched)
    assert [p.name for p in manager.checkpoints()] == ["step-00000002.safetensors", "step-00000003.safetensors"]
    manager.path_for(3).write_bytes(manager.path_for(3).read_bytes()[:100])
    with pytest.warns(UserWarning, match="corrupt or truncated"):
        assert manager.latest_intact() == manager.path_for(2)


@pytest.mark.parametrize("drop", ["step", "rng", "extra", "scheduler"])
def test_missing_header_field_is_a_one_line_error(tmp_path, drop):
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    model, opt, sched = _trained()
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, sched, step=3)
    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    header = json.loads(metadata["qkv"])
    del header[drop]
    metadata["qkv"] = json.dumps(header)
    save_file(load_file(str(path)), str(path), metadata=metadata)
    target = ToyLM(dropout=0.1, tied=True)
    fresh_opt = torch.optim.AdamW(target.parameters(), lr=1e-2)
    with pytest.raises(CheckpointError, match=drop) as error:
        load_checkpoint(path, target, fresh_opt, schedules.warmup_cosine(fresh_opt, warmup=2, total=10))
    assert "\n" not in str(error.value)
