"""LSH attention (Kitaev et al. 2020) against literal references written with loops: the same
hashing, sorted by (bucket, position) in plain Python, chunk windows built position by position."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import qkv
from qkv.attention.lsh import LSHAttention, LSHState, derived_n_buckets, hash_vectors


def heads(B=1, H=2, L=11, E=6, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, E, generator=g, dtype=dtype) for _ in range(3))


def windows(kernel, bq, bk, L, nb, hq=None):
    """For each query ``i``: the list (one entry per round) of key sets it attends in that round.

    ``bq``/``bk``: per round lists of effective buckets (masked keys already moved to ``nb``,
    which sorts after every real bucket, as the padding does); ``hq``: the queries' own hash
    buckets (masked or not).
    Written from the definitions: sort (bucket, position), chunks of ``m``, chunk + previous chunk
    (non-causal; chunk 0's previous is the last chunk that holds a real key, none when that is chunk 0:
    a padded row sees what it sees alone); the ``bucket_size`` most recent keys ``j <= i`` of the
    query's bucket (causal; a masked position is no key but still a query, as in softmax attention)."""
    m = min(kernel.bucket_size, L)
    C = math.ceil(L / m)
    Lp = C * m
    out = [[] for _ in range(L)]
    for r in range(len(bq)):
        def ranks(b):
            padded = list(b) + [math.inf] * (Lp - L)
            order = sorted(range(Lp), key=lambda j: (padded[j], j))
            return {pos: idx for idx, pos in enumerate(order)}
        rq, rk = ranks(bq[r]), ranks(bk[r])
        nb_real = [j for j in range(L) if bk[r][j] != nb]
        for i in range(L):
            if kernel.causal:
                same = [j for j in nb_real if bk[r][j] == hq[r][i] and j <= i]
                keys = set(same[len(same) - kernel.bucket_size:] if len(same) > kernel.bucket_size else same)
            else:
                c = rq[i] // m
                last = math.ceil(len(nb_real) / m) - 1  # the last chunk holding a real key
                prev = c - 1 if c > 0 else (last if last > 0 else None)
                keys = {j for j in nb_real if rk[j] // m in {c, prev}}
            out[i].append(keys)
    return out


def literal_lsh(kernel, q, k, v, key_mask=None):
    """Reformer attention written plainly (float64, autograd through indexing only).

    For each query: the multiset of keys over all rounds (a set with ``dedup``); self dropped when
    anything else is there; softmax of ``q_i . k_j / sqrt(d)`` (or ``score_scale q_i . k_j``) with
    ``k_j = q_j / ||q_j||`` (shared QK)."""
    B, H, L, E = q.shape
    hashing = kernel.hashing(H, E, L, q.device)
    nb = hashing.n_buckets
    raw_q = hash_vectors(q, hashing)
    raw_k = raw_q if kernel.shared_qk else hash_vectors(k, hashing)
    keys = q / q.norm(dim=-1, keepdim=True) if kernel.shared_qk else k
    rows = []
    for b in range(B):
        for h in range(H):
            def eff(raw):
                return [[nb if key_mask is not None and not key_mask[b, j] else int(raw[b, h, r, j]) for j in range(L)]
                        for r in range(raw.shape[2])]
            hq = [[int(raw_q[b, h, r, j]) for j in range(L)] for r in range(raw_q.shape[2])]
            win = windows(kernel, eff(raw_q), eff(raw_k), L, nb, hq)
            for i in range(L):
                met = [j for keys_r in win[i] for j in sorted(keys_r)]
                if kernel.dedup:
                    met = sorted(set(met))
                if kernel.shared_qk:
                    others = [j for j in met if j != i]
                    met = others if others else met
                if not met:
                    rows.append(torch.zeros(v.shape[-1], dtype=v.dtype))
                    continue
                scale = 1 / math.sqrt(E) if kernel.score_scale is None else kernel.score_scale
                s = torch.stack([q[b, h, i] @ keys[b, h, j] for j in met]) * scale
                rows.append(torch.softmax(s, 0) @ v[b, h, met])
    return torch.stack(rows).view(B, H, L, -1)


CASES = [  # (L, bucket_size, n_rounds, n_buckets, causal, dedup)
    (7, 2, 3, 4, False, False),
    (13, 4, 2, 4, False, True),
    (17, 3, 4, 6, True, False),
    (13, 2, 3, 4, True, True),
    (11, 4, 1, None, False, False),
    (9, 16, 2, 2, True, False),
    (23, 2, 2, (4, 2), False, True),
    (19, 2, 3, (2, 4), True, False),
]


@pytest.mark.parametrize("L, bucket_size, n_rounds, n_buckets, causal, dedup", CASES)
def test_matches_literal_reference_of_the_same_hashing(L, bucket_size, n_rounds, n_buckets, causal, dedup):
    kernel = LSHAttention(causal=causal, bucket_size=bucket_size, n_rounds=n_rounds, n_buckets=n_buckets,
                          dedup=dedup, seed=3)
    q, k, v = heads(B=2, L=L)
    mask = torch.ones(2, L, dtype=torch.bool)
    mask[1, L - 3:] = False
    mask[0, 2] = False
    for key_mask in (None, mask):
        if n_buckets is None and key_mask is not None:  # derived from the length: padding would re-hash the tokens
            with pytest.raises(ValueError, match="n_buckets=None derives the bucket count"):
                kernel(q, k, v, mask=key_mask)
            continue
        out = kernel(q, k, v, mask=key_mask, need_weights=True)
        ref = literal_lsh(kernel, q, k, v, key_mask)
        torch.testing.assert_close(out.output, ref, atol=1e-10, rtol=1e-9)
        rows = out.weights.sum(-1)
        assert torch.allclose(rows[rows > 0], torch.ones(()).double())
        torch.testing.assert_close(out.weights @ v, out.output)


@pytest.mark.parametrize("score_scale", [1.0, 0.25])
@pytest.mark.parametrize("L, bucket_size, n_rounds, n_buckets, causal, dedup", CASES[:4])
def test_score_scale_matches_literal_reference(L, bucket_size, n_rounds, n_buckets, causal, dedup, score_scale):
    kernel = LSHAttention(causal=causal, bucket_size=bucket_size, n_rounds=n_rounds, n_buckets=n_buckets,
                          dedup=dedup, score_scale=score_scale, seed=3)
    q, k, v = heads(B=2, L=L)
    mask = torch.ones(2, L, dtype=torch.bool)
    mask[1, L - 3:] = False
    out = kernel(q, k, v, mask=mask, need_weights=True)
    torch.testing.assert_close(out.output, literal_lsh(kernel, q, k, v, mask), atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(out.weights @ v, out.output)
    default = LSHAttention(causal=causal, bucket_size=bucket_size, n_rounds=n_rounds, n_buckets=n_buckets,
                           dedup=dedup, seed=3)(q, k, v, mask=mask).output
    assert not torch.allclose(out.output, default)  # the scale changes the function


@pytest.mark.parametrize("causal", [False, True])
def test_score_scale_one_is_the_authors_code(causal):
    """trax (and Hugging Face's port) normalise shared-QK keys to length sqrt(d) (``x / rms(x)``),
    then divide by sqrt(d) as for any key: scores ``q_i . q_j / ||q_j||``, no further scaling."""
    kernel = LSHAttention(causal=causal, n_buckets=1, bucket_size=64, score_scale=1.0)
    q, _, v = heads(L=19, E=8)
    E = q.shape[-1]
    keys = q / q.pow(2).mean(-1, keepdim=True).sqrt() / math.sqrt(E)  # trax: length_normalized(k) / sqrt(d)
    s = q @ keys.transpose(-1, -2)
    allowed = torch.ones(19, 19, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    eye = torch.eye(19, dtype=torch.bool)
    allowed = torch.where((allowed & ~eye).any(-1, keepdim=True), allowed & ~eye, eye)
    ref = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v
    torch.testing.assert_close(kernel(q, q, v).output, ref)


def test_score_scale_decodes_token_by_token_as_in_parallel():
    kernel = LSHAttention(causal=True, bucket_size=3, n_rounds=2, n_buckets=4, score_scale=1.0, seed=2)
    q, _, v = heads(L=10)
    full = kernel(q, q, v).output
    state, steps = None, []
    for t in range(10):
        out = kernel(q[:, :, t:t + 1], q[:, :, t:t + 1], v[:, :, t:t + 1], state=state, return_state=True)
        state = out.state
        steps.append(out.output)
    torch.testing.assert_close(torch.cat(steps, dim=2), full, atol=1e-10, rtol=1e-9)


def test_separate_queries_and_keys_match_literal_reference():
    kernel = LSHAttention(bucket_size=3, n_rounds=3, n_buckets=4, shared_qk=False, dedup=True, seed=1)
    q, k, v = heads(L=10)
    torch.testing.assert_close(kernel(q, k, v).output, literal_lsh(kernel, q, k, v), atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dedup", [False, True])
def test_multi_round_gradients_equal_autograd_through_the_reference(causal, dedup):
    """The rounds' combination must carry gradients to every round's keys and values (the
    reformer-pytorch PR #104 bug): compare with autograd through the literal reference, and gradcheck."""
    kernel = LSHAttention(causal=causal, bucket_size=2, n_rounds=3, n_buckets=4, dedup=dedup, seed=5)
    q, k, v = (t.requires_grad_(True) for t in heads(L=9, E=4))
    mask = torch.tensor([[True] * 8 + [False]])
    g = torch.randn(1, 2, 9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad((kernel(q, k, v, mask=mask).output * g).sum(), (q, v))
    want = torch.autograd.grad((literal_lsh(kernel, q, k, v, mask) * g).sum(), (q, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)
    assert torch.autograd.gradcheck(lambda a, c: kernel(a, a, c, mask=mask).output, (q, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_rounds", [1, 4])
def test_one_bucket_one_chunk_is_shared_qk_attention_without_self(causal, n_rounds):
    kernel = LSHAttention(causal=causal, n_buckets=1, bucket_size=64, n_rounds=n_rounds)
    q, _, v = heads(L=23)
    keys = q / q.norm(dim=-1, keepdim=True)
    s = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = torch.ones(23, 23, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    eye = torch.eye(23, dtype=torch.bool)
    allowed = torch.where((allowed & ~eye).any(-1, keepdim=True), allowed & ~eye, eye)  # self only when alone
    ref = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v
    torch.testing.assert_close(kernel(q, q, v).output, ref)


def clustered(L, E, n_clusters, seed):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(1, 1, n_clusters, E, generator=g) * 3
    labels = torch.randint(n_clusters, (L,), generator=g)
    q = centres[:, :, labels] + 0.3 * torch.randn(1, 1, L, E, generator=g)
    return q.double(), torch.randn(1, 1, L, E, generator=g, dtype=torch.float64)


def test_error_against_full_attention_falls_with_rounds():
    """Clustered inputs (the regime LSH is made for): the relative error against full shared-QK
    attention without self falls as hash rounds are added."""
    L, E = 256, 16
    errors = []
    for n_rounds in (1, 2, 4, 8):
        err = 0.0
        for seed in range(3):
            q, v = clustered(L, E, 8, seed)
            full = LSHAttention(n_buckets=1, bucket_size=L)(q, q, v).output
            approx = LSHAttention(bucket_size=16, n_rounds=n_rounds, n_buckets=16, dedup=True, seed=seed)(q, q, v).output
            err += float((approx - full).norm() / full.norm())
        errors.append(err / 3)
    assert all(b < a for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.5 * errors[0], errors


@pytest.mark.parametrize("L", [1, 2, 5, 31, 97])
@pytest.mark.parametrize("causal", [False, True])
def test_odd_and_prime_lengths(L, causal):
    kernel = LSHAttention(causal=causal, bucket_size=8, n_rounds=2, seed=0)
    q, k, v = heads(B=2, L=L, dtype=torch.float32)
    out = kernel(q, k, v).output
    assert out.shape == (2, 2, L, 6) and torch.isfinite(out).all()
    if L > 1:
        torch.testing.assert_close(out.double(), literal_lsh(kernel, q.double(), k.double(), v.double()).float().double(),
                                   atol=1e-5, rtol=1e-5)


def test_empty_input_gives_empty_output():
    q, k, v = heads(L=0)
    out = LSHAttention(causal=True, seed=0)(q, k, v, need_weights=True)
    assert out.output.shape == (1, 2, 0, 6) and out.weights.shape == (1, 2, 0, 0)


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operator produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("causal", [False, True])
def test_never_builds_an_n_by_n_tensor(causal):
    L, m = 2048, 32
    kernel = LSHAttention(causal=causal, bucket_size=m, n_rounds=2, dedup=True, seed=0)
    q, k, v = (t.requires_grad_(True) for t in heads(B=1, H=1, L=L, E=8, dtype=torch.float32))
    with LargestTensor() as seen:
        kernel(q, k, v).output.sum().backward()
    assert seen.largest <= 2 * 2 * L * 2 * m, seen.largest  # rounds x L x 2m (x rounds for dedup counts)
    assert seen.largest < L * L / 4


def test_state_keeps_the_hashing_of_its_first_call():
    kernel = LSHAttention(causal=True, bucket_size=4, n_rounds=2)  # n_buckets and rotations not fixed
    q, k, v = heads(L=12)
    torch.manual_seed(0)
    first = kernel(q[:, :, :5], k[:, :, :5], v[:, :, :5], return_state=True)
    assert isinstance(first.state, LSHState) and first.state.hashing.factors == derived_n_buckets(5, 4) == (4,)
    torch.manual_seed(0)
    again = kernel(q[:, :, :5], k[:, :, :5], v[:, :, :5])
    torch.testing.assert_close(again.output, first.output)  # the same global generator state: the same rotations
    state, outs = first.state, [first.output]
    for t in range(5, 12):
        o = kernel(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], state=state, return_state=True)
        assert o.state.hashing is first.state.hashing
        state = o.state
        outs.append(o.output)
    full = kernel.attend_chunked(q, k, v, None, state.hashing)[0]  # the whole sequence, hashed the same way
    torch.testing.assert_close(torch.cat(outs, dim=2), full)


def test_unseeded_kernel_rehashes_every_call():
    kernel = LSHAttention(bucket_size=4, n_rounds=1, n_buckets=8)
    q, k, v = heads(L=32)
    assert not torch.allclose(kernel(q, k, v).output, kernel(q, k, v).output)


def test_multihead_shares_queries_and_keys():
    mha = qkv.MultiHeadAttention(16, 2, "lsh", causal=True, bucket_size=4, n_rounds=2, seed=0)
    assert mha.k_proj is None
    x = torch.randn(2, 9, 16)
    assert mha(x).output.shape == (2, 9, 16)
    with pytest.raises(ValueError, match="self-attention only"):
        mha(x, torch.randn(2, 5, 16))


def test_bad_knobs_are_named():
    with pytest.raises(ValueError, match="n_buckets must be even"):
        LSHAttention(n_buckets=3)
    with pytest.raises(ValueError, match="shared_qk=False"):
        LSHAttention(causal=True, shared_qk=False)
    with pytest.raises(TypeError, match="dedup"):
        LSHAttention(dedup=1)
    with pytest.raises(ValueError, match="bucket_size"):
        LSHAttention(bucket_size=0)
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="score_scale"):
            LSHAttention(score_scale=bad)
    q, k, v = heads(L=6)
    with pytest.raises(ValueError, match="same length"):
        LSHAttention()(q, k[:, :, :4], v[:, :, :4])
    with pytest.raises(TypeError, match="LSHState"):
        LSHAttention(causal=True)(q, k, v, state=object())
    with pytest.raises(ValueError, match="key-padding"):
        LSHAttention()(q, k, v, mask=torch.ones(1, 1, 6, 6, dtype=torch.bool))


@pytest.mark.parametrize("n_rounds,dedup", [(1, False), (3, False), (3, True)])
def test_causal_padded_queries_attend_like_any_query(n_rounds, dedup):
    """Issue 20 item 6: causal LSH with key padding zeroed the outputs at padded positions, while
    softmax and non-causal LSH attend from them. A padding position is no key but still a query:
    it attends to the bucket_size most recent keys of its own bucket, in the parallel pass and
    one token at a time alike, and no padded key reaches any output."""
    kernel = LSHAttention(causal=True, bucket_size=2, n_rounds=n_rounds, n_buckets=4, dedup=dedup, seed=1)
    q, k, v = heads(B=2, L=12)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, 8:] = False  # trailing padding
    mask[1, 3] = mask[1, 6] = False
    out = kernel(q, k, v, mask=mask, need_weights=True)
    torch.testing.assert_close(out.output, literal_lsh(kernel, q, k, v, mask), atol=1e-10, rtol=1e-9)
    assert (out.output[0, :, 8:].abs().sum(-1) > 0).any()  # padded queries see keys
    assert (out.weights[..., ~mask[0]][0] == 0).all() and (out.weights[1][..., ~mask[1]] == 0).all()
    torch.testing.assert_close(out.weights @ v, out.output)
    state, steps = None, []
    for t in range(12):
        o = kernel(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], mask=mask[:, :t + 1], state=state,
                   return_state=True)
        state = o.state
        steps.append(o.output)
    torch.testing.assert_close(torch.cat(steps, 2), out.output, atol=1e-10, rtol=1e-9)


def test_masked_keys_never_reach_an_output_however_large_the_scores():
    """A masked key scored -1e9 (finite) lost to scores of that size (separate keys of magnitude
    1e4): the row of a batch entry whose keys are all masked came out non-zero. Masked pairs now
    score -inf."""
    kernel = LSHAttention(causal=False, bucket_size=1, n_rounds=1, n_buckets=derived_n_buckets(3, 1), shared_qk=False,
                          seed=0)
    q, k, v = (x * 1e4 - 1e4 for x in heads(B=1, H=1, L=3, E=3, seed=4))
    out = kernel(q, k, v, mask=torch.zeros(1, 3, dtype=torch.bool)).output
    assert (out == 0).all()
    mask = torch.tensor([[True, False, True]])
    ref = kernel(q, k, v, mask=mask).output
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 1], v2[:, :, 1] = 1e5 * q[:, :, 0], 7.0  # the masked key, as tempting as can be
    torch.testing.assert_close(kernel(q, k2, v2, mask=mask).output, ref)


@pytest.mark.parametrize("knobs, message", [
    ({"n_rounds": 10 ** 9}, "n_rounds must be at most 256"),
    ({"n_buckets": 2 ** 40}, "hash a larger count as factors"),
    ({"n_buckets": (2 ** 16, 2 ** 16)}, "at most 2147483648 buckets"),
])
def test_absurd_knobs_are_refused_before_any_work(knobs, message):
    """Issue 20 item 5: Reformer n_rounds=1e9 / n_buckets=2**40 ended in allocation tracebacks."""
    with pytest.raises(ValueError, match=message):
        LSHAttention(**knobs)
    from qkv.models.transformer.reformer import Reformer, ReformerConfig

    reformer_knobs = {"n_rounds": knobs["n_rounds"]} if "n_rounds" in knobs else {"n_buckets": knobs["n_buckets"]}
    # the Reformer's config refuses first, from the memory the hashing would need, or the kernel does
    with pytest.raises(ValueError, match=f"{message}|LSH hashing with .* needs .* more than the"):
        Reformer(ReformerConfig(vocab_size=7, max_len=16, n_layers=1, d_model=8, n_heads=2, d_ff=16, **reformer_knobs))


class MatmulDtypes(TorchDispatchMode):
    """The (dtype, last dim) of every matrix product, and the largest float32 tensor made."""

    def __init__(self):
        super().__init__()
        self.matmuls, self.largest_float32 = set(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.mm, torch.ops.aten.baddbmm, torch.ops.aten.addmm):
            self.matmuls.add((out.dtype, out.shape[-1]))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest_float32 = max(self.largest_float32, t.numel())
        return out


@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16_runs_in_bfloat16_with_float32_normalisers(causal):
    """bfloat16 scores and values stay bfloat16 (the tensor cores' type, half the memory of float32):
    no float32 tensor larger than the per-round normalisers (B H R L) and hashes; the output is the
    float32 kernel's on the same (rounded) inputs to bfloat16's rounding."""
    L, m, R, E = 256, 32, 4, 16
    kernel = LSHAttention(causal=causal, bucket_size=m, n_rounds=R, seed=0)
    q, k, v = (t.bfloat16().requires_grad_(True) for t in heads(B=1, H=2, L=L, E=E, dtype=torch.float32))
    with MatmulDtypes() as seen:
        out = kernel(q, k, v).output
        out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and q.grad.dtype == torch.bfloat16
    hash_width = R * derived_n_buckets(L, m)[0] // 2  # x R of every round in float32, for the argmax
    # scores (last dim 2m) and the values' product (E) in bfloat16; the hash alone in float32
    assert {(torch.bfloat16, 2 * m), (torch.bfloat16, E)} <= seen.matmuls, seen.matmuls
    assert {d for d, _ in seen.matmuls} - {torch.bfloat16} <= {torch.float32}
    assert {w for d, w in seen.matmuls if d == torch.float32} <= {hash_width}, seen.matmuls
    assert seen.largest_float32 < 2 * R * L * 2 * m, seen.largest_float32  # never the (H R L 2m) scores
    ref = kernel(q.detach().float(), k.detach().float(), v.detach().float()).output
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_float16_works_in_float32():
    """float16 scores could pass 65504: its products run in float32 and the result returns to float16."""
    kernel = LSHAttention(bucket_size=8, n_rounds=2, seed=0)
    q, k, v = (t.half() for t in heads(B=1, H=1, L=64, E=8, dtype=torch.float32))
    with MatmulDtypes() as seen:
        out = kernel(100 * q, k, v).output
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert {d for d, _ in seen.matmuls} == {torch.float32}


def test_rotations_are_float32_whatever_the_default_dtype():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        kernel = LSHAttention(bucket_size=2, n_buckets=2, seed=0)
        q, _, v = heads(L=6)
        assert kernel.hashing(2, 6, 6, q.device).rotations.dtype == torch.float32
        assert kernel(q, q, v).output.dtype == torch.float64
        unseeded = LSHAttention(bucket_size=2, n_buckets=2)
        assert torch.isfinite(unseeded(q, q, v).output).all()
    finally:
        torch.set_default_dtype(before)
