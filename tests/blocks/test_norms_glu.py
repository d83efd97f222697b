"""RMSNorm (Zhang & Sennrich 2019) and the gated feed-forward networks (Shazeer 2020) against
their equations written out in float64, and the norm choice of the residual wirings."""

import math

import pytest
import torch

from qkv.blocks import GatedFeedForward, RMSNorm, build_feedforward, build_norm, build_residual


def test_rmsnorm_is_its_equation():
    torch.manual_seed(0)
    norm = RMSNorm(5, eps=1e-3).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(5))
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    y = norm(x)
    for row, out in zip(x.reshape(-1, 5), y.reshape(-1, 5)):
        rms = math.sqrt(sum(v * v for v in row.tolist()) / 5 + 1e-3)
        expected = torch.tensor([g * v / rms for g, v in zip(norm.weight.tolist(), row.tolist())], dtype=torch.float64)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    const = norm(torch.full((1, 5), 2.0, dtype=torch.float64))
    torch.testing.assert_close(const[0], norm.weight.detach() * 2 / math.sqrt(4 + 1e-3))


def test_rmsnorm_half_inputs_and_gradients():
    norm = RMSNorm(4)
    x = torch.randn(3, 4).to(torch.bfloat16)
    assert norm.to(torch.bfloat16)(x).dtype == torch.bfloat16
    torch.testing.assert_close(norm(x).float(), norm.float()(x.float()), rtol=1e-2, atol=1e-2)
    assert torch.autograd.gradcheck(RMSNorm(4).double(), (torch.randn(2, 4, dtype=torch.float64, requires_grad=True),))
    with pytest.raises(ValueError, match="eps must be a positive float"):
        RMSNorm(4, eps=0)
    with pytest.raises(ValueError, match="norm must be one of"):
        build_norm("batchnorm", 4)


@pytest.mark.parametrize("activation,fn", [
    ("silu", lambda a: a / (1 + math.exp(-a))),  # SwiGLU: Swish_1
    ("gelu", lambda a: 0.5 * a * (1 + math.erf(a / math.sqrt(2)))),  # GeGLU
    ("relu", lambda a: max(a, 0.0)),  # ReGLU
])
def test_glu_feedforward_is_its_equation(activation, fn):
    """FFN_GLU(x) = (act(x W) ⊗ x V) W2 (Shazeer 2020, eq. 6), bias-free as the paper."""
    torch.manual_seed(1)
    ff = GatedFeedForward(3, 4, activation, bias=False).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    W, V, W2 = ff.w1.weight.T, ff.v.weight.T, ff.w2.weight.T  # (3, 4), (3, 4), (4, 3)
    for row, out in zip(x, ff(x.unsqueeze(0))[0]):
        hidden = [fn(float(row @ W[:, j].detach())) * float(row @ V[:, j].detach()) for j in range(4)]
        expected = [sum(hidden[j] * float(W2[j, o].detach()) for j in range(4)) for o in range(3)]
        torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    assert ff.w1.bias is None and ff.v.bias is None and ff.w2.bias is None


def test_glu_fused_inference_path_equals_autograd_path():
    torch.manual_seed(2)
    ff = build_feedforward(8, 16, "silu", glu=True)
    x = torch.randn(4, 8, 8)  # 32 rows: the oneDNN path without gradients
    with torch.no_grad():
        fused = ff(x)
    torch.testing.assert_close(fused, ff(x), rtol=1e-5, atol=1e-6)
    assert type(build_feedforward(8, 16, "relu")).__name__ == "FeedForward"


@pytest.mark.parametrize("wiring", ["pre-ln", "post-ln", "gru-gate"])
def test_residual_wirings_take_rmsnorm(wiring):
    w = build_residual(wiring, 6, norm="rmsnorm")
    assert isinstance(w.norm, RMSNorm)
    x = torch.randn(2, 6)
    assert w.exit(x, w.enter(x)).shape == (2, 6)
