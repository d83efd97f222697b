"""Linear attention's descendants — retention, gla, deltanet, gated-deltanet (attention/gated_linear.py),
their engine (qkv/_chunkwise.py) and qkv.functional's drop-ins with fla's signatures (the gated delta
rule, Kimi's KDA) — against the papers' recurrences written literally here
(float64, loops, explicit ``d_v x d_k`` matrices), as fla keeps ``naive.py`` beside each kernel:
chunkwise == recurrent == parallel == literal, stepwise == one call, gradients, key padding,
packed documents, gates from MultiHeadAttention, and bad input."""

import math

import pytest
import torch

import qkv
from qkv import _chunkwise as cw
from qkv.attention.gated_linear import NORM_EPS

F64 = torch.float64
KERNELS = ["retention", "gla", "deltanet", "gated-deltanet"]
DELTA = {"retention": False, "gla": False, "deltanet": True, "gated-deltanet": True}


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def literal(q, k, v, g=None, beta=None, delta=False, S=None, resets=None):
    """The papers' recurrence token by token, one (batch, head) at a time:
    additive ``S_t = S_{t-1} Diag(a_t) + beta_t v_t k_t^T``; delta
    ``S_t = S_{t-1} Diag(a_t) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``; ``a_t = exp(g_t)``,
    ``o_t = S_t q_t``; a reset zeroes ``S_{t-1}``. Returns ``(o (B, H, N, Ev), S_N (B, H, Ev, E))``."""
    B, H, N, E = k.shape
    Ev = v.shape[-1]
    out, final = torch.zeros(B, H, N, Ev, dtype=F64), torch.zeros(B, H, Ev, E, dtype=F64)
    for b in range(B):
        for h in range(H):
            s = torch.zeros(Ev, E, dtype=F64) if S is None else S[b, h].clone()
            for t in range(N):
                if resets is not None and resets[b, t]:
                    s = torch.zeros(Ev, E, dtype=F64)
                a = torch.ones(E, dtype=F64) if g is None else (g[b, h, t].exp() * torch.ones(E, dtype=F64))
                bt = 1.0 if beta is None else beta[b, h, t]
                kt, vt = k[b, h, t], v[b, h, t]
                if delta:
                    s = s @ torch.diag(a) @ (torch.eye(E, dtype=F64) - bt * torch.outer(kt, kt)) + bt * torch.outer(vt, kt)
                else:
                    s = s @ torch.diag(a) + bt * torch.outer(vt, kt)
                out[b, h, t] = s @ q[b, h, t]
            final[b, h] = s
    return out, final


def gates_for(name, B, H, N, E, seed=7):
    """Random gates of kernel ``name``'s kind: ``g <= 0`` (per channel for gla), ``beta`` in [0, 1]."""
    kw = {}
    if name in ("gla", "gated-deltanet"):
        shape = (B, H, N, E) if name == "gla" else (B, H, N)
        kw["g"] = -torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * 0.7
    if DELTA[name]:
        kw["beta"] = torch.rand(B, H, N, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
    return kw


def kernel_reference(name, q, k, v, g=None, beta=None, causal=True, resets=None):
    """What kernel ``name`` computes, from the literal recurrence: L2-normalised q, k for the delta
    rule (``x / sqrt(|x|^2 + 1e-6)``), q scaled by ``E^-1/2``, RetNet's ``log gamma_h`` when no ``g``
    (not for deltanet), ``beta = 1`` when none; non-causal: every query reads ``S_N``; then each
    output divided by its root mean square."""
    B, H, N, E = k.shape
    if DELTA[name]:
        q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q = q / math.sqrt(E)
    if g is None and name != "deltanet":
        g = torch.tensor([math.log(1 - 2.0 ** (-5 - h)) for h in range(H)], dtype=F64).view(1, H, 1).expand(B, H, N)
    o, S = literal(q, k, v, g, beta, DELTA[name], resets=resets)
    if not causal:
        o = torch.einsum("bhve,bhme->bhmv", S, q)  # o_i = S_N q_i
    return o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + NORM_EPS)


