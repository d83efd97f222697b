"""The decoding step of the recurrent kernels (``_ops.decoding``): a call that continues a state with a
few new keys runs the recurrence token by token (``_chunkwise.recurrent``), never the chunked engine,
and — with grouped keys — reads each key head's state with its group of queries instead of repeating
the state to the query heads. Its outputs and new state equal the chunked path's (forced here by
``DECODE_KEYS = 0``) to float64 rounding, with key padding, left-padded batches, grouped keys, several
new tokens and half inputs; and a whole sequence decoded token by token equals one parallel call."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from qkv import _chunkwise
from qkv.attention import _ops
from qkv.attention.multihead import MultiHeadAttention
from qkv.registry import lookup

F64 = torch.float64
GATED = ["retention", "gla", "deltanet", "gated-deltanet"]
LINEAR = [("linear", {}), ("linear", {"feature_map": "hedgehog", "n_heads": 4, "d_head": 8}),
          ("linear", {"feature_map": F.softplus}), ("performer", {"d_head": 8, "nb_features": 16, "seed": 0})]
B, H, G, E, P = 2, 4, 2, 8, 7  # batch, query heads, key heads, head size, prefilled tokens


def rand(*shape, seed=0, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype)


def gates(name, n, seed=3, dtype=F64):
    """Random gates of ``n`` keys for kernel ``name`` (none for the others)."""
    kw = {}
    if name in ("gla", "gated-deltanet"):
        shape = (B, H, n, E) if name == "gla" else (B, H, n)
        kw["g"] = (-torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * 0.7).to(dtype)
    if name in ("deltanet", "gated-deltanet"):
        kw["beta"] = torch.rand(B, H, n, generator=torch.Generator().manual_seed(seed + 1), dtype=F64).to(dtype)
    return kw


def window(kw, lo, hi):
    return {k: v[:, :, lo:hi] for k, v in kw.items()}


def kernel(name, kw):
    return lookup("attention", name)(causal=True, **kw)


def heads_of(name, kw):
    """Key heads the kernel takes: grouped for linear/performer with a shared map, else the query heads."""
    k = kernel(name, kw)
    return G if k.grouped_kv else H


def left_padded(n):
    """A key-padding mask of two rows, the first padded at the front by 2 positions."""
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[0, :2] = False
    return mask


def same_state(a, b, tol):
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert x.shape == y.shape and x.dtype == y.dtype, f.name
            torch.testing.assert_close(x, y, atol=tol, rtol=tol, msg=f.name)
        else:
            assert x == y, f.name


class Spy:
    """Counts calls of ``_chunkwise.chunkwise`` and ``_chunkwise.recurrent``; forbids ``state_heads``."""

    def __init__(self, monkeypatch):
        self.calls = {"chunkwise": 0, "recurrent": 0}
        for name in self.calls:
            real = getattr(_chunkwise, name)

            def counted(*a, _real=real, _name=name, **kw):
                self.calls[_name] += 1
                return _real(*a, **kw)
            monkeypatch.setattr(_chunkwise, name, counted)

        def no_repeat(*a, **kw):
            raise AssertionError("the decoding step repeated the state to the query heads (state_heads)")
        monkeypatch.setattr(_ops, "state_heads", no_repeat)


def prefill_and_step(name, kw, dtype, n_new, n_queries, monkeypatch, chunked):
    """A left-padded batch: ``P`` keys read in one call, then one call of ``n_new`` keys with the state."""
    torch.manual_seed(0)
    kern = kernel(name, kw).to(dtype)
    Hk = heads_of(name, kw)
    N = P + n_new
    q, k, v = rand(B, H, N, E, seed=1, dtype=dtype), rand(B, Hk, N, E, seed=2, dtype=dtype), rand(B, Hk, N, E, seed=4, dtype=dtype)
    gk, mask = gates(name, N, dtype=torch.float32 if dtype != F64 else F64), left_padded(N)
    with torch.no_grad():
        first = kern(q[:, :, :P], k[:, :, :P], v[:, :, :P], mask[:, :P], return_state=True, **window(gk, 0, P))
        if chunked:
            monkeypatch.setattr(_chunkwise, "DECODE_KEYS", 0)  # the chunked path, for comparison
        spy = None if chunked else Spy(monkeypatch)
        step = kern(q[:, :, N - n_queries:], k[:, :, P:], v[:, :, P:], mask, state=first.state, return_state=True,
                    **window(gk, P, N))
    monkeypatch.undo()
    return step, spy, Hk


@pytest.mark.parametrize("n_new,n_queries", [(1, 1), (3, 3), (3, 1)])
@pytest.mark.parametrize("name,kw", LINEAR + [(n, {}) for n in GATED],
                         ids=lambda x: x if isinstance(x, str) else ",".join(f"{a}" for a in x) or "-")
def test_the_step_skips_the_engine_and_equals_the_chunked_path(name, kw, n_new, n_queries, monkeypatch):
    step, spy, Hk = prefill_and_step(name, kw, F64, n_new, n_queries, monkeypatch, chunked=False)
    assert spy.calls == {"chunkwise": 0, "recurrent": 1}
    chunked, _, _ = prefill_and_step(name, kw, F64, n_new, n_queries, monkeypatch, chunked=True)
    torch.testing.assert_close(step.output, chunked.output, atol=1e-12, rtol=1e-12)
    same_state(step.state, chunked.state, 1e-12)
    if Hk < H:  # grouped keys: the state stays per key head
        assert step.state.S.shape[1] == Hk


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,kw", [LINEAR[0], LINEAR[3], ("gla", {}), ("gated-deltanet", {})],
                         ids=["linear", "performer", "gla", "gated-deltanet"])
def test_half_inputs_step_like_the_chunked_path(name, kw, dtype, monkeypatch):
    step, spy, _ = prefill_and_step(name, kw, dtype, 1, 1, monkeypatch, chunked=False)
    assert spy.calls["chunkwise"] == 0
    chunked, _, _ = prefill_and_step(name, kw, dtype, 1, 1, monkeypatch, chunked=True)
    assert step.output.dtype == dtype and step.state.S.dtype == torch.float32
    torch.testing.assert_close(step.output, chunked.output)  # rounded to the half type alike
    same_state(step.state, chunked.state, 1e-5)


@pytest.mark.parametrize("name,kw", LINEAR[:1] + LINEAR[3:] + [("gla", {})], ids=["linear", "performer", "gla"])
def test_more_new_keys_than_a_step_go_to_the_engine(name, kw, monkeypatch):
    spy = {"n": 0}
    real = _chunkwise.chunkwise

    def counted(*a, **k):
        spy["n"] += 1
        return real(*a, **k)
    kern = kernel(name, kw).double()
    Hk = heads_of(name, kw)
    n = _chunkwise.DECODE_KEYS + 1
    q, k, v = rand(B, H, P + n, E, seed=1), rand(B, Hk, P + n, E, seed=2), rand(B, Hk, P + n, E, seed=4)
    gk = gates(name, P + n)
    state = kern(q[:, :, :P], k[:, :, :P], v[:, :, :P], return_state=True, **window(gk, 0, P)).state
    monkeypatch.setattr(_chunkwise, "chunkwise", counted)
    kern(q[:, :, P:], k[:, :, P:], v[:, :, P:], state=state, **window(gk, P, P + n))
    assert spy["n"] == 1


@pytest.mark.parametrize("name", ["linear", "linear-hedgehog", "performer"] + GATED)
def test_a_grouped_key_model_decodes_token_by_token_as_in_one_call(name):
    """Through ``MultiHeadAttention`` with grouped keys (``n_kv_heads``): a left-padded batch decoded
    one token at a time after a prefill equals one causal call over the whole row."""
    torch.manual_seed(0)
    kw = {"feature_map": "hedgehog"} if name == "linear-hedgehog" else {}
    if name == "performer":
        kw = {"nb_features": 16, "seed": 0}
    mha = MultiHeadAttention(32, H, attention=name.split("-hedgehog")[0], causal=True, n_kv_heads=G, **kw).double()
    N = P + 4
    x, mask = rand(B, N, 32, seed=5), left_padded(N)
    with torch.no_grad():
        full = mha(x, mask=mask).output
        out = mha(x[:, :P], mask=mask[:, :P], return_state=True)
        rows, state = [out.output], out.state
        for t in range(P, N):
            out = mha(x[:, t:t + 1], mask=mask[:, :t + 1], state=state, return_state=True)
            rows.append(out.output)
            state = out.state
    torch.testing.assert_close(torch.cat(rows, dim=1), full, atol=1e-12, rtol=1e-12)


def test_grouped_queries_outside_decoding_are_refused():
    phi_q, phi_k = torch.rand(1, 4, 2, 3, dtype=F64), torch.rand(1, 2, 2, 3, dtype=F64)
    with pytest.raises(ValueError, match="grouped queries are read only while decoding"):
        _ops.linear_attention(_ops.Features(phi_q, phi_k), torch.rand(1, 2, 2, 5, dtype=F64), causal=True)


def test_recurrent_grouped_queries_read_their_key_heads_state():
    """``_chunkwise.recurrent`` with ``R`` times the key heads' queries equals the keys, values and
    state repeated to the query heads."""
    q, k, v, S0 = rand(2, 6, 3, 4, seed=1), rand(2, 2, 3, 4, seed=2), rand(2, 2, 3, 5, seed=3), rand(2, 2, 5, 4, seed=4)
    g = -torch.rand(2, 2, 3, dtype=F64)
    o, S = _chunkwise.recurrent(q, k, v, g, state=S0)
    rep = lambda x: x.repeat_interleave(3, dim=1)  # noqa: E731
    o_ref, S_ref = _chunkwise.recurrent(q, rep(k), rep(v), rep(g), state=rep(S0))
    torch.testing.assert_close(o, o_ref, atol=1e-13, rtol=1e-13)
    torch.testing.assert_close(rep(S), S_ref, atol=1e-13, rtol=1e-13)


def test_elu_plus_one_without_autograd_gives_the_functions_features():
    from qkv.attention.linear import elu_plus_one

    x = torch.tensor([-100.0, -17.0, -1.0, 0.0, 0.5, 30.0], dtype=F64, requires_grad=True)
    with torch.no_grad():
        plain = elu_plus_one(x)
    assert plain.grad_fn is None
    torch.testing.assert_close(plain, elu_plus_one(x), atol=0, rtol=0)
    torch.testing.assert_close(plain, torch.where(x > 0, x + 1, x.exp()), atol=1e-15, rtol=1e-15)
