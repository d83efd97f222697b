"""QuaternionLinear (Parcollet et al. 2019; Tay et al. 2019): the Hamilton product against its
block matrix and against the product written component by component; a quarter of nn.Linear's
weights; the polar-form initialisation's statistics; use in the stack through config.linear."""

import math

import pytest
import torch
from torch import nn

from qkv.blocks import LINEAR_LAYERS, QuaternionLinear
from qkv.models.transformer.stack import StackConfig, TransformerStack


def hamilton(w, q):
    """(r, x, y, z) quaternion product w (x) q, components multiplied as matrices (row vectors q)."""
    wr, wx, wy, wz = w
    r, x, y, z = q
    # (W_r + W_x i + W_y j + W_z k)(r + x i + y j + z k), i^2 = j^2 = k^2 = ijk = -1
    return (r @ wr - x @ wx - y @ wy - z @ wz,
            x @ wr + r @ wx + z @ wy - y @ wz,
            y @ wr - z @ wx + r @ wy + x @ wz,
            z @ wr + y @ wx - x @ wy + r @ wz)


def test_equals_block_matrix_and_component_product():
    torch.manual_seed(0)
    layer = QuaternionLinear(8, 12).double()
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(5, 3, 8, dtype=torch.float64)
    W = [layer.weight_r, layer.weight_x, layer.weight_y, layer.weight_z]  # (2, 3) each
    r, i, j, k = (w.T for w in W)
    block = torch.cat([torch.cat(row, 1) for row in ([r, -i, -j, -k], [i, r, -k, j], [j, k, r, -i], [k, -j, i, r])], 0)
    torch.testing.assert_close(layer(x), x @ block.T + layer.bias)
    expected = torch.cat(hamilton(W, x.split(2, dim=-1)), dim=-1) + layer.bias
    torch.testing.assert_close(layer(x), expected)
    # the block matrix is the Hamilton product: the product of two quaternions (1 x 1 components)
    a, b = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    q1 = QuaternionLinear(4, 4, bias=False).double()
    with torch.no_grad():
        for w, val in zip((q1.weight_r, q1.weight_x, q1.weight_y, q1.weight_z), a):
            w.fill_(val)
    ar, ax, ay, az = a
    br, bx, by, bz = b
    hamilton_ab = torch.stack([ar * br - ax * bx - ay * by - az * bz, ar * bx + ax * br + ay * bz - az * by,
                               ar * by - ax * bz + ay * br + az * bx, ar * bz + ax * by - ay * bx + az * br])
    torch.testing.assert_close(q1(b), hamilton_ab)


def test_a_quarter_of_the_weights_of_nn_linear():
    q, d = QuaternionLinear(64, 32), nn.Linear(64, 32)
    n_q = sum(p.numel() for n, p in q.named_parameters() if n != "bias")
    assert n_q * 4 == d.weight.numel() == 64 * 32
    assert q.weight.shape == d.weight.shape and q.bias.shape == d.bias.shape


def test_polar_initialisation_statistics():
    torch.manual_seed(0)
    layer = QuaternionLinear(256, 256).requires_grad_(False)
    n = 64
    modulus = torch.stack([layer.weight_r, layer.weight_x, layer.weight_y, layer.weight_z]).norm(dim=0)
    sigma = 1 / math.sqrt(2 * (n + n))
    # |w| ~ sigma * chi_4: E[chi_4^2] = 4
    assert abs(float(modulus.square().mean()) / (4 * sigma ** 2) - 1) < 0.05
    # each component: r = |w| cos(theta) has E[r^2] = 4 sigma^2 / 2; the imaginary parts share the rest
    assert abs(float(layer.weight_r.square().mean()) / (2 * sigma ** 2) - 1) < 0.1
    assert float(layer.bias.abs().max()) == 0


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="in_features must be a multiple of 4"):
        QuaternionLinear(6, 8)
    with pytest.raises(ValueError, match="out_features must be a multiple of 4"):
        QuaternionLinear(8, 10)
    with pytest.raises(ValueError, match="feature size"):
        QuaternionLinear(8, 8)(torch.randn(2, 4))


def test_stack_built_with_quaternion_layers():
    kw = dict(n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    dense = TransformerStack(StackConfig(**kw), vocab_size=10)
    quat = TransformerStack(StackConfig(linear="quaternion", **kw), vocab_size=10)
    block = quat.layers[0]
    for layer in (block.self_attn.q_proj, block.self_attn.out_proj, block.ff.w1, block.ff.w2):
        assert isinstance(layer, QuaternionLinear)
    weights = lambda s: sum(p.numel() for n, p in s.named_parameters() if "weight" in n and ("proj" in n or ".ff." in n))
    assert weights(dense) == 4 * weights(quat)
    out = quat(torch.randint(10, (2, 5))).hidden
    out.sum().backward()
    assert block.ff.w1.weight_r.grad is not None
    with pytest.raises(ValueError, match="linear must be one of"):
        StackConfig(linear="complex", **kw)
    assert set(LINEAR_LAYERS) == {"dense", "quaternion"}


def test_bad_inputs_are_named():
    """Issue 20 item 6: integer input was a bare RuntimeError from F.linear."""
    layer = QuaternionLinear(8, 4)
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got dtype torch.int64"):
        layer(torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(TypeError, match="x has dtype torch.float64 but the parameters of QuaternionLinear are torch.float32"):
        layer(torch.ones(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="feature size"):
        layer(torch.ones(2, 7))