# ------------------------------------------------------------------ the engine


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("decay", [None, "head", "channel"])
@pytest.mark.parametrize("with_resets", [False, True])
def test_engine_forms_equal_the_literal_recurrence(delta, decay, with_resets):
    """chunkwise (every chunk length, the last chunk short or not) == recurrent == literal, with an
    initial state, beta, resets inside and at the edges of chunks; the delta rule with a decay per
    key channel is Kimi's KDA."""
    B, H, N, E, Ev = 2, 2, 9, 3, 4
    q, k, v = rand(B, H, N, E, seed=1), cw.l2_normalize(rand(B, H, N, E, seed=2)), rand(B, H, N, Ev, seed=3)
    g = None if decay is None else -torch.rand(*((B, H, N, E) if decay == "channel" else (B, H, N)), dtype=F64)
    beta = torch.rand(B, H, N, dtype=F64)
    S0 = rand(B, H, Ev, E, seed=4)
    resets = None
    if with_resets:
        resets = torch.zeros(B, N, dtype=torch.bool)
        resets[0, 3] = resets[0, 4] = resets[1, 0] = resets[1, 8] = True
    ref_o, ref_S = literal(q, k, v, g, beta, delta, S0, resets)
    o, S = cw.recurrent(q, k, v, g, beta, delta=delta, state=S0, resets=resets)
    torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, ref_S, rtol=0, atol=1e-12)
    for C in (1, 2, 4, 9, 16):
        o, S = cw.chunkwise(q, k, v, g, beta, delta=delta, state=S0, resets=resets, chunk_size=C)
        torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-12)
        torch.testing.assert_close(S, ref_S, rtol=0, atol=1e-12)
    o, S = cw.parallel(q, k, v, g, beta, delta=delta, state=S0, resets=resets)
    torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-12)


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("decay", [None, "head", "channel"])
def test_engine_grouped_query_key_heads_equal_repeated_ones(delta, decay):
    """q and k with fewer heads than v (each serving 2 consecutive value heads, as transformers'
    grouped value heads) == the literal recurrence with q and k repeated per value head, for every
    chunk length, with a reset, an initial state and beta — and their gradients reach the shared heads."""
    B, Hk, G, N, E, Ev = 2, 2, 2, 9, 3, 4
    H = Hk * G
    q, k = rand(B, Hk, N, E, seed=1), cw.l2_normalize(rand(B, Hk, N, E, seed=2))
    v, S0 = rand(B, H, N, Ev, seed=3), rand(B, H, Ev, E, seed=4)
    g = None if decay is None else -torch.rand(*((B, H, N, E) if decay == "channel" else (B, H, N)), dtype=F64)
    beta = torch.rand(B, H, N, dtype=F64)
    resets = torch.zeros(B, N, dtype=torch.bool)
    resets[1, 5] = True
    ref_o, ref_S = literal(q.repeat_interleave(G, 1), k.repeat_interleave(G, 1), v, g, beta, delta, S0, resets)
    for C in (1, 4, 9):
        o, S = cw.chunkwise(q, k, v, g, beta, delta=delta, state=S0, resets=resets, chunk_size=C)
        torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-12)
        torch.testing.assert_close(S, ref_S, rtol=0, atol=1e-12)
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    (cw.chunkwise(qg, kg, v, g, beta, delta=delta, state=S0, chunk_size=4)[0] * v).sum().backward()
    qr, kr = q.clone().requires_grad_(), k.clone().requires_grad_()
    (cw.recurrent(qr.repeat_interleave(G, 1), kr.repeat_interleave(G, 1), v, g, beta, delta=delta,
                  state=S0)[0] * v).sum().backward()
    torch.testing.assert_close(qg.grad, qr.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(kg.grad, kr.grad, rtol=0, atol=1e-10)


def test_retention_parallel_form_is_qk_times_d_times_v():
    """RetNet eq. 5: ``(Q K^T o D) V``, ``D_nm = gamma^{n-m}`` for ``n >= m`` — built entry by entry."""
    N, gamma = 6, 0.9
    q, k, v = rand(1, 1, N, 3, seed=1), rand(1, 1, N, 3, seed=2), rand(1, 1, N, 2, seed=3)
    D = torch.tensor([[gamma ** (n - m) if n >= m else 0.0 for m in range(N)] for n in range(N)], dtype=F64)
    expected = ((q[0, 0] @ k[0, 0].T) * D) @ v[0, 0]
    g = torch.full((1, 1, N), math.log(gamma), dtype=F64)
    torch.testing.assert_close(cw.parallel(q, k, v, g)[0][0, 0], expected, rtol=0, atol=1e-12)


def test_engine_never_overflows_with_strong_decays():
    """Every exponent is <= 0: decays of e^-200 per token over a chunk of 64 stay finite (the
    factorised ``q exp(b) . k exp(-b)`` would overflow)."""
    q, k, v = rand(1, 1, 64, 2, seed=1), rand(1, 1, 64, 2, seed=2), rand(1, 1, 64, 2, seed=3)
    g = torch.full((1, 1, 64, 2), -200.0, dtype=F64)
    o, S = cw.chunkwise(q.float(), k.float(), v.float(), g.float(), chunk_size=64)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    torch.testing.assert_close(o.double(), literal(q, k, v, g)[0], atol=1e-5, rtol=1e-5)


def test_scan_without_decay_is_a_cumulative_sum():
    """``scan(S, None, R)`` (no decay: linear attention's sums) == the loop with decays of 1, chunk
    states and final state; no chunk gives no starts and the state unchanged."""
    S, R = rand(2, 3, 4, 5, seed=1), rand(2, 3, 6, 4, 5, seed=2)
    starts, end = cw.scan(S, None, R)
    ref_starts, ref_end = cw.scan(S, torch.ones(2, 3, 6, 1, 1, dtype=F64), R)
    torch.testing.assert_close(starts, ref_starts, rtol=0, atol=1e-12)
    torch.testing.assert_close(end, ref_end, rtol=0, atol=1e-12)
    torch.testing.assert_close(starts[:, :, 3], S + R[:, :, :3].sum(2), rtol=0, atol=1e-12)
    starts, end = cw.scan(S, None, R[:, :, :0])
    assert starts.shape == (2, 3, 0, 4, 5) and torch.equal(end, S)


def test_resets_from_fla_and_transformers_conventions():
    assert cw.resets_from_cu_seqlens(torch.tensor([0, 3, 5, 9]), 9).tolist() == [
        [True, False, False, True, False, True, False, False, False]]
    assert cw.resets_from_position_ids(torch.tensor([[0, 1, 2, 0, 1]])).tolist() == [[True, False, False, True, False]]


# ------------------------------------------------------------------ the kernels


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("causal", [True, False])
def test_kernels_equal_their_literal_reference(name, causal):
    B, H, N, E = 2, 3, 7, 4
    q, k, v = rand(B, H, N, E, seed=1), rand(B, H, N, E, seed=2), rand(B, H, N, 5, seed=3)
    forms = qkv.build_attention(name).forms
    for form in forms:
        kernel = qkv.build_attention(name, causal=causal, form=form, chunk_size=3)
        torch.testing.assert_close(kernel(q, k, v).output, kernel_reference(name, q, k, v, causal=causal),
                                   rtol=0, atol=1e-12)
        gates = gates_for(name, B, H, N, E)
        if gates:
            torch.testing.assert_close(kernel(q, k, v, **gates).output,
                                       kernel_reference(name, q, k, v, causal=causal, **gates), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", KERNELS)
def test_unnormalised_output_is_the_recurrence_and_weights_reproduce_it(name):
    """``norm=False``: ``o_t = S_t q_t`` itself; the weights ``W`` give ``o = W v`` with or without the norm."""
    q, k, v = rand(1, 2, 6, 3, seed=1), rand(1, 2, 6, 3, seed=2), rand(1, 2, 6, 4, seed=3)
    gates = gates_for(name, 1, 2, 6, 3)
    kernel = qkv.build_attention(name, causal=True, norm=False, chunk_size=4)
    qq, kk = (q, k) if not DELTA[name] else (cw.l2_normalize(q), cw.l2_normalize(k))
    g = gates.get("g")
    if g is None and name != "deltanet":
        g = cw.multiscale_log_decay(2, dtype=F64).view(1, 2, 1).expand(1, 2, 6)
    expected = literal(qq / math.sqrt(3), kk, v, g, gates.get("beta"), DELTA[name])[0]
    out = kernel(q, k, v, need_weights=True, **gates)
    torch.testing.assert_close(out.output, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.weights @ v, out.output, rtol=0, atol=1e-12)
    assert (out.weights[..., torch.ones(6, 6, dtype=torch.bool).triu(1)] == 0).all()  # causal
    normed = qkv.build_attention(name, causal=True)(q, k, v, need_weights=True, **gates)
    torch.testing.assert_close(normed.weights @ v, normed.output, rtol=0, atol=1e-12)


def test_retention_decays_are_multiscale():
    assert torch.allclose(cw.multiscale_log_decay(3, dtype=F64).exp(),
                          torch.tensor([1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128], dtype=F64), rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", KERNELS)
def test_gradcheck_with_gates_and_padding(name):
    B, H, N, E = 1, 2, 6, 3
    q, k, v = (rand(B, H, N, E, seed=s).requires_grad_() for s in (1, 2, 3))
    gates = {key: t.clone().requires_grad_() for key, t in gates_for(name, B, H, N, E).items()}
    pad = torch.tensor([[True] * 4 + [False, True]])
    kernel = qkv.build_attention(name, causal=True, chunk_size=4)
    keys = sorted(gates)

    def f(q, k, v, *gs):
        return kernel(q, k, v, mask=pad, **dict(zip(keys, gs))).output

    assert torch.autograd.gradcheck(f, (q, k, v, *(gates[key] for key in keys)))


@pytest.mark.parametrize("name", KERNELS)
def test_stepwise_with_gates_equals_one_call(name):
    B, H, N, E = 2, 2, 10, 4
    q, k, v = rand(B, H, N, E, seed=1), rand(B, H, N, E, seed=2), rand(B, H, N, 3, seed=3)
    gates = gates_for(name, B, H, N, E)
    kernel = qkv.build_attention(name, causal=True, chunk_size=3)
    full = kernel(q, k, v, **gates).output
    state, outs, start = None, [], 0
    for size in (1, 4, 0, 2, 3):
        sl = slice(start, start + size)
        o = kernel(q[:, :, sl], k[:, :, sl], v[:, :, sl], state=state, return_state=True,
                   **{key: t[:, :, sl] for key, t in gates.items()})
        outs.append(o.output)
        state, start = o.state, start + size
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=0, atol=1e-12)
    assert state.length == N and state.S.shape == (B, H, 3, E)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("causal", [True, False])
def test_a_padded_key_adds_nothing_to_the_state(name, causal):
    """Padding in front and in the middle of a row: the real tokens' outputs are those of the row
    alone (a padded key neither writes nor decays the state), whatever the padded keys, values and
    gates hold."""
    B, H, N, E = 1, 2, 6, 3
    q, k, v = rand(B, H, N, E, seed=1), rand(B, H, N, E, seed=2), rand(B, H, N, 4, seed=3)
    gates = gates_for(name, B, H, N, E)
    real = torch.tensor([False, False, True, True, False, False, False, True, True, True, True])  # 2 + 3 pads
    where = real.nonzero().squeeze(1)

    def padded(x, seed, fill=None):
        out = (rand(*x.shape[:2], real.numel(), *x.shape[3:], seed=seed) * 5 if fill is None
               else torch.full((*x.shape[:2], real.numel(), *x.shape[3:]), fill, dtype=F64))
        out[:, :, where] = x
        return out

    pgates = {key: padded(t, 0, -3.0 if key == "g" else 0.5) for key, t in gates.items()}
    kernel = qkv.build_attention(name, causal=causal, chunk_size=4)
    alone = kernel(q, k, v, **gates).output
    out = kernel(padded(q, 4), padded(k, 5), padded(v, 6), mask=real.unsqueeze(0), **pgates).output
    torch.testing.assert_close(out[:, :, where], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", KERNELS)
def test_packed_documents_reset_the_state(name):
    """transformers' packing (position_ids restarting at 0): each document's outputs are those of
    the document alone, chunk boundaries inside documents or not; decoding a packed row in pieces
    gives the same."""
    E = 3
    lengths = (4, 1, 5)
    docs = [(rand(1, 2, n, E, seed=10 + i), rand(1, 2, n, E, seed=20 + i), rand(1, 2, n, 2, seed=30 + i),
             gates_for(name, 1, 2, n, E, seed=40 + i)) for i, n in enumerate(lengths)]
    kernel = qkv.build_attention(name, causal=True, chunk_size=3)
    alone = torch.cat([kernel(q, k, v, **gs).output for q, k, v, gs in docs], dim=2)
    cat = lambda i: torch.cat([d[i] for d in docs], dim=2)
    gates = {key: torch.cat([d[3][key] for d in docs], dim=2) for key in docs[0][3]}
    position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    packed = kernel(cat(0), cat(1), cat(2), position_ids=position_ids, **gates).output
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)
    state, outs = None, []
    for a, b in ((0, 2), (2, 6), (6, 10)):
        o = kernel(cat(0)[:, :, a:b], cat(1)[:, :, a:b], cat(2)[:, :, a:b], state=state, return_state=True,
                   position_ids=position_ids[:, a:b], **{key: t[:, :, a:b] for key, t in gates.items()})
        state = o.state
        outs.append(o.output)
    torch.testing.assert_close(torch.cat(outs, dim=2), alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", KERNELS)
def test_half_precision_stays_finite_and_close(name):
    q, k, v = (rand(1, 2, 20, 8, seed=s).mul(30) for s in (1, 2, 3))
    kernel = qkv.build_attention(name, causal=True, chunk_size=8)
    ref = kernel(q.float(), k.float(), v.float()).output
    for dtype in (torch.bfloat16, torch.float16):
        out = kernel(q.to(dtype), k.to(dtype), v.to(dtype)).output
        assert out.dtype == dtype and torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)


# ------------------------------------------------------------------ bad input


def test_bad_gates_are_named():
    q = k = v = rand(1, 2, 5, 3)
    gdn = qkv.build_attention("gated-deltanet", causal=True)
    beta = torch.full((1, 2, 5), 0.5, dtype=F64)
    g = torch.full((1, 2, 5), -0.1, dtype=F64)
    with pytest.raises(ValueError, match="g .*finite"):
        gdn(q, k, v, g=g.clone().fill_(float("nan")), beta=beta)
    with pytest.raises(ValueError, match="g .*<= 0"):
        gdn(q, k, v, g=-g, beta=beta)
    with pytest.raises(ValueError, match=r"g must have shape \(1, 2, 5\)"):
        gdn(q, k, v, g=g[:, :1], beta=beta)
    with pytest.raises(ValueError, match=r"beta .*\[0, 1\]"):
        gdn(q, k, v, g=g, beta=beta + 0.6)
    with pytest.raises(ValueError, match=r"beta .*\[0, 1\]"):
        gdn(q, k, v, g=g, beta=beta.clone().fill_(float("nan")))
    with pytest.raises(ValueError, match=r"beta must have shape \(1, 2, 5\)"):
        gdn(q, k, v, beta=beta[..., :4])
    with pytest.raises(TypeError, match="beta must be a floating"):
        gdn(q, k, v, beta=torch.ones(1, 2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"g must have shape \(1, 2, 5, 3\)"):
        qkv.build_attention("gla", causal=True)(q, k, v, g=g)
    with pytest.raises(ValueError, match="retention.*takes no g"):
        qkv.build_attention("retention", causal=True)(q, k, v, g=g)
    with pytest.raises(ValueError, match="deltanet.*takes no g"):
        qkv.build_attention("deltanet", causal=True)(q, k, v, g=g)
    with pytest.raises(ValueError, match="gla.*takes no beta"):
        qkv.build_attention("gla", causal=True)(q, k, v, beta=beta)
    with pytest.raises(ValueError, match="position_ids .*causal=True"):
        qkv.build_attention("gla")(q, k, v, position_ids=torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"position_ids must have shape"):
        gdn(q, k, v, position_ids=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="form must be one of"):
        qkv.build_attention("gla", form="parallel")
    with pytest.raises(ValueError, match="need_weights=True with a state"):
        st = gdn(q, k, v, return_state=True).state
        gdn(q, k, v, state=st, need_weights=True)


def test_context_parallel_passes_the_shards_affine_state_maps():
    """On sequence shards each rank keeps every head (the default decays differ per head, gamma_h)
    and passes its shard's affine map of the state (qkv.parallel's 'affine'; exactness:
    tests/parallel/test_gated_context_parallel.py)."""
    for name in KERNELS:
        assert type(qkv.build_attention(name)).context_parallel == "affine"


# ------------------------------------------------------------------ inside MultiHeadAttention


@pytest.mark.parametrize("name", ["gla", "deltanet", "gated-deltanet"])
def test_multihead_computes_the_gates_from_the_tokens(name):
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(8, 2, name, causal=True).double()
    assert mha.gates is not None and any(p.requires_grad for p in mha.gates.parameters())
    x = rand(2, 7, 8, seed=1)
    gates = mha.gates(x)
    q, k, v = (mha._split(proj(x)) for proj in (mha.q_proj, mha.k_proj, mha.v_proj))
    expected = mha.out_proj(mha.kernel(q, k, v, **gates).output.transpose(1, 2).reshape(2, 7, 8))
    out = mha(x).output
    torch.testing.assert_close(out, expected)
    out.pow(2).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mha.gates.parameters())
    # decoding a token at a time through the module: each step's gates from its own token
    mha.eval()
    with torch.no_grad():
        full, state, outs = mha(x).output, None, []
        for t in range(7):
            o = mha(x[:, t:t + 1], state=state, return_state=True)
            outs.append(o.output)
            state = o.state
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="gates from the key input"):
        mha(x, kv=mha.project_kv(x))
    # the gates follow their papers' ranges
    if "beta" in gates:
        assert gates["beta"].shape == (2, 2, 7) and ((gates["beta"] >= 0) & (gates["beta"] <= 1)).all()
    if "g" in gates:
        assert gates["g"].shape == ((2, 2, 7, 4) if name == "gla" else (2, 2, 7)) and (gates["g"] <= 0).all()


def test_multihead_of_retention_has_no_gates():
    assert qkv.MultiHeadAttention(8, 2, "retention", causal=True).gates is None
    assert qkv.MultiHeadAttention(8, 2, "softmax").gates is None


# ------------------------------------------------------------------ fla's signatures (qkv.functional)


def fla_inputs(B=2, T=9, H=2, Hv=4, K=3, V=2, seed=0):
    q, k, v = rand(B, T, H, K, seed=seed), rand(B, T, H, K, seed=seed + 1), rand(B, T, Hv, V, seed=seed + 2)
    g = -torch.rand(B, T, Hv, generator=torch.Generator().manual_seed(seed + 3), dtype=F64)
    beta = torch.rand(B, T, Hv, generator=torch.Generator().manual_seed(seed + 4), dtype=F64)
    return q, k, v, g, beta


def fla_literal(q, k, v, g, beta, scale, S0=None, l2=False):
    """fla's layout (B, T, H, K), state (B, Hv, K, V), value heads sharing query/key heads, into the literal."""
    rep = v.shape[2] // q.shape[2]
    q, k = (x.repeat_interleave(rep, dim=2).transpose(1, 2) for x in (q, k))  # (B, Hv, T, K)
    if l2:
        q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    o, S = literal(q * scale, k, v.transpose(1, 2), g.transpose(1, 2), beta.transpose(1, 2), True,
                   None if S0 is None else S0.transpose(-1, -2))
    return o.transpose(1, 2), S.transpose(-1, -2)


@pytest.mark.parametrize("fn", [qkv.functional.chunk_gated_delta_rule, qkv.functional.fused_recurrent_gated_delta_rule])
def test_fla_signatures_compute_the_gated_delta_rule(fn):
    q, k, v, g, beta = fla_inputs()
    S0 = rand(2, 4, 3, 2, seed=9)
    for l2, scale in ((True, None), (False, 0.7)):
        kw = {"chunk_size": 4} if fn is qkv.functional.chunk_gated_delta_rule else {}
        o, S = fn(q, k, v, g, beta, scale=scale, initial_state=S0, output_final_state=True,
                  use_qk_l2norm_in_kernel=l2, **kw)
        ref_o, ref_S = fla_literal(q, k, v, g, beta, 3 ** -0.5 if scale is None else scale, S0, l2)
        torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-12)
        torch.testing.assert_close(S, ref_S, rtol=0, atol=1e-12)
    assert fn(q, k, v, g, beta)[1] is None
    o, _ = fn(q.float(), k.float(), v.float(), g.float(), beta.float())
    assert o.dtype == torch.float32


