"""The hooks the trainer, the tasks and the command line call are declared on QKVModel with
defaults that do nothing, so a model overrides only what it needs and nobody probes for them."""

import inspect
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import qkv  # noqa: F401  (registers the models)
from qkv.models import QKVModel
from qkv.registry import lookup, names


@dataclass
class BareConfig:
    width: int = 2  # the one layer's size


class Bare(QKVModel):
    """A model that declares nothing beyond its config."""

    config_class = BareConfig

    def __init__(self, config: BareConfig) -> None:
        super().__init__(config)
        self.layer = nn.Linear(config.width, config.width)


def test_a_bare_model_has_every_hook_as_a_no_op(tmp_path):
    m = Bare(BareConfig())
    before = {k: v.clone() for k, v in m.state_dict().items()}
    assert m.set_step(3, 10) is None and m.on_evaluate({"valid_loss": 1.0}) is None
    assert m.export_state(None) == {} and m.import_state({}) is None
    assert m.eval_report() == {}
    assert m.visualize(tmp_path / "own.png") is None and not (tmp_path / "own.png").exists()
    assert not Bare.can_generate()
    with pytest.raises(TypeError, match="Bare"):
        m.generate(torch.zeros(1, 1, dtype=torch.long), 3)
    assert Bare.train_defaults == {} and Bare.carries_state is False and Bare.input_key is None
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())


@pytest.mark.parametrize("name", names("model"))
def test_declared_input_key_is_what_forward_reads(name):
    """``input_key`` picks the form of a task (``task_for_model``); a model whose ``forward`` reads
    token ids or documents must say so, and a declared key must be a ``forward`` argument."""
    cls = lookup("model", name)
    params = list(inspect.signature(cls.forward).parameters)[1:]
    if cls.input_key is not None:
        assert cls.input_key in params
    for key in ("input_ids", "doc"):
        if params and params[0] == key:
            assert cls.input_key == key
    assert cls.can_generate() == any("generate" in vars(k) for k in cls.__mro__[:cls.__mro__.index(QKVModel)])
