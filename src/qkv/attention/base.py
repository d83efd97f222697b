"""The self-attention kernel interface shared by every registered mechanism.

A kernel sees projected heads — ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` — and
returns ``AttentionOutput(output (B, H, M, Ev), weights (B, H, M, N) or None, state or None)``.
``MultiHeadAttention`` owns projections, head split/merge and the output projection.

Conventions (design.md §2–3): boolean masks, True = may attend, broadcastable to
``(B, H, M, N)``; a 2-D mask is a key-padding mask ``(B, N)``. Queries are aligned to the end of
the keys: query ``i`` of ``M`` sits at key position ``N - M + i``. A query row whose keys are all
masked returns zeros.

Packed documents (transformers' ``DataCollatorWithFlattening``): ``forward(..., position_ids=
(B, N))`` restarting at 0 at each document of a self-attention row; every query sees only keys
of its own document, as if each document were run alone. A kernel that honours the document ids
in its own pattern sets ``packs_documents`` (softmax: a block mask; window: its band); for the
others ``forward`` runs each document alone, one call per document and row.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from .. import _checks
from ..types import AttentionOutput

__all__ = ["AttentionKernel", "normalize_mask", "clamp_knob", "documents_of", "same_document"]


def documents_of(position_ids: Tensor) -> Tensor:
    """The document index ``(B, N)`` of each token of packed rows whose ``position_ids (B, N)``
    restart at 0 at each document (the count of restarts so far)."""
    return (position_ids == 0).long().cumsum(-1)


def same_document(documents: Tensor, n_queries: int) -> Tensor:
    """``(B, 1, M, N)`` bool: query ``i`` (the last ``M = n_queries`` of the keys) and key ``j`` lie in
    one document, of ``documents (B, N)``."""
    return documents[:, None, documents.shape[-1] - n_queries:, None] == documents[:, None, None, :]


def normalize_mask(mask: Optional[Tensor], B: int, H: int, M: int, N: int, name: str = "mask") -> Optional[Tensor]:
    """Check ``mask`` and return it as a 4-D bool tensor broadcastable to ``(B, H, M, N)``.

    Accepts ``(B, N)`` (key padding), ``(B, M, N)`` or ``(B|1, H|1, M|1, N)``.
    """
    return _checks.attention_mask(name, mask, B, M, N, H=H)


def clamp_knob(value: int, low: int, high: int) -> int:
    """``value`` clipped to ``[low, high]`` (for knobs derived from a length in ``default_knobs``)."""
    return max(low, min(high, value))


def _select_away_masked(k: Tensor, v: Tensor, mask: Tensor, causal: bool = False) -> tuple[Tensor, Tensor]:
    """Zero the non-finite entries of keys/values that ``mask`` (``(B|1, H|1, M|1, n_total)``)
    hides from every query, so that a masked key has no influence at all: a weight of 0 times
    inf or NaN would be NaN. ``causal``: a query row of the mask counts only its keys at or
    before the query (queries aligned to the end of the keys), so that a key the mask hides from
    the queries after it and causality from those before it is hidden too. (Non-finite values at
    keys that only a kernel's own pattern excludes — causality alone, a window, strided columns —
    are not cleaned: they reach outputs as 0 times inf, as in PyTorch's fused attention.) Finite
    entries are kept as they are (a cache keeps the true values). On the CPU, where a look at the data costs no device sync, all-finite keys and values (their
    sum is finite only then) are returned as they are: one reduction instead of two masked copies.
    A key-padding mask names the hidden keys at the cost of a look at the mask: then only their rows
    are summed (a batch padded at a few positions no longer reads all of ``k`` and ``v``)."""
    cols = mask[..., mask.shape[-1] - k.shape[-2]:]  # (B|1, H|1, M|1, N)
    if k.device.type == "cpu" and not torch.compiler.is_compiling():  # a traced graph takes the branch-free path
        if cols.shape[-2] == 1:  # key padding: (B|1, H|1, 1, N), O(B N) to read
            hidden_rows = _per_key_head(~cols[..., 0, :], k.shape[1])
            if not bool(hidden_rows.any()):
                return k, v
            k_hidden = k.detach()[hidden_rows.expand(k.shape[:-1])]  # (count, E): only the hidden rows
            v_hidden = v.detach()[hidden_rows.expand(v.shape[:-1])]
            if math.isfinite(float(k_hidden.sum()) + float(v_hidden.sum())):
                return k, v
        elif math.isfinite(float(k.detach().sum()) + float(v.detach().sum())):
            return k, v
    if causal and cols.shape[-2] > 1:  # a key-padding row: the last query sees every key, causality hides none
        M, N = cols.shape[-2:]
        cols = cols & torch.ones(M, N, dtype=torch.bool, device=cols.device).tril(N - M)
    hidden = _per_key_head(~(cols[..., 0, :] if cols.shape[-2] == 1 else cols.any(-2)), k.shape[1]).unsqueeze(-1)  # (B|1, G|1, N, 1): masked for every query
    # elementwise, O(N E), two kernels per tensor and no branch on the data (no host-device sync on
    # accelerators): nan_to_num leaves finite entries as they are
    return tuple(torch.where(hidden, x.nan_to_num(0.0, 0.0, 0.0), x) for x in (k, v))


def _per_key_head(hidden: Tensor, G: int) -> Tensor:
    """``hidden (B|1, H|1, N)`` (a key hidden from a query head's every query) per key/value head
    ``(B|1, G|1, N)``: hidden from a group only when hidden from each of its query heads."""
    H = hidden.shape[1]
    if H in (1, G):
        return hidden
    return hidden.unflatten(1, (G, H // G)).all(2)


class AttentionKernel(nn.Module):
    """Base class of the registered self-attention kernels.

    Subclasses implement ``_attend(q, k, v, mask, state, need_weights, return_state)`` on validated
    inputs and set the capability flags below, which ``MultiHeadAttention`` and the contract tests
    read.
    """

    #: "full" (any mask broadcastable to (B, H, M, N)), "key_padding" (only (B, 1, 1, N)) or "none".
    supports_mask: ClassVar[str] = "full"
    #: continues a sequence from a returned ``state`` (causal kernels only).
    supports_state: ClassVar[bool] = False
    #: may be built with ``causal=True``.
    supports_causal: ClassVar[bool] = True
    #: must be built with ``causal=True`` (a decoder's mechanism with no bidirectional form: ``linear-window``).
    causal_only: ClassVar[bool] = False
    #: computes softmax attention exactly (approximations document their error knob).
    exact: ClassVar[bool] = True
    #: the type of the ``state`` this kernel returns and continues (``supports_state``); another
    #: type given as ``state`` raises TypeError at the boundary.
    state_type: ClassVar[Optional[type]] = None
    #: needs the sequence length at construction (e.g. Linformer's projections).
    needs_seq_len: ClassVar[bool] = False
    #: keys are the unit-normalised queries (``k`` unused) and a position attends to itself only
    #: when nothing else is available (Reformer's shared-QK attention); contract tests use a
    #: shared-QK reference for such kernels.
    shared_qk: ClassVar[bool] = False
    #: knobs under which an approximate kernel is exact (tested against the literal reference), or None.
    exact_kwargs: ClassVar[Optional[dict]] = None
    #: knobs under which a kernel that draws random numbers on every call draws the same ones each
    #: time (contract tests that compare calls, stepwise with parallel, use them), or None.
    deterministic_kwargs: ClassVar[Optional[dict]] = None
    #: the pattern's blocks sit at absolute positions (boundaries at multiples of a block or stride,
    #: not at distances from the query): a row padded in front sees other blocks than the same tokens
    #: alone, so callers with left-padded batches shift each row to its first token (the
    #: transformers bridge) or refuse them (qkv's GPT).
    anchored: ClassVar[bool] = False
    #: weights are returned only when they are computed anyway or asked for.
    registry_name: ClassVar[str] = ""
    #: applies ``dropout`` somewhere (the paper's or authors' practice); a kernel that forms no
    #: attention-weight matrix and whose authors apply none sets False and refuses ``dropout > 0``.
    applies_dropout: ClassVar[bool] = True
    #: takes keys and values with fewer heads than the queries (grouped-query attention: ``k, v
    #: (B, G, N, E)`` with ``G`` dividing ``H``, query head ``h`` reading key head ``floor(h G / H)``)
    #: and keeps its state per key/value head; ``MultiHeadAttention`` repeats them for the others.
    grouped_kv: ClassVar[bool] = False
    #: the kernel turns each query head's copy of a key head its own way (a learned per-head feature
    #: map): grouped keys are repeated to it and its state stays per query head (no heads are equal copies)
    keys_per_query_head: ClassVar[bool] = False
    #: honours packed documents (``forward(position_ids=)``) in ``_attend(..., documents=(B, N))``,
    #: the document index of each key; otherwise ``forward`` runs each document alone.
    packs_documents: ClassVar[bool] = False
    #: how ``qkv.parallel`` splits a sequence over processes: "ring", "halo", "summary", "state", "projection", "ulysses" (heads or batch rows, all-to-all) or "ulysses-batch" (whole batch rows: per-head parameters or draws).
    context_parallel: ClassVar[str] = "ulysses"
    #: why ``torch.export`` cannot trace the kernel at a dynamic sequence length (its Python computes
    #: with the length: blocks, chunks, the last one's padding), or None: it can. Refused in one line.
    static_length: ClassVar[Optional[str]] = None

    def __init__(self, *, causal: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        if causal and not self.supports_causal:
            raise ValueError(f"attention {self.registry_name!r} cannot be causal (causal=True given)")
        if not causal and self.causal_only:
            raise ValueError(f"attention {self.registry_name!r} is causal only: build it with causal=True (causal=False given)")
        self.causal = causal
        self.dropout = _checks.probability("dropout", dropout)
        if self.dropout > 0 and not self.applies_dropout:
            raise ValueError(f"attention {self.registry_name!r} forms no attention-weight matrix and its authors apply no "
                             f"dropout inside it, so dropout must be 0, got dropout={dropout!r}; regularise with the "
                             f"residual dropout of the stack instead")

    def extra_repr(self) -> str:
        return f"causal={self.causal}, dropout={self.dropout}"

    @classmethod
    def head_kwargs(cls, n_heads: int, d_head: int) -> Dict[str, Any]:
        """The constructor arguments taken from the heads' shape, for kernels with per-head
        parameters (``MultiHeadAttention`` fills them in unless given); none by default."""
        return {}

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> Dict[str, Any]:
        """Knobs that fit sequences of up to ``max_len`` positions, with the head arguments.

        What a model built with ``attention=NAME`` and no knobs gets (knobs given explicitly win),
        and the example knobs of ``qkv bench``, the contract tests and the pattern pictures: a new
        kernel states its own here and needs no table elsewhere. The base class: the head
        arguments only (for a kernel whose constructor defaults fit every length).
        """
        for name, value in (("max_len", max_len), ("n_heads", n_heads), ("d_head", d_head)):
            _checks.positive_int(name, value)
        return cls.head_kwargs(n_heads, d_head)

    @classmethod
    def knobs(cls, length: int, n_heads: int, d_head: int, given: Optional[Mapping[str, Any]] = None, *,
              image_size: Optional[Tuple[int, int]] = None, with_heads: bool = False) -> Dict[str, Any]:
        """The knobs this kernel is built with for sequences of up to ``length`` positions: its
        :meth:`default_knobs`, then the ``given`` ones (given knobs win).

        The one place the knobs are filled (the Transformer stack, the LRA encoder, ``qkv bench``,
        ``qkv viz --pattern``, the Hugging Face attention functions). ``with_heads``: keep the head
        arguments (:meth:`head_kwargs`); without, they are left out unless given, for
        ``MultiHeadAttention`` fills them from its own shape. ``image_size``: ``(H, W)`` when the
        sequence is an image in raster order; a kernel that reads images sizes its knobs by it
        (``local-2d``), the others ignore it.
        """
        defaults = cls.default_knobs(length, n_heads, d_head)
        if not with_heads:
            heads = cls.head_kwargs(n_heads, d_head)
            defaults = {k: v for k, v in defaults.items() if k not in heads}
        return {**defaults, **(given or {})}

    @classmethod
    def knob_choices(cls) -> Dict[str, Tuple[Any, ...]]:
        """Values worth trying for each knob on short sequences (up to 8 positions, heads of 1–4
        features): the property tests (tests/attention/test_kernel_properties.py) draw each knob
        from its values, independently — a combination the constructor refuses is skipped, by its
        error. None by default: the kernel is searched with its ``default_knobs`` only."""
        return {}

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Optional[Tensor] = None,
        state: Any = None,
        need_weights: bool = False,
        return_state: bool = False,
        *,
        position_ids: Optional[Tensor] = None,
    ) -> AttentionOutput:
        """Attend ``q (B, H, M, E)`` to ``k (B, H, N, E)``, ``v (B, H, N, Ev)``.

        Args:
            mask: bool, True = may attend; ``(B, N)`` key padding or broadcastable to
                ``(B, H, M, N_total)`` where ``N_total`` counts the cached keys when ``state`` is given.
                A key-padding mask may also cover every position so far, those a bounded
                ``KVCache`` dropped (its ``offset``) included: their columns go with them.
            state: what a previous call returned with ``return_state=True`` (causal kernels).
            need_weights: also return the ``(B, H, M, N)`` attention weights.
            return_state: return the state that continues the sequence.
            position_ids: ``(B, N)`` integers of packed documents in self-attention (``M = N``, no
                state): 0 starts a document; a query sees the keys of its own document only.
        """
        for name, x in (("q", q), ("k", k), ("v", v)):
            _checks.tensor(name, x, ndim=4, floating=True)
        if self.static_length is not None and torch.compiler.is_exporting() and not all(
                isinstance(n, int) for n in (q.shape[-2], k.shape[-2])):
            raise ValueError(f"attention {self.registry_name!r} cannot be exported with a dynamic sequence length: "
                             f"{self.static_length}; export it at a fixed length (one program per length)")
        B, H, M, E = q.shape
        G = k.shape[1]  # key/value heads: H, or (grouped_kv) a divisor of H
        if (k.shape[0] != B or v.shape[:2] != k.shape[:2] or H % max(G, 1)
                or (G != H and not self.grouped_kv) or (G == 0) != (H == 0)):
            groups = " (k and v may have fewer heads, dividing q's: grouped_kv)" if self.grouped_kv else ""
            raise ValueError(f"q, k and v must share (batch, heads){groups}; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                             f"v {tuple(v.shape)}")
        _checks.same("q", E, "k", k.shape[-1], "the head size (dim -1)")
        _checks.same("k", k.shape[-2], "v", v.shape[-2], "the number of keys (dim -2)")
        if not (q.dtype == k.dtype == v.dtype):
            raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        if (state is not None or return_state) and not self.supports_state:
            what = "is not causal" if not self.causal else "keeps no state"
            raise ValueError(f"attention {self.registry_name!r} {what}: state/return_state need a causal kernel "
                             f"with incremental decoding")
        if (state is not None or return_state) and not self.causal:
            raise ValueError(f"state/return_state need causal=True (attention {self.registry_name!r} was built with causal=False)")
        n_total = k.shape[-2] + self._state_length(state)  # checks the state's type
        self._validate(q, k, v, state)
        dropped = getattr(state, "offset", 0)  # positions a bounded KVCache no longer holds
        if isinstance(mask, Tensor) and mask.dim() == 2 and dropped and mask.shape[-1] == dropped + n_total:
            mask = mask[:, dropped:]  # a key-padding mask over every position so far: the cached ones' columns
        mask = normalize_mask(mask, B, H, M, n_total)
        if mask is not None:
            if self.supports_mask == "none":
                raise ValueError(f"attention {self.registry_name!r} does not support masks")
            if self.supports_mask == "key_padding" and mask.shape[-2] != 1:
                raise ValueError(f"attention {self.registry_name!r} supports only key-padding masks (B, N) or (B, 1, 1, N); "
                                 f"got a mask with {mask.shape[-2]} query rows — use causal=True or the kernel's own knobs "
                                 f"for structured patterns")
        documents = None
        if position_ids is not None:
            documents = self._documents(position_ids, q, k, state, return_state)
            if not self.packs_documents:
                return self._each_document(q, k, v, mask, need_weights, documents)
        if mask is not None:
            k, v = _select_away_masked(k, v, mask, self.causal)
        return self._attend_edges(q, k, v, mask, state, need_weights, return_state, n_total, documents)

    def _documents(self, position_ids: Any, q: Tensor, k: Tensor, state: Any, return_state: bool) -> Tensor:
        """Check ``position_ids`` of packed self-attention rows and return their document ids ``(B, N)``."""
        if not isinstance(position_ids, Tensor) or position_ids.is_floating_point() or position_ids.dtype == torch.bool:
            raise TypeError(f"position_ids must be an integer tensor (B, N), got "
                            f"{position_ids.dtype if isinstance(position_ids, Tensor) else type(position_ids).__name__}")
        B, _, M, _ = q.shape
        N = k.shape[-2]
        if tuple(position_ids.shape) != (B, N) or M != N:
            raise ValueError(f"position_ids (packed documents) must cover the keys of a self-attention row, (B, N) = "
                             f"{(B, N)} with as many queries; got position_ids {tuple(position_ids.shape)}, {M} queries")
        if state is not None or return_state:
            raise ValueError(f"position_ids (packed documents) with state/return_state: attention "
                             f"{self.registry_name!r} packs whole rows, not a sequence decoded in steps")
        return documents_of(position_ids)

    def _each_document(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], need_weights: bool,
                       documents: Tensor) -> AttentionOutput:
        """Packed rows for a kernel without ``packs_documents``: each document of each row alone
        (a call per document; the weights block-diagonal). Reads the boundaries' values, so not
        while compiling."""
        if torch.compiler.is_compiling():
            raise ValueError(f"attention {self.registry_name!r} runs packed documents one by one (it has no pattern "
                             f"that keeps them apart), which reads their boundaries: not under torch.compile")
        B, H, M, _ = q.shape
        rows, weight_rows = [], []
        for b in range(B):
            changes = (documents[b, 1:] != documents[b, :-1]).nonzero().flatten().add(1).tolist()
            bounds = [0] + changes + [M]
            outs, weights = [], []
            for s, e in zip(bounds[:-1], bounds[1:]):
                part = None
                if mask is not None:  # (B|1, H|1, M|1, N): this row's, this document's queries and keys
                    part = mask[b:b + 1] if mask.shape[0] > 1 else mask
                    part = part[:, :, s:e] if part.shape[-2] > 1 else part
                    part = part[..., s:e]
                res = self.forward(q[b:b + 1, :, s:e], k[b:b + 1, :, s:e], v[b:b + 1, :, s:e], part,
                                   need_weights=need_weights)
                outs.append(res.output)
                if need_weights:
                    weights.append(torch.nn.functional.pad(res.weights, (s, M - e)))
            rows.append(torch.cat(outs, dim=2))
            if need_weights:
                weight_rows.append(torch.cat(weights, dim=2))
        return AttentionOutput(torch.cat(rows), torch.cat(weight_rows) if need_weights else None, None)

    def _attend_edges(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], state: Any, need_weights: bool,
                      return_state: bool, n_total: int, documents: Optional[Tensor] = None) -> AttentionOutput:
        """The edge cases every kernel shares, then ``_attend``.

        * Empty inputs (no batch, head, query or key) give empty outputs: zeros ``(B, H, M, Ev)``
          (a sum over no key), zero weights, and the state unchanged when no key was added. A
          first call that asks for a state still reaches the kernel, which builds its empty state.
        * Causal: queries aligned before the first key (``M > n_total``) have no allowed key and
          return zero rows (design.md §2); the kernel sees only the others.
        """
        B, H, M, _ = q.shape
        N = k.shape[-2]
        if (B * H * M == 0 or n_total == 0) and (not return_state or (state is not None and N == 0)):
            if k.shape[1] != H:  # grouped keys: repeated to the query heads for this empty product
                k, v = k.repeat_interleave(H // max(k.shape[1], 1), dim=1), v.repeat_interleave(H // max(k.shape[1], 1), dim=1)
            out = (q @ k.transpose(-1, -2)) @ v  # (B, H, M, Ev) zeros: an empty sum, still in the graph
            weights = v.new_zeros(B, H, M, n_total) if need_weights else None
            return AttentionOutput(out, weights, state if return_state else None)
        if self.causal and M > n_total:
            lead = M - n_total  # queries at key positions < 0
            rows = mask if mask is None or mask.shape[-2] == 1 else mask[..., lead:, :]
            res = self._attend_edges(q[:, :, lead:], k, v, rows, state, need_weights, return_state, n_total, documents)
            out = torch.cat([res.output.new_zeros(B, H, lead, v.shape[-1]), res.output], dim=2)
            weights = None if res.weights is None else torch.cat(
                [res.weights.new_zeros(B, H, lead, res.weights.shape[-1]), res.weights], dim=2)
            return AttentionOutput(out, weights, res.state)
        packed = {} if documents is None else {"documents": documents}
        return self._attend(q, k, v, mask, state, need_weights, return_state, **packed)

    def pattern(self, n_queries: int, n_keys: int):
        """The ``mask_mod`` of the positions this kernel lets query ``i`` see (queries aligned to
        the end of the keys), or None when it sees every key. Exact kernels are tested against
        dense softmax attention restricted to this pattern."""
        if self.causal:
            from ..masks import causal
            return causal(offset=n_keys - n_queries)
        return None

    def gate_projections(self, d_in: int, n_heads: int, d_head: int) -> Optional[nn.Module]:
        """Hook for kernels whose state update depends on the token (GLA's decay, DeltaNet's
        ``beta``): the module that computes the call's gates from the hidden states ``x (B, N, d_in)``
        that write the keys, returning keyword tensors for the call (``{"g": ..., "beta": ...}``).
        ``MultiHeadAttention`` builds it once (a submodule: its parameters are the layer's) and passes
        its result to each kernel call. Default: None, no gates."""
        return None

    def share_across_layers(self, first: "AttentionKernel") -> None:
        """Hook called by ``TransformerStack`` on layers 2 .. N with the first layer's kernel: a kernel
        whose parameters are shared across the stack (Linformer's layerwise projection) adopts
        ``first``'s. Default: nothing is shared."""

    def _state_length(self, state: Any) -> int:
        """Number of cached key positions in ``state`` (masks cover cached + new keys); 0 for None.
        A state that is not this kernel's ``state_type`` raises TypeError."""
        if state is None:
            return 0
        if self.state_type is not None and not isinstance(state, self.state_type):
            raise TypeError(f"state must be the {self.state_type.__name__} attention {self.registry_name!r} returned, "
                            f"got {type(state).__name__}")
        return getattr(state, "length", 0)

    def _validate(self, q: Tensor, k: Tensor, v: Tensor, state: Any) -> None:
        """The kernel's own checks of its inputs (shapes it needs, its head size, ...), run by
        ``forward`` before any shortcut, so that empty inputs are checked too. Default: none."""

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], state: Any,
                need_weights: bool, return_state: bool) -> AttentionOutput:
        raise NotImplementedError  # abstract: every registered kernel implements it