def test_fla_cu_seqlens_keep_packed_documents_apart():
    q, k, v, g, beta = fla_inputs(B=1, T=9)
    cu = torch.tensor([0, 4, 5, 9])
    packed, _ = qkv.functional.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, chunk_size=3)
    step, _ = qkv.functional.fused_recurrent_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
    alone = torch.cat([qkv.functional.chunk_gated_delta_rule(*(x[:, a:b] for x in (q, k, v, g, beta)))[0]
                       for a, b in ((0, 4), (4, 5), (5, 9))], dim=1)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)
    torch.testing.assert_close(step, alone, rtol=0, atol=1e-12)


def test_fla_signatures_name_bad_arguments():
    f = qkv.functional.chunk_gated_delta_rule
    q, k, v, g, beta = fla_inputs()
    with pytest.raises(ValueError, match="g .*finite"):
        f(q, k, v, g.clone().fill_(float("inf")), beta)
    with pytest.raises(ValueError, match="g .*<= 0"):
        f(q, k, v, -g + 0.1, beta)
    with pytest.raises(ValueError, match=r"beta .*\[0, 1\]"):
        f(q, k, v, g, beta - 0.5)
    with pytest.raises(ValueError, match=r"g must have shape \(2, 9, 4\)"):
        f(q, k, v, g[..., :2], beta)
    with pytest.raises(ValueError, match="multiple of q's and k's heads"):
        f(q, k, v[:, :, :3], g[..., :3], beta[..., :3])
    with pytest.raises(ValueError, match="q must have k's shape"):
        f(q[:, :, :1], k, v, g, beta)
    with pytest.raises(ValueError, match="v must be"):
        f(q, k, v[:, :5], g, beta)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(B, Hv, K, V\)"):
        f(q, k, v, g, beta, initial_state=rand(2, 4, 2, 3))
    with pytest.raises(ValueError, match="cu_seqlens"):
        f(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 9]))  # B = 2
    with pytest.raises(ValueError, match="cu_seqlens must rise"):
        f(*(x[:1] for x in (q, k, v, g, beta)), cu_seqlens=torch.tensor([0, 5, 8]))
    with pytest.raises(ValueError, match="cu_seqlens with initial_state"):
        f(*(x[:1] for x in (q, k, v, g, beta)), cu_seqlens=torch.tensor([0, 9]), output_final_state=True)
    with pytest.raises(ValueError, match="q must be 4-D"):
        f(q[0], k, v, g, beta)


