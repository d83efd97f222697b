"""retention, gla, deltanet, gated-deltanet (attention/gated_linear.py) and qkv.functional's gated delta
rule and KDA against an outside reference: flash-linear-attention's pure-PyTorch ``naive`` functions
(``fla/ops/<op>/naive.py`` of fla-core 0.6.0, loaded by file with ``qkv.bench.peers.fla_naive``;
skipped when fla-core is not installed) — outputs, final states and the gradients of q, k, v, the
gates and the initial state, on the same inputs.

fla's conventions, converted here at the boundary: layout ``(B, L, H, E)`` (``naive_retention`` and
``delta_rule_*``: ``(B, H, L, E)``), the state ``d_k x d_v`` (qkv's is the paper's ``d_v x d_k``),
``g`` the log of the decay, q scaled by ``d_k^{-1/2}`` inside every reference, and for the delta rule
q and k L2-normalised by the caller (fla's layers, ``x / sqrt(|x|^2 + 1e-6)``). The qkv kernels run
with ``norm=False`` (no head normalisation in fla's functions). ``d_k != d_v`` so that a transposed
state cannot pass.

Precision: the references compute in float32 whatever the input dtype (``.float()`` /
``.to(torch.float32)`` at their top), except ``delta_rule_chunkwise``, which keeps float64: float64
inputs are compared to ``TOL32`` (relative to the largest magnitude; float32 rounding over 37 steps
measured ~3e-7) and to ``TOL64`` against ``delta_rule_chunkwise``.
"""

import pytest
import torch

import qkv
from qkv.bench.peers import fla_naive
from qkv.types import RecurrentState

pytestmark = pytest.mark.peers

F64 = torch.float64
B, H, L, K, V = 2, 2, 37, 8, 6  # an odd length; d_k != d_v
CHUNKS = [5, 16]  # neither divides L
TOL32, TOL64 = 1e-5, 1e-12


def naive(op):
    try:
        return fla_naive(op)
    except ModuleNotFoundError as e:
        pytest.skip(f"fla-core not installed ({e}); pip install fla-core==0.6.0")


def leaf(*shape, seed, transform=None):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return (x if transform is None else transform(x)).requires_grad_()


def inputs(gate=None, beta=False, state=False):
    """Leaves in qkv's layout: ``q, k (B, H, L, K)``, ``v (B, H, L, V)``; ``g`` log decays <= 0 (``"head"``
    ``(B, H, L)``, ``"channel"`` ``(B, H, L, K)``), ``beta`` in (0, 1), ``S0`` in fla's ``(B, H, K, V)``."""
    x = {"q": leaf(B, H, L, K, seed=1), "k": leaf(B, H, L, K, seed=2), "v": leaf(B, H, L, V, seed=3)}
    if gate is not None:
        shape = (B, H, L, K) if gate == "channel" else (B, H, L)
        x["g"] = leaf(*shape, seed=4, transform=lambda t: torch.nn.functional.logsigmoid(t + 2) / 4)
    if beta:
        x["beta"] = leaf(B, H, L, seed=5, transform=torch.sigmoid)
    if state:
        x["S0"] = leaf(B, H, K, V, seed=6, transform=lambda t: t / 4)
    return x


