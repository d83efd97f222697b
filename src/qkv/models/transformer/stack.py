"""The Transformer stack shared by the Transformer, BERT, GPT and their descendants
(Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762).

    x_0 = Dropout(E[ids] * scale + P(positions) (+ S[segments]))
    x_l = Block_l(x_{l-1})                 l = 1 .. N
    h   = FinalNorm(x_N)                   (pre-LN only)

A block is self-attention, optional cross-attention (decoder) and the feed-forward network, each
joined to the residual stream by a residual wiring (``qkv.blocks``):

    x = wiring.exit(x, SelfAttention(wiring.enter(x)))
    x = wiring.exit(x, CrossAttention(wiring.enter(x), memory))     (decoder blocks)
    x = wiring.exit(x, FFN(wiring.enter(x)))

Hooks for the variants (each a name in a registry or one overridable method, never a flag here):

- **attention kernel**: ``config.attention`` + ``config.attention_kwargs`` go to
  ``qkv.MultiHeadAttention``, missing knobs filled from the kernel's ``default_knobs`` for
  ``max_len`` (``self_attention_settings``); what a kernel cannot do (be causal) is the kernel's
  error to raise.
- **positional scheme**: ``@register("positional", name)`` on a module ``(d_model, max_len=, dropout=)``
  whose ``forward(x, offset)`` returns ``x`` plus the encoding of positions ``offset ..``. Rotary
  positions (``positional="rotary"``, Su et al. 2021) add nothing: the stack builds one
  ``qkv.rotary.RotaryEmbedding`` (``rope_theta``, ``rope_scaling``) that every self-attention
  applies to its queries and keys at the tokens' positions (``position_ids``, else those after the
  state's), passed down the layer loop as ``positions``. A scheme
  that changes the scores (Transformer-XL's relative positions) is an attention kernel
  (``attention="relative"``) used with ``positional="none"``: the kernel sees positions through its
  state.
- **residual wiring**: ``@register("residual", name)`` (``qkv.blocks.ResidualWiring``).
- **state**: every block takes and returns a ``BlockState`` (its self-attention kernel's state and
  the cached cross-attention keys/values); the stack's ``StackState`` holds one per layer and the
  number of positions seen, which offsets the positional encoding. KV caches (softmax, window),
  ``(S, Z)`` sums (linear) and segment memories (Transformer-XL) all travel this way; a block
  also reads extra earlier positions as keys/values through ``prefix`` (Transformer-XL's memory of
  hidden states, ``models/transformer/transformer_xl.py``).
- **the parts of today's decoders** (Llama and its kin), each a field: ``norm`` (LayerNorm or
  RMSNorm, every norm of the blocks and the final one), ``glu`` (the gated feed-forward network:
  SwiGLU with ``activation="silu"``, GeGLU with ``"gelu"``), ``n_kv_heads`` (grouped-query
  attention), ``d_head``, ``qk_norm`` (RMSNorm over each head's queries and keys), ``bias`` /
  ``qkv_bias`` (bias-free projections, or biases on q/k/v only).
- **linear layers**: ``config.linear`` names the factory (``qkv.blocks.LINEAR_LAYERS``) of every
  attention projection and feed-forward layer (dense, or quaternion for the Quaternion Transformer).
- **shared kernel parameters**: after building the blocks the stack calls
  ``kernel.share_across_layers(first_layer_kernel)`` on layers 2 .. N (Linformer's layerwise projection).
- **depth**: ``run_layers`` is the layer loop; shared-weight depth with ACT (Universal
  Transformer) or reversible layers (Reformer) override it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ... import _checks
from ...attention import MultiHeadAttention
from ...blocks import ACTIVATIONS, LINEAR_LAYERS, NORMS, OutputGate, ShortConv, build_feedforward, build_norm, build_residual
from ...positional import NoPositionalEncoding
from ...rotary import RotaryEmbedding, check_rope_scaling
from ...registry import lookup, names, register

__all__ = [
    "StackConfig", "TransformerStack", "TransformerBlock", "Embeddings", "BlockState", "StackState",
    "BlockOutput", "StackOutput", "NoPositionalEncoding", "check_token_mask", "reorder_state", "copy_torch_layer",
    "init_normal", "token_scale", "self_attention_settings", "GatedSelfAttention", "GatedSelfAttentionState",
]


def init_normal(module: nn.Module, std: float = 0.02) -> None:
    """GPT/BERT initialisation for ``model.apply``: ``N(0, std)`` linear and embedding weights,
    zero biases (BERT truncates the normal; the difference is immaterial at 0.02) — except the
    token table of ``Embeddings`` that scale their tokens (fixed positions, see ``token_scale``):
    ``N(0, 1 / scale^2)``, so that the scaled tokens start at unit RMS, as the positions do.
    (``model.apply`` visits a module's children first, so this comes after the table's 0.02.)"""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, Embeddings) and module.scale != 1.0:
        nn.init.normal_(module.token.weight, mean=0.0, std=1.0 / module.scale)


def token_scale(positional: str, d_model: int) -> float:
    """The factor on the token embeddings under the positional scheme ``positional``.

    ``sqrt(d_model)`` when the scheme adds a fixed unit-amplitude signal (``fixed``: sinusoidal,
    timestep), as Vaswani et al. (2017, §3.4) scale theirs; with the token table drawn from
    ``N(0, 1 / d_model)`` (``init_normal``) tokens and positions then start at the same RMS at every
    width. GPT's and BERT's ``N(0, 0.02)`` tokens under unscaled sinusoids were ~35 times smaller
    than the positions and the model could not see them (a GPT stayed at the unigram loss).
    1 for learned schemes and none.
    """
    return math.sqrt(d_model) if getattr(lookup("positional", positional), "fixed", False) else 1.0




@dataclass
class StackConfig:
    """The fields every model built on ``TransformerStack`` shares; a model's config subclasses it
    (overriding defaults) and adds its own fields."""

    n_layers: int = 6  # N: blocks in the stack
    d_model: int = 512  # width of the residual stream
    n_heads: int = 8  # h: attention heads (must divide d_model)
    d_ff: int = 2048  # hidden width of the feed-forward network
    dropout: float = 0.1  # P_drop on embeddings and on every sub-layer output (residual dropout)
    attention_dropout: float = 0.0  # dropout on the attention weights (inside the kernel)
    activation: str = "relu"  # feed-forward activation: "relu" (the paper) | "gelu" (BERT) | "gelu-tanh" (GPT-2's gelu_new)
    residual: str = "post-ln"  # residual wiring: "post-ln" LN(x + F(x)) | "pre-ln" x + F(LN(x)) (+ final LN)
    positional: str = "sinusoidal"  # positional scheme: "sinusoidal" | "learned" | "rotary" | "alibi" | "none"
    max_len: int = 512  # longest sequence ("learned" positions raise beyond it; sinusoids cache this many rows)
    attention: str = "softmax"  # self-attention kernel: a qkv.list_attention() name
    attention_kwargs: Dict[str, Any] = field(default_factory=dict)  # the kernel's own knobs, e.g. {"radius": 16}
    ff_chunk_size: Optional[int] = None  # compute the feed-forward network over length chunks of this size
    gradient_checkpointing: bool = False  # recompute each block in backward (torch.utils.checkpoint) to save memory
    layer_norm_eps: float = 1e-5  # epsilon of every LayerNorm
    linear: str = "dense"  # linear layers of the attention projections and feed-forward: "dense" | "quaternion" (qkv.blocks.LINEAR_LAYERS)
    norm: str = "layernorm"  # every norm of the blocks and the final one: "layernorm" | "rmsnorm" (Zhang & Sennrich 2019)
    glu: bool = False  # gated feed-forward (act(x W) * x V) W2 (Shazeer 2020): SwiGLU with activation="silu", GeGLU with "gelu"
    n_kv_heads: Optional[int] = None  # key/value heads (grouped-query attention, Ainslie et al. 2023; 1: multi-query); None: n_heads
    d_head: Optional[int] = None  # head size; None: d_model // n_heads
    bias: bool = True  # biases in the attention projections and the feed-forward network (False: bias-free, as Llama)
    qkv_bias: Optional[bool] = None  # biases in the q/k/v projections only (Qwen2: True with bias=False); None: as bias
    qk_norm: bool = False  # RMSNorm over each head's queries and keys before rotary (Qwen3)
    rope_theta: float = 10000.0  # rotary base (positional="rotary"; Llama 3: 500000)
    rope_scaling: Dict[str, Any] = field(default_factory=dict)  # rotary scaling as transformers' rope_parameters ({"rope_type": "yarn", "factor": 4.0, ...}); {}: none
    short_conv: int = 0  # causal depthwise convolution (+ SiLU) of this many positions on self-attention's q, k, v (0: none; DeltaNet: 4)
    output_gate: bool = False  # gate self-attention's merged heads by SiLU(x W_r) before the output projection (GLA, DeltaNet)
    hybrid_every: int = 0  # every k-th layer (k, 2k, ...) uses hybrid_attention instead of attention (0: none; Qwen3-Next: 4)
    hybrid_attention: str = "softmax"  # the kernel of those layers (its default knobs; no short_conv or output_gate)

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "d_ff", "max_len"):
            _checks.positive_int(name, getattr(self, name))
        if self.d_head is not None:
            _checks.positive_int("d_head", self.d_head)
        elif self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_kv_heads is not None:
            _checks.positive_int("n_kv_heads", self.n_kv_heads)
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {sorted(NORMS)}, got {self.norm!r}")
        for name in ("glu", "bias", "qk_norm") + (("qkv_bias",) if self.qkv_bias is not None else ()):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 1 < theta < float("inf"):
            raise ValueError(f"rope_theta must be a number > 1, got {theta!r}")
        if not isinstance(self.rope_scaling, dict):
            raise TypeError(f"rope_scaling must be a dict (transformers' rope_parameters), got {self.rope_scaling!r}")
        check_rope_scaling(self.rope_scaling or None)
        _checks.probability("dropout", self.dropout)
        _checks.probability("attention_dropout", self.attention_dropout)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        for kind in ("residual", "positional", "attention"):
            try:
                lookup(kind, getattr(self, kind))
            except ValueError as e:
                raise ValueError(f"{kind}: {e}") from None
            except TypeError:
                raise TypeError(f"{kind} must be a str (one of {names(kind)}), got {getattr(self, kind)!r}") from None
        if not isinstance(self.attention_kwargs, dict):
            raise TypeError(f"attention_kwargs must be a dict, got {type(self.attention_kwargs).__name__}")
        if self.ff_chunk_size is not None:
            _checks.positive_int("ff_chunk_size", self.ff_chunk_size)
        if not isinstance(self.gradient_checkpointing, bool):
            raise TypeError(f"gradient_checkpointing must be a bool, got {self.gradient_checkpointing!r}")
        if isinstance(self.layer_norm_eps, bool) or not isinstance(self.layer_norm_eps, (int, float)) or self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be a positive float, got {self.layer_norm_eps!r}")
        if self.linear not in LINEAR_LAYERS:
            raise ValueError(f"linear must be one of {sorted(LINEAR_LAYERS)}, got {self.linear!r}")
        _checks.positive_int("short_conv", self.short_conv, allow_zero=True)
        if not isinstance(self.output_gate, bool):
            raise TypeError(f"output_gate must be a bool, got {self.output_gate!r}")
        _checks.positive_int("hybrid_every", self.hybrid_every, allow_zero=True)
        try:
            lookup("attention", self.hybrid_attention)
        except ValueError as e:
            raise ValueError(f"hybrid_attention: {e}") from None
        except TypeError:
            raise TypeError(f"hybrid_attention must be a str (one of {names('attention')}), got "
                            f"{self.hybrid_attention!r}") from None
        if self.head_size() % 2 and self.rotary():
            raise ValueError(f"positional='rotary' turns pairs of features: the head size must be even, got {self.head_size()}")

    def head_size(self) -> int:
        """The size of one attention head: ``d_head``, else ``d_model // n_heads``."""
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    def alibi(self) -> bool:
        """Whether the positional scheme is ALiBi (a score bias inside self-attention)."""
        return bool(getattr(lookup("positional", self.positional), "alibi", False))

    def rotary(self) -> bool:
        """Whether the positional scheme is rotary (applied inside self-attention)."""
        return bool(getattr(lookup("positional", self.positional), "rotary", False))

    def layer_attention(self, layer: int) -> str:
        """The self-attention kernel of layer ``layer`` (0-based): ``hybrid_attention`` on every
        ``hybrid_every``-th layer (layers ``k - 1, 2k - 1, ...``), else ``attention``."""
        if self.hybrid_every and (layer + 1) % self.hybrid_every == 0:
            return self.hybrid_attention
        return self.attention