def test_fla_chunk_gated_delta_rule_gradcheck():
    q, k, v, g, beta = (x.requires_grad_() for x in fla_inputs(B=1, T=5, H=1, Hv=2, K=3, V=2))
    S0 = rand(1, 2, 3, 2, seed=9).requires_grad_()

    def f(q, k, v, g, beta, S0):
        o, S = qkv.functional.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True, chunk_size=2)
        return o, S

    assert torch.autograd.gradcheck(f, (q, k, v, g, beta, S0))


# ------------------------------------------------------------------ KDA, fla's signatures (qkv.functional)


KDA_FNS = [qkv.functional.chunk_kda, qkv.functional.fused_recurrent_kda]


def kda_inputs(B=2, T=9, H=2, Hv=4, K=3, V=2, seed=0):
    """fla's KDA layout: ``q, k (B, T, H, K)``, ``v (B, T, Hv, V)``, ``g (B, T, Hv, K)`` <= 0 (one decay
    per key channel), ``beta (B, T, Hv)`` in [0, 1]; ``K != V`` so that a transposed state cannot pass."""
    q, k, v = rand(B, T, H, K, seed=seed), rand(B, T, H, K, seed=seed + 1), rand(B, T, Hv, V, seed=seed + 2)
    g = -torch.rand(B, T, Hv, K, generator=torch.Generator().manual_seed(seed + 3), dtype=F64)
    beta = torch.rand(B, T, Hv, generator=torch.Generator().manual_seed(seed + 4), dtype=F64)
    return q, k, v, g, beta