def l2norm(x):
    """fla's ``l2norm``: ``x / sqrt(sum x^2 + 1e-6)``."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def fla_layout(x):
    return x.transpose(1, 2)  # (B, H, L, *) <-> (B, L, H, *)


def results_and_grads(fn, leaves):
    """``fn() -> [tensors]``, their values and the gradients of ``leaves`` for fixed random cotangents."""
    for t in leaves.values():
        t.grad = None
    outs = [o.to(F64) for o in fn()]
    gen = torch.Generator().manual_seed(9)
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen, dtype=F64) for o in outs])
    grads = {name: t.grad.clone() for name, t in leaves.items()}
    return [o.detach() for o in outs], grads


def assert_agree(ours, theirs, leaves, tol):
    (outs, grads), (ref_outs, ref_grads) = results_and_grads(ours, leaves), results_and_grads(theirs, leaves)
    for i, (a, b) in enumerate(zip(outs, ref_outs)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        assert b.abs().max() > 0.05  # not vacuous
        err = ((a - b).abs().max() / b.abs().max()).item()
        assert err <= tol, f"result {i}: relative difference {err:.3g} > {tol}"
    for name in leaves:
        a, b = grads[name], ref_grads[name]
        err = ((a - b).abs().max() / b.abs().max()).item()
        assert err <= tol, f"gradient of {name}: relative difference {err:.3g} > {tol}"


def kernel_call(name, x, state=True, **knobs):
    """The qkv kernel on ``x`` with explicit gates; returns ``[o (B, H, L, V), S_N in fla's (B, H, K, V)]``."""
    kernel = qkv.build_attention(name, causal=True, norm=False, **knobs)
    gates = {key: x[key] for key in ("g", "beta") if key in x}
    S0 = RecurrentState(x["S0"].transpose(-1, -2)) if state else None  # qkv's S is d_v x d_k
    out = kernel(x["q"], x["k"], x["v"], state=S0, return_state=True, **gates)
    return [out.output, out.state.S.transpose(-1, -2)]


# ------------------------------------------------------------------ gated delta rule


@pytest.mark.parametrize("chunk_size", CHUNKS + [None])  # None: fused_recurrent_gated_delta_rule
@pytest.mark.parametrize("reference", ["naive_recurrent_gated_delta_rule", "naive_chunk_gated_delta_rule"])
def test_functional_gated_delta_rule_equals_fla_naive(chunk_size, reference):
    """``qkv.functional``'s drop-ins, fla's own signature and layout on both sides (fla's chunk reference
    with chunks of 16, padding the last)."""
    gdr = naive("gated_delta_rule")
    x = inputs(gate="head", beta=True, state=True)
    q, k, v, g, beta = (fla_layout(x[n]) for n in ("q", "k", "v", "g", "beta"))

    def ours():
        kw = dict(initial_state=x["S0"], output_final_state=True, use_qk_l2norm_in_kernel=True)
        if chunk_size is None:
            return qkv.functional.fused_recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
        return qkv.functional.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk_size, **kw)

    def theirs():
        kw = dict(initial_state=x["S0"], output_final_state=True)
        if reference == "naive_recurrent_gated_delta_rule":  # (q, k, v, beta, g): its order
            return gdr.naive_recurrent_gated_delta_rule(l2norm(q), l2norm(k), v, beta, g, **kw)
        return gdr.naive_chunk_gated_delta_rule(l2norm(q), l2norm(k), v, g, beta, chunk_size=16, **kw)

    assert_agree(ours, theirs, x, TOL32)


@pytest.mark.parametrize("knobs", [{"chunk_size": 5}, {"chunk_size": 16}, {"form": "recurrent"}])
def test_gated_deltanet_kernel_equals_fla_naive(knobs):
    gdr = naive("gated_delta_rule")
    x = inputs(gate="head", beta=True, state=True)

    def theirs():
        q, k, v, g, beta = (fla_layout(x[n]) for n in ("q", "k", "v", "g", "beta"))
        o, S = gdr.naive_recurrent_gated_delta_rule(l2norm(q), l2norm(k), v, beta, g, initial_state=x["S0"],
                                                    output_final_state=True)
        return [fla_layout(o), S]

    assert_agree(lambda: kernel_call("gated-deltanet", x, **knobs), theirs, x, TOL32)


# ------------------------------------------------------------------ gla


@pytest.mark.parametrize("knobs", [{"chunk_size": 5}, {"chunk_size": 16}, {"form": "recurrent"}])
def test_gla_kernel_equals_fla_naive_recurrent_gla(knobs):
    """A decay per key channel: fla's ``gk (B, L, H, K)`` is qkv's ``g (B, H, L, K)``; its state
    ``h_t = Diag(alpha_t) h_{t-1} + k_t v_t^T`` is the transpose of qkv's ``S_{t-1} Diag(alpha_t) + v_t k_t^T``."""
    gla = naive("gla")
    x = inputs(gate="channel", state=True)

    def theirs():
        o, S = gla.naive_recurrent_gla(*(fla_layout(x[n]) for n in ("q", "k", "v", "g")), initial_state=x["S0"],
                                       output_final_state=True)
        return [fla_layout(o), S]

    assert_agree(lambda: kernel_call("gla", x, **knobs), theirs, x, TOL32)


# ------------------------------------------------------------------ deltanet


@pytest.mark.parametrize("knobs", [{"chunk_size": 5}, {"chunk_size": 16}, {"form": "recurrent"}])
def test_deltanet_kernel_equals_fla_delta_rule_recurrence(knobs):
    dr = naive("delta_rule")
    x = inputs(beta=True, state=True)

    def theirs():  # this reference takes qkv's layout (B, H, L, *)
        return dr.delta_rule_recurrence(l2norm(x["q"]), l2norm(x["k"]), x["v"], x["beta"], initial_state=x["S0"],
                                        output_final_state=True)

    assert_agree(lambda: kernel_call("deltanet", x, **knobs), theirs, x, TOL32)


@pytest.mark.parametrize("chunk_size", CHUNKS)
def test_deltanet_kernel_equals_fla_delta_rule_chunkwise_in_float64(chunk_size):
    """fla's chunkwise reference (the UT transform, Yang et al. 2024) keeps float64: the two chunkwise
    forms agree to float64's rounding. It takes whole chunks of 8 and no initial state: L padded with
    zero keys and beta (they write nothing, the final state included)."""
    dr = naive("delta_rule")
    x = inputs(beta=True)
    pad = -L % 8

    def theirs():
        padded = [torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (l2norm(x["q"]), l2norm(x["k"]), x["v"])]
        o, S = dr.delta_rule_chunkwise(*padded, torch.nn.functional.pad(x["beta"], (0, pad)), chunk_size=8)
        return [o[:, :, :L], S]

    assert_agree(lambda: kernel_call("deltanet", x, state=False, chunk_size=chunk_size), theirs, x, TOL64)


# ------------------------------------------------------------------ retention


@pytest.mark.parametrize("knobs", [{"chunk_size": 5}, {"chunk_size": 16}, {"form": "recurrent"}, {"form": "parallel"}])
def test_retention_kernel_equals_fla_naive_retention(knobs):
    """fla's parallel form ``(Q K^T o D) V`` with ``gamma_h = 1 - 2^{-5-h}`` (no state in or out)."""
    ret = naive("retention")
    x = inputs()
    assert_agree(lambda: kernel_call("retention", x, state=False, **knobs)[:1],
                 lambda: [ret.naive_retention(x["q"], x["k"], x["v"])], x, TOL32)


# ------------------------------------------------------------------ the checks are sharp


def test_a_convention_off_by_one_disagrees_with_fla():
    """What the boundary converts is seen: the gated delta rule with each token's decay taken one step late
    (``g_{t-1}``), and GLA with its gate on reversed key channels, disagree with fla far beyond ``TOL32``."""
    gdr, gla = naive("gated_delta_rule"), naive("gla")
    x = inputs(gate="head", beta=True)
    late = dict(x, g=torch.nn.functional.pad(x["g"][..., :-1], (1, 0)))
    with torch.no_grad():
        q, k, v, g, beta = (fla_layout(x[n]) for n in ("q", "k", "v", "g", "beta"))
        ref, _ = gdr.naive_recurrent_gated_delta_rule(l2norm(q), l2norm(k), v, beta, g)
        for ours, expect_close in ((x, True), (late, False)):
            o = kernel_call("gated-deltanet", ours, state=False)[0]
            err = ((o - fla_layout(ref)).abs().max() / ref.abs().max()).item()
            assert (err <= TOL32) if expect_close else (err > 1e-3), err
        y = inputs(gate="channel")
        ref, _ = gla.naive_recurrent_gla(*(fla_layout(y[n]) for n in ("q", "k", "v", "g")))
        for ours, expect_close in ((y, True), (dict(y, g=y["g"].flip(-1)), False)):
            o = kernel_call("gla", ours, state=False)[0]
            err = ((o - fla_layout(ref)).abs().max() / ref.abs().max()).item()
            assert (err <= TOL32) if expect_close else (err > 1e-3), err


# ------------------------------------------------------------------ KDA (Kimi Delta Attention)


@pytest.mark.parametrize("chunk_size", CHUNKS + [None])  # None: fused_recurrent_kda
@pytest.mark.parametrize("reference", ["naive_recurrent_kda", "naive_chunk_kda"])
def test_functional_kda_equals_fla_naive(chunk_size, reference):
    """``qkv.functional.chunk_kda`` / ``fused_recurrent_kda`` against ``fla/ops/kda/naive.py``, fla's layout on
    both sides, with grouped value heads (``Hv = 2 H``: which value heads share a query/key head is a
    convention the reference fixes). fla's chunk reference takes whole chunks of 16: ``L`` padded with zero
    keys, ``beta`` and ``g`` (a padded step neither decays nor writes: the final state is unchanged)."""
    kda = naive("kda")
    Hv = 2 * H
    x = {"q": leaf(B, L, H, K, seed=1), "k": leaf(B, L, H, K, seed=2), "v": leaf(B, L, Hv, V, seed=3),
         "g": leaf(B, L, Hv, K, seed=4, transform=lambda t: torch.nn.functional.logsigmoid(t + 2) / 4),
         "beta": leaf(B, L, Hv, seed=5, transform=torch.sigmoid),
         "S0": leaf(B, Hv, K, V, seed=6, transform=lambda t: t / 4)}
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))

    def ours():
        kw = dict(initial_state=x["S0"], output_final_state=True, use_qk_l2norm_in_kernel=True)
        if chunk_size is None:
            return qkv.functional.fused_recurrent_kda(q, k, v, g, beta, **kw)
        return qkv.functional.chunk_kda(q, k, v, g, beta, chunk_size=chunk_size, **kw)

    def theirs():
        kw = dict(initial_state=x["S0"], output_final_state=True)
        if reference == "naive_recurrent_kda":
            return kda.naive_recurrent_kda(l2norm(q), l2norm(k), v, g, beta, **kw)
        pad = -L % 16
        padded = [torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) for t in (l2norm(q), l2norm(k), v, g)]
        o, S = kda.naive_chunk_kda(*padded, torch.nn.functional.pad(beta, (0, 0, 0, pad)), chunk_size=16, **kw)
        return o[:, :L], S

    assert_agree(ours, theirs, x, TOL32)

