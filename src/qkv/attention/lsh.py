"""LSH attention (Kitaev, Kaiser, Levskaya 2020, "Reformer: The Efficient Transformer",
arXiv:2001.04451, §2).

Hashing by random rotations (Andoni et al. 2015): for ``b`` buckets draw ``R`` of shape
``(d, b/2)`` and set

    h(x) = argmax([x R ; -x R])

so that nearby vectors share a bucket with high probability. Shared-QK attention uses one
projection for queries and keys, with keys normalised, ``k_j = q_j / ||q_j||``, so that
``h(q_j) = h(k_j)``; scores are ``q_i . k_j / sqrt(d)``, the paper's scaled dot product (eq. 1)
with those keys. The authors' trax code and Hugging Face's port instead scale unit keys by 1,
scores ``q_i . k_j`` (trax normalises keys to length ``sqrt(d)``, then applies the usual
``1 / sqrt(d)``): ``sqrt(d)`` times sharper at the same queries; ``score_scale=1.0`` gives that.
Positions are sorted by
``(bucket, position)``, cut into chunks of ``m = bucket_size`` and every chunk attends to itself
and to the previous chunk (the authors' code: everything in those two chunks, whatever its bucket).
A position attends to itself only when nothing else is available (its score gets ``-1e5``, as in
the authors' code: ``q_i . k_i`` is the largest score and would otherwise dominate). ``n_rounds``
independent hashes give per-round outputs ``o^(r)`` and normalisers ``z^(r) = logsumexp`` of the
round's scores, combined as (eq. 4 and Appendix)

    o_i = sum_r exp(z_i^(r) - logsumexp_r z_i^(r)) o_i^(r)

which is softmax attention over the multiset of keys met in all rounds. ``dedup=True`` subtracts
``log N_ij`` (``N_ij`` = rounds in which ``j`` is in ``i``'s window) from each score so that each
key counts once: the result is softmax over the union of the rounds' windows.

Causal attention (a deviation, for exactness). Chunk boundaries in the sorted order depend on
every position, later ones included: with causal masking alone, which earlier keys share query
``i``'s chunk depends on how later tokens hash — a (small) leak from the future, and no
incremental decoding can reproduce it. Here a causal query ``i`` attends, in each round, to the
``bucket_size`` most recent positions ``j <= i`` that share its bucket (itself included): in the
sorted order these are the positions of its bucket at most ``bucket_size - 1`` places before it —
always inside its chunk or the previous one, and determined by positions ``<= i`` only. That is
the paper's ``P_i = {j : h(q_i) = h(k_j), j <= i}`` (eq. 3) restricted to a window, computed in the
same chunks; outputs never depend on later positions, and decoding one token at a time gives the
same numbers.

"The same hashing" for a growing sequence: the rotations and the number of buckets must not change
while a sequence grows. A decoding ``LSHState`` keeps the rotations drawn (or seeded) at its
first call and the number of buckets fixed then (``n_buckets`` given, or derived from the first
call's length); each cached key keeps its bucket per round. Stepwise equals parallel when the
parallel call hashes with the same rotations and bucket count (``seed`` and ``n_buckets`` given).

Randomness: ``seed=None`` draws fresh rotations from torch's global generator on every
training-mode call (the paper re-hashes every step); ``ReversibleSequence`` saves and restores that
generator to replay a layer's hashing in backward. In eval mode the rotations come from
``eval_seed`` (default 0, as transformers' ``hash_seed`` for evaluation), so that a model is a
function of its weights there: two calls, a copy and a reloaded model agree (``eval_seed=None``
draws fresh ones in eval too). ``seed=int`` fixes them in both modes (tests).

Cost: one batched ``argsort`` of ``(B, H, n_rounds, L)`` keys, gathers, and ``(m, 2m)`` score
blocks: O(n_rounds L (log L + m d)) time and O(n_rounds L m) memory — never an ``L x L`` matrix
(only ``need_weights=True`` builds one). Any length works: the sequence is padded to a multiple of
``m`` inside (padding sorts into its own bucket after every real one and is never seen). Masks:
key padding only; masked keys move to that padding bucket too, so their hashes do not shift the
chunks of the others, and chunk 0 looks back at the last chunk holding a real key (not cyclically at
chunks of padding): a padded row's real positions get exactly what the row gets alone with the same
rotations. So that padding cannot change the rotations, ``n_buckets=None`` (derived from the call's
length) is refused with a key-padding mask. A masked position is no key but still a query (as in softmax attention):
causal, it attends to the ``bucket_size`` most recent keys of its own bucket, found apart by a
binary search in the sorted order (O(K n_rounds m d) for K masked positions). ``dedup`` adds O(n_rounds^2 L m) for the round counts. A derived bucket
count above 64 is hashed as two factors (``derived_n_buckets``).

Numerics: bfloat16 inputs run in bfloat16 (the score and value products sum in float32 inside the
matmul; each round's normaliser ``z`` and the combination of the rounds are float32: ``z`` is
read off the softmax as ``max s - log max p``, which is exact to bfloat16's rounding of ``p``, not
of ``z``); float16 inputs run in float32, since their scores can pass 65504; a pair that may not attend scores
``-inf`` however large the others (a row with no allowed key gets a finite stand-in and is zeroed
afterwards, so no softmax sees a row of ``-inf``); the self penalty ``1e5`` excludes self as long as the scores stay far
below it (unit keys: ``|q_i . k_j| s <= ||q_i|| s`` for the score scale ``s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _checks
from ..registry import register
from ..types import AttentionOutput
from ._ops import matmul_dtype
from .base import AttentionKernel, clamp_knob

__all__ = ["LSHAttention", "LSHState", "LSHHashing", "hash_vectors", "draw_hashing", "derived_n_buckets",
           "SELF_PENALTY"]

#: subtracted from a position's score with itself (the authors' code uses the same constant).
SELF_PENALTY = 1e5
#: the most hash rounds: each round is a full pass of chunked attention (memory O(n_rounds L m));
#: the paper uses 1 to 8, and the error vs full attention is flat long before this.
MAX_ROUNDS = 256
#: the largest single bucket factor (``n_buckets`` or one of its factors): a factor ``f`` costs
#: ``f / 2`` rotation columns per round and head; larger counts are hashed as factors (a tuple).
MAX_BUCKET_FACTOR = 2 ** 16
#: the largest bucket count (the product of the factors): beyond ~2 L / m buckets almost every
#: bucket is empty, and bucket ids times positions must fit the sort keys.
MAX_BUCKETS = 2 ** 31


def derived_n_buckets(length: int, bucket_size: int) -> Tuple[int, ...]:
    """The bucket factors for ``n_buckets=None``: the paper's ``n_b = 2 l / m`` (§2, average bucket
    ``m / 2``) rounded up to a power of two, at least 2. Above 64 buckets it is hashed as two
    factors ``n_b = n_1 n_2`` (the authors' code does the same for large counts): hashing then costs
    O(L sqrt(n_b)) instead of O(L n_b), which would grow as L^2 / m."""
    k = max(1, math.ceil(math.log2(2 * math.ceil(length / bucket_size))))
    return (2 ** k,) if k <= 6 else (2 ** ((k + 1) // 2), 2 ** (k // 2))


@dataclass(frozen=True)
class LSHHashing:
    """The random rotations of ``n_rounds`` hashes into ``prod(factors)`` buckets.

    rotations: ``(H, d, n_rounds, sum(factors) / 2)`` float32, or None for one bucket.
    factors: bucket ``= h_1 + f_1 h_2`` with ``h_i = argmax([x R_i; -x R_i])`` over factor ``i``'s
        ``f_i / 2`` columns of ``R`` (one factor: the paper's hash).
    """

    rotations: Optional[Tensor]
    factors: Tuple[int, ...]

    @property
    def n_buckets(self) -> int:
        return math.prod(self.factors)


def draw_hashing(n_heads: int, dim: int, n_rounds: int, factors: Tuple[int, ...], *, seed: Optional[int] = None,
                 device: torch.device = torch.device("cpu")) -> LSHHashing:
    """Draw the rotations of an ``LSHHashing``.

    ``seed`` draws them from NumPy's ``default_rng(seed)`` (PCG64: the same numbers on every
    device and platform) as a constant tensor: a model traced by ``torch.export`` holds those
    numbers, where a ``torch.Generator`` made here was lifted into the exported program as state
    and drew new rotations at every call. None: from torch's global generator of ``device``
    (saved/restored by ``ReversibleSequence``).
    """
    if math.prod(factors) == 1:
        return LSHHashing(None, (1,))
    shape = (n_heads, dim, n_rounds, sum(factors) // 2)
    if seed is None:
        return LSHHashing(torch.randn(shape, device=device, dtype=torch.float32), tuple(factors))
    return LSHHashing(_seeded_rotations(seed, shape).to(device), tuple(factors))


@torch._dynamo.assume_constant_result
def _seeded_rotations(seed: int, shape: Tuple[int, ...]) -> Tensor:
    """``shape`` standard normal float32 numbers from NumPy's ``default_rng(seed)``; a constant of the
    graph under ``torch.compile`` (Dynamo cannot trace NumPy's generator: a graph break each layer)."""
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


@torch.no_grad()
def hash_vectors(x: Tensor, hashing: LSHHashing) -> Tensor:
    """``h(x) = argmax([x R ; -x R])`` per round: ``x (B, H, L, d)`` -> buckets ``(B, H, n_rounds, L)`` (long).

    One bucket: every position in bucket 0. Hashing runs in float32.
    """
    B, H, L, _ = x.shape
    if hashing.rotations is None:
        return torch.zeros(B, H, 1, L, dtype=torch.long, device=x.device)
    xR = torch.einsum("bhld,hdrk->bhrlk", x.float(), hashing.rotations)  # (B, H, R, L, sum(f) / 2)
    buckets, scale = 0, 1
    for f, part in zip(hashing.factors, xR.split([f // 2 for f in hashing.factors], dim=-1)):
        buckets = buckets + scale * torch.cat([part, -part], dim=-1).argmax(dim=-1)  # (B, H, R, L)
        scale *= f
    return buckets


@dataclass(frozen=True)
class LSHState:
    """What causal LSH attention needs to continue a sequence.

    key: ``(B, H, S, E)`` unit-length keys seen so far; value: ``(B, H, S, Ev)``.
    buckets: ``(B, H, n_rounds, S)`` each cached key's bucket in every round.
    hashing: the rotations and bucket count, fixed for the whole sequence (None until the first
        call with tokens).
    """

    key: Tensor
    value: Tensor
    buckets: Tensor
    hashing: Optional[LSHHashing]

    @property
    def length(self) -> int:
        return self.key.shape[-2]


def _flat_gather(x: Tensor, index: Tensor) -> Tensor:
    """``x (B, H, L, D)`` rows at ``index (B, H, *rest)`` (values in ``[0, L)``) -> ``(B, H, *rest, D)``.

    One ``index_select`` on the flattened rows: its backward is one ``index_add`` (a ``gather``
    would need a ``D``-times larger index tensor).
    """
    B, H, L, D = x.shape
    base = torch.arange(B * H, device=x.device).view(B, H, *([1] * (index.dim() - 2))) * L
    return x.reshape(B * H * L, D).index_select(0, (index + base).reshape(-1)).view(*index.shape, D)


def _look_back(x: Tensor, dim: int, prev: Optional[Tensor] = None) -> Tensor:
    """Chunks ``c`` followed by chunks ``c - 1`` (cyclically) along ``dim + 1``; ``dim`` indexes chunks.
    ``prev``: the chunk each one looks back at instead (``_previous_chunks``; -1: none, chunk 0 stands
    in and the caller masks it), ``x (B, H, R, C, m)`` with ``dim = 3``."""
    if x.shape[dim] == 1:
        return x  # one chunk: its "previous chunk" is itself
    if prev is None:
        return torch.cat([x, x.roll(1, dims=dim)], dim=dim + 1)
    back = x.gather(dim, prev.clamp(min=0)[..., None].expand_as(x))  # (B, H, R, C, m): the chunks looked back at
    return torch.cat([x, back], dim=dim + 1)


def _previous_chunks(bucket: Tensor, nb: int, m: int, C: int) -> Tensor:
    """The chunk each chunk looks back at, ``(B, H, R, C)`` long: ``c - 1``, and for chunk 0 the last
    chunk that holds a real key (-1: none but chunk 0 itself). ``bucket (B, H, R, Lp)``: masked keys
    and padding in bucket ``nb``, sorted after every real key. The cyclic ``C - 1`` would make a padded
    row's chunk 0 look back at chunks of padding instead of its last real keys, which the row alone sees."""
    real = (bucket < nb).sum(-1, keepdim=True)  # (B, H, R, 1)
    last = torch.div(real + m - 1, m, rounding_mode="floor") - 1  # the last chunk holding a real key
    first = torch.where(last > 0, last, torch.full_like(last, -1))
    prev = torch.arange(-1, C - 1, device=bucket.device).expand(*bucket.shape[:-1], C)  # (B, H, R, C): c - 1
    return torch.cat([first, prev[..., 1:]], dim=-1)


class _SoftmaxLSE(torch.autograd.Function):
    """Softmax over the last dim and its log-sum-exp normaliser ``z`` (fused kernels), saving only ``p``.

    Backward: ``ds = p * (dp - sum(dp * p)) + p dz`` (``dz/ds = p``): gradients reach the scores
    through both the weights and the normaliser that weighs each hash round.

    ``own > 0``: first subtract ``SELF_PENALTY`` from the diagonal of the first ``own`` key columns
    (a position and itself, shared-QK), in place: ``s`` is the caller's temporary, which nothing
    else reads, and a constant changes no gradient (done outside autograd, so that its backward
    copies no ``(.., m, W)`` tensor).
    """

    @staticmethod
    def forward(ctx, s: Tensor, own: int = 0) -> tuple[Tensor, Tensor]:
        if own:
            s[..., :own].diagonal(dim1=-2, dim2=-1).sub_(SELF_PENALTY)
        p = torch.softmax(s, dim=-1)
        ctx.save_for_backward(p)
        if s.dtype != torch.bfloat16:
            return p, torch.logsumexp(s, dim=-1)
        # bfloat16: z = s_max - log p_max in float32 (p = exp(s - z), largest where s is): its error is
        # the rounding of p (<= 2^-9 relative, ~0.002 in z), not that of a bfloat16 z (~0.02 at z ~ 5)
        return p, s.amax(dim=-1).float() - p.amax(dim=-1).float().log()

    @staticmethod
    def backward(ctx, dp: Optional[Tensor], dz: Optional[Tensor]) -> Tensor:
        (p,) = ctx.saved_tensors
        g = torch.zeros_like(p) if dp is None else torch._softmax_backward_data(dp, p, -1, p.dtype)
        return (g if dz is None else torch.addcmul(g, p, dz.unsqueeze(-1).to(p.dtype))), None


class _Sort(NamedTuple):
    """One round-batched sort of the padded positions by (bucket, position), each ``(B, H, R, Lp)``."""
    bucket: Tensor  # the bucket of each position (masked keys and padding: ``n_buckets``)
    perm: Tensor  # the position at each sorted index
    inv: Tensor  # the sorted index of each position


def _combine_rounds(o: Tensor, z: Tensor, L: int) -> tuple[Tensor, Tensor]:
    """``o_i = sum_r exp(z_i^(r) - logsumexp_r z_i^(r)) o_i^(r)`` of the unsorted ``o (B, H, R, Lp, Ev)``,
    ``z (B, H, R, Lp)``; a query with no allowed key in any round gets zeros. Returns ``out (B, H, L, Ev)``
    and the round weights ``w (B, H, R | 1, Lp)``."""
    R = z.shape[2]
    found = torch.isfinite(z).any(dim=2)  # (B, H, Lp): False where no key was allowed in any round
    if R == 1:
        w = found[:, :, None].to(z.dtype)  # one round: its softmax is the answer
        out = o[:, :, 0, :L] * w[:, :, 0, :L, None].to(o.dtype)
    else:
        w = torch.softmax(z.masked_fill(~found[:, :, None], 0.0), dim=2) * found[:, :, None]  # (B, H, R, Lp)
        out = (w[..., None].to(o.dtype) * o).sum(dim=2)[:, :, :L]  # (B, H, L, Ev)
    return out, w


def _dense_weights(p: Tensor, w: Tensor, perm_q: Tensor, pos_q: Tensor, pos_k: Tensor, extra, L: int) -> Tensor:
    """The combined weight ``w_i^(r) p_ij^(r)`` of each (i, j) pair, summed over rounds and scattered
    into a dense ``(B, H, L, L)`` matrix: the chunks' ``p (B, H, R, C, m, W)`` at ``pos_q``, ``pos_k``,
    and the masked causal queries' windows ``extra`` (see ``_masked_queries``; None without)."""
    B, H, R, C, m = pos_q.shape
    Lp = C * m
    wr = w.expand(B, H, R, Lp).gather(-1, perm_q).view(B, H, R, C, m, 1)  # round weights in sorted order
    pair = (p * wr).reshape(B, H, -1)
    index = (pos_q[..., :, None] * Lp + pos_k[..., None, :]).reshape(B, H, -1)
    dense = pair.new_zeros(B, H, Lp * Lp).scatter_add_(-1, index, pair).view(B, H, Lp, Lp)
    if extra is not None:  # the masked queries' windows (see _masked_queries)
        (bi, hi, ii), p_m, pos_m = extra  # (K,) x 3, (K, R, n), (K, R, n)
        w_m = w[bi, hi, :, ii]  # (K, R)
        dense = dense.index_put((bi[:, None, None], hi[:, None, None], ii[:, None, None], pos_m),
                                p_m * w_m[..., None], accumulate=True)
    return dense[:, :, :L, :L]


@register("attention", "lsh", "reformer")
class LSHAttention(AttentionKernel):
    """LSH attention: softmax over the sorted chunks of a random-rotation hash (Kitaev et al. 2020).

    ``h(x) = argmax([xR; -xR])``; shared-QK keys ``k_j = q_j / ||q_j||``; scores ``s q_i . k_j``,
    ``s = 1 / sqrt(d)`` (``score_scale``), within each chunk of the ``(bucket, position)``-sorted
    sequence and its previous chunk; a position attends to itself only when nothing else is
    available; rounds combined by their log-sum-exp normalisers.

    Args:
        bucket_size: chunk length ``m`` (the paper: 64); a causal query sees at most ``m``
            positions of its bucket per round.
        n_rounds: independent hashes (the error against full attention falls as they grow).
        n_buckets: buckets per round: an even int (or 1: no hashing), a tuple of even factors
            hashed separately (``n_b = n_1 n_2``, cheaper for many buckets), or None: derived
            from the length (``derived_n_buckets``: ``2 L / m`` rounded up to a power of two).
        shared_qk: keys are the unit-normalised queries (``k`` is ignored; ``q`` and ``v`` must
            have the same length). False: separate sorts of queries and keys, unnormalised keys,
            no self rule (non-causal only).
        dedup: count a key met in several rounds once (subtract ``log N_ij``).
        score_scale: ``s`` of the scores ``s q_i . k_j``; None: ``1 / sqrt(d)``, the paper's scaled dot
            product. With shared-QK (unit keys) the authors' trax code and Hugging Face's port use
            ``1.0`` (the module docstring).
        seed: fixes the rotations; None draws new ones every training-mode call.
        eval_seed: the rotations' seed in eval mode when ``seed`` is None (None: new ones every call).
        causal, dropout: as every kernel (dropout on each round's weights).
    Shapes: ``q (B, H, L, E)``, ``k (B, H, L, E)``, ``v (B, H, L, Ev)`` -> ``(B, H, L, Ev)``;
    weights ``(B, H, L, L)`` only when asked (built densely). Masks: key padding ``(B, L)``.
    Incremental decoding (causal): ``LSHState``; O(S) per new token, as a KV cache.
    Cost: O(n_rounds L (log L + m E)) time, O(n_rounds L m) memory.
    """

    supports_mask = "key_padding"
    supports_state = True
    state_type = LSHState
    exact = False
    context_parallel = "ulysses-batch"  # qkv.parallel: rotations drawn per head, so whole batch rows per rank
    static_length = "its sorted positions are cut into chunks of bucket_size, in numbers of the length"
    #: with one bucket and one chunk covering the sequence this is exact shared-QK attention.
    exact_kwargs: ClassVar[dict] = {"n_buckets": 1, "bucket_size": 1 << 20}
    deterministic_kwargs: ClassVar[dict] = {"seed": 0}  # seed=None draws new rotations on every call

    def __init__(self, *, causal: bool = False, dropout: float = 0.0, bucket_size: int = 64, n_rounds: int = 1,
                 n_buckets: Union[int, Tuple[int, ...], None] = None, shared_qk: bool = True, dedup: bool = False,
                 score_scale: Optional[float] = None, seed: Optional[int] = None,
                 eval_seed: Optional[int] = 0) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.bucket_size = _checks.positive_int("bucket_size", bucket_size)
        self.n_rounds = _checks.positive_int("n_rounds", n_rounds)
        if self.n_rounds > MAX_ROUNDS:
            raise ValueError(f"n_rounds must be at most {MAX_ROUNDS} (each hash round is one more full pass of "
                             f"chunked attention; the paper uses 1 to 8), got n_rounds={n_rounds!r}")
        self.factors = None if n_buckets is None else self._check_buckets(n_buckets)
        self.n_buckets = n_buckets
        for name, flag in (("shared_qk", shared_qk), ("dedup", dedup)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        if causal and not shared_qk:
            raise ValueError("shared_qk=False is supported only with causal=False: separately sorted queries and "
                             "keys do not line up in chunks, so no causal window can be kept exact")
        self.shared_qk = shared_qk
        self.dedup = dedup
        if score_scale is not None:
            if isinstance(score_scale, bool) or not isinstance(score_scale, (int, float)) or not (
                    math.isfinite(score_scale) and score_scale > 0):
                raise ValueError(f"score_scale must be a positive finite number or None (1 / sqrt(d)), got {score_scale!r}")
            score_scale = float(score_scale)
        self.score_scale = score_scale
        for name, value in (("seed", seed), ("eval_seed", eval_seed)):
            if value is not None:
                _checks.positive_int(name, value, allow_zero=True)
        self.seed, self.eval_seed = seed, eval_seed

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """Chunks of ``bucket_size = max_len / 4`` in ``[1, 64]`` (the paper's 64 from 256 positions on)
        and the paper's ``n_b = 2 max_len / bucket_size`` buckets, fixed for the model (``derived_n_buckets``):
        shorter sequences hash the same way, so decoding continues the hashing of a full pass."""
        bucket_size = clamp_knob(max_len // 4, 1, 64)
        return {**super().default_knobs(max_len, n_heads, d_head), "bucket_size": bucket_size,
                "n_buckets": derived_n_buckets(max_len, bucket_size)}

    @classmethod
    def knob_choices(cls) -> dict:
        """A fixed bucket count only: ``n_buckets=None`` derives it from each call's length, so a
        sequence fed in pieces hashes differently from one pass (the module docstring)."""
        return {"bucket_size": (1, 2, 3, 4), "n_rounds": (1, 2), "n_buckets": (1, 2, 4, (2, 2)),
                "shared_qk": (False, True), "dedup": (False, True), "score_scale": (None, 1.0, 0.5),
                "seed": (0, 1, 2, 3)}

    @staticmethod
    def _check_buckets(n_buckets) -> Tuple[int, ...]:
        factors = tuple(n_buckets) if isinstance(n_buckets, (tuple, list)) else (n_buckets,)
        if not factors:
            raise ValueError("n_buckets must be an int, a non-empty tuple of ints or None, got ()")
        for f in factors:
            _checks.positive_int("n_buckets", f)
        if factors != (1,) and any(f % 2 for f in factors):
            raise ValueError(f"n_buckets must be even (argmax over [xR; -xR]) or 1, got {n_buckets}")
        if max(factors) > MAX_BUCKET_FACTOR:
            raise ValueError(f"n_buckets: a bucket factor is at most {MAX_BUCKET_FACTOR} (f / 2 rotation columns per "
                             f"round and head); hash a larger count as factors, e.g. n_buckets=(256, 256), got {n_buckets}")
        if math.prod(factors) > MAX_BUCKETS:
            raise ValueError(f"n_buckets must be at most {MAX_BUCKETS} buckets in all (the paper: about 2 L / bucket_size), "
                             f"got {n_buckets} = {math.prod(factors)}")
        return factors

    def extra_repr(self) -> str:
        return (f"bucket_size={self.bucket_size}, n_rounds={self.n_rounds}, n_buckets={self.n_buckets}, "
                f"shared_qk={self.shared_qk}, dedup={self.dedup}, score_scale={self.score_scale}, seed={self.seed}, "
                f"eval_seed={self.eval_seed}, "
                f"{super().extra_repr()}")

    def scale(self, dim: int) -> float:
        """The scores' factor ``s`` for head size ``dim``: ``score_scale``, or ``1 / sqrt(dim)``."""
        return self.score_scale if self.score_scale is not None else 1.0 / math.sqrt(dim)

    def hashing(self, n_heads: int, dim: int, length: int, device: torch.device) -> LSHHashing:
        """The rotations for a call on ``length`` positions (seeded — ``seed``, or ``eval_seed`` in eval
        mode — or drawn now; see ``draw_hashing``)."""
        factors = self.factors if self.factors is not None else derived_n_buckets(length, self.bucket_size)
        seed = self.seed if self.seed is not None or self.training else self.eval_seed
        return draw_hashing(n_heads, dim, self.n_rounds, factors, seed=seed, device=device)

    # ------------------------------------------------------------------------------------------

    def _validate(self, q, k, v, state):
        M = q.shape[-2]
        if self.causal and M > k.shape[-2] and state is None:
            return  # queries before the first key: zero rows (AttentionKernel), the rest M == N
        if self.shared_qk and state is None and k.shape[-2] != M:
            raise ValueError(f"shared-QK LSH attention uses the queries as keys: q and k must have the same length, "
                             f"got {M} and {k.shape[-2]} (use shared_qk=False for other keys)")
        if not self.shared_qk and k.shape[-2] != M:
            raise ValueError(f"LSH attention sorts queries and keys into aligned chunks: q and k must have the same "
                             f"length, got {M} and {k.shape[-2]}")

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        B, H, M, E = q.shape
        out_dtype = v.dtype
        work = matmul_dtype(q.dtype)  # float16 -> float32 (scores can pass 65504); bfloat16 stays (Numerics)
        q, k, v = q.to(work), k.to(work), v.to(work)
        key_mask = None if mask is None else mask[:, :, 0, :].expand(B, H, -1)  # (B, H, N_total)
        if state is not None and not isinstance(state, LSHState):
            raise TypeError(f"state must be an LSHState returned by this kernel, got {type(state).__name__}")
        if state is not None and state.hashing is None:
            state = None  # the state of an empty first call: nothing is hashed yet
        if state is not None:
            if state.key.shape[:2] != (B, H) or state.key.shape[-1] != E or state.value.shape[-1] != v.shape[-1]:
                raise ValueError(f"state holds keys {tuple(state.key.shape)} and values {tuple(state.value.shape)}, "
                                 f"incompatible with q {tuple(q.shape)} and v {tuple(v.shape)}")
            out, weights, new_state = self._attend_cached(q, v, key_mask, state, need_weights)
        else:
            if M == 0:  # a first call with no token: an empty state, hashed at the first real call
                empty = LSHState(q.new_zeros(B, H, 0, E), v.new_zeros(B, H, 0, v.shape[-1]),
                                 torch.zeros(B, H, self.n_rounds, 0, dtype=torch.long, device=q.device), None)
                return AttentionOutput(v.new_zeros(B, H, 0, v.shape[-1]).to(out_dtype),
                                       v.new_zeros(B, H, 0, 0).to(out_dtype) if need_weights else None,
                                       empty if return_state else None)
            if self.factors is None and key_mask is not None:
                # the count derived from this call's length (padding included) would hash a row's real
                # tokens otherwise than the row alone: padding would change their buckets
                raise ValueError(f"lsh with n_buckets=None derives the bucket count from each call's length, so a "
                                 f"key-padding mask's padding would change how the real tokens hash; give n_buckets "
                                 f"(e.g. {derived_n_buckets(M, self.bucket_size)}, what this length derives; "
                                 f"models fix it from max_len)")
            hashing = self.hashing(H, E, M, q.device)
            out, weights, buckets = self.attend_chunked(q, k, v, key_mask, hashing, need_weights)
            new_state = LSHState(self._unit(q), v, buckets, hashing) if return_state else None
        return AttentionOutput(out.to(out_dtype), None if weights is None else weights.to(out_dtype),
                               new_state if return_state else None)

    @staticmethod
    def _unit(x: Tensor, scale: float = 1.0) -> Tensor:
        """``x / (scale ||x||)`` (a zero vector stays zero)."""
        return x / (x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny ** 0.5) * scale)

    # ------------------------------------------------------------------------------------------
    # The parallel path: sort, chunk, attend within the chunk and the previous one, unsort.

    def attend_chunked(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], hashing: LSHHashing,
                       need_weights: bool = False) -> tuple[Tensor, Optional[Tensor], Tensor]:
        """LSH attention of ``q, k (B, H, L, E)``, ``v (B, H, L, Ev)`` with the given hashing;
        ``key_mask (B, H, L)`` or None. Returns ``(out (B, H, L, Ev), weights or None, buckets (B, H, R, L))``."""
        B, H, L, E = q.shape
        m = min(self.bucket_size, L)  # chunk length; one chunk when the sequence is shorter
        C = -(-L // m)  # chunks per round
        Lp = C * m  # padded length
        pad = Lp - L

        # h(x) = argmax([xR; -xR]) per round; sort by (h, position), masked keys and padding last
        raw_q, sort_q, sort_k = self._hash_and_sort(q, k, key_mask, hashing, Lp)

        # keys carry the scale s of the scores (one multiply of an L x E tensor, not of L x W scores),
        # normalised before the sort (once per position, not once per round)
        scale = self.scale(E)
        keys = self._unit(q, scale=1.0 / scale) if self.shared_qk else k * scale  # k_j = q_j / ||q_j||
        qp, keys, vp = (F.pad(t, (0, 0, 0, pad)) if pad else t for t in (q, keys, v))  # (B, H, Lp, .)

        # each round r, in sorted chunks that see their predecessor (eq. 3, P_i^(r) = i's window):
        #   o_i^(r) = sum_{j in P_i^(r)} exp(s q_i . k_j - z_i^(r)) v_j,  z_i^(r) = logsumexp_{j in P_i^(r)} s q_i . k_j
        p, o, z, pos_q, pos_k = self._chunk_attention(qp, keys, vp, sort_q, sort_k, hashing.n_buckets, m, C,
                                                      maybe_masked=pad > 0 or key_mask is not None)

        # undo the sort; causal queries at masked positions get their windows apart
        R, Ev = raw_q.shape[2], v.shape[-1]
        o = _flat_gather(o.reshape(B, H * R, Lp, Ev), sort_q.inv.view(B, H * R, Lp)).view(B, H, R, Lp, Ev)
        z = z.view(B, H, R, Lp).gather(-1, sort_q.inv)  # (B, H, R, Lp)
        extra = None
        if self.causal and key_mask is not None and (torch.compiler.is_compiling() or not bool(key_mask.all())):
            o, z, extra = self._masked_queries(q, raw_q, key_mask, o, z, sort_q.bucket, sort_q.perm, keys, vp, Lp)

        # o_i = sum_r exp(z_i^(r) - logsumexp_r z_i^(r)) o_i^(r)   (eq. 4 and Appendix)
        out, w = _combine_rounds(o, z, L)
        weights = _dense_weights(p, w, sort_q.perm, pos_q, pos_k, extra, L) if need_weights else None
        return out, weights, raw_q

    def _hash_and_sort(self, q: Tensor, k: Tensor, key_mask: Optional[Tensor], hashing: LSHHashing,
                       Lp: int) -> tuple[Tensor, _Sort, _Sort]:
        """h(x) = argmax([xR; -xR]) per round, then each round's positions sorted by (bucket, position),
        padded to ``Lp``; masked keys and padding go to bucket ``n_buckets`` (sorted last). Returns the
        queries' buckets ``(B, H, R, L)`` and the queries' and keys' sorts (one sort when shared-QK)."""
        nb = hashing.n_buckets
        pad = Lp - q.shape[-2]
        raw_q = hash_vectors(q, hashing)  # (B, H, R, L)
        raw_k = raw_q if self.shared_qk else hash_vectors(k, hashing)

        def prepare(raw: Tensor) -> _Sort:
            b = raw if key_mask is None else raw.masked_fill(~key_mask[:, :, None, :], nb)
            b = F.pad(b, (0, pad), value=nb)  # (B, H, R, Lp)
            pos = torch.arange(Lp, device=q.device)
            perm = (b * Lp + pos).argsort(dim=-1)  # sort by (bucket, position): one batched argsort
            inv = torch.empty_like(perm).scatter_(-1, perm, pos.expand_as(perm))  # sorted index of each position
            return _Sort(b, perm, inv)

        sort_q = prepare(raw_q)
        sort_k = sort_q if self.shared_qk else prepare(raw_k)
        return raw_q, sort_q, sort_k

    def _chunk_attention(self, qp: Tensor, keys: Tensor, vp: Tensor, sort_q: _Sort, sort_k: _Sort, nb: int, m: int,
                         C: int, maybe_masked: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Each round's attention in sorted order, chunk by chunk, every chunk seeing itself and its
        predecessor: of ``qp, keys (B, H, Lp, E)`` (keys scaled), ``vp (B, H, Lp, Ev)``, in position order.
        ``maybe_masked``: padding or a key mask may leave a row without a key. Returns the weights
        ``p (B, H, R, C, m, W)``, the sorted outputs ``o (B, H, R, C, m, Ev)``, their normalisers
        ``z (B, H, R, C, m)``, and the positions of each chunk's queries ``(B, H, R, C, m)`` and keys ``(.., W)``."""
        B, H, R = sort_q.perm.shape[:3]
        # a key mask moves masked keys after the real ones: chunk 0 looks back at the last real chunk
        prev = _previous_chunks(sort_k.bucket, nb, m, C) if maybe_masked and C > 1 else None  # (B, H, R, C)
        pos_q = sort_q.perm.view(B, H, R, C, m)
        pos_k = _look_back(sort_k.perm.view(B, H, R, C, m), 3, prev)  # (B, H, R, C, W): each chunk's keys, W = m or 2m
        sq = _flat_gather(qp, pos_q)  # (B, H, R, C, m, E): sorted queries in chunks
        kw = _flat_gather(keys, pos_k)  # (B, H, R, C, W, E): gathered straight into the chunk and its predecessor
        vw = _flat_gather(vp, pos_k)  # (B, H, R, C, W, Ev)
        with torch.no_grad():
            allowed, dedup = self._window_mask(pos_q, pos_k, sort_q.bucket, sort_k.bucket, sort_q.perm, sort_k.perm,
                                               sort_q.inv, sort_k.inv, nb, m, C, kw.dtype, maybe_masked, prev)

        # scores s q_i . k_j within the chunk and its predecessor: -inf where a pair may not
        # attend (however large the scores), 0 on a row with no allowed key (no NaN; zeroed below)
        s = sq @ kw.transpose(-1, -2)  # (B, H, R, C, m, W)
        has_key = None  # every row has a key (itself, at least, when causal) unless padding or a mask takes them
        if allowed is not None:
            s = s.masked_fill_(~allowed, -math.inf)
            if maybe_masked:
                has_key = allowed.any(-1, keepdim=True)  # (..., m | 1, 1)
                s = s.masked_fill_(~has_key, 0.0)
        if dedup is not None:
            s = s.add_(dedup)
        # each round's softmax (B, H, R, C, m, W) and its normaliser z^(r); shared-QK: self scores -1e5,
        # on the diagonal of the chunk's own block (queries and keys share one sort)
        p, z = _SoftmaxLSE.apply(s, m if self.shared_qk else 0)
        if has_key is not None:
            p = p * has_key  # a row with no allowed key: no weight, and z = -inf
            z = z.masked_fill(~has_key[..., 0], -math.inf)
        if self.dropout and self.training:
            p = F.dropout(p, self.dropout)
        o = p @ vw  # (B, H, R, C, m, Ev)
        return p, o, z, pos_q, pos_k

    def _masked_queries(self, q: Tensor, raw_q: Tensor, key_mask: Tensor, o: Tensor, z: Tensor, b: Tensor,
                        perm: Tensor, keys: Tensor, v: Tensor, Lp: int):
        """Causal attention of the queries at masked (padding) positions, which the sort moved to the
        padding bucket: like every causal query, each attends in each round to the ``bucket_size``
        most recent keys ``j < i`` of its own bucket ``h(q_i)`` — the entries just before where
        ``(h(q_i), i)`` would sort. Their rows of ``o (B, H, R, Lp, Ev)`` and ``z (B, H, R, Lp)`` (unsorted)
        are filled in; also returns ``((b, h, i), p (K, R, n), key positions (K, R, n))`` for weights.
        ``keys``, ``v``: ``(B, H, Lp, .)`` the scaled keys and the values in position order, padded.
        Cost O(K R n E) for the K masked positions, n = ``bucket_size``."""
        B, H, R, _ = raw_q.shape
        L = q.shape[-2]
        E, Ev = keys.shape[-1], v.shape[-1]
        n = self.bucket_size
        pos = torch.arange(Lp, device=q.device)
        sorted_key = (b * Lp + pos).gather(-1, perm)  # (B, H, R, Lp) ascending: (bucket, position)
        where = (raw_q * Lp + pos[:L]).contiguous()  # (B, H, R, L): (h(q_i), i)
        insert = torch.searchsorted(sorted_key, where)  # sorted entries before (h(q_i), i)
        masked = ~key_mask[:, :, :L]  # (B, H, L)
        keep = None
        if torch.compiler.is_compiling():
            # no data-dependent shape in a traced graph: every position is computed as a masked query,
            # and its result kept where it is one (K = B H L)
            grid = torch.meshgrid(*(torch.arange(n, device=q.device) for n in masked.shape), indexing="ij")
            bi, hi, ii = (t.reshape(-1) for t in grid)
            keep = masked[bi, hi, ii]  # (K,)
        else:
            bi, hi, ii = masked.nonzero(as_tuple=True)  # (K,) each: the masked queries
        r = torch.arange(R, device=q.device)
        slots = insert[bi, hi, :, ii][..., None] - n + torch.arange(n, device=q.device)  # (K, R, n) sorted indices
        at = slots.clamp(min=0)
        K3 = (bi[:, None, None], hi[:, None, None], r[None, :, None], at)
        valid = (slots >= 0) & (b.gather(-1, perm)[K3] == raw_q[bi, hi, :, ii][..., None])  # same bucket, j < i
        key_pos = perm[K3]  # (K, R, n) positions of the window keys
        at_key = (bi[:, None, None], hi[:, None, None], key_pos)
        s = (keys[at_key] @ q[bi, hi, ii].unsqueeze(1).unsqueeze(-1)).squeeze(-1)  # (K, R, n): s q_i . k_j
        if self.dedup and R > 1:  # N_ij: rounds whose window holds j
            same = (key_pos[:, :, :, None, None] == key_pos[:, None, None, :, :]) & valid[:, None, None, :, :]
            s = s - torch.log(same.any(-1).sum(-1).clamp_min(1).to(s.dtype))
        has = valid.any(-1, keepdim=True)
        s = torch.where(valid, s, torch.where(has, -math.inf, 0.0))
        p_m = torch.softmax(s, dim=-1) * has  # (K, R, n)
        z_m = torch.logsumexp(s.to(z.dtype), dim=-1).masked_fill(~has[..., 0], -math.inf)  # (K, R)
        if self.dropout and self.training:
            p_m = F.dropout(p_m, self.dropout)
        o_m = (p_m.to(v.dtype).unsqueeze(-2) @ v[at_key]).squeeze(-2)  # (K, R, Ev)
        o, z = o.permute(0, 1, 3, 2, 4), z.permute(0, 1, 3, 2)  # (B, H, Lp, R, .)
        if keep is not None:  # every position computed: the others keep their chunked results
            o_m = torch.where(keep[:, None, None], o_m, o[bi, hi, ii])
            z_m = torch.where(keep[:, None], z_m, z[bi, hi, ii])
            p_m = p_m * keep[:, None, None]
        o = o.index_put((bi, hi, ii), o_m).permute(0, 1, 3, 2, 4)
        z = z.index_put((bi, hi, ii), z_m).permute(0, 1, 3, 2)
        return o, z, ((bi, hi, ii), p_m, key_pos)

    def _window_mask(self, pos_q, pos_k, b_q, b_k, perm_q, perm_k, inv_q, inv_k, nb, m, C, dtype,
                     maybe_masked: bool = True, prev: Optional[Tensor] = None) -> tuple[Optional[Tensor], Optional[Tensor]]:
        """Which pairs of the chunked windows may attend, bool broadcastable to ``(B, H, R, C, m, W)``
        (None: every pair), and the dedup bias ``-log N_ij`` (None without dedup); the self penalty
        is subtracted from the scores' diagonal apart (``_SoftmaxLSE``). Only what varies is
        materialised: without causality the mask is ``(B, H, R, C, 1, W)`` (masked keys), and None
        when no key can be masked (``maybe_masked`` False: no padding, no key mask). ``prev``: the chunk
        each one looks back at (``_previous_chunks``; None: ``c - 1`` cyclically)."""
        B, H, R = pos_q.shape[:3]
        dev = pos_q.device
        W = pos_k.shape[-1]
        dedup = None
        if self.dedup and R > 1:
            dedup = -torch.log(self._round_counts(pos_q, pos_k, b_q, b_k, inv_q, inv_k, m, C, prev).to(dtype))
        if not (maybe_masked or self.causal):
            return None, dedup
        bk = _look_back(b_k.gather(-1, perm_k).view(B, H, R, C, m), 3, prev)  # bucket of each window key
        allowed = (bk != nb)[..., None, :]  # (B, H, R, C, 1, W): masked keys and padding sit in bucket nb
        if prev is not None:  # a chunk with nothing to look back at (-1): its second half is no key
            allowed[..., m:] &= (prev >= 0)[..., None, None]
        if self.causal:
            # the bucket_size most recent positions of i's bucket: same bucket and at most
            # bucket_size - 1 places before i in the sorted order (then j <= i, as ties sort by
            # position); chunk 0's "previous chunk" wraps around to the end: never earlier.
            t = torch.arange(m, device=dev)
            u = torch.arange(W, device=dev)
            bq = b_q.gather(-1, perm_q).view(B, H, R, C, m)
            dist = t[:, None] - u[None, :] + 2 * m * (u[None, :] >= m)  # (m, W): i's sorted index minus j's
            window = (dist >= 0) & (dist < self.bucket_size)
            window = window.expand(C, m, W).clone()
            window[0, :, m:] = False
            allowed = (bq[..., :, None] == bk[..., None, :]).logical_and_(window).logical_and_(allowed)
        return allowed, dedup

    def _round_counts(self, pos_q, pos_k, b_q, b_k, inv_q, inv_k, m, C, prev: Optional[Tensor] = None) -> Tensor:
        """``N_ij``: in how many rounds key ``j`` is in query ``i``'s window, for each pair of the
        chunked windows ``(B, H, R, C, m, W)`` (the duplicate-attention correction); ``prev`` as
        ``_window_mask``'s (the same in every round: it depends on the key mask only)."""
        B, H, R = pos_q.shape[:3]

        def per_round(table: Tensor, pos: Tensor) -> Tensor:  # table (B, H, R', Lp), pos (B, H, ...) -> (B, H, ..., R')
            return _flat_gather(table.transpose(-1, -2).contiguous(), pos)

        sq_all = per_round(inv_q, pos_q)[..., :, None, :]  # (B, H, R, C, m, 1, R') sorted index of i in round r'
        sk_all = per_round(inv_k, pos_k)[..., None, :, :]  # (B, H, R, C, 1, W, R')
        if self.causal:
            same = per_round(b_q, pos_q)[..., :, None, :] == per_round(b_k, pos_k)[..., None, :, :]
            d = sq_all - sk_all
            inside = same & (d >= 0) & (d < self.bucket_size)
        else:
            cq, ck = sq_all // m, sk_all // m
            if prev is None:
                back = (cq - 1) % C if C > 1 else torch.full_like(cq, -1)
            else:  # chunk 0 looks back at prev[..., 0] (-1: at nothing)
                back = torch.where(cq == 0, prev[:, :, :1, :1].view(B, H, *([1] * (cq.dim() - 2))), cq - 1)
            inside = (ck == cq) | (ck == back)
        return inside.sum(-1).clamp_min(1)  # (B, H, R, C, m, W)

    # ------------------------------------------------------------------------------------------
    # The incremental path: new queries against the cache, with the same windows as above.

    def _attend_cached(self, q: Tensor, v: Tensor, key_mask: Optional[Tensor], state: LSHState, need_weights: bool):
        B, H, M, E = q.shape
        S = state.length
        N = S + M
        nb = state.hashing.n_buckets
        k_all = torch.cat([state.key.to(q.dtype), self._unit(q)], dim=-2)  # (B, H, N, E)
        v_all = torch.cat([state.value.to(v.dtype), v], dim=-2)
        raw = torch.cat([state.buckets, hash_vectors(q, state.hashing)], dim=-1)  # (B, H, R, N)
        new_state = LSHState(k_all, v_all, raw, state.hashing)
        b = raw if key_mask is None else raw.masked_fill(~key_mask[:, :, None, :], nb)  # keys: masked ones in no bucket
        i_pos = torch.arange(S, N, device=q.device)  # query positions
        j_pos = torch.arange(N, device=q.device)
        causal = j_pos[None, :] <= i_pos[:, None]  # (M, N)
        # a query's own bucket is its hash, masked or not (a masked position is no key, still a query)
        member = (raw[..., S:, None] == b[..., None, :]) & (b[..., None, :] < nb) & causal  # (B, H, R, M, N)
        # rank distance within the bucket: positions of i's bucket in (j, i]
        cnt = member.cumsum(-1)
        at_i = cnt.gather(-1, i_pos.view(1, 1, 1, M, 1).expand(B, H, cnt.shape[2], M, 1))
        window = member & (at_i - cnt < self.bucket_size)
        n_ij = window.sum(dim=2)  # (B, H, M, N) rounds in which j is in i's window
        s = (q @ k_all.transpose(-1, -2)) * self.scale(E)  # (B, H, M, N)
        s = torch.where(j_pos[None, :] == i_pos[:, None], s - SELF_PENALTY, s)
        bonus = 0.0 if self.dedup else torch.log(n_ij.clamp_min(1).to(s.dtype))  # multiset of the rounds
        has = (n_ij > 0).any(-1, keepdim=True)  # (B, H, M, 1)
        p = torch.softmax((s + bonus).masked_fill(n_ij == 0, -math.inf).masked_fill(~has, 0.0), dim=-1)  # (B, H, M, N)
        p = p * has  # no allowed key: zeros
        if self.dropout and self.training:
            p = F.dropout(p, self.dropout)
        return p @ v_all, (p if need_weights else None), new_state
