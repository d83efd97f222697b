"""The trainer trains any ``torch.nn.Module`` that keeps the contract (``qkv._nn.Trainable``: the
hooks it calls), not only a ``QKVModel``; a module without the hooks is refused, naming them."""

from typing import Any, Dict, Optional

import pytest
import torch
from _toy_train import ToyTask, VOCAB, ToyOutput
from torch import nn
import torch.nn.functional as F

from qkv._nn import Trainable
from qkv.train import TrainConfig, Trainer


class PlainLM(nn.Module):
    """Not a QKVModel: a bare module with the trainer's hooks."""

    carries_state = False

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, VOCAB)
        self.steps = []

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids))
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return ToyOutput(loss, logits)

    def set_step(self, step: int, total_steps: Optional[int] = None) -> None:
        self.steps.append((step, total_steps))

    def on_evaluate(self, metrics: Dict[str, float]) -> None:
        pass

    def export_state(self, state: Any) -> Dict[str, torch.Tensor]:
        return {}

    def import_state(self, tensors: Dict[str, torch.Tensor]) -> Any:
        return None


def _config(tmp_path):
    return TrainConfig(steps=3, batch_size=4, lr=1e-2, warmup=1, schedule="constant", log_every=1, eval_every=0,
                       save_every=0, out_dir=str(tmp_path), device="cpu", progress=False, tensorboard=False)


def test_a_plain_module_with_the_hooks_trains(tmp_path):
    torch.manual_seed(0)
    model = PlainLM()
    assert isinstance(model, Trainable)
    before = model.head.weight.detach().clone()
    Trainer(model, ToyTask(), _config(tmp_path)).fit()
    assert [s for s, _ in model.steps] == [0, 1, 2] and not torch.equal(before, model.head.weight)


def test_a_module_without_the_hooks_is_refused(tmp_path):
    with pytest.raises(TypeError, match="Trainable"):
        Trainer(nn.Linear(2, 2), ToyTask(), _config(tmp_path))
