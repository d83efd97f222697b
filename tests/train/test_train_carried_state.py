"""Stream batches and the trainer's carried model state (Transformer-XL's memory): every batch
continues the previous one, the memory travels between steps and through checkpoints, and a
resumed run logs the same losses as an uninterrupted one."""

import json

import pytest
import torch

from qkv.models import TransformerXL, TransformerXLConfig
from qkv.tasks.base import LanguageModelTask
from qkv.tasks.vocab import ByteVocab
from qkv.train import TrainConfig, Trainer
from qkv.train.checkpoint import read_carried_state


def stream_task(stream=True, block_size=6):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (4000,), generator=g)
    return LanguageModelTask(tokens, ByteVocab(), block_size, stream=stream)


def test_stream_batches_continue_row_by_row_and_are_pure():
    task = stream_task()
    for step in range(3):
        a, b = task.get_batch("train", 4, step), task.get_batch("train", 4, step + 1)
        assert torch.equal(b["input_ids"][:, 0], a["labels"][:, -1])  # row b picks up where it stopped
        assert torch.equal(a["input_ids"], task.get_batch("train", 4, step)["input_ids"])
    # two ranks of 2 rows read the 4 streams of one process with 4 rows
    r0, r1 = (task.get_batch("train", 2, 5, rank=r, world_size=2)["input_ids"] for r in (0, 1))
    assert torch.equal(torch.cat([r0, r1]), task.get_batch("train", 4, 5)["input_ids"])
    batches = list(task.eval_batches("valid", 3, max_examples=9))
    assert len(batches) == 3
    for a, b in zip(batches, batches[1:]):
        assert torch.equal(b["input_ids"][:, 0], a["labels"][:, -1])
    with pytest.raises(TypeError, match="stream"):
        LanguageModelTask(torch.arange(100), ByteVocab(), 4, stream="yes")
    with pytest.raises(ValueError, match="streams"):
        stream_task(block_size=100).get_batch("train", 64, 0)


def test_evaluate_carries_the_memory_only_in_stream_mode():
    torch.manual_seed(0)
    model = TransformerXL(TransformerXLConfig(vocab_size=256, n_layers=2, d_model=16, n_heads=2, d_ff=32, mem_len=6))
    with_memory = stream_task().evaluate(model, "valid", max_examples=12, batch_size=4)
    model.config.eval_mem_len = 0
    without = stream_task().evaluate(model, "valid", max_examples=12, batch_size=4)
    assert with_memory["tokens"] == without["tokens"] == 3 * 4 * 6
    assert with_memory["loss"] != without["loss"]


def train(out_dir, steps=8, stop_at=None, resume=False):
    torch.manual_seed(0)
    model = TransformerXL(TransformerXLConfig(vocab_size=256, n_layers=2, d_model=16, n_heads=2, d_ff=32,
                                              mem_len=6, dropout=0.1))
    task = stream_task()
    if stop_at is not None:
        get_batch = task.get_batch

        def interrupted(split, batch_size, step, **kw):
            if step == stop_at:
                raise KeyboardInterrupt
            return get_batch(split, batch_size, step, **kw)

        task.get_batch = interrupted
    config = TrainConfig(steps=steps, batch_size=3, lr=3e-3, warmup=2, log_every=1, save_every=3, eval_batches=2,
                         eval_max_examples=6, out_dir=str(out_dir), progress=False, tensorboard=False)
    trainer = Trainer(model, task, config)
    try:
        trainer.fit(resume=resume)
    except KeyboardInterrupt:
        pass
    return trainer


def losses(out_dir):
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["event"] == "train"}


def test_resume_of_an_xl_run_gives_the_same_losses(tmp_path):
    whole = train(tmp_path / "whole")
    assert whole.carries_state and whole._carried.length == 6
    train(tmp_path / "cut", stop_at=7)  # dies during update 8, after the checkpoint of step 6
    saved = read_carried_state(tmp_path / "cut" / "checkpoints" / "step-00000006.safetensors")
    assert sorted(saved) == ["memory.0", "memory.1"] and saved["memory.0"].shape == (3, 6, 16)
    train(tmp_path / "cut", resume=True)
    assert losses(tmp_path / "cut") == losses(tmp_path / "whole")
    assert len(losses(tmp_path / "whole")) == 8


def test_the_memory_matters_to_the_resumed_losses(tmp_path):
    """Resuming without the saved memory changes the next loss: the test above can fail."""
    train(tmp_path / "cut", stop_at=7)
    trainer = train(tmp_path / "cut2", stop_at=6)  # checkpoint of step 6 written, memory in hand
    memory = trainer._carried
    task = stream_task()
    batch = task.get_batch("train", 3, 6)
    trainer.model.eval()
    with torch.no_grad():
        with_memory = trainer.model(**batch, state=memory).loss
        without = trainer.model(**batch).loss
    assert not torch.equal(with_memory, without)
