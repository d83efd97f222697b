"""A toy language model and a toy task that follow docs/contracts.md, for the trainer's tests.

Run as a script it trains the toy model (used by the kill/resume and torchrun tests)::

    python _toy_train.py --out DIR --steps 20 [--resume] [--batch-size 4] [--grad-accum 1]
                         [--dropout 0.1] [--save-every 5] [--sleep 0.0]

and writes the final weights to ``DIR/final`` with ``qkv.train.save_model`` (rank 0).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.models import QKVModel
from qkv.tasks.base import Task

VOCAB = 11
LENGTH = 6
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def script_env() -> dict:
    """Environment for a subprocess running this file: qkv and this module importable, one
    thread, no distributed variables inherited."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


class ToyOutput(NamedTuple):
    loss: Optional[Tensor]
    logits: Tensor


@dataclass
class ToyConfig:
    vocab: int = VOCAB  # token vocabulary
    d_model: int = 8  # width
    dropout: float = 0.0  # on the embeddings
    tied: bool = False  # output layer = embedding matrix


class ToyLM(QKVModel):
    """Embedding -> dropout -> linear; the output layer may share the embedding's weight."""

    config_class = ToyConfig

    def __init__(self, vocab: int = VOCAB, d_model: int = 8, dropout: float = 0.0, tied: bool = False) -> None:
        super().__init__(ToyConfig(vocab, d_model, dropout, tied))
        self.embed = nn.Embedding(vocab, d_model)
        self.drop = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None) -> ToyOutput:
        logits = self.head(self.norm(self.drop(self.embed(input_ids))))  # (B, L, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return ToyOutput(loss, logits)


class ToyTask(Task):
    """Arithmetic sequences ``x_t = (a + t d) mod V``; example ``j`` depends only on (seed, split, j).

    A batch is the slice ``[(step * world_size + rank) * B, ... + B)`` of the example stream, so
    per-rank batches partition the combined batch and micro-batches partition the full batch.
    """

    kind = "lm"

    def __init__(self, sleep: float = 0.0) -> None:
        self.sleep = sleep

    def example(self, split: str, index: int, seed: int) -> Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + index * 7 + {"train": 0, "valid": 1, "test": 2}[split])
        a, d = torch.randint(0, VOCAB, (2,), generator=g).tolist()
        return (a + d * torch.arange(LENGTH + 1)) % VOCAB

    def _batch(self, split: str, indices: range, seed: int) -> Dict[str, Tensor]:
        x = torch.stack([self.example(split, j, seed) for j in indices])  # (B, L + 1)
        return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1):
        if self.sleep:
            time.sleep(self.sleep)
        first = (step * world_size + rank) * batch_size
        return self._batch(split, range(first, first + batch_size), seed)

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Dict[str, Tensor]]:
        for start in range(0, 32, batch_size):
            yield self._batch(split, range(start, min(start + batch_size, 32)), seed=12345)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str = "test", max_examples: Optional[int] = None) -> Dict[str, float]:
        n = min(max_examples or 32, 32)
        batch = self._batch(split, range(n), seed=12345)
        predictions = model(batch["input_ids"].to(next(model.parameters()).device)).logits.argmax(-1).cpu()
        return {"accuracy": float((predictions == batch["labels"]).float().mean())}


def run(out: str, steps: int = 20, batch_size: int = 4, grad_accum: int = 1, dropout: float = 0.1,
        save_every: int = 5, sleep: float = 0.0, resume: bool = False) -> ToyLM:
    """Train the toy model (tied weights) on the toy task; rank 0 writes the weights to ``out/final``."""
    from qkv.train import TrainConfig, Trainer, save_model

    torch.manual_seed(0)
    model = ToyLM(dropout=dropout, tied=True)
    config = TrainConfig(steps=steps, batch_size=batch_size, grad_accum=grad_accum, lr=1e-2, warmup=3,
                         schedule="cosine", grad_clip=1.0, log_every=1, eval_every=7, eval_batches=2,
                         save_every=save_every, keep_last=2, seed=3, out_dir=out, device="cpu", progress=False,
                         tensorboard=False)
    Trainer(model, ToyTask(sleep=sleep), config).fit(resume=resume)
    if int(os.environ.get("RANK", "0")) == 0:
        save_model(model, {"vocab": VOCAB, "d_model": 8}, os.path.join(out, "final"))
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run(args.out, args.steps, args.batch_size, args.grad_accum, args.dropout, args.save_every, args.sleep, args.resume)


if __name__ == "__main__":
    main()
