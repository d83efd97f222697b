"""Multi-head attention (Vaswani et al. 2017): projections, head split/merge and the output
projection around any registered kernel.

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O``, ``head_i = Kernel(Q W_i^Q, K W_i^K, V W_i^V)``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .. import _checks, _linear
from ..registry import build as _build, check_kwargs, lookup
from ..types import AttentionOutput
from .base import AttentionKernel

__all__ = ["MultiHeadAttention", "build_attention"]


def build_attention(name: str, **kwargs: Any) -> AttentionKernel:
    """Build the kernel registered as ``name`` (see ``qkv.list_attention()``); unknown kwargs raise."""
    return _build("attention", name, **kwargs)


class MultiHeadAttention(nn.Module):
    """Multi-head attention around a registered kernel (Vaswani et al. 2017, §3.2.2).

    Args:
        d_model: model width; split into ``n_heads`` heads of ``d_head = d_model // n_heads``.
        n_heads: number of heads (must divide ``d_model``).
        attention: a registry name (``qkv.list_attention()``) or an ``AttentionKernel`` instance.
        causal, dropout: passed to the kernel (dropout acts on the attention weights).
        bias: biases in the four projections.
        kdim, vdim: feature sizes of ``key`` and ``value`` inputs (default ``d_model``).
        linear: the factory ``linear(in_features, out_features, bias=)`` of the four projections
            (``nn.Linear``; e.g. ``qkv.blocks.QuaternionLinear``).
        **kernel_kwargs: the kernel's own knobs (e.g. ``radius=``); a kernel with per-head
            parameters gets its ``head_kwargs(n_heads, d_head)`` filled in.

    A shared-QK kernel (``kernel.shared_qk``: Reformer's ``lsh``) gets no key projection: the
    projected queries are the keys (``k_proj`` is None) and the module does self-attention only.

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
        **kernel_kwargs: Any,
    ) -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        _checks.positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        kdim = d_model if kdim is None else _checks.positive_int("kdim", kdim)
        vdim = kdim if vdim is None else _checks.positive_int("vdim", vdim)
        self.q_proj = linear(d_model, d_model, bias=bias)
        self.k_proj = linear(kdim, d_model, bias=bias)
        self.v_proj = linear(vdim, d_model, bias=bias)
        self.out_proj = linear(d_model, d_model, bias=bias)
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
        self._joined_in_proj: dict = {}  # number of projections -> (their parameters' key, (weight, bias) views)
        self._pack_in_proj()

    # ------------------------------------------------------------------ the fused input projection

    def _in_proj_params(self, projs: Sequence[Optional[nn.Module]]) -> Optional[tuple[list, Optional[list]]]:
        """The weights and biases (None: no biases) of ``projs`` when they fuse — dense
        (``_linear.plain_dense``), of one shape, dtype and device, with biases on all or none — else None."""
        weights, biases = [], []
        for p in projs:
            if not _linear.plain_dense(p):
                return None
            weights.append(p.weight)
            biases.append(p.bias)
        w = weights[0]
        for t in weights[1:]:
            if t.shape != w.shape or t.dtype != w.dtype or t.device != w.device:
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
            for p, part in zip(params, buffer.chunk(len(params))):
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
        return _linear.linear(x, weight, bias).chunk(len(projs), dim=-1)

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

    def _split(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, E)

    def project_kv(self, key: Tensor, value: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """Project ``key (B, N, kdim)`` and ``value (B, N, vdim)`` (default ``key``) into heads
        ``(B, H, N, E)`` each — computed once and passed as ``kv=`` when the same memory is
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
        if kv is not None:
            return self._split(kv[0]), self._split(kv[1])  # (B, H, N, E) each
        return self._split(self._project(self.k_proj, key)), self._split(self._project(self.v_proj, value))

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
    ) -> AttentionOutput:
        """Attend ``query (B, M, d_model)`` to ``key (B, N, kdim)`` / ``value (B, N, vdim)``.

        ``key`` defaults to ``query`` (self-attention) and ``value`` to ``key``; ``kv`` gives
        already projected heads instead (see ``project_kv``). ``mask``: bool, True = may attend,
        ``(B, N)`` key padding or broadcastable to ``(B, H, M, N)``.
        Returns ``AttentionOutput(output (B, M, d_model), weights (B, H, M, N) or None, state)``.
        """
        _checks.tensor("query", query, ndim=3, floating=True)
        _checks.same("query", query.shape[-1], "d_model", self.d_model, "the feature size")
        _checks.same_dtype("query", query, "MultiHeadAttention.q_proj", self.q_proj.weight)
        if self.k_proj is None:
            if kv is not None or (key is not None and key is not query):
                raise ValueError(f"attention {self.kernel.registry_name!r} shares queries and keys (shared_qk=True): "
                                 f"self-attention only, call it as mha(x)")
            v = self._split(self._project(self.v_proj, query if value is None else value))  # (B, H, L, E)
            q = self._split(self._project(self.q_proj, query))  # (B, H, L, E), also the keys
            out = self.kernel(q, q, v, mask=mask, state=state, need_weights=need_weights, return_state=return_state)
            return self._merge(out)
        if kv is not None:
            if key is not None or value is not None:
                raise ValueError("give either key/value or kv (projected heads), not both")
            if not (isinstance(kv, tuple) and len(kv) == 2):
                raise TypeError(f"kv must be the (k, v) pair returned by project_kv, got {type(kv).__name__}")
            k, v = kv
        else:
            qkv = None
            if (key is None or key is query) and (value is None or value is query):
                qkv = self._in_proj(query, (self.q_proj, self.k_proj, self.v_proj))  # [Q K V] = x [W^Q W^K W^V]
            if qkv is not None:  # self-attention, one product; q, k, v: (B, H, L, E) each
                out = self.kernel(*map(self._split, qkv), mask=mask, state=state, need_weights=need_weights,
                                  return_state=return_state)
                del qkv  # freed before the output projection allocates its result
                return self._merge(out)
            k, v = self.project_kv(query if key is None else key, value)  # (B, H, N, E) each
        _checks.same("query", query.shape[0], "key", k.shape[0], "the batch size")
        q = self._split(self._project(self.q_proj, query))  # (B, H, M, E)
        out = self.kernel(q, k, v, mask=mask, state=state, need_weights=need_weights, return_state=return_state)
        return self._merge(out)

    def _merge(self, out: AttentionOutput) -> AttentionOutput:
        """Merge the kernel's heads ``(B, H, M, E)`` and apply the output projection."""
        B, H, M, E = out.output.shape
        merged = out.output.transpose(1, 2).reshape(B, M, H * E)  # (B, M, d_model)
        return AttentionOutput(self._project(self.out_proj, merged), out.weights, out.state)


def _joined(params: Sequence[Tensor], copy: bool = True) -> Optional[Tensor]:
    """``cat(params)`` along dim 0, for use without a gradient — read in place when the (contiguous,
    equal) tensors lie side by side in memory, within the first one's storage (``_pack_in_proj``'s
    layout); else (``copy``) the concatenation; None when not side by side and ``copy`` is False."""
    first = params[0]
    try:
        size = first.numel() * first.element_size()
        start = first.data_ptr()
        storage = first.untyped_storage()
        side_by_side = (storage.data_ptr() + storage.nbytes() >= start + len(params) * size
                        and all(t.is_contiguous() and t.data_ptr() == start + i * size for i, t in enumerate(params)))
    except (RuntimeError, NotImplementedError):  # no memory to look at (functorch wrappers)
        side_by_side = False
    if side_by_side:  # no copy
        return first.detach().as_strided((len(params) * first.shape[0], *first.shape[1:]), first.stride())
    return torch.cat([t.detach() for t in params]) if copy else None