def kda_literal(q, k, v, g, beta, scale, S0=None):
    """KDA written as its equation in fla's ``K x V`` layout, one (batch, value head) at a time:
    ``S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T``, ``o_t = S_t^T (scale q_t)``;
    value head ``h`` reads query/key head ``h // (Hv / H)``. Returns ``(o (B, T, Hv, V), S_T (B, Hv, K, V))``."""
    B, T, H, K = q.shape
    Hv, V = v.shape[2:]
    eye = torch.eye(K, dtype=F64)
    outs, finals = [], []
    for b in range(B):
        for h in range(Hv):
            hk = h // (Hv // H)
            s = torch.zeros(K, V, dtype=F64) if S0 is None else S0[b, h]
            for t in range(T):
                kt, bt = k[b, t, hk], beta[b, t, h]
                # S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
                vt = v[b, t, h]
                s = (eye - bt * torch.outer(kt, kt)) @ torch.diag(g[b, t, h].exp()) @ s + bt * torch.outer(kt, vt)
                outs.append(s.T @ (scale * q[b, t, hk]))
            finals.append(s)
    o = torch.stack(outs).view(B, Hv, T, V).transpose(1, 2) if outs else v.new_zeros(B, T, Hv, V)
    return o, torch.stack(finals).view(B, Hv, K, V)