# ----------------------------------------------------------------------------- states and outputs


@dataclass(frozen=True)
class BlockState:
    """What a block carries from one call to the next (incremental decoding, segment memory).

    self_attn: the self-attention kernel's state (``KVCache``, ``LinearState``, ...).
    cross_kv:  the projected memory ``(k, v)``, each ``(B, H, S, E)``, computed once per source.
    """

    self_attn: Any = None
    cross_kv: Optional[Tuple[Tensor, Tensor]] = None


@dataclass(frozen=True)
class StackState:
    """Per-layer ``BlockState``s and the number of positions already seen (the positional offset)."""

    layers: Tuple[BlockState, ...]
    position: int = 0


class BlockOutput(NamedTuple):
    hidden: Tensor  # (B, L, d_model)
    self_weights: Optional[Tensor]  # (B, H, L, N) when asked for
    cross_weights: Optional[Tensor]  # (B, H, L, S) when asked for (decoder blocks)
    state: Optional[BlockState]  # when asked for


class StackOutput(NamedTuple):
    hidden: Tensor  # (B, L, d_model), after the final LayerNorm (pre-LN)
    weights: Optional[List[Tensor]]  # per layer (B, H, L, N) self-attention weights
    cross_weights: Optional[List[Tensor]]  # per layer (B, H, L, S) cross-attention weights (decoder)
    state: Optional[StackState]  # when asked for
    hidden_states: Optional[List[Tensor]]  # per layer outputs x_1 .. x_N (before the final LayerNorm)


def reorder_state(state: Any, index: Tensor) -> Any:
    """Select batch rows ``index`` of every tensor in a (nested) state — beam search reordering.

    Every state tensor is batch-first (design.md §2), so this works for any kernel's state
    dataclass, tuple, list or dict without knowing its type.
    """
    if isinstance(state, Tensor):
        return state.index_select(0, index)
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return dataclasses.replace(state, **{f.name: reorder_state(getattr(state, f.name), index)
                                             for f in dataclasses.fields(state) if f.init})
    if isinstance(state, (tuple, list)):
        return type(state)(reorder_state(s, index) for s in state)
    if isinstance(state, dict):
        return {k: reorder_state(v, index) for k, v in state.items()}
    return state


def bool_token_mask(name: str, mask: Any) -> Any:
    """A ``(B, L)`` padding mask as bool (True = real token): a bool mask as it is, an integer one of
    0s and 1s as transformers takes it (``tokenizer(...)["attention_mask"]``) as bool; other values
    (a 2) are refused naming ``name``; anything else (None, a float mask) is returned for the
    caller's own checks to refuse."""
    if isinstance(mask, Tensor) and mask.dtype != torch.bool and not mask.is_floating_point() and not mask.is_complex():
        if mask.numel() and not torch.compiler.is_compiling() and bool(((mask != 0) & (mask != 1)).any()):
            bad = mask[(mask != 0) & (mask != 1)][0].item()
            raise ValueError(f"{name} must hold 0 (padding) and 1 (real token), got {bad}")
        mask = mask != 0
    return mask


def check_token_mask(name: str, mask: Any, ids: Tensor) -> Optional[Tensor]:
    """Check an optional ``(B, L)`` bool padding mask (True = real token) shaped like ``ids``."""
    if mask is None:
        return None
    _checks.tensor(name, mask, ndim=2)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = real token), got dtype {mask.dtype}")
    _checks.same(name, tuple(mask.shape), "input_ids", tuple(ids.shape), "the shape")
    return mask


