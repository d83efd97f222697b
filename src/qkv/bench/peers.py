"""``qkv bench peers``: qkv against the other maintained PyTorch attention libraries, same function, same run.

For every mechanism that another package implements, both sides get the same inputs (and, where
the function is the same, the same weights or random features), their outputs and input gradients
are compared first, and then they are timed alternately, round by round (``time_interleaved``), so
that both see the same machine load. Reported per pair and length: the median time of each side,
the ratio ``qkv / peer`` (below 1: qkv is faster) and, "per round", the median of the two sides'
ratios within each round (``common.round_ratio``: a drift of the machine's speed cancels), the
peak memory of each side and the largest output difference. Forward-only and forward + backward are measured separately.

Peers are an optional extra (``pip install -e .[peers]``); this command installs nothing. A peer
that is absent, or a qkv kernel that does not exist yet, is listed with the reason and skipped.

Pairs (``--pairs`` picks some; ``qkv bench peers --list`` prints them):

* ``mha``: ``qkv.MultiHeadAttention(attention="softmax")`` vs ``torch.nn.MultiheadAttention``
  (same weights, ``MultiHeadAttention.from_torch``);
* ``window`` / ``window-causal``: ``window`` (radius ``w``) vs ``local_attention.LocalAttention``
  (``window_size=w``, one block back (and forward), ``exact_windowsize=True``, no rotary
  embedding): the same keys ``|i - j| <= w`` (causal ``0 <= i - j <= w``);
* ``linear`` / ``linear-causal``: ``linear`` vs ``fast_transformers``' ``LinearAttention`` /
  ``CausalLinearAttention`` (its compiled CPU kernels; build it with
  ``pip install --no-build-isolation pytorch-fast-transformers``);
* ``linear-causal-fla``: causal ``linear`` vs flash-linear-attention's (``fla-core``) Triton chunk
  kernel ``fla.ops.linear_attn.chunk_linear_attn`` on the same ``elu + 1`` features
  (``normalize=True``: fla adds ``1e-10`` to the denominator; CUDA only). fla has no non-causal
  linear attention and no random-feature (FAVOR+) map, so ``linear`` and ``performer`` have no fla pair;
* ``gated-deltanet-fla-naive``, ``gla-fla-naive``, ``deltanet-fla-naive``, ``retention-fla-naive``: linear
  attention's descendants (``qkv/attention/gated_linear.py``) vs flash-linear-attention's pure-PyTorch
  references (``fla/ops/<op>/naive.py``, the CPU's only fla code; loaded by file, ``fla_naive``), the
  same inputs and gates with fla's conventions converted at the boundary (layout ``(B, L, H, E)``,
  state ``d_k x d_v``, ``g`` the log of the decay, q scaled by ``E^{-1/2}``; the delta rule's q and k
  L2-normalised on fla's side as fla's layers do): ``qkv.functional.chunk_gated_delta_rule`` vs
  ``naive_chunk_gated_delta_rule``; ``gla`` (a decay per key channel) vs ``naive_recurrent_gla`` (one
  token at a time); ``deltanet`` vs ``delta_rule_chunkwise`` (the UT transform; inputs padded to its
  chunk); causal ``retention`` vs ``naive_retention`` (the parallel form, ``(Q K^T o D) V``). The qkv
  kernels run with ``norm=False`` (fla's functions apply no head normalisation). fla's references
  compute in float32 whatever the input dtype (``delta_rule_chunkwise`` excepted);
* ``performer`` / ``performer-causal``: ``performer`` vs ``performer_pytorch.FastAttention`` with
  the same random features (performer-pytorch adds ``1e-4`` to every feature: outputs differ by
  about that much);
* ``linformer``: ``qkv.MultiHeadAttention(attention="linformer")`` vs
  ``linformer.LinformerSelfAttention`` (same weights and projections);
* ``lsh`` / ``lsh-causal``: ``lsh`` vs ``reformer_pytorch.LSHAttention`` (timing; random rotations
  are drawn independently by each side, so outputs are not compared);
* ``lsh-hf``: ``lsh`` vs the Hugging Face ``ReformerModel``'s ``LSHSelfAttention`` layer (timing);
* ``relative``: Transformer-XL ``relative`` attention vs x-transformers' ``Attention`` with a
  relative position bias and memory (timing only: not the same function).

Writes ``peers.json``, ``peers.md`` and ``peers.png`` (time vs length, log-log) into ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .._errors import UserError
from .. import functional
from ..attention import MultiHeadAttention, build_attention
from ..registry import names
from . import common

__all__ = ["PAIRS", "Pair", "Case", "add_arguments", "run", "build_case", "available", "fla_naive"]

#: lengths of the comparison (the issue's: 1,024 / 4,096 / 16,384).
LENGTHS: List[int] = [1024, 4096, 16384]
LENGTHS_QUICK: List[int] = [128, 256]


@dataclass
class Case:
    """One pair at one size: two forwards over the same inputs.

    ``qkv`` and ``peer`` each return the output tensor ``(B, H, L, E)``, ``(B, L, H, E)`` (fla's layout)
    or ``(B, L, D)``;
    ``inputs`` are the leaf tensors both read (their gradients are compared and reset);
    ``same_function``: outputs are expected to agree within ``tolerance``.
    """

    qkv: Callable[[], Tensor]
    peer: Callable[[], Tensor]
    inputs: List[Tensor]
    same_function: bool
    tolerance: float = 1e-4
    note: str = ""
    peer_reference: Optional[Callable[[], Tensor]] = None  # the peer as compared, when timing runs it otherwise


@dataclass(frozen=True)
class Pair:
    """A qkv mechanism and the peer package that implements it."""

    name: str
    kernel: str  # qkv registry name (the pair is skipped until it exists)
    package: str  # pip requirement of the peer
    module: str  # what must import for the peer to be present
    build: Callable[..., Case]  # build(L, *, B, H, E, dtype, device, seed) -> Case
    description: str
    max_length: Optional[int] = None  # longer inputs are skipped (the peer's cost there is prohibitive)
    max_length_reason: str = ""
    cuda_only: bool = False  # the peer has GPU kernels only (skipped on other devices)
    load: Optional[Callable[[], Any]] = None  # loads the peer where importing ``module`` would not (``fla_naive``)


# ---------------------------------------------------------------------------------------- helpers


def _qkv_inputs(B: int, H: int, L: int, E: int, dtype: torch.dtype, device: torch.device,
                seed: int, scale: float = 1.0) -> Tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, E, generator=g, dtype=torch.float32) * scale for _ in range(3))
    return tuple(t.to(device=device, dtype=dtype).requires_grad_() for t in (q, k, v))  # type: ignore[return-value]


def _heads_last(t: Tensor) -> Tensor:
    """``(B, H, L, E)`` -> ``(B, L, H, E)`` (fast-transformers' layout)."""
    return t.transpose(1, 2)


# ---------------------------------------------------------------------------------------- pairs


def _mha(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device, seed: int,
         causal: bool = False) -> Case:
    torch.manual_seed(seed)
    d = H * E
    theirs = nn.MultiheadAttention(d, H, batch_first=True).to(device=device, dtype=dtype)
    ours = MultiHeadAttention.from_torch(theirs).to(device=device, dtype=dtype)
    x = torch.randn(B, L, d, device=device, dtype=dtype, requires_grad=True)
    return Case(qkv=lambda: ours(x).output,
                peer=lambda: theirs(x, x, x, need_weights=False)[0],
                inputs=[x], same_function=True, tolerance=1e-4)


def _window(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device, seed: int,
            causal: bool, radius: int = 128) -> Case:
    from local_attention import LocalAttention

    w = min(radius, L)
    ours = build_attention("window", radius=w, causal=causal)
    theirs = LocalAttention(window_size=w, causal=causal, look_backward=1, look_forward=0 if causal else 1,
                            exact_windowsize=True, autopad=True, use_rotary_pos_emb=False)
    q, k, v = _qkv_inputs(B, H, L, E, dtype, device, seed)
    return Case(qkv=lambda: ours(q, k, v).output, peer=lambda: theirs(q, k, v),
                inputs=[q, k, v], same_function=True, tolerance=1e-4,
                note=f"radius {w}, local-attention window_size {w} exact")


def _linear(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device, seed: int,
            causal: bool) -> Case:
    from fast_transformers.attention import CausalLinearAttention, LinearAttention
    from fast_transformers.masking import LengthMask, TriangularCausalMask

    ours = build_attention("linear", causal=causal)
    theirs = (CausalLinearAttention if causal else LinearAttention)(E)
    q, k, v = _qkv_inputs(B, H, L, E, dtype, device, seed)
    attn_mask = TriangularCausalMask(L, device=device) if causal else _full_mask(L, device)
    lengths = LengthMask(torch.full((B,), L, dtype=torch.long, device=device), max_len=L, device=device)

    def peer() -> Tensor:
        out = theirs(_heads_last(q), _heads_last(k), _heads_last(v), attn_mask, lengths, lengths)
        return out.transpose(1, 2)  # (B, H, L, E)

    return Case(qkv=lambda: ours(q, k, v).output, peer=peer, inputs=[q, k, v], same_function=True,
                tolerance=1e-3)


def _linear_causal_fla(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device,
                       seed: int) -> Case:
    from fla.ops.linear_attn import chunk_linear_attn

    ours = build_attention("linear", causal=True)
    q, k, v = _qkv_inputs(B, H, L, E, dtype, device, seed)

    def peer() -> Tensor:
        # fla takes the features (its layers apply the map in PyTorch first, as here): (B, L, H, E)
        phi_q, phi_k = (nn.functional.elu(_heads_last(t)) + 1 for t in (q, k))
        out, _ = chunk_linear_attn(phi_q, phi_k, _heads_last(v), scale=1.0, normalize=True)
        return out.transpose(1, 2)  # (B, H, L, E)

    # float32 inputs differ by ~1.4e-3 relative (measured on an H200 at L = 300): the size of TF32
    # rounding, which Triton's dot products use for float32 by default
    return Case(qkv=lambda: ours(q, k, v).output, peer=peer, inputs=[q, k, v], same_function=True,
                tolerance=5e-3, note="elu+1 features; fla chunk_linear_attn")


def _full_mask(L: int, device: torch.device):
    from fast_transformers.masking import FullMask

    return FullMask(L, device=device)


def _performer(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device, seed: int,
               causal: bool, nb_features: int = 256) -> Case:
    import contextlib
    import io

    from performer_pytorch import FastAttention

    with contextlib.redirect_stdout(io.StringIO()):  # it prints a note about its non-CUDA causal path
        theirs = FastAttention(dim_heads=E, nb_features=nb_features, causal=causal).to(device)
    ours = build_attention("performer", causal=causal, nb_features=nb_features, d_head=E, seed=seed)
    ours.projection = theirs.projection_matrix.detach().clone().float()  # the same random features
    q, k, v = _qkv_inputs(B, H, L, E, dtype, device, seed, scale=0.5)
    module = importlib.import_module("performer_pytorch.performer_pytorch")

    def peer_without_eps() -> Tensor:
        # performer-pytorch adds eps=1e-4 to every (max-shifted) feature, a bias of its own; the
        # function compared is FAVOR+ itself, so the check runs it with eps=0.
        # Its causal path also adds eps=1e-6 to the prefix sums in the normaliser.
        original, causal_fn = module.softmax_kernel, getattr(theirs, "causal_linear_fn", None)
        module.softmax_kernel = functools.partial(original, eps=0.0)
        if causal_fn is not None:
            theirs.causal_linear_fn = functools.partial(causal_fn, eps=0.0)
        try:
            return theirs(q, k, v)
        finally:
            module.softmax_kernel = original
            if causal_fn is not None:
                theirs.causal_linear_fn = causal_fn

    return Case(qkv=lambda: ours(q, k, v).output, peer=lambda: theirs(q, k, v), inputs=[q, k, v],
                same_function=True, tolerance=1e-3, peer_reference=peer_without_eps,
                note=f"m={nb_features}, same features; compared with the peer's eps set to 0")


def _linformer(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device, seed: int,
               k: int = 256) -> Case:
    from linformer import LinformerSelfAttention

    torch.manual_seed(seed)
    d = H * E
    theirs = LinformerSelfAttention(dim=d, seq_len=L, k=k, heads=H, dim_head=E, share_kv=False).to(device, dtype)
    ours = MultiHeadAttention(d, H, "linformer", seq_len=L, k=k, sharing="headwise").to(device, dtype)
    copy_linformer(ours, theirs)
    x = torch.randn(B, L, d, device=device, dtype=dtype, requires_grad=True)
    return Case(qkv=lambda: ours(x).output, peer=lambda: theirs(x), inputs=[x], same_function=True,
                tolerance=1e-4, note=f"k={k}, headwise sharing")


def copy_linformer(ours: MultiHeadAttention, theirs: nn.Module) -> None:
    """Copy ``linformer.LinformerSelfAttention``'s weights into a qkv ``MultiHeadAttention``.

    lucidrains' layer: bias-free ``to_q``, ``to_k``, ``to_v``, ``proj_k``/``proj_v`` ``(n, k)``
    applied as ``einsum('bnd,nk->bkd')`` (one projection for all heads: the paper's headwise
    sharing), ``to_out`` with bias. qkv's ``linformer`` kernel holds ``E, F`` as ``(k, n)``.
    """
    with torch.no_grad():
        ours.q_proj.weight.copy_(theirs.to_q.weight)
        ours.k_proj.weight.copy_(theirs.to_k.weight)
        ours.v_proj.weight.copy_(theirs.to_v.weight)
        for lin in (ours.q_proj, ours.k_proj, ours.v_proj):
            if lin.bias is not None:
                lin.bias.zero_()
        ours.out_proj.weight.copy_(theirs.to_out.weight)
        ours.out_proj.bias.copy_(theirs.to_out.bias)
        kernel = ours.kernel
        kernel.E.copy_(theirs.proj_k.T.reshape(kernel.E.shape))
        kernel.F.copy_(theirs.proj_v.T.reshape(kernel.F.shape))


def _lsh(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device, seed: int,
         causal: bool, bucket_size: int = 64, n_rounds: int = 4) -> Case:
    from reformer_pytorch.reformer_pytorch import LSHAttention

    torch.manual_seed(seed)
    theirs = LSHAttention(bucket_size=bucket_size, n_hashes=n_rounds, causal=causal)
    ours = build_attention("lsh", causal=causal, bucket_size=bucket_size, n_rounds=n_rounds, seed=seed)
    q, _, v = _qkv_inputs(B, H, L, E, dtype, device, seed)
    qk = q  # shared-QK: both sides hash and attend with the queries as keys

    def peer() -> Tensor:
        out = theirs(qk.reshape(B * H, L, E), v.reshape(B * H, L, E))[0]
        return out.view(B, H, L, E)

    return Case(qkv=lambda: ours(qk, qk, v).output, peer=peer, inputs=[q, v], same_function=False,
                note=f"bucket {bucket_size}, {n_rounds} rounds; independent random rotations")


def _lsh_hf(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device, seed: int,
            bucket_size: int = 64, n_rounds: int = 4) -> Case:
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import LSHSelfAttention

    torch.manual_seed(seed)
    d = H * E
    config = ReformerConfig(hidden_size=d, num_attention_heads=H, attention_head_size=E,
                            lsh_attn_chunk_length=bucket_size, num_hashes=n_rounds,
                            num_buckets=max(2, 2 * (L // bucket_size // 2)), is_decoder=False,
                            lsh_attention_probs_dropout_prob=0.0, max_position_embeddings=L)
    theirs = LSHSelfAttention(config).to(device, dtype)
    ours = MultiHeadAttention(d, H, "lsh", bucket_size=bucket_size, n_rounds=n_rounds, seed=seed).to(device, dtype)
    x = torch.randn(B, L, d, device=device, dtype=dtype, requires_grad=True)
    return Case(qkv=lambda: ours(x).output, peer=lambda: theirs(x).hidden_states, inputs=[x], same_function=False,
                note=f"bucket {bucket_size}, {n_rounds} rounds; layers with projections (no output projection in HF's)")


def _relative(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    from x_transformers.x_transformers import Attention, RelativePositionBias

    torch.manual_seed(seed)
    d = H * E
    mem = L // 2
    theirs = Attention(d, heads=H, dim_head=E, causal=True).to(device, dtype)
    bias = RelativePositionBias(scale=E ** -0.5, causal=True, heads=H).to(device, dtype)
    ours = MultiHeadAttention(d, H, "relative", causal=True, mem_len=mem).to(device, dtype)
    x = torch.randn(B, L, d, device=device, dtype=dtype, requires_grad=True)
    m = torch.randn(B, mem, d, device=device, dtype=dtype)

    def peer() -> Tensor:
        return theirs(x, mem=m, rel_pos=bias)

    def qkv_step() -> Tensor:
        # XL's step: queries of the segment against [memory; segment] (queries aligned to the end)
        km = torch.cat([m, x], dim=1)
        return ours(x, km, km).output

    return Case(qkv=qkv_step, peer=peer, inputs=[x], same_function=False,
                note=f"memory {mem}; x-transformers' relative bias is T5's, not XL's: timing only")


# ---------------------------------------------------------------------------------------- fla's naive references


@functools.lru_cache(maxsize=None)
def fla_naive(op: str) -> ModuleType:
    """flash-linear-attention's pure-PyTorch reference of operator ``op``: ``fla/ops/<op>/naive.py`` of the
    installed ``fla-core``, loaded from its file. Importing the ``fla`` package runs its ``__init__``,
    which imports triton (absent from a CPU machine); the ``naive`` files import only torch and einops.
    Raises ModuleNotFoundError when fla-core is not installed or has no such file."""
    spec = importlib.util.find_spec("fla")  # finds the package's folder without running fla/__init__.py
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("no module named 'fla' (fla-core is not installed)")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / op / "naive.py"
    if not path.is_file():
        raise ModuleNotFoundError(f"fla-core has no reference {path}")
    file_spec = importlib.util.spec_from_file_location(f"qkv_fla_naive_{op}", path)
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _fla_l2norm(x: Tensor) -> Tensor:
    """fla's ``l2norm`` (``fla/modules/norm/l2norm.py``, Triton there), which its delta-rule layers apply
    to q and k before the kernel: ``x / sqrt(sum x^2 + 1e-6)`` over the last dim."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def _gates(B: int, H: int, L: int, E: Optional[int], dtype: torch.dtype, device: torch.device,
           seed: int) -> Tuple[Tensor, Tensor]:
    """Leaf gates ``(g, beta)``: ``g = log sigmoid(x) / 16`` (GLA's ``alpha = sigmoid(.)^{1/16}``, a slow
    decay), ``(B, H, L)`` or per key channel ``(B, H, L, E)``; ``beta = sigmoid(x)`` in (0, 1), ``(B, H, L)``."""
    gen = torch.Generator().manual_seed(seed + 1)
    g = nn.functional.logsigmoid(torch.randn(B, H, L, *([E] if E else []), generator=gen)) / 16
    beta = torch.sigmoid(torch.randn(B, H, L, generator=gen))
    return tuple(t.to(device=device, dtype=dtype).requires_grad_() for t in (g, beta))  # type: ignore[return-value]


def _gated_deltanet_fla_naive(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device,
                              seed: int) -> Case:
    naive = fla_naive("gated_delta_rule")

    def fla_layout(t: Tensor) -> Tensor:  # a leaf (B, H, L, *) -> a leaf (B, L, H, *)
        return t.detach().transpose(1, 2).contiguous().requires_grad_()

    # fla's layout for both sides: q, k, v (B, L, H, E), g and beta (B, L, H)
    q, k, v = map(fla_layout, _qkv_inputs(B, H, L, E, dtype, device, seed))
    g, beta = map(fla_layout, _gates(B, H, L, None, dtype, device, seed))

    def ours() -> Tensor:
        return functional.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]

    def peer() -> Tensor:  # fla's naive functions take normalised q and k; chunks of 64 as qkv's
        return naive.naive_chunk_gated_delta_rule(_fla_l2norm(q), _fla_l2norm(k), v, g, beta)[0]

    return Case(qkv=ours, peer=peer, inputs=[q, k, v, g, beta], same_function=True, tolerance=1e-4,
                note="qkv.functional.chunk_gated_delta_rule vs naive_chunk_gated_delta_rule, chunks of 64")


def _gla_fla_naive(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    naive = fla_naive("gla")
    ours = build_attention("gla", causal=True, norm=False)
    q, k, v = _qkv_inputs(B, H, L, E, dtype, device, seed)
    g, _ = _gates(B, H, L, E, dtype, device, seed)  # (B, H, L, E): log alpha per key channel, fla's gk

    def peer() -> Tensor:
        out, _ = naive.naive_recurrent_gla(*(_heads_last(t) for t in (q, k, v, g)))
        return out.transpose(1, 2)  # (B, H, L, E)

    return Case(qkv=lambda: ours(q, k, v, g=g).output, peer=peer, inputs=[q, k, v, g], same_function=True,
                tolerance=1e-4, note=f"chunks of {ours.chunk_size} vs naive_recurrent_gla (token by token)")


def _deltanet_fla_naive(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device,
                        seed: int) -> Case:
    naive = fla_naive("delta_rule")
    ours = build_attention("deltanet", causal=True, norm=False)
    q, k, v = _qkv_inputs(B, H, L, E, dtype, device, seed)
    _, beta = _gates(B, H, L, None, dtype, device, seed)
    C = ours.chunk_size
    pad = -L % C  # delta_rule_chunkwise takes whole chunks: zero keys and beta after the end write nothing

    acc = torch.float64 if dtype == torch.float64 else torch.float32  # it computes in its inputs' dtype

    def peer() -> Tensor:
        padded = (nn.functional.pad(t.to(acc), (0, 0, 0, pad)) for t in (_fla_l2norm(q), _fla_l2norm(k), v))
        out, _ = naive.delta_rule_chunkwise(*padded, nn.functional.pad(beta.to(acc), (0, pad)), chunk_size=C)
        return out[:, :, :L]  # (B, H, L, E): this reference takes qkv's layout

    return Case(qkv=lambda: ours(q, k, v, beta=beta).output, peer=peer, inputs=[q, k, v, beta],
                same_function=True, tolerance=1e-4, note=f"chunks of {C} vs delta_rule_chunkwise, chunks of {C}")


def _retention_fla_naive(L: int, *, B: int, H: int, E: int, dtype: torch.dtype, device: torch.device,
                         seed: int) -> Case:
    naive = fla_naive("retention")
    ours = build_attention("retention", causal=True, norm=False)
    q, k, v = _qkv_inputs(B, H, L, E, dtype, device, seed)
    # both sides: gamma_h = 1 - 2^{-5-h}, q scaled by E^{-1/2}; fla's reference takes qkv's layout
    return Case(qkv=lambda: ours(q, k, v).output, peer=lambda: naive.naive_retention(q, k, v), inputs=[q, k, v],
                same_function=True, tolerance=1e-4,
                note=f"chunks of {ours.chunk_size} vs naive_retention (the parallel form)")


PAIRS: Dict[str, Pair] = {p.name: p for p in [
    Pair("mha", "softmax", "torch", "torch", _mha,
         "qkv.MultiHeadAttention(softmax) vs torch.nn.MultiheadAttention, same weights"),
    Pair("window", "window", "local-attention==1.11.2", "local_attention",
         lambda L, **kw: _window(L, causal=False, **kw), "window vs local-attention, bidirectional"),
    Pair("window-causal", "window", "local-attention==1.11.2", "local_attention",
         lambda L, **kw: _window(L, causal=True, **kw), "causal window vs local-attention"),
    Pair("linear", "linear", "pytorch-fast-transformers==0.4.0", "fast_transformers.attention",
         lambda L, **kw: _linear(L, causal=False, **kw), "linear vs fast-transformers LinearAttention"),
    Pair("linear-causal", "linear", "pytorch-fast-transformers==0.4.0", "fast_transformers.attention",
         lambda L, **kw: _linear(L, causal=True, **kw), "causal linear vs fast-transformers CausalLinearAttention"),
    Pair("linear-causal-fla", "linear", "fla-core==0.6.0", "fla.ops.linear_attn", _linear_causal_fla,
         "causal linear vs flash-linear-attention chunk_linear_attn (Triton; CUDA only)", cuda_only=True),
    Pair("gated-deltanet-fla-naive", "gated-deltanet", "fla-core==0.6.0", "fla.ops.gated_delta_rule.naive",
         _gated_deltanet_fla_naive, "qkv.functional.chunk_gated_delta_rule vs fla's naive_chunk_gated_delta_rule "
         "(pure PyTorch)", load=functools.partial(fla_naive, "gated_delta_rule")),
    Pair("gla-fla-naive", "gla", "fla-core==0.6.0", "fla.ops.gla.naive", _gla_fla_naive,
         "causal gla vs fla's naive_recurrent_gla (pure PyTorch)", load=functools.partial(fla_naive, "gla")),
    Pair("deltanet-fla-naive", "deltanet", "fla-core==0.6.0", "fla.ops.delta_rule.naive", _deltanet_fla_naive,
         "causal deltanet vs fla's delta_rule_chunkwise (pure PyTorch)",
         load=functools.partial(fla_naive, "delta_rule")),
    Pair("retention-fla-naive", "retention", "fla-core==0.6.0", "fla.ops.retention.naive", _retention_fla_naive,
         "causal retention vs fla's naive_retention (pure PyTorch)", load=functools.partial(fla_naive, "retention"),
         max_length=8192, max_length_reason="fla's naive_retention forms (H, L, L) decays and (B, H, L, L) scores: "
         "4.3 GB each in float32 at 16,384 (H = 4), more in backward"),
    Pair("performer", "performer", "performer-pytorch==1.1.4", "performer_pytorch",
         lambda L, **kw: _performer(L, causal=False, **kw), "performer vs performer-pytorch FastAttention"),
    Pair("performer-causal", "performer", "performer-pytorch==1.1.4", "performer_pytorch",
         lambda L, **kw: _performer(L, causal=True, **kw), "causal performer vs performer-pytorch",
         max_length=4096, max_length_reason="performer-pytorch's CPU causal path keeps an (n/128, 128, m, E) "
         "tensor of prefix sums: ~4.6 GB and minutes per step at 16,384"),
    Pair("linformer", "linformer", "linformer==0.2.3", "linformer", _linformer,
         "MultiHeadAttention(linformer) vs linformer.LinformerSelfAttention, same weights"),
    Pair("lsh", "lsh", "reformer-pytorch==1.4.4", "reformer_pytorch",
         lambda L, **kw: _lsh(L, causal=False, **kw), "lsh vs reformer-pytorch LSHAttention"),
    Pair("lsh-causal", "lsh", "reformer-pytorch==1.4.4", "reformer_pytorch",
         lambda L, **kw: _lsh(L, causal=True, **kw), "causal lsh vs reformer-pytorch LSHAttention"),
    Pair("lsh-hf", "lsh", "transformers==5.23.0", "transformers", _lsh_hf,
         "MultiHeadAttention(lsh) vs Hugging Face LSHSelfAttention"),
    Pair("relative", "relative", "x-transformers==2.31.10", "x_transformers", _relative,
         "Transformer-XL relative attention vs x-transformers relative-bias attention with memory",
         max_length=4096, max_length_reason="both sides form (L, L + memory) score matrices per head: at 16,384 "
         "qkv peaks at 37 GiB and x-transformers at 27 GiB (measured on an H100), more than a 24 GiB machine has"),
]}


#: Agreement asked of a pair computed in bfloat16 / float16 (their eps: 7.8e-3 / 9.8e-4).
HALF_TOLERANCE = 5e-2


def available(pair: Pair) -> Optional[str]:
    """None when the pair can run, else the reason it cannot."""
    if pair.kernel not in names("attention"):
        return f"qkv has no '{pair.kernel}' kernel yet"
    try:
        pair.load() if pair.load is not None else importlib.import_module(pair.module)
    except Exception as e:  # an absent or broken peer is reported, never fatal
        return f"peer not importable ({type(e).__name__}: {e}); pip install '{pair.package}'"
    return None


def build_case(pair: Pair, L: int, *, B: int = 1, H: int = 4, E: int = 64, dtype: torch.dtype = torch.float32,
               device: torch.device = torch.device("cpu"), seed: int = 0) -> Case:
    """The pair's case at length ``L`` (the cross-check tests use this too)."""
    return pair.build(L, B=B, H=H, E=E, dtype=dtype, device=device, seed=seed)


def compare(case: Case, backward: bool = True) -> Dict[str, float]:
    """Largest absolute differences of the outputs (and input gradients) of the two sides, relative
    to the largest output magnitude."""
    results: Dict[str, float] = {}
    outs, grads = [], []
    for fn in (case.qkv, case.peer_reference or case.peer):
        for t in case.inputs:
            t.grad = None
        out = fn()
        outs.append(out.detach().double())  # float64 differences below float32's rounding are seen too
        if backward:
            g = torch.Generator().manual_seed(1)
            out.backward(torch.randn(out.shape, generator=g).to(out))
            grads.append([t.grad.detach().double().clone() for t in case.inputs])
    for t in case.inputs:
        t.grad = None
    scale = max(outs[1].abs().max().item(), 1e-12)
    results["max_abs_diff"] = (outs[0] - outs[1]).abs().max().item()
    results["max_rel_diff"] = results["max_abs_diff"] / scale
    if backward:
        gdiff = max(((a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)) for a, b in zip(*grads))
        results["max_rel_grad_diff"] = gdiff
    return results


def _steps(case: Case, backward: bool) -> Dict[str, Callable[[], None]]:
    grad_cache: Dict[str, Tensor] = {}

    def make(fn: Callable[[], Tensor], key: str) -> Callable[[], None]:
        def step() -> None:
            if not backward:
                with torch.no_grad():
                    fn()
                return
            for t in case.inputs:
                t.grad = None
            out = fn()
            if key not in grad_cache:
                grad_cache[key] = torch.randn_like(out)
            out.backward(grad_cache[key])
        return step

    return {"qkv": make(case.qkv, "qkv"), "peer": make(case.peer, "peer")}


# ---------------------------------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``peers`` options."""
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), metavar="PAIR",
                        help="pairs to run (default: all; absent peers are listed and skipped): " + ", ".join(PAIRS))
    parser.add_argument("--lengths", nargs="+", type=int, metavar="L",
                        help="sequence lengths (default: " + " ".join(map(str, LENGTHS)) + ")")
    parser.add_argument("--heads", type=int, default=4, help="heads H (default 4)")
    parser.add_argument("--head-dim", type=int, default=64, help="head size E (default 64)")
    parser.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="input dtype (default float32)")
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"],
                        help="forward only and/or forward + backward (default both)")
    parser.add_argument("--target-seconds", type=float, default=3.0,
                        help="time spent per measurement, both sides together (default 3)")
    parser.add_argument("--list", action="store_true", help="list the pairs and whether each can run, then exit")


def skip_reason(pair: "Pair", device: torch.device) -> Optional[str]:
    """Why ``pair`` cannot run on ``device`` (a CUDA-only peer elsewhere first, then ``available``), or None."""
    if pair.cuda_only and device.type != "cuda":
        return f"the peer runs on CUDA only (--device {device.type})"
    return available(pair)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    device = common.resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    for name, value in (("--heads", args.heads), ("--head-dim", args.head_dim), ("--batch", args.batch)):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    lengths = args.lengths or (LENGTHS_QUICK if args.quick else LENGTHS)
    common.check_lengths("--lengths", lengths)
    common.check_range("--target-seconds", args.target_seconds, 0.0)
    selected = [PAIRS[p] for p in (args.pairs or list(PAIRS))]
    skipped = {p.name: reason for p in selected if (reason := skip_reason(p, device)) is not None}
    if args.list:  # every pair, with the reason a run on this device would skip it
        listed = {p.name: skip_reason(p, device) for p in PAIRS.values()}
        for p in PAIRS.values():
            reason = listed[p.name]
            print(f"  {p.name:<24} {p.description}" + (f"  [skipped: {reason}]" if reason else "  [ready]"))
        return {"pairs": listed}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: List[Dict[str, Any]] = []
    target = args.target_seconds / (4.0 if args.quick else 1.0)
    for pair in selected:
        if pair.name in skipped:
            print(f"{pair.name}: skipped: {skipped[pair.name]}")
            continue
        for L in lengths:
            if pair.max_length is not None and L > pair.max_length:
                print(f"{pair.name}: L={L} skipped: {pair.max_length_reason}")
                skipped[f"{pair.name} at L={L}"] = pair.max_length_reason
                continue
            case = build_case(pair, L, B=args.batch, H=args.heads, E=args.head_dim, dtype=dtype, device=device,
                              seed=args.seed)
            diffs = compare(case, backward=True) if case.same_function else {}
            # The pairs' tolerances are float32's; half types round each side differently by ~ their eps.
            tolerance = max(case.tolerance, HALF_TOLERANCE) if dtype in (torch.bfloat16, torch.float16) else case.tolerance
            if case.same_function and diffs["max_rel_diff"] > tolerance:
                raise RuntimeError(f"{pair.name} at L={L}: qkv and the peer disagree (relative difference "
                                   f"{diffs['max_rel_diff']:.3g} > {tolerance}); refusing to time different functions")
            for mode in args.modes:
                steps = _steps(case, backward=(mode == "fwd+bwd"))
                timings = common.time_interleaved(steps, device, warmup=1, min_repeats=3, max_repeats=20,
                                                  target_seconds=target)
                memory = {side: common.peak_memory(step, device) for side, step in steps.items()}
                row = {"pair": pair.name, "length": L, "mode": mode,
                       "qkv_ms": timings["qkv"].median * 1e3, "peer_ms": timings["peer"].median * 1e3,
                       "ratio": timings["qkv"].median / timings["peer"].median,
                       "round_ratio": common.round_ratio(timings["qkv"], timings["peer"]),
                       "qkv_mib": memory["qkv"] / 2 ** 20, "peer_mib": memory["peer"] / 2 ** 20,
                       "repeats": len(timings["qkv"].times), "note": case.note, **diffs}
                rows.append(row)
                print(f"{pair.name:<24} L={L:<6} {mode:<8} qkv {row['qkv_ms']:9.2f} ms  peer {row['peer_ms']:9.2f} ms  "
                      f"ratio {row['ratio']:.2f}  mem {row['qkv_mib']:.1f}/{row['peer_mib']:.1f} MiB"
                      + (f"  diff {diffs['max_rel_diff']:.1e}" if diffs else ""))
            del case
    machine = common.describe_machine(device)
    versions = {p.package.split("==")[0]: _version(p.module) for p in selected if p.name not in skipped}
    results = {"machine": machine, "command": args.command_line, "date": common.now_iso(), "dtype": args.dtype,
               "shape": {"B": args.batch, "H": args.heads, "E": args.head_dim}, "rows": rows,
               "skipped": skipped, "versions": versions}
    common.write_json(out_dir / "peers.json", results)
    common.write_markdown(out_dir / "peers.md", "qkv against peer libraries", machine, args.command_line,
                          results["date"], [_table(rows, skipped, versions)])
    plotted = [r for r in rows if r["mode"] == "fwd+bwd"]
    if plotted:
        series: Dict[str, Dict[str, List[float]]] = {}
        for r in plotted:
            for side in ("qkv", "peer"):
                s = series.setdefault(f"{r['pair']} {side}", {"x": [], "ms": [], "MiB": []})
                s["x"].append(r["length"])
                s["ms"].append(r[f"{side}_ms"])
                s["MiB"].append(r[f"{side}_mib"])
        common.plot_loglog(out_dir / "peers.png", series, title="qkv vs peers, forward + backward",
                           panels=[("ms", "median time (ms)"), ("MiB", "peak memory (MiB)")], machine=machine)
    return results


def _version(module: str) -> str:
    root = module.split(".")[0]
    try:
        from importlib.metadata import packages_distributions, version

        dists = packages_distributions().get(root, [root])
        return version(dists[0])
    except Exception:
        return getattr(importlib.import_module(root), "__version__", "?")


def _table(rows: Sequence[Dict[str, Any]], skipped: Dict[str, str], versions: Dict[str, str]) -> str:
    lines = [common.markdown_table(
        ["pair", "L", "mode", "qkv ms", "peer ms", "qkv/peer", "per round", "qkv MiB", "peer MiB", "max rel diff", "note"],
        [[r["pair"], r["length"], r["mode"], f"{r['qkv_ms']:.2f}", f"{r['peer_ms']:.2f}", f"{r['ratio']:.2f}",
          f"{r['round_ratio']:.2f}", f"{r['qkv_mib']:.1f}", f"{r['peer_mib']:.1f}",
          f"{r['max_rel_diff']:.1e}" if "max_rel_diff" in r else "—", r["note"]] for r in rows])]
    if versions:
        lines.append("\nPeer versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".")
    if skipped:
        lines.append("\nSkipped: " + "; ".join(f"`{k}` ({v})" for k, v in skipped.items()) + ".")
    return "\n".join(lines)