def test_kda_chunk_and_recurrent_equal_the_literal_recurrence():
    """chunk_kda (chunks of 1, 4 — the last short — and 16) == fused_recurrent_kda == the literal
    float64 loop: outputs, final state and the gradients of every input, grouped value heads, an
    initial state, the L2 norm and a scale."""
    leaves = [x.requires_grad_() for x in (*kda_inputs(), rand(2, 4, 3, 2, seed=9))]
    cot = rand(2, 9, 4, 2, seed=10), rand(2, 4, 3, 2, seed=11)

    def grads(o, S):
        return torch.autograd.grad((o * cot[0]).sum() + (S * cot[1]).sum(), leaves)

    for l2, scale in ((True, None), (False, 0.7)):
        q, k, v, g, beta, S0 = leaves
        nq, nk = (cw.l2_normalize(x) for x in (q, k)) if l2 else (q, k)
        ref_o, ref_S = kda_literal(nq, nk, v, g, beta, 3 ** -0.5 if scale is None else scale, S0)
        ref_grads = grads(ref_o, ref_S)
        runs = [(qkv.functional.fused_recurrent_kda, {})] + [(qkv.functional.chunk_kda, {"chunk_size": C})
                                                            for C in (1, 4, 16)]
        for fn, kw in runs:
            o, S = fn(q, k, v, g, beta, scale=scale, initial_state=S0, output_final_state=True,
                      use_qk_l2norm_in_kernel=l2, **kw)
            torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-12)
            torch.testing.assert_close(S, ref_S, rtol=0, atol=1e-12)
            for got, want in zip(grads(o, S), ref_grads):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("fn", KDA_FNS)
