"""qkv._linear.linear: F.linear (and an activation) through oneDNN in CPU float32 inference, F.linear otherwise."""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from qkv import _linear

needs_onednn = pytest.mark.skipif(not _linear._onednn_available(), reason="this torch has no oneDNN linear")


def reference(x, weight, bias, activation):
    y = F.linear(x, weight, bias)
    return {None: y, "relu": F.relu(y), "gelu": F.gelu(y), "gelu-tanh": F.gelu(y, approximate="tanh")}[activation]


def ops(fn):
    with profile() as p:
        fn()
    return {e.key for e in p.key_averages()}


@needs_onednn
@pytest.mark.parametrize("shape", [(64, 32), (2, 17, 32), (2, 3, 4, 32)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu-tanh"])
def test_inference_through_onednn_equals_f_linear(shape, with_bias, activation):
    torch.manual_seed(0)
    x, weight = torch.randn(*shape), torch.randn(48, 32)
    bias = torch.randn(48) if with_bias else None
    with torch.no_grad():
        out = _linear.linear(x, weight, bias, activation)
        assert any("linear_pointwise" in k for k in ops(lambda: _linear.linear(x, weight, bias, activation)))
    assert out.shape == (*shape[:-1], 48)
    torch.testing.assert_close(out, reference(x, weight, bias, activation), atol=1e-5, rtol=1e-5)


def test_with_gradients_it_is_f_linear_and_gradients_flow():
    torch.manual_seed(0)
    x = torch.randn(4, 32, 16, requires_grad=True)
    linear = torch.nn.Linear(16, 8)
    out = _linear.linear(x, linear.weight, linear.bias, "gelu")
    torch.testing.assert_close(out, F.gelu(linear(x)), atol=0, rtol=0)
    out.sum().backward()
    assert x.grad is not None and linear.weight.grad.abs().sum() > 0 and linear.bias.grad.abs().sum() > 0


@pytest.mark.parametrize("case", ["float64", "few rows", "non-contiguous", "oneDNN off", "empty"])
def test_outside_its_domain_it_is_exactly_f_linear(case, monkeypatch):
    torch.manual_seed(0)
    x, weight, bias = torch.randn(4, 32, 16), torch.randn(8, 16), torch.randn(8)
    if case == "float64":
        x, weight, bias = x.double(), weight.double(), bias.double()
    elif case == "few rows":
        x = x[:1, : _linear.MIN_ROWS - 1]
    elif case == "non-contiguous":
        x = torch.randn(4, 16, 32).transpose(1, 2)
    elif case == "empty":
        x = x[:0]
    elif case == "oneDNN off":
        monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    with torch.no_grad():
        out = _linear.linear(x, weight, bias)
        assert not any("linear_pointwise" in k for k in ops(lambda: _linear.linear(x, weight, bias)))
    torch.testing.assert_close(out, F.linear(x, weight, bias), atol=0, rtol=0)


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation must be None or one of"):
        _linear.linear(torch.randn(2, 3), torch.randn(4, 3), activation="swish")