# ----------------------------------------------------------------------------- embeddings


class Embeddings(nn.Module):
    """Token embeddings (scaled), optional segment embeddings and a positional scheme.

    ``x = Dropout(Norm(E[ids] * scale + P(offset .. offset + L - 1) + S[segments]))``; the paper
    scales by ``sqrt(d_model)`` (§3.4), BERT adds segments and normalises (Devlin et al. 2019, §3).

    Args:
        vocab_size, d_model: the table size.
        positional, max_len: scheme name and its length limit.
        dropout: on the sum.
        scale: multiplies the token embeddings; None: ``token_scale(positional, d_model)``.
        n_segments: number of segment embeddings (0: none).
        norm: LayerNorm after the sum (BERT).
        token: an existing ``nn.Embedding`` to share (encoder and decoder of one vocabulary).
        token_segments: without a segment table, ``token_type_ids`` index the token table and are
            added (GPT-2: transformers' ``GPT2Model`` embeds token types with ``wte``).
    """

    def __init__(self, vocab_size: int, d_model: int, *, positional: str = "sinusoidal", max_len: int = 512,
                 dropout: float = 0.0, scale: Optional[float] = None, n_segments: int = 0, norm: bool = False,
                 eps: float = 1e-5, token: Optional[nn.Embedding] = None, token_segments: bool = False) -> None:
        super().__init__()
        self.vocab_size = _checks.positive_int("vocab_size", vocab_size)
        self.token = nn.Embedding(vocab_size, d_model) if token is None else token
        if self.token.weight.shape != (vocab_size, d_model):
            raise ValueError(f"token embedding must be ({vocab_size}, {d_model}), got {tuple(self.token.weight.shape)}")
        self.scale = token_scale(positional, d_model) if scale is None else scale
        self.positional = lookup("positional", positional)(d_model, max_len=max_len, dropout=0.0)
        self.n_segments = _checks.positive_int("n_segments", n_segments, allow_zero=True)
        self.segment = nn.Embedding(n_segments, d_model) if n_segments else None
        self.token_segments = token_segments
        self.norm = nn.LayerNorm(d_model, eps=eps) if norm else nn.Identity()
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))

    def forward(self, ids: Tensor, token_type_ids: Optional[Tensor] = None, offset: int = 0,
                position_ids: Optional[Tensor] = None) -> Tensor:
        """``ids (B, L)`` -> ``(B, L, d_model)``; positions start at ``offset``, or are ``position_ids
        (B, L)`` when given (schemes ``learned`` and ``sinusoidal``)."""
        _checks.token_ids("input_ids", ids, self.vocab_size)
        x = self.token(ids)  # (B, L, d_model)
        if self.scale != 1.0:
            x = x * self.scale
        if self.segment is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids)
            _checks.token_ids("token_type_ids", token_type_ids, self.n_segments)
            _checks.same("token_type_ids", tuple(token_type_ids.shape), "input_ids", tuple(ids.shape), "the shape")
            x = x + self.segment(token_type_ids)
        elif token_type_ids is not None and self.token_segments:
            _checks.token_ids("token_type_ids", token_type_ids, self.vocab_size)
            _checks.same("token_type_ids", tuple(token_type_ids.shape), "input_ids", tuple(ids.shape), "the shape")
            x = x + self.token(token_type_ids)  # GPT-2: token types through the token table
        elif token_type_ids is not None:
            raise ValueError("token_type_ids given, but the embeddings have no segments (n_segments=0)")
        if position_ids is None:
            return self.dropout(self.norm(self.positional(x, offset)))
        if "positions" not in inspect.signature(self.positional.forward).parameters:
            raise ValueError(f"position_ids given, but the positional scheme {type(self.positional).__name__} takes "
                             f"none (learned and sinusoidal positions do)")
        return self.dropout(self.norm(self.positional(x, offset, positions=position_ids)))


# ----------------------------------------------------------------------------- one block


def self_attention_settings(config: StackConfig, attention: Optional[str] = None) -> Tuple[Dict[str, Any], float]:
    """The self-attention kernel's knobs and dropout under ``config`` (``attention``: another kernel
    than ``config.attention``, a hybrid layer's, which takes its default knobs only).

    Knobs: the kernel's ``knobs(max_len, n_heads, d_head, config.attention_kwargs)`` (its default
    knobs for the model's length, the head arguments left to ``MultiHeadAttention``, under the given
    ones), so that ``attention=NAME`` alone builds every kernel. Dropout: ``config.attention_dropout``, or 0 for a
    kernel that forms no attention-weight matrix (``applies_dropout = False``: linear, performer,
    efficient), with a warning (once) — the residual dropout still applies.
    """
    own = attention is None or attention == config.attention
    name = config.attention if own else attention
    kernel = lookup("attention", name)
    knobs = kernel.knobs(config.max_len, config.n_heads, config.head_size(), config.attention_kwargs if own else {})
    if config.alibi():
        if "alibi" not in inspect.signature(kernel.__init__).parameters:
            able = [n for n in names("attention") if "alibi" in inspect.signature(lookup("attention", n).__init__).parameters]
            raise ValueError(f"positional='alibi' adds a bias to every score q.k - m_h (i - j): attention "
                             f"{name!r} forms no score of each query-key pair to add it to (kernels "
                             f"that take it: {', '.join(able)})")
        knobs["alibi"] = True
    dropout = config.attention_dropout
    if dropout > 0 and not kernel.applies_dropout:
        warnings.warn(f"attention {kernel.registry_name!r} forms no attention-weight matrix: attention_dropout="
                      f"{dropout} is not applied inside it (the residual dropout still is)", stacklevel=3)
        dropout = 0.0
    return knobs, dropout