def test_kda_cu_seqlens_keep_packed_documents_apart(fn):
    q, k, v, g, beta = kda_inputs(B=1, T=9)
    cu = torch.tensor([0, 4, 5, 9])
    kw = {"chunk_size": 3} if fn is qkv.functional.chunk_kda else {}
    packed, _ = fn(q, k, v, g, beta, cu_seqlens=cu, **kw)
    alone = torch.cat([kda_literal(*(x[:, a:b] for x in (q, k, v, g, beta)), 3 ** -0.5)[0]
                       for a, b in ((0, 4), (4, 5), (5, 9))], dim=1)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)
    whole, _ = fn(q, k, v, g, beta, **kw)
    assert (whole - alone).abs().max() > 1e-3  # unpacked, the documents do meet


@pytest.mark.parametrize("fn", KDA_FNS)
def test_kda_empty_sequence_gives_empty_outputs(fn):
    q, k, v, g, beta = (x[:, :0] for x in kda_inputs())
    S0 = rand(2, 4, 3, 2, seed=9)
    o, S = fn(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    assert o.shape == (2, 0, 4, 2) and o.dtype == F64
    torch.testing.assert_close(S, S0, rtol=0, atol=0)  # nothing read, nothing written
    assert fn(q, k, v, g, beta)[0].shape == (2, 0, 4, 2)


@pytest.mark.parametrize("fn", KDA_FNS)
def test_kda_names_bad_arguments(fn):
    q, k, v, g, beta = kda_inputs()
    with pytest.raises(ValueError, match="g .*finite"):
        fn(q, k, v, g.clone().fill_(float("nan")), beta)
    with pytest.raises(ValueError, match="g .*finite"):
        fn(q, k, v, g.clone().fill_(float("-inf")), beta)
    with pytest.raises(ValueError, match="g .*<= 0"):
        fn(q, k, v, -g + 0.1, beta)
    with pytest.raises(ValueError, match=r"g must have shape \(2, 9, 4, 3\)"):
        fn(q, k, v, g[..., 0], beta)  # the gated delta rule's per-head g
    with pytest.raises(ValueError, match=r"beta .*\[0, 1\]"):
        fn(q, k, v, g, beta + 1.0)
    with pytest.raises(ValueError, match=r"beta .*\[0, 1\]"):
        fn(q, k, v, g, beta - 0.5)
    with pytest.raises(ValueError, match=r"beta must have shape \(2, 9, 4\)"):
        fn(q, k, v, g, beta[..., :2])
    with pytest.raises(ValueError, match="multiple of q's and k's heads"):
        fn(q, k, v[:, :, :3], g[:, :, :3], beta[..., :3])
    with pytest.raises(ValueError, match="q must have k's shape"):
        fn(q[..., :2], k, v, g, beta)
    with pytest.raises(ValueError, match="v must be"):
        fn(q, k, v[:1], g, beta)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(B, Hv, K, V\)"):
        fn(q, k, v, g, beta, initial_state=rand(2, 4, 2, 3))
    with pytest.raises(ValueError, match="scale must be"):
        fn(q, k, v, g, beta, scale=-1.0)
    with pytest.raises(ValueError, match="cu_seqlens with initial_state"):
        fn(*(x[:1] for x in (q, k, v, g, beta)), cu_seqlens=torch.tensor([0, 9]), output_final_state=True)
    with pytest.raises(ValueError, match="k must be 4-D"):
        fn(q, k[0], v, g, beta)
    with pytest.raises(TypeError, match="g must be a floating"):
        fn(q, k, v, g.long(), beta)


def test_kda_chunk_gradcheck():
    leaves = tuple(x.requires_grad_() for x in (*kda_inputs(B=1, T=5, H=1, Hv=2, K=3, V=2), rand(1, 2, 3, 2, seed=9)))

    def f(q, k, v, g, beta, S0):
        return qkv.functional.chunk_kda(q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                        use_qk_l2norm_in_kernel=True, chunk_size=2)

    assert torch.autograd.gradcheck(f, leaves)
