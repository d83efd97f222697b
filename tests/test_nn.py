"""qkv._nn: the one ``evaluating(model)`` context (eval mode, no gradients, the mode given back)
and ``module_device``."""

import pytest
import torch

from qkv._nn import evaluating, module_device


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_gives_the_mode_back_and_takes_no_gradients(training):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.5))
    model.train(training)
    with evaluating(model) as inside:
        assert inside is model and not model.training and not model[1].training
        assert not torch.is_grad_enabled()
        assert not model(torch.ones(1, 3)).requires_grad
    assert model.training is training and model[1].training is training
    assert torch.is_grad_enabled()


def test_evaluating_gives_the_mode_back_when_the_block_raises():
    model = torch.nn.Linear(3, 2).train()
    with pytest.raises(RuntimeError, match="boom"):
        with evaluating(model):
            raise RuntimeError("boom")
    assert model.training and torch.is_grad_enabled()


def test_module_device():
    assert module_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert module_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters
