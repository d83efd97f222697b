"""Tests of qkv.scores: each score against its equation written as loops (formulas.md, "Scores
and classical attention"), gradients, build() and input validation."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call

from qkv import scores

B, M, N, DQ, DK, H = 2, 3, 4, 3, 5, 6


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The tensors here are tiny: intra-op threads only add synchronisation.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
SIZES = dict(query_dim=DQ, key_dim=DK, hidden_dim=H, max_keys=7)
SAME = dict(query_dim=DK, key_dim=DK, hidden_dim=H, max_keys=7)  # scores that need Dq == Dk


def _inputs(dq: int, dk: int = DK, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, M, dq, generator=g, dtype=dtype), torch.randn(B, N, dk, generator=g, dtype=dtype))


def _loop(name: str, score, s: torch.Tensor, h: torch.Tensor, beta=1.0) -> torch.Tensor:
    """e[b, t, i] = score(s_t, h_i), one pair at a time."""
    out = torch.zeros(s.shape[0], s.shape[1], h.shape[1], dtype=s.dtype)
    for b in range(s.shape[0]):
        for t in range(s.shape[1]):
            for i in range(h.shape[1]):
                st, hi = s[b, t], h[b, i]
                if name == "dot":
                    e = sum(st[d] * hi[d] for d in range(st.shape[0]))
                elif name == "scaled_dot":
                    e = sum(st[d] * hi[d] for d in range(st.shape[0])) / math.sqrt(hi.shape[0])
                elif name == "general":
                    W = score.W.weight  # (Dq, Dk)
                    e = sum(st[d] * W[d, k] * hi[k] for d in range(st.shape[0]) for k in range(hi.shape[0]))
                elif name == "additive":
                    W1, W2, b2, v = score.W1.weight, score.W2.weight, score.W2.bias, score.v.weight[0]
                    e = sum(v[j] * torch.tanh(W1[j] @ st + W2[j] @ hi + b2[j]) for j in range(v.shape[0]))
                elif name == "cosine":
                    bt = beta if not isinstance(beta, torch.Tensor) else (beta[b] if beta.dim() == 1 else beta[b, t])
                    e = bt * (st @ hi) / (st.norm() * hi.norm())
                elif name == "location":
                    e = score.W_a.weight[i] @ st  # (W_a s_t)_i
                else:
                    raise AssertionError(name)
                out[b, t, i] = e
    return out


NAMES = ["dot", "scaled_dot", "general", "additive", "cosine", "location"]


def _build(name: str):
    torch.manual_seed(0)
    sizes = SAME if name in ("dot", "scaled_dot", "cosine") else SIZES
    return scores.build(name, **sizes).double(), sizes["query_dim"]


@pytest.mark.parametrize("name", NAMES)
def test_matches_loop_reference(name):
    score, dq = _build(name)
    s, h = _inputs(dq)
    torch.testing.assert_close(score(s, h), _loop(name, score, s, h))


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_inputs_and_parameters(name):
    score, dq = _build(name)
    s, h = _inputs(dq)
    params = {k: p.detach().clone().requires_grad_() for k, p in score.named_parameters()}
    keys_ = list(params)

    def fn(s, h, *ps):
        return functional_call(score, dict(zip(keys_, ps)), (s, h))

    s.requires_grad_()
    h.requires_grad_(name != "location")  # location scores ignore the key values
    assert torch.autograd.gradcheck(fn, (s, h, *params.values()))


@pytest.mark.parametrize("alias, cls", [("concat", scores.AdditiveScore), ("bahdanau", scores.AdditiveScore),
                                        ("mlp", scores.AdditiveScore), ("content", scores.CosineScore),
                                        ("additive", scores.AdditiveScore), ("cosine", scores.CosineScore)])
def test_aliases(alias, cls):
    assert type(scores.build(alias, **SAME)) is cls


def test_names_are_canonical():
    assert set(scores.names()) == {"dot", "scaled_dot", "general", "additive", "cosine", "location"}


def test_additive_without_bias_is_the_printed_equation():
    torch.manual_seed(0)
    score = scores.build("additive", bias=False, **SIZES).double()
    assert score.W2.bias is None
    s, h = _inputs(DQ)
    W1, W2, v = score.W1.weight, score.W2.weight, score.v.weight[0]
    ref = torch.stack([torch.stack([torch.stack([v @ torch.tanh(W1 @ s[b, t] + W2 @ h[b, i]) for i in range(N)])
                                    for t in range(M)]) for b in range(B)])
    torch.testing.assert_close(score(s, h), ref)


@pytest.mark.parametrize("beta", [2.5, "per_sequence", "per_query"])
def test_cosine_sharpening(beta):
    score = scores.build("content", beta=1.0)
    s, h = _inputs(DK)
    if beta == "per_sequence":
        beta = torch.tensor([0.5, 3.0], dtype=torch.float64)
    elif beta == "per_query":
        beta = torch.rand(B, M, dtype=torch.float64) * 5
    torch.testing.assert_close(score(s, h, beta=beta), _loop("cosine", score, s, h, beta=beta))


def test_cosine_module_beta_and_bad_beta():
    s, h = _inputs(DK)
    sharp = scores.CosineScore(beta=4.0)
    torch.testing.assert_close(sharp(s, h), 4.0 * scores.CosineScore()(s, h))
    with pytest.raises(ValueError, match="beta"):
        sharp(s, h, beta=torch.ones(B, M + 1, dtype=torch.float64))
    with pytest.raises(TypeError, match="beta"):
        scores.CosineScore(beta="sharp")


def test_cosine_zero_vector_is_finite():
    s, h = _inputs(DK)
    h[0, 1] = 0
    e = scores.build("cosine")(s, h)
    assert torch.isfinite(e).all() and (e[0, :, 1] == 0).all()


def test_location_uses_first_columns_and_ignores_key_values():
    torch.manual_seed(0)
    score = scores.build("location", query_dim=DQ, max_keys=7).double()
    s, h = _inputs(DQ)
    e = score(s, h)
    torch.testing.assert_close(e, s @ score.W_a.weight[:N].T)
    torch.testing.assert_close(score(s, torch.randn_like(h)), e)
    with pytest.raises(ValueError, match="max_keys"):
        score(s, torch.randn(B, 8, DK, dtype=torch.float64))


def test_half_precision_runs():
    torch.manual_seed(0)
    score = scores.build("additive", **SIZES)
    s, h = _inputs(DQ, dtype=torch.float32)
    ref = score(s, h)
    out = score.to(torch.bfloat16)(s.bfloat16(), h.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.05)


# ----------------------------------------------------------------------------- build


def test_build_unknown_name_lists_known():
    with pytest.raises(ValueError, match="Known: .*additive"):
        scores.build("bilinearr", **SIZES)


@pytest.mark.parametrize("name, missing", [("general", "key_dim"), ("additive", "hidden_dim"), ("location", "max_keys")])
def test_build_missing_size_is_named(name, missing):
    given = {k: v for k, v in SIZES.items() if k != missing}
    with pytest.raises(ValueError, match=missing):
        scores.build(name, **given)


def test_build_takes_only_needed_sizes():
    assert isinstance(scores.build("dot", query_dim=4, key_dim=4, hidden_dim=9, max_keys=3), scores.DotScore)
    loc = scores.build("location", query_dim=4, key_dim=11, hidden_dim=9, max_keys=3)
    assert loc.W_a.weight.shape == (3, 4)
    gen = scores.build("general", query_dim=4, key_dim=6, hidden_dim=9)
    assert gen.W.weight.shape == (4, 6)


def test_build_rejects_unknown_option_and_mismatched_dot():
    with pytest.raises(TypeError, match="temperature"):
        scores.build("dot", temperature=2.0)
    with pytest.raises(ValueError, match="query_dim"):
        scores.build("dot", query_dim=3, key_dim=4)


def test_build_rejects_bad_sizes():
    with pytest.raises(ValueError, match="hidden_dim"):
        scores.build("additive", query_dim=3, key_dim=3, hidden_dim=0)
    with pytest.raises(TypeError, match="query_dim"):
        scores.build("general", query_dim=3.0, key_dim=3)


# ----------------------------------------------------------------------------- forward validation


def test_forward_validation():
    gen = scores.build("general", query_dim=DQ, key_dim=DK)
    s, h = _inputs(DQ, dtype=torch.float32)
    with pytest.raises(ValueError, match="query"):
        gen(s[0], h)
    with pytest.raises(ValueError, match="keys"):
        gen(s, h[0])
    with pytest.raises(ValueError, match="batch"):
        gen(s, h[:1])
    with pytest.raises(ValueError, match="query_dim"):
        gen(torch.randn(B, M, DQ + 1), h)
    with pytest.raises(ValueError, match="key_dim"):
        gen(s, torch.randn(B, N, DK + 1))
    with pytest.raises(TypeError, match="dtype"):
        gen(s, h.double())
    with pytest.raises(TypeError, match="query"):
        gen(s.long(), h)
    with pytest.raises(ValueError, match="feature size"):
        scores.build("dot")(s, h)


def test_additive_prepared_keys_equal_plain_scores():
    from qkv import scores as S

    torch.manual_seed(0)
    score = S.build("additive", query_dim=3, key_dim=4, hidden_dim=5)
    q, k = torch.randn(2, 6, 3), torch.randn(2, 7, 4)
    prepared = score.prepare_keys(k)
    assert prepared.shape == (2, 7, 5)
    torch.testing.assert_close(score(q, k, prepared=prepared), score(q, k))
    assert S.build("dot").prepare_keys(k) is None