class GatedSelfAttention(MultiHeadAttention):
    """Self-attention with the parts gated linear-attention layers put around their kernel (GLA,
    DeltaNet, Gated DeltaNet): a short causal convolution (+ SiLU) on the projected ``q, k, v``
    (``qkv.blocks.ShortConv``) and the output gate ``SiLU(x W_r) ⊙ o`` on the merged heads before
    the output projection (``qkv.blocks.OutputGate``); the head normalisation the gate multiplies
    is the kernel's (``norm=True``; its gain is absorbed by ``W^O``, as the gate is elementwise).

    ``MultiHeadAttention``'s arguments (grouped keys, qk-norm and rotary positions included: they
    act on the convolved heads, through ``MultiHeadAttention._attend``) plus ``short_conv`` (kernel
    size, 0: none) and ``output_gate``; self-attention only (``mha(x)``). Its state is
    ``GatedSelfAttentionState``: the kernel's and the convolution's last ``short_conv - 1`` inputs,
    so that decoding token by token gives the full forward's outputs. A key-padding mask zeroes the
    padded positions' inputs to the convolution (a left-padded row sees what the row alone would).
    """

    def __init__(self, d_model: int, n_heads: int, attention: Any = "softmax", *, short_conv: int = 0,
                 output_gate: bool = False, linear: Any = nn.Linear, **kwargs: Any) -> None:
        super().__init__(d_model, n_heads, attention, linear=linear, **kwargs)
        if self.k_proj is None:
            raise ValueError(f"short_conv/output_gate: attention {self.kernel.registry_name!r} shares queries and keys")
        self._widths = [p.weight.shape[0] for p in (self.q_proj, self.k_proj, self.v_proj)]  # H E, G E, G E
        self.conv = (ShortConv(sum(self._widths), short_conv)
                     if _checks.positive_int("short_conv", short_conv, allow_zero=True) else None)
        if not isinstance(output_gate, bool):
            raise TypeError(f"output_gate must be a bool, got {output_gate!r}")
        self.out_gate = OutputGate(d_model, self.n_heads * self.d_head, linear=linear) if output_gate else None

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                mask: Optional[Tensor] = None, state: Any = None, need_weights: bool = False,
                return_state: bool = False, kv: Optional[Tuple[Tensor, Tensor]] = None,
                positions: Optional[Tensor] = None, packed: Optional[Tensor] = None) -> Any:
        """``MultiHeadAttention.forward`` for self-attention (``key``, ``value``, ``kv`` must be None or
        ``query``). Packed documents (``packed``) are refused with a short convolution, which would
        read across their boundaries."""
        if packed is not None and self.conv is not None:
            raise ValueError("packed documents (position_ids restarting inside a row) with short_conv: the causal "
                             "convolution would read the previous document's last tokens; pad the documents instead")
        if kv is not None or (key is not None and key is not query) or (value is not None and value is not query):
            raise ValueError("GatedSelfAttention (short_conv/output_gate) does self-attention only: call it as mha(x)")
        _checks.tensor("query", query, ndim=3, floating=True)
        _checks.same("query", query.shape[-1], "d_model", self.d_model, "the feature size")
        if state is not None and not isinstance(state, GatedSelfAttentionState):
            raise TypeError(f"state must be the GatedSelfAttentionState a previous call returned, got {type(state).__name__}")
        kernel_state, conv_cache = (None, None) if state is None else (state.kernel, state.conv)
        qkv = torch.cat([self._project(p, query) for p in (self.q_proj, self.k_proj, self.v_proj)], dim=-1)  # (B, L, (H + 2G) E)
        if self.conv is not None:
            if isinstance(mask, Tensor) and mask.dim() == 2 and mask.dtype == torch.bool:  # key padding: no input
                qkv = qkv * mask[:, mask.shape[1] - qkv.shape[1]:].unsqueeze(-1).to(qkv.dtype)
            qkv, conv_cache = self.conv(qkv, conv_cache)
        q, k, v = qkv.split(self._widths, dim=-1)
        q, k, v = self._split(q), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)  # (B, H|G, L, E)
        gate = None if self.out_gate is None else (lambda o: self.out_gate(query, o))  # SiLU(x W_r) ⊙ Norm(o)
        out = self._attend(q, k, v, mask=mask, state=kernel_state, need_weights=need_weights, return_state=return_state,
                           positions=positions, packed=packed, gates=self._gates(query), gate_output=gate)
        new_state = GatedSelfAttentionState(out.state, conv_cache if self.conv is not None else None) if return_state else None
        return out._replace(state=new_state)


