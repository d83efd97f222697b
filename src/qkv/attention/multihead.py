"""Multi-head attention (Vaswani et al. 2017): projections, head split/merge and the output
projection around any registered kernel.

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O``, ``head_i = Kernel(Q W_i^Q, K W_i^K, V W_i^V)``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .. import _checks, _linear
from ..blocks.norms import RMSNorm
from ..registry import build as _build, check_kwargs, lookup
from ..rotary import RotaryEmbedding
from ..types import AttentionOutput
from ._ops import state_heads
from .base import AttentionKernel

__all__ = ["MultiHeadAttention", "build_attention"]


def build_attention(name: str, **kwargs: Any) -> AttentionKernel:
    """Build the kernel registered as ``name`` (see ``qkv.list_attention()``); unknown kwargs raise."""
    return _build("attention", name, **kwargs)


class MultiHeadAttention(nn.Module):
    """Multi-head attention around a registered kernel (Vaswani et al. 2017, §3.2.2).

    Args:
        d_model: model width; split into ``n_heads`` heads of ``d_head = d_model // n_heads``.
        n_heads: number of (query) heads (must divide ``d_model`` unless ``d_head`` is given).
        attention: a registry name (``qkv.list_attention()``) or an ``AttentionKernel`` instance.
        causal, dropout: passed to the kernel (dropout acts on the attention weights).
        bias: biases in the four projections.
        n_kv_heads: key/value heads (grouped-query attention, below; default ``n_heads``).
        d_head: the head size (default ``d_model // n_heads``); the projections map ``d_model`` to
            ``n_heads * d_head`` (queries), ``n_kv_heads * d_head`` (keys, values) and back.
        qkv_bias, out_bias: override ``bias`` for the q/k/v projections or the output projection
            (Qwen2: biases on q, k, v only).
        qk_norm: RMSNorm over each head's queries and keys (``q_norm``, ``k_norm``, one gain of
            ``d_head`` shared by the heads; Qwen3), before the rotation; ``norm_eps`` its epsilon.
        rotary: a ``qkv.rotary.RotaryEmbedding`` turning queries and keys by their positions
            (self-attention only; ``forward(..., positions=)``).
        kdim, vdim: feature sizes of ``key`` and ``value`` inputs (default ``d_model``).
        linear: the factory ``linear(in_features, out_features, bias=)`` of the four projections
            (``nn.Linear``; e.g. ``qkv.blocks.QuaternionLinear``).
        **kernel_kwargs: the kernel's own knobs (e.g. ``radius=``); a kernel with per-head
            parameters gets its ``head_kwargs(n_heads, d_head)`` filled in.

    A shared-QK kernel (``kernel.shared_qk``: Reformer's ``lsh``) gets no key projection: the
    projected queries are the keys (``k_proj`` is None) and the module does self-attention only.

    Grouped-query attention (Ainslie et al. 2023, "GQA", arXiv:2305.13245): keys and values are
    projected to ``G = n_kv_heads`` heads (``G = 1``: multi-query attention, Shazeer 2019) and
    query head ``h`` of ``H`` reads key/value head ``floor(h G / H)`` — consecutive query heads
    share one, as transformers' ``repeat_kv`` lays them out. A kernel that takes grouped keys
    (``grouped_kv``: softmax natively; linear and performer group the queries, ``_ops.grouped_attend``)
    gets them as they are and keeps its state per key/value head; any other kernel gets keys and
    values repeated to ``H`` heads right before its call, and a state it keeps is stored per
    key/value head again when it is a ``KVCache`` (the repeated keys; ``_ops.state_heads``) —
    other states (``lsh``'s, ``fixed``'s) stay per query head.

    Rotary positions and qk-norm (``rotary``, ``qk_norm``) act on the projected heads, before
    the kernel: ``q = rotate(norm(x W^Q), m)``, ``k = rotate(norm(x W^K), n)``; the keys a cache
    keeps are the rotated ones. Positions default to those after the state's (``offset`` +
    ``length``); give ``positions (M,) or (B, M)`` for others (a left-padded batch).

    Parameter mapping to ``torch.nn.MultiheadAttention``: ``in_proj_weight`` is
    ``cat([q_proj.weight, k_proj.weight, v_proj.weight])`` (and likewise ``in_proj_bias``);
    ``out_proj`` is ``out_proj``. ``MultiHeadAttention.from_torch(m)`` copies them.

    Fused input projection: with dense (``nn.Linear``) projections of equal sizes, the three
    weights (and biases) live side by side in one buffer, so that ``[Q K V] = x [W^Q W^K W^V]``
    is one matrix product for self-attention (``[K V]`` for cross-attention) read straight from
    that buffer — no copy, and the parameters and state-dict names stay ``q_proj.weight``, ... .
    Only when no gradient flows to the weights (inference, decoding): in training three products
    cost less than one whose weight is a concatenation and whose output gradient is concatenated
    back. When the buffer was undone (a parameter replaced, ``load_state_dict(assign=True)``) a
    concatenation serves, and ``.to()``, ``copy.deepcopy`` and pickling lay the weights out side
    by side again.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        attention: Union[str, AttentionKernel] = "softmax",
        *,
        causal: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        linear: Callable[..., nn.Module] = nn.Linear,
        n_kv_heads: Optional[int] = None,
        d_head: Optional[int] = None,
        qkv_bias: Optional[bool] = None,
        out_bias: Optional[bool] = None,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        rotary: Optional[nn.Module] = None,
        **kernel_kwargs: Any,
    ) -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        _checks.positive_int("n_heads", n_heads)
        if d_head is None and d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        d_head = d_model // n_heads if d_head is None else _checks.positive_int("d_head", d_head)
        n_kv_heads = n_heads if n_kv_heads is None else _checks.positive_int("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads}): each key/value head serves "
                             f"a group of n_heads / n_kv_heads query heads")
        for name, flag in (("bias", bias), ("qkv_bias", qkv_bias), ("out_bias", out_bias), ("qk_norm", qk_norm)):
            if flag is not None and not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        self.d_model, self.n_heads, self.d_head, self.n_kv_heads = d_model, n_heads, d_head, n_kv_heads
        kdim = d_model if kdim is None else _checks.positive_int("kdim", kdim)
        vdim = kdim if vdim is None else _checks.positive_int("vdim", vdim)
        in_bias = bias if qkv_bias is None else qkv_bias
        self.q_proj = linear(d_model, n_heads * d_head, bias=in_bias)
        self.k_proj = linear(kdim, n_kv_heads * d_head, bias=in_bias)
        self.v_proj = linear(vdim, n_kv_heads * d_head, bias=in_bias)
        self.out_proj = linear(n_heads * d_head, d_model, bias=bias if out_bias is None else out_bias)
        self.q_norm = self.k_norm = None
        if qk_norm:
            self.q_norm, self.k_norm = RMSNorm(d_head, eps=norm_eps), RMSNorm(d_head, eps=norm_eps)
        if rotary is not None and not isinstance(rotary, RotaryEmbedding):
            raise TypeError(f"rotary must be a qkv.rotary.RotaryEmbedding or None, got {type(rotary).__name__}")
        if rotary is not None and rotary.d_head != d_head:
            raise ValueError(f"rotary rotates heads of {rotary.d_head} features, the heads have d_head={d_head}")
        self.rotary = rotary
        if isinstance(attention, AttentionKernel):
            if kernel_kwargs:
                raise TypeError(f"kernel kwargs {sorted(kernel_kwargs)} given with a built kernel instance")
            self.kernel = attention
        elif isinstance(attention, str):
            cls = lookup("attention", attention)
            kernel_kwargs = {**cls.head_kwargs(n_heads, self.d_head), **kernel_kwargs}  # given ones win
            check_kwargs(cls, kernel_kwargs, f"attention {attention!r}")
            self.kernel = cls(causal=causal, dropout=dropout, **kernel_kwargs)
        else:
            raise TypeError(f"attention must be a registry name or an AttentionKernel, got {type(attention).__name__}")
        if self.kernel.shared_qk:
            self.k_proj = None  # shared-QK kernels (Reformer) take the queries as keys: no key projection
        # per-token gates of a kernel whose state update depends on the token (GLA, DeltaNet): computed
        # from the key input by the kernel's own projections and passed to each call (None: no gates)
        self.gates = self.kernel.gate_projections(kdim, n_heads, self.d_head)
        self._joined_in_proj: dict = {}  # number of projections -> (their parameters' key, (weight, bias) views)
        self._pack_in_proj()

    # ------------------------------------------------------------------ the fused input projection

    def _in_proj_params(self, projs: Sequence[Optional[nn.Module]]) -> Optional[tuple[list, Optional[list]]]:
        """The weights and biases (None: no biases) of ``projs`` when they fuse — dense
        (``_linear.plain_dense``), of one input size, dtype and device, with biases on all or none — else
        None. Their output sizes may differ (grouped-query attention: keys and values have fewer heads)."""
        weights, biases = [], []
        for p in projs:
            if not _linear.plain_dense(p):
                return None
            weights.append(p.weight)
            biases.append(p.bias)
        w = weights[0]
        for t in weights[1:]:
            if t.shape[1:] != w.shape[1:] or t.dtype != w.dtype or t.device != w.device:
                return None
        if biases[0] is None:
            return (weights, None) if all(b is None for b in biases) else None
        return (weights, biases) if all(b is not None for b in biases) else None

    def _pack_in_proj(self) -> None:
        """Lay ``q_proj``, ``k_proj`` and ``v_proj``'s weights (and biases) out side by side in one
        buffer each (the parameters become views of it and keep their values and names), so that
        ``_joined`` can read ``[W^Q; W^K; W^V]`` without a copy. Nothing when already packed."""
        fused = self._in_proj_params((self.q_proj, self.k_proj, self.v_proj))
        for params in fused or ():
            if params is None or _joined(params, copy=False) is not None:
                continue
            with torch.no_grad():
                buffer = torch.cat([p.detach() for p in params])  # (3 d_model, ...)
            for p, part in zip(params, buffer.split([t.shape[0] for t in params])):
                p.data = part  # the same Parameter object (optimizers keep it), its storage now the buffer's

    def _apply(self, fn, *args, **kwargs):  # .to(), .double(), .cuda(): each parameter is converted alone
        super()._apply(fn, *args, **kwargs)
        self._joined_in_proj = {}
        self._pack_in_proj()
        return self

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_joined_in_proj": {}}  # views of the parameters: found again, not copied

    def __setstate__(self, state: dict) -> None:  # copy.deepcopy and pickle copy each parameter alone
        super().__setstate__(state)
        self._joined_in_proj = {}
        self._pack_in_proj()

    def _in_proj(self, x: Tensor, projs: Sequence[Optional[nn.Module]]) -> Optional[tuple[Tensor, ...]]:
        """``x W_i^T + b_i`` for the consecutive projections ``projs`` (q, k, v or k, v) as one matrix
        product with the joined weights, split into ``(B, L, d_model)`` views; None when they do
        not fuse (``_in_proj_params``) or when their gradient is recorded.

        Only without a gradient: in training the joined weight would be a concatenation and the
        product's output gradient concatenated back, which cost more than three products (a
        Linformer layer's forward and backward 195 vs 161 ms at 4,096 positions, one CPU thread; a
        GPT training step the same within 1 %)."""
        params = []
        for p in projs:
            if not _linear.plain_dense(p):
                return None
            params += (p.weight, p.bias)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in params):
            return None
        if torch.compiler.is_compiling():
            # separate products: the joined views are found by the parameters' memory addresses
            # (data_ptr), which Dynamo cannot trace — a graph break each layer; a compiler fuses them itself
            return None
        # the joined views, found once for these parameters (same objects, storage and shape) and
        # reused: a decoding step makes this call once per layer and token
        try:
            key = [None if t is None else (id(t), t.data_ptr(), t.shape) for t in params]
        except (RuntimeError, NotImplementedError):  # no memory to look at (functorch wrappers): nothing kept
            key = None
        cached = self._joined_in_proj.get(len(projs))
        if key is not None and cached is not None and cached[0] == key:
            weight, bias = cached[1]
        else:
            fused = self._in_proj_params(projs)
            if fused is None:
                return None
            weights, biases = fused
            weight = _joined(weights)  # (n d_model, d_in)
            bias = None if biases is None else _joined(biases)  # (n d_model,)
            if key is not None and _joined(weights, copy=False) is not None and (
                    biases is None or _joined(biases, copy=False) is not None):
                self._joined_in_proj[len(projs)] = (key, (weight, bias))  # views of the parameters, not copies
        return _linear.linear(x, weight, bias).split([p.weight.shape[0] for p in projs], dim=-1)

    def _project(self, proj: nn.Module, x: Tensor) -> Tensor:
        """``proj(x)``; a plain dense layer through ``qkv._linear.linear`` (oneDNN in inference on the CPU)."""
        return _linear.linear(x, proj.weight, proj.bias) if _linear.plain_dense(proj) else proj(x)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, **kwargs: Any) -> "MultiHeadAttention":
        """A softmax ``MultiHeadAttention`` with the weights of ``torch.nn.MultiheadAttention``."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module must be torch.nn.MultiheadAttention, got {type(module).__name__}")
        if not module._qkv_same_embed_dim:
            raise ValueError("from_torch supports nn.MultiheadAttention with kdim == vdim == embed_dim")
        d = module.embed_dim
        mha = cls(d, module.num_heads, bias=module.in_proj_bias is not None, dropout=module.dropout, **kwargs)
        with torch.no_grad():
            for i, proj in enumerate((mha.q_proj, mha.k_proj, mha.v_proj)):
                proj.weight.copy_(module.in_proj_weight[i * d:(i + 1) * d])
                if module.in_proj_bias is not None:
                    proj.bias.copy_(module.in_proj_bias[i * d:(i + 1) * d])
            mha.out_proj.load_state_dict(module.out_proj.state_dict())
        return mha

    def _split(self, x: Tensor, n_heads: Optional[int] = None) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, n_heads or self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, E)

    def project_kv(self, key: Tensor, value: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """Project ``key (B, N, kdim)`` and ``value (B, N, vdim)`` (default ``key``) into key/value
        heads ``(B, G, N, E)`` each (``G = n_kv_heads``) — computed once and passed as ``kv=`` when the same memory is
        attended many times (cross-attention while decoding)."""
        if self.k_proj is None:
            raise ValueError(f"attention {self.kernel.registry_name!r} shares queries and keys (shared_qk=True): it has "
                             f"no key projection and does only self-attention")
        _checks.tensor("key", key, ndim=3, floating=True)
        value = key if value is None else _checks.tensor("value", value, ndim=3, floating=True)
        _checks.same("key", key.shape[-1], "kdim", self.k_proj.in_features, "the feature size")
        _checks.same("value", value.shape[-1], "vdim", self.v_proj.in_features, "the feature size")
        _checks.same("key", key.shape[0], "value", value.shape[0], "the batch size")
        _checks.same("key", key.shape[1], "value", value.shape[1], "the number of positions")
        _checks.same_dtype("key", key, "MultiHeadAttention.k_proj", self.k_proj.weight)
        _checks.same_dtype("value", value, "MultiHeadAttention.v_proj", self.v_proj.weight)
        kv = self._in_proj(key, (self.k_proj, self.v_proj)) if value is key else None  # [K V] = x [W^K W^V]
        G = self.n_kv_heads
        if kv is not None:
            return self._split(kv[0], G), self._split(kv[1], G)  # (B, G, N, E) each
        return self._split(self._project(self.k_proj, key), G), self._split(self._project(self.v_proj, value), G)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        mask: Optional[Tensor] = None,
        state: Any = None,
        need_weights: bool = False,
        return_state: bool = False,
        kv: Optional[tuple[Tensor, Tensor]] = None,
        positions: Optional[Tensor] = None,
        packed: Optional[Tensor] = None,
    ) -> AttentionOutput:
        """Attend ``query (B, M, d_model)`` to ``key (B, N, kdim)`` / ``value (B, N, vdim)``.

        ``key`` defaults to ``query`` (self-attention) and ``value`` to ``key``; ``kv`` gives
        already projected heads instead (see ``project_kv``). ``mask``: bool, True = may attend,
        ``(B, N)`` key padding or broadcastable to ``(B, H, M, N)``. ``positions (M,) or (B, M)``:
        the queries' (and new keys') positions for ``rotary`` (default: after the state's).
        ``packed (B, L)``: the ``position_ids`` of packed documents in self-attention (0 starts a
        document): each query sees its own document's keys only (the kernel's ``position_ids``).
        Returns ``AttentionOutput(output (B, M, d_model), weights (B, H, M, N) or None, state)``.
        """
        _checks.tensor("query", query, ndim=3, floating=True)
        _checks.same("query", query.shape[-1], "d_model", self.d_model, "the feature size")
        _checks.same_dtype("query", query, "MultiHeadAttention.q_proj", self.q_proj.weight)
        run = dict(mask=mask, state=state, need_weights=need_weights, return_state=return_state, positions=positions,
                   packed=packed)
        if self.k_proj is None:
            if kv is not None or (key is not None and key is not query):
                raise ValueError(f"attention {self.kernel.registry_name!r} shares queries and keys (shared_qk=True): "
                                 f"self-attention only, call it as mha(x)")
            v = self._split(self._project(self.v_proj, query if value is None else value), self.n_kv_heads)
            q = self._split(self._project(self.q_proj, query))  # (B, H, L, E), also the keys
            return self._attend(q, None, v, **run)
        if kv is not None:
            if key is not None or value is not None:
                raise ValueError("give either key/value or kv (projected heads), not both")
            if not (isinstance(kv, tuple) and len(kv) == 2):
                raise TypeError(f"kv must be the (k, v) pair returned by project_kv, got {type(kv).__name__}")
            if self.gates is not None:
                raise ValueError(f"attention {self.kernel.registry_name!r} computes its gates from the key input: "
                                 f"pass key/value, not projected kv")
            k, v = kv
        else:
            qkv = None
            if (key is None or key is query) and (value is None or value is query):
                qkv = self._in_proj(query, (self.q_proj, self.k_proj, self.v_proj))  # [Q K V] = x [W^Q W^K W^V]
            if qkv is not None:  # self-attention, one product; q (B, H, L, E), k, v (B, G, L, E)
                q, k, v = self._split(qkv[0]), self._split(qkv[1], self.n_kv_heads), self._split(qkv[2], self.n_kv_heads)
                del qkv  # the heads are views of it; freed with them, before the output projection
                return self._attend(q, k, v, **run, gates=self._gates(query))
            if self.rotary is not None and key is not None and key is not query:
                raise ValueError("rotary positions turn queries and keys of one sequence: self-attention only "
                                 "(key must be None or the query)")
            k, v = self.project_kv(query if key is None else key, value)  # (B, G, N, E) each
        if kv is not None and self.rotary is not None:
            raise ValueError("rotary positions turn queries and keys of one sequence: self-attention only (no kv=)")
        _checks.same("query", query.shape[0], "key", k.shape[0], "the batch size")
        q = self._split(self._project(self.q_proj, query))  # (B, H, M, E)
        return self._attend(q, k, v, **run, gates=self._gates(query if key is None else key) if kv is None else {})

    def _attend(self, q: Tensor, k: Optional[Tensor], v: Tensor, mask: Optional[Tensor], state: Any,
                need_weights: bool, return_state: bool, positions: Optional[Tensor], packed: Optional[Tensor] = None,
                gates: Optional[dict] = None, gate_output: Optional[Callable[[Tensor], Tensor]] = None) -> AttentionOutput:
        """qk-norm and rotary on the projected heads ``q (B, H, M, E)``, ``k (B, G, N, E)`` (None:
        the queries are the keys, shared-QK), then the kernel — keys and values repeated to the
        query heads for a kernel that does not take groups — and the output projection. ``gates``:
        the kernel's per-token gates (``_gates``; None: none), passed to its call, with the packed
        documents' ``position_ids``. ``gate_output``: a function of the merged heads ``(B, M, H E)``
        applied before the output projection (an output gate, ``GatedSelfAttention``)."""
        call = dict(gates or {}, **({} if packed is None else {"position_ids": packed}))  # the kernel's keywords
        if self.q_norm is not None:
            q = self.q_norm(q)
            k = None if k is None else self.k_norm(k)
        if self.rotary is not None:
            if positions is None:  # the positions after the state's
                start = getattr(state, "offset", 0) + self.kernel._state_length(state)
                positions = torch.arange(start, start + q.shape[-2], device=q.device)
            q, k_rot = self.rotary(q, q if k is None else k, positions)
            k = None if k is None else k_rot
        elif positions is not None:
            raise ValueError("positions given, but this attention has no rotary embedding (rotary=None)")
        if k is None:
            k = q  # shared-QK: the (normalised, rotated) queries are the keys
        G = self.n_heads // v.shape[1]  # query heads per key/value head
        if G == 1 or self.kernel.grouped_kv:
            return self._merge(self.kernel(q, k, v, mask=mask, state=state, need_weights=need_weights,
                                           return_state=return_state, **call), gate_output)
        if k.shape[1] != self.n_heads:
            k = k.repeat_interleave(G, dim=1)  # (B, H, N, E): query head h reads key head floor(h / G)
        v = v.repeat_interleave(G, dim=1)
        if self.kernel.keys_per_query_head:  # its state differs between the heads of a group: kept per query head
            return self._merge(self.kernel(q, k, v, mask=mask, state=state, need_weights=need_weights,
                                           return_state=return_state, **call), gate_output)
        out = self.kernel(q, k, v, mask=mask, state=state_heads(state, G, self.n_heads), need_weights=need_weights,
                          return_state=return_state, **call)
        return self._merge(out._replace(state=state_heads(out.state, G, self.n_heads, grouped=True)), gate_output)

    def _gates(self, x: Tensor) -> dict:
        """The kernel's gates of the keys written by ``x (B, N, kdim)`` (``AttentionKernel.gate_projections``); {} without."""
        return {} if self.gates is None else self.gates(x)

    def _merge(self, out: AttentionOutput, gate_output: Optional[Callable[[Tensor], Tensor]] = None) -> AttentionOutput:
        """Merge the kernel's heads ``(B, H, M, E)`` and apply the output projection (after
        ``gate_output`` of the merged heads, when given)."""
        B, H, M, E = out.output.shape
        merged = out.output.transpose(1, 2).reshape(B, M, H * E)  # (B, M, H E)
        if gate_output is not None:
            merged = gate_output(merged)
        return AttentionOutput(self._project(self.out_proj, merged), out.weights, out.state)


def _joined(params: Sequence[Tensor], copy: bool = True) -> Optional[Tensor]:
    """``cat(params)`` along dim 0, for use without a gradient — read in place when the contiguous
    tensors (of equal trailing sizes) lie side by side in memory, within the first one's storage
    (``_pack_in_proj``'s layout); else (``copy``) the concatenation; None when not side by side and
    ``copy`` is False."""
    first = params[0]
    try:
        start = first.data_ptr()
        ends = [0]
        for t in params:  # byte offset of each tensor from the first
            ends.append(ends[-1] + t.numel() * t.element_size())
        storage = first.untyped_storage()
        side_by_side = (storage.data_ptr() + storage.nbytes() >= start + ends[-1]
                        and all(t.is_contiguous() and t.shape[1:] == first.shape[1:] and t.data_ptr() == start + ends[i]
                                for i, t in enumerate(params)))
    except (RuntimeError, NotImplementedError):  # no memory to look at (functorch wrappers)
        side_by_side = False
    if side_by_side:  # no copy
        rows = sum(t.shape[0] for t in params)
        return first.detach().as_strided((rows, *first.shape[1:]), first.stride())
    return torch.cat([t.detach() for t in params]) if copy else None

