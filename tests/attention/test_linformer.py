"""Linformer (Wang et al. 2020): against the literal equation softmax(Q (E K)^T / sqrt(d)) (F V),
identity projections reduce it to softmax attention, shorter inputs slice E and F, padding is
applied before projecting, causal is refused, sharing modes (layerwise through the stack)."""

import math

import pytest
import torch

import qkv
from qkv.models.transformer.stack import StackConfig, TransformerStack


def tensors(B=2, H=3, N=9, E=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, E, generator=g, dtype=dtype) for _ in range(3))


def literal(q, k, v, Ep, Fp, pad=None):
    """softmax(q (E k)^T / sqrt(d)) (F v) with padded keys/values zeroed first, loops over b, h, i."""
    B, H, M, d = q.shape
    N = k.shape[2]
    Ep, Fp = Ep.detach(), Fp.detach()
    out = torch.zeros(B, H, M, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kb, vb = k[b, h].double().clone(), v[b, h].double().clone()
            if pad is not None:
                kb[~pad[b]] = 0
                vb[~pad[b]] = 0
            kp = Ep[:, :N].double() @ kb  # (k, d)
            vp = Fp[:, :N].double() @ vb  # (k, Ev)
            for i in range(M):
                s = [float(q[b, h, i].double() @ kp[r]) / math.sqrt(d) for r in range(kp.shape[0])]
                mx = max(s)
                w = torch.tensor([math.exp(x - mx) for x in s], dtype=torch.float64)
                out[b, h, i] = (w / w.sum()) @ vp
    return out


def test_identity_projections_equal_softmax_attention():
    q, k, v = tensors(N=9)
    kernel = qkv.build_attention("linformer", seq_len=9, k=9).double()
    with torch.no_grad():
        kernel.E.copy_(torch.eye(9))
        kernel.F.copy_(torch.eye(9))
    exact = qkv.build_attention("softmax")(q, k, v, need_weights=True)
    out = kernel(q, k, v, need_weights=True)
    torch.testing.assert_close(out.output, exact.output)
    torch.testing.assert_close(out.weights, exact.weights)


@pytest.mark.parametrize("sharing", ["headwise", "key-value", "layerwise"])
@pytest.mark.parametrize("N", [12, 7, 1])
def test_matches_literal_equation_with_shorter_inputs_and_padding(sharing, N):
    kernel = qkv.build_attention("linformer", seq_len=12, k=5, sharing=sharing).double()
    Fp = kernel.E if sharing != "headwise" else kernel.F
    q, k, v = tensors(N=N, seed=N)
    torch.testing.assert_close(kernel(q, k, v).output, literal(q, k, v, kernel.E, Fp))
    pad = torch.ones(2, N, dtype=torch.bool)
    pad[0, N // 2 + 1:] = False
    out = kernel(q, k, v, mask=pad, need_weights=True)
    torch.testing.assert_close(out.output, literal(q, k, v, kernel.E, Fp, pad))
    # the implied weights P F on the values reproduce the output and give padded values 0
    torch.testing.assert_close(out.weights @ v, out.output)
    assert (out.weights[0, :, :, N // 2 + 1:] == 0).all()


def test_padding_is_applied_before_projecting():
    """A padded key/value changes nothing, even with huge values (it never enters E K or F V)."""
    kernel = qkv.build_attention("linformer", seq_len=10, k=4).double()
    q, k, v = tensors(N=10)
    pad = torch.ones(2, 10, dtype=torch.bool)
    pad[:, 6:] = False
    out = kernel(q, k, v, mask=pad).output
    k[:, :, 6:] = 1e6
    v[:, :, 6:] = float("inf")
    torch.testing.assert_close(kernel(q, k, v, mask=pad).output, out)
    # and equals running on the 6 real positions with the first 6 columns of E and F
    torch.testing.assert_close(kernel(q, k[:, :, :6], v[:, :, :6]).output, out)


def test_causal_is_refused_and_long_inputs_raise():
    with pytest.raises(ValueError, match="cannot be causal"):
        qkv.build_attention("linformer", seq_len=8, causal=True)
    with pytest.raises(ValueError, match="cannot be causal"):
        qkv.MultiHeadAttention(16, 2, "linformer", causal=True, seq_len=8)
    kernel = qkv.build_attention("linformer", seq_len=8, k=4)
    q, k, v = tensors(N=9, dtype=torch.float32)
    with pytest.raises(ValueError, match="seq_len=8"):
        kernel(q, k, v)
    with pytest.raises(ValueError, match="sharing"):
        qkv.build_attention("linformer", seq_len=8, sharing="per-layer")
    with pytest.raises(TypeError, match="seq_len"):
        qkv.build_attention("linformer")


def test_dropout_acts_on_the_projected_weights_in_training_only():
    kernel = qkv.build_attention("linformer", seq_len=9, k=4, dropout=0.5)
    q, k, v = tensors(N=9, dtype=torch.float32)
    kernel.eval()
    a, b = kernel(q, k, v).output, kernel(q, k, v, need_weights=True).output
    torch.testing.assert_close(a, b)
    kernel.train()
    torch.manual_seed(0)
    assert not torch.allclose(kernel(q, k, v).output, a)


def test_gradients_reach_the_projections():
    kernel = qkv.build_attention("linformer", seq_len=9, k=4).double()
    q, k, v = tensors(N=7)
    kernel(q, k, v).output.square().sum().backward()
    assert kernel.E.grad[:, :7].abs().sum() > 0 and (kernel.E.grad[:, 7:] == 0).all()
    assert kernel.F.grad[:, :7].abs().sum() > 0


@pytest.mark.parametrize("sharing, per_layer, total", [("headwise", 2, 6), ("key-value", 1, 3), ("layerwise", 1, 1)])
def test_sharing_modes_in_a_stack(sharing, per_layer, total):
    """Projection matrices per layer and in a 3-layer stack: layerwise shares one through the stack's hook."""
    config = StackConfig(n_layers=3, d_model=16, n_heads=2, d_ff=32, dropout=0.0, max_len=10, attention="linformer",
                         attention_kwargs={"seq_len": 10, "k": 4, "sharing": sharing})
    stack = TransformerStack(config, vocab_size=11)
    kernels = [block.self_attn.kernel for block in stack.layers]
    assert sum(p is not None for p in (kernels[0].E, kernels[0].F)) == per_layer
    projections = {id(p) for kern in kernels for p in (kern.E, kern.F) if p is not None}
    assert len(projections) == total
    n_params = sum(p.numel() for p in stack.parameters())  # parameters() counts a shared one once
    assert sum(p.numel() for n, p in stack.named_parameters() if n.endswith((".E", ".F"))) == total * 40
    ids = torch.randint(11, (2, 8))
    out = stack(ids).hidden
    out.sum().backward()
    assert kernels[0].E.grad is not None and n_params > 0


def test_bfloat16_projections_and_scores_stay_bfloat16():
    """E K, F V and the scores of bfloat16 inputs are bfloat16 products (float32 sums inside the
    matmul): no float32 copy of the inputs; the output is the float32 kernel's to bfloat16 rounding."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Dtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                # (the fused softmax's own float32 log-sum-exp, one per query, is not a copy)
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 2 * 64:
                    self.seen.add(t.dtype)
            return out

    kernel = qkv.attention.build_attention("linformer", seq_len=64, k=16)
    q, k, v = (t.float() for t in tensors(B=1, H=2, N=64, E=8))
    ref = kernel(q, k, v).output
    kernel = kernel.bfloat16()
    qb, kb, vb = (t.bfloat16().requires_grad_(True) for t in (q, k, v))
    with Dtypes() as d:
        out = kernel(qb, kb, vb).output
        out.backward(torch.ones_like(out))
    assert d.seen == {torch.bfloat16}, d.seen
    assert out.dtype == torch.bfloat16 and kernel.E.grad.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