@dataclass(frozen=True)
class GatedSelfAttentionState:
    """``GatedSelfAttention``'s state: the kernel's and the short convolution's last inputs ``(B, K - 1, 3 d_model)``."""

    kernel: Any = None
    conv: Optional[Tensor] = None


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention and feed-forward, each inside a residual wiring.

    Args:
        config: sizes, kernel, wiring, dropout (``StackConfig`` fields).
        causal: the self-attention kernel is built causal (decoder, LM).
        cross_attention: kernel name of a cross-attention sub-layer (None: none).
        cross_attention_kwargs: its knobs.
        rotary: the stack's ``RotaryEmbedding`` (``positional="rotary"``), for self-attention.
        attention: the self-attention kernel when not ``config.attention`` (a hybrid layer's,
            ``StackConfig.layer_attention``): its default knobs, no short convolution or output gate.

    With ``config.short_conv`` or ``config.output_gate`` the self-attention is ``GatedSelfAttention``.
    """

    def __init__(self, config: StackConfig, *, causal: bool = False, cross_attention: Optional[str] = None,
                 cross_attention_kwargs: Optional[Dict[str, Any]] = None, rotary: Optional[RotaryEmbedding] = None,
                 attention: Optional[str] = None) -> None:
        super().__init__()
        c = config
        linear = LINEAR_LAYERS[c.linear]
        attention = c.attention if attention is None else attention
        knobs, attention_dropout = self_attention_settings(c, attention)
        heads = dict(n_kv_heads=c.n_kv_heads, d_head=c.d_head, bias=c.bias, qkv_bias=c.qkv_bias, qk_norm=c.qk_norm,
                     norm_eps=c.layer_norm_eps)
        if attention == c.attention and (c.short_conv or c.output_gate):
            self.self_attn = GatedSelfAttention(c.d_model, c.n_heads, attention, causal=causal, dropout=attention_dropout,
                                                linear=linear, rotary=rotary, short_conv=c.short_conv,
                                                output_gate=c.output_gate, **heads, **knobs)
        else:
            self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, attention, causal=causal, dropout=attention_dropout,
                                                linear=linear, rotary=rotary, **heads, **knobs)
        residual = dict(dropout=c.dropout, eps=c.layer_norm_eps, norm=c.norm)
        self.res_self = build_residual(c.residual, c.d_model, **residual)
        self.cross_attn = self.res_cross = None
        if cross_attention is not None:
            self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, cross_attention, causal=False,
                                                 dropout=c.attention_dropout, linear=linear, **heads,
                                                 **dict(cross_attention_kwargs or {}))
            self.res_cross = build_residual(c.residual, c.d_model, **residual)
        self.ff = build_feedforward(c.d_model, c.d_ff, c.activation, glu=c.glu, chunk_size=c.ff_chunk_size,
                                    linear=linear, bias=c.bias)
        self.res_ff = build_residual(c.residual, c.d_model, **residual)

    def _cross_attend(self, h: Tensor, memory: Tensor, memory_mask: Optional[Tensor],
                      cross_kv: Optional[Tuple[Tensor, Tensor]], need_weights: bool):
        """Cross-attention with the memory's keys/values projected once and reused every step.

        The same computation as ``self.cross_attn(h, memory, memory, mask=memory_mask)``, split so
        that ``(k, v) = (memory W^K, memory W^V)`` can be cached in the ``BlockState``.
        """
        if cross_kv is None:
            _checks.same("memory", memory.shape[0], "x", h.shape[0], "the batch size")
            cross_kv = self.cross_attn.project_kv(memory)  # (B, H, S, E) each
        out = self.cross_attn(h, kv=cross_kv, mask=memory_mask, need_weights=need_weights)
        return out.output, out.weights, cross_kv

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, memory: Optional[Tensor] = None,
                memory_mask: Optional[Tensor] = None, state: Optional[BlockState] = None,
                need_weights: bool = False, return_state: bool = False,
                prefix: Optional[Tensor] = None, positions: Optional[Tensor] = None,
                packed: Optional[Tensor] = None) -> BlockOutput:
        """``x (B, L, d_model)``; ``mask`` for self-attention (True = may attend); ``memory (B, S, d_model)``
        and ``memory_mask (B, S)`` for cross-attention. ``prefix (B, P, d_model)``: earlier inputs
        that self-attention reads as extra keys/values before ``x`` but does not update
        (Transformer-XL's segment memory, ``[SG(m), x]``). ``positions (L,) or (B, L)``: the
        tokens' positions for rotary self-attention. ``packed (B, L)``: the ``position_ids`` of
        packed documents (0 starts one): self-attention stays within each document."""
        state = state or BlockState()
        h = self.res_self.enter(x)
        context = None
        if prefix is not None and self.self_attn.rotary is not None:
            raise ValueError("prefix (a segment memory) with rotary positions: the memory's keys have no positions here")
        if prefix is not None:
            _checks.tensor("prefix", prefix, ndim=3, floating=True)
            _checks.same("prefix", prefix.shape[0], "x", x.shape[0], "the batch size")
            _checks.same("prefix", prefix.shape[2], "x", x.shape[2], "the feature size (dim -1)")
            context = torch.cat([self.res_self.enter(prefix), h], dim=1)  # (B, P + L, d_model)
        extra = {} if positions is None else {"positions": positions}
        if packed is not None:
            extra["packed"] = packed
        y, self_weights, self_state = self.self_attn(h, context, context, mask=mask, state=state.self_attn,
                                                     need_weights=need_weights, return_state=return_state, **extra)
        x = self.res_self.exit(x, y)
        del h, context, y  # freed before the feed-forward network allocates its (B, L, d_ff) hidden
        cross_weights, cross_kv = None, state.cross_kv
        if self.cross_attn is not None:
            if memory is None and cross_kv is None:
                raise ValueError("this block has cross-attention: memory (B, S, d_model) is required")
            y, cross_weights, cross_kv = self._cross_attend(self.res_cross.enter(x), memory, memory_mask,
                                                             cross_kv, need_weights)
            x = self.res_cross.exit(x, y)
            del y
        x = self.res_ff.exit(x, self.ff(self.res_ff.enter(x)))
        new_state = BlockState(self_state, cross_kv) if return_state else None
        return BlockOutput(x, self_weights, cross_weights, new_state)


# ----------------------------------------------------------------------------- the stack


class TransformerStack(nn.Module):
    """Embeddings, N blocks and (pre-LN) a final LayerNorm (Vaswani et al. 2017, §3.1).

    Args:
        config: a ``StackConfig`` (or a model config that subclasses it).
        vocab_size: token table size.
        causal: causal self-attention (decoder, LM).
        cross_attention: kernel name of the cross-attention sub-layer (decoder), None for none.
        cross_attention_kwargs: its knobs.
        n_layers: overrides ``config.n_layers`` (e.g. a decoder deeper than its encoder).
        token_embedding: an ``nn.Embedding`` to share with another stack.
        embedding_scale: multiplies token embeddings (the paper: ``sqrt(d_model)``); None:
            ``token_scale(config.positional, d_model)``.
        n_segments, embedding_norm: BERT's segment embeddings and embedding LayerNorm.
        token_segments: token types embedded by the token table (GPT-2), see ``Embeddings``.

    ``forward(input_ids)`` embeds then runs the layers; ``run_layers(x)`` takes embeddings.
    """

    def __init__(self, config: StackConfig, *, vocab_size: int, causal: bool = False,
                 cross_attention: Optional[str] = None, cross_attention_kwargs: Optional[Dict[str, Any]] = None,
                 n_layers: Optional[int] = None, token_embedding: Optional[nn.Embedding] = None,
                 embedding_scale: Optional[float] = None, n_segments: int = 0, embedding_norm: bool = False,
                 token_segments: bool = False) -> None:
        super().__init__()
        if not isinstance(config, StackConfig):
            raise TypeError(f"config must be a StackConfig, got {type(config).__name__}")
        self.config = config
        self.causal = causal
        n_layers = config.n_layers if n_layers is None else _checks.positive_int("n_layers", n_layers)
        self.rotary = None
        if config.rotary():
            if "positions" not in inspect.signature(self.run_layers).parameters:
                raise ValueError(f"positional='rotary' needs a layer loop that passes positions to attention; "
                                 f"{type(self).__name__}.run_layers does not")
            self.rotary = RotaryEmbedding(config.head_size(), base=config.rope_theta, scaling=config.rope_scaling or None,
                                          max_len=config.max_len)
        self.embed = Embeddings(vocab_size, config.d_model, positional=config.positional, max_len=config.max_len,
                                dropout=config.dropout, scale=embedding_scale, n_segments=n_segments,
                                norm=embedding_norm, eps=config.layer_norm_eps, token=token_embedding,
                                token_segments=token_segments)
        self.layers = nn.ModuleList(
            TransformerBlock(config, causal=causal, cross_attention=cross_attention,
                             cross_attention_kwargs=cross_attention_kwargs, rotary=self.rotary,
                             attention=config.layer_attention(i))
            for i in range(n_layers))
        for block in self.layers[1:]:  # parameters a kernel shares across the stack (Linformer's layerwise E)
            if type(block.self_attn.kernel) is type(self.layers[0].self_attn.kernel):  # (not a hybrid stack's other kernel)
                block.self_attn.kernel.share_across_layers(self.layers[0].self_attn.kernel)
        final = lookup("residual", config.residual).final_norm
        self.final_norm = build_norm(config.norm, config.d_model, eps=config.layer_norm_eps) if final else nn.Identity()

    def forward(self, input_ids: Tensor, token_type_ids: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                memory: Optional[Tensor] = None, memory_mask: Optional[Tensor] = None,
                state: Optional[StackState] = None, need_weights: bool = False, return_state: bool = False,
                return_hidden: bool = False, position_ids: Optional[Tensor] = None) -> StackOutput:
        """Embed ``input_ids (B, L)`` at positions following ``state.position`` (or at ``position_ids
        (B, L)``, e.g. counted from each row's first real token) and run the layers.

        Packed documents (transformers' ``DataCollatorWithFlattening``): ``position_ids`` that
        restart at 0 inside a row, with no ``mask``, mark documents concatenated in the row; every
        self-attention keeps each document to itself (``run_layers(..., packed=position_ids)``), so
        each gets what it gets alone. (With a ``mask``, ``position_ids`` are positions only: a
        left-padded batch.)"""
        offset = 0
        if state is not None:
            if not isinstance(state, StackState):
                raise TypeError(f"state must be the StackState a previous call returned, got {type(state).__name__}")
            offset = state.position
        _checks.token_ids("input_ids", input_ids, self.embed.vocab_size)
        max_len = self.config.max_len
        if self.config.positional == "learned" and offset + input_ids.shape[1] > max_len and position_ids is None:
            raise ValueError(f"input_ids reach position {offset + input_ids.shape[1]}, beyond max_len={max_len} "
                             f"of the learned positional embedding")
        x = self.embed(input_ids, token_type_ids, offset=offset, position_ids=position_ids)
        extra = {}
        if self.rotary is not None:  # the tokens' positions, for every self-attention to turn its queries and keys
            positions = position_ids if position_ids is not None else torch.arange(
                offset, offset + input_ids.shape[1], device=input_ids.device)
            extra = {"positions": positions}
        if mask is None and position_ids is not None and restarts(position_ids):
            if "packed" not in inspect.signature(self.run_layers).parameters:
                raise ValueError(f"position_ids of packed documents (restarting at 0 inside a row) need a layer loop "
                                 f"that passes them to attention; {type(self).__name__}.run_layers does not")
            extra["packed"] = position_ids  # packed documents: attention stays within each
        return self.run_layers(x, mask=mask, memory=memory, memory_mask=memory_mask, state=state,
                               need_weights=need_weights, return_state=return_state, return_hidden=return_hidden,
                               **extra)

    def run_layers(self, x: Tensor, mask: Optional[Tensor] = None, memory: Optional[Tensor] = None,
                   memory_mask: Optional[Tensor] = None, state: Optional[StackState] = None,
                   need_weights: bool = False, return_state: bool = False,
                   return_hidden: bool = False, positions: Optional[Tensor] = None,
                   packed: Optional[Tensor] = None) -> StackOutput:
        """The layer loop on embeddings ``x (B, L, d_model)`` — the hook for other depths (ACT, reversible).

        ``mask``: self-attention mask, True = may attend (``(B, L)`` key padding, or broadcastable
        to ``(B, H, L, N)``). A key-padding mask with no padding is dropped so that kernels keep
        their fast paths. ``memory (B, S, d_model)``, ``memory_mask (B, S)``: for cross-attention.
        ``positions (L,) or (B, L)``: the tokens' positions (rotary self-attention). ``packed (B, L)``:
        the ``position_ids`` of packed documents, for every self-attention (``forward``).
        """
        _checks.tensor("x", x, ndim=3, floating=True)
        mask = _drop_if_full(mask)
        memory_mask = _drop_if_full(memory_mask)
        layer_states = state.layers if state is not None else (None,) * len(self.layers)
        if len(layer_states) != len(self.layers):
            raise ValueError(f"state has {len(layer_states)} layers, the stack has {len(self.layers)}")
        checkpointing = (self.config.gradient_checkpointing and self.training and torch.is_grad_enabled()
                         and state is None and not return_state and not need_weights)
        weights, cross_weights, new_states, hidden_states = [], [], [], []
        for block, s in zip(self.layers, layer_states):
            if checkpointing:
                out = checkpoint(block, x, mask, memory, memory_mask, positions=positions, packed=packed,
                                 use_reentrant=False)
            else:
                out = block(x, mask=mask, memory=memory, memory_mask=memory_mask, state=s,
                            need_weights=need_weights, return_state=return_state, positions=positions, packed=packed)
            x = out.hidden
            weights.append(out.self_weights)
            cross_weights.append(out.cross_weights)
            new_states.append(out.state)
            if return_hidden:  # kept only when asked: each is (B, L, d_model)
                hidden_states.append(x)
        new_state = None
        if return_state:
            position = (state.position if state is not None else 0) + x.shape[1]
            new_state = StackState(tuple(new_states), position)
        has_cross = self.layers[0].cross_attn is not None
        return StackOutput(self.final_norm(x), weights if need_weights else None,
                           cross_weights if need_weights and has_cross else None, new_state,
                           hidden_states if return_hidden else None)


def copy_torch_layer(block: TransformerBlock, layer: nn.Module) -> None:
    """Copy a ``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer`` into ``block``.

    Mapping: ``self_attn`` -> ``self_attn`` and ``multihead_attn`` -> ``cross_attn`` (through
    ``MultiHeadAttention.from_torch``, which splits ``in_proj_weight`` into q, k, v);
    ``linear1``/``linear2`` -> ``ff.w1``/``ff.w2``; ``norm1``, (``norm2`` cross), last norm ->
    ``res_self``, (``res_cross``), ``res_ff`` LayerNorms. The residual wiring must match the
    layer's ``norm_first`` (pre-LN) or not (post-LN); a stack's closing norm is copied separately.
    """
    decoder = isinstance(layer, nn.TransformerDecoderLayer)
    if not decoder and not isinstance(layer, nn.TransformerEncoderLayer):
        raise TypeError(f"layer must be an nn.TransformerEncoderLayer or nn.TransformerDecoderLayer, got {type(layer).__name__}")
    if decoder != (block.cross_attn is not None):
        raise ValueError("a decoder layer needs a block with cross-attention, an encoder layer one without")
    pairs = [(block.self_attn, layer.self_attn)] + ([(block.cross_attn, layer.multihead_attn)] if decoder else [])
    for ours, theirs in pairs:
        ours.load_state_dict(MultiHeadAttention.from_torch(theirs).state_dict())
    block.ff.w1.load_state_dict(layer.linear1.state_dict())
    block.ff.w2.load_state_dict(layer.linear2.state_dict())
    norms = [block.res_self, block.res_cross, block.res_ff] if decoder else [block.res_self, block.res_ff]
    for wiring, norm in zip(norms, (layer.norm1, layer.norm2, layer.norm3) if decoder else (layer.norm1, layer.norm2)):
        wiring.norm.load_state_dict(norm.state_dict())


def restarts(position_ids: Tensor) -> bool:
    """Whether ``position_ids (B, L)`` restart at 0 after a row's first token (packed documents);
    while compiling, where values are not read, True."""
    if torch.compiler.is_compiling():
        return True
    return bool((position_ids[:, 1:] == 0).any())


def _drop_if_full(mask: Optional[Tensor]) -> Optional[Tensor]:
    """A 2-D key-padding mask that lets every key through is no mask (keeps SDPA's fast paths)."""
    if (isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.dim() == 2 and not torch.compiler.is_compiling()
            and bool(mask.all())):
        return None
    return mask
