"""ReversibleSequence (Gomez et al. 2017): gradients equal the ordinary residual computation's,
with dropout and random LSH hashing replayed; saved activations do not grow with depth."""

import pytest
import torch
from torch import nn

import qkv
from qkv.blocks import ReversibleBlock, ReversibleSequence


class Attn(nn.Module):
    """F: a masked mixing layer with dropout (stands in for attention; takes a mask argument)."""

    def __init__(self, d, p):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x, mask):
        mixed = (x * mask[..., None]).cumsum(1) / torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[:, None]
        return self.drop(torch.tanh(self.lin(mixed)))


def ff(d, p):
    return nn.Sequential(nn.Linear(d, 2 * d), nn.Tanh(), nn.Dropout(p), nn.Linear(2 * d, d))


def make(depth=3, d=5, p=0.3, dtype=torch.float64):
    torch.manual_seed(0)
    return ReversibleSequence([ReversibleBlock(Attn(d, p), ff(d, p)) for _ in range(depth)]).to(dtype)


def ordinary(seq, x1, x2, *args):
    """The same residual equations with plain autograd (activations stored)."""
    for block in seq.blocks:
        x1, x2 = block(x1, x2, *args)
    return x1, x2


def run(fn, seq, x1, x2, mask, seed=7):
    torch.manual_seed(seed)  # the same dropout masks for both computations
    y1, y2 = fn(seq, x1, x2, mask)
    return y1, y2


def test_gradients_equal_the_ordinary_residual_stack_with_dropout():
    seq = make()
    seq.train()
    x1, x2 = (torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float64)
    g1, g2 = torch.randn(2, 4, 5, dtype=torch.float64), torch.randn(2, 4, 5, dtype=torch.float64)
    grads = []
    for fn in (lambda s, a, b, m: s(a, b, m), ordinary):
        y1, y2 = run(fn, seq, x1, x2, mask)
        inputs = [x1, x2] + list(seq.parameters())
        grads.append((torch.cat([y1, y2]), torch.autograd.grad((y1 * g1 + y2 * g2).sum(), inputs)))
    (out_rev, grad_rev), (out_ord, grad_ord) = grads
    torch.testing.assert_close(out_rev, out_ord)
    for a, b in zip(grad_rev, grad_ord):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_gradcheck_with_dropout_on():
    seq = make(depth=2, d=3)
    seq.train()
    mask = torch.ones(1, 3, dtype=torch.float64)
    x1, x2 = (torch.randn(1, 3, 3, dtype=torch.float64, requires_grad=True) for _ in range(2))

    def f(a, b):
        with torch.random.fork_rng():
            torch.manual_seed(1)
            return seq(a, b, mask)

    assert torch.autograd.gradcheck(f, (x1, x2))


def test_random_lsh_hashing_is_replayed_in_backward():
    """F is unseeded LSH attention: fresh rotations every call, which the backward must redraw."""
    torch.manual_seed(0)
    d = 8

    class LSHHalf(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = qkv.MultiHeadAttention(d, 2, "lsh", causal=True, bucket_size=2, n_rounds=2, n_buckets=4)

        def forward(self, x, mask):
            return self.attn(x, mask=mask).output

    seq = ReversibleSequence([ReversibleBlock(LSHHalf(), ff(d, 0.0)) for _ in range(2)]).double()
    x1, x2 = (torch.randn(2, 9, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 7:] = False
    grads = []
    for fn in (lambda s, a, b, m: s(a, b, m), ordinary):
        y1, y2 = run(fn, seq, x1, x2, mask)
        grads.append(torch.autograd.grad((y1 + 2 * y2).sum(), [x1, x2] + list(seq.parameters())))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)


def saved_bytes(fn):
    """Bytes of the tensors autograd saves for backward while ``fn`` runs (saved-tensor hooks)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def test_saved_activations_do_not_grow_with_depth():
    x = torch.randn(2, 64, 16, requires_grad=True)
    mask = torch.ones(2, 64)
    rev, plain = {}, {}
    for depth in (1, 8):
        seq = make(depth=depth, d=16, p=0.1, dtype=torch.float32)
        rev[depth] = saved_bytes(lambda: seq(x, x, mask))
        plain[depth] = saved_bytes(lambda: ordinary(seq, x, x, mask))
    assert rev[8] == rev[1]
    assert plain[8] > 6 * plain[1]


def test_backward_leaves_the_random_generator_alone():
    seq = make()
    seq.train()
    x = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 4, dtype=torch.float64)
    torch.manual_seed(3)
    y1, y2 = seq(x, x, mask)
    after_forward = torch.get_rng_state()
    (y1 + y2).sum().backward()
    assert torch.equal(torch.get_rng_state(), after_forward)


def test_no_grad_runs_the_plain_loop_and_bad_input_is_named():
    seq = make()
    seq.eval()
    x = torch.randn(2, 4, 5, dtype=torch.float64)
    mask = torch.ones(2, 4, dtype=torch.float64)
    with torch.no_grad():
        a = seq(x, x, mask)
    b = ordinary(seq, x, x, mask)
    torch.testing.assert_close(a[0], b[0])
    with pytest.raises(TypeError, match="f\\(x, \\*args\\)"):
        ReversibleSequence([nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="shape"):
        seq(x, x[:, :3], mask)
