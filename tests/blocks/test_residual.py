"""Residual wirings: post-LN and pre-LN (Vaswani et al. 2017; Xiong et al. 2020) and GTrXL's
gates (Parisotto et al. 2019), each against its equation."""

import pytest
import torch
from torch import nn

from qkv.blocks import InputGate, PostLN, PreLN, ReLUSum, build_residual


def test_residual_wirings():
    torch.manual_seed(0)
    x, f = torch.randn(2, 3, 4), nn.Linear(4, 4)
    post, pre = build_residual("post-ln", 4), build_residual("pre-ln", 4)
    assert isinstance(post, PostLN) and isinstance(pre, PreLN)
    ln = nn.functional.layer_norm
    torch.testing.assert_close(post.exit(x, f(post.enter(x))), ln(x + f(x), (4,)))  # LN(x + F(x))
    torch.testing.assert_close(pre.exit(x, f(pre.enter(x))), x + f(ln(x, (4,))))  # x + F(LN(x))
    assert pre.final_norm and not post.final_norm
    with pytest.raises(ValueError, match="sandwich"):
        build_residual("sandwich", 4)


def test_gated_wirings_compute_their_equations():
    torch.manual_seed(0)
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    plain = build_residual("relu-sum", 8)
    assert isinstance(plain, ReLUSum)
    torch.testing.assert_close(plain.exit(x, y), x + y.relu())
    torch.testing.assert_close(plain.enter(x), torch.nn.functional.layer_norm(x, (8,)))
    inp = build_residual("input-gate", 8)
    assert isinstance(inp, InputGate)
    torch.testing.assert_close(inp.exit(x, y), torch.sigmoid(inp.w_g(x)) * x + y.relu())
    gru = build_residual("gru-gate", 8)
    Wr, Wz, Wg = gru.w.weight.chunk(3, 0)
    Ur, Uz = gru.u_rz.weight.chunk(2, 0)
    yr = y.relu()
    r = torch.sigmoid(yr @ Wr.T + x @ Ur.T)
    z = torch.sigmoid(yr @ Wz.T + x @ Uz.T - 2.0)
    h = torch.tanh(yr @ Wg.T + (r * x) @ gru.u_g.weight.T)
    torch.testing.assert_close(gru.exit(x, y), (1 - z) * x + z * h)
