"""qkv's kernels inside any transformers model, as ``attn_implementation="qkv-<kernel>"``.

    from qkv.hf import attention as huggingface             # or qkv.integrations.huggingface, the old name
    huggingface.register()                                  # every kernel that fits, as qkv-<name>
    huggingface.register("qkv-window-16", "window", radius=16)   # one more, with its knobs
    model = AutoModel.from_pretrained(path, attn_implementation="qkv-performer")
    model.set_attn_implementation("qkv-window-16")          # or swap on a loaded model

transformers (v5) calls an attention function ``f(module, query, key, value, attention_mask,
dropout=, scaling=, **kwargs) -> (output (B, L, H, E), weights or None)`` with the projected heads
``(B, H, L, E)`` — keys and values already joined with the KV cache — and builds the mask with the
function registered under the same name in ``AttentionMaskInterface``. Both are registered here:
a name with no mask function gets no mask at all (``masking_utils._preprocess_mask_arguments``
returns None), so a decoder silently loses its causal mask and every model its padding
(transformers PRs #45811, #46132).

The mask function keeps what qkv's kernels can use cheaply: for the plain causal and bidirectional
patterns it returns the key-padding mask ``(B, 1, 1, N)`` (or None without padding) and the kernel
is built causal when the attention layer is (``module.is_causal``, as transformers' own SDPA path
reads it); queries are aligned to the end of the keys, as in a KV cache. Any other pattern
(sliding windows, packed sequences, chunked attention, a static cache whose slots run past the
queries) is materialised as a boolean ``(B, 1, M, N)`` mask, which only ``qkv-softmax`` takes; the
other kernels refuse it and say why.

Which kernels fit a pretrained model: the kernels that map the model's own ``Q``, ``K``, ``V``
projections to outputs without weights of their own — ``softmax`` (exact: transformers' eager
attention), ``window``, ``local-1d``, ``strided``, ``fixed`` (softmax restricted to a pattern),
``performer`` (random features: an unbiased estimate of softmax), ``linear``, ``efficient`` and
``retention`` (other similarity functions; retention's decays are fixed), and ``lsh`` with
``shared_qk=False`` (encoders only). Refused: ``gla``, ``deltanet``, ``gated-deltanet`` (their gates
come from learned projections of the tokens; Qwen3-Next's and Kimi Linear's own layers get qkv's
gated delta rule and KDA through ``register()``, see ``delta_rule``),
``linformer`` (its learned projections ``E``, ``F`` are not in any pretrained checkpoint),
``adaptive-span`` and ``relative`` (learned spans, learned position terms), ``linear-window`` (its
window factors and feature maps are learned by attention transfer), ``lsh`` with shared
queries and keys (a pretrained model has separate key weights), ``local-2d`` without an
``image_size``. Kernels that cannot be causal (``efficient``, ``lsh`` without shared QK) serve
encoders only and say so when a decoder calls them.

Scores: transformers passes ``scaling`` (``1/sqrt(head_dim)`` for BERT, GPT-2, Llama). ``softmax``
takes it as its ``scale``; the kernels that approximate or restrict ``softmax(q k^T / sqrt(d))``
get ``q`` multiplied by ``scaling * sqrt(d)``, which gives them the same scores; ``linear`` and
``efficient`` have no temperature and ignore it. Grouped key/value heads (GQA, MQA) are repeated
to the query heads, as transformers' eager attention does.

Saving and loading: once ``register()`` has run, a model saved under a ``qkv-`` implementation
records it in ``config.json`` (``attn_implementation`` and ``qkv_attention``: the kernel and its
knobs), and ``from_pretrained`` loads it under that implementation, registering the name from the
record when this process has not — not under sdpa. A name registered here as another kernel is
refused; without ``register()`` in the loading process, transformers refuses the unknown name.

Arguments: every keyword argument a model passes is honoured or refused by name. Honoured:
``dropout``, ``scaling``, ``is_causal``, ``output_attentions``, ``softcap`` (Gemma 2) and ``s_aux``
(GPT-OSS's sink logits ``(H,)``, the layer's own parameter, read at each call) — the score knobs of
the kernels that take them, softmax, window and local-1d; the others refuse them by name — and
those in :data:`CARRIED`, which change nothing here (positions are in the rotated heads; packed
sequences and sliding windows are in the mask, as for eager). Refused when given: those in
:data:`UNIMPLEMENTED` (sinks in another layout, ``sinks``, ``position_bias``, a sparse indexer's ``indices``/``block_indices`` — which
transformers folds into the mask for eager and sdpa only — and a paged ``cache``), and any name
not listed: a DeepSeek V3.2 layer under ``qkv-softmax`` raises naming ``indices=`` instead of
running dense attention.

Decoding under transformers' KV cache: a kernel here keeps no state of its own. transformers
stores every key and value (``DynamicCache``) and hands the whole cache to each step, so a step is
one query against all cached keys. The exact and pattern kernels give the same tokens as without
a cache (the query is aligned to the last key). The recurrent kernels ``linear`` and ``performer``
do too — ``phi(q_t) sum_{j<=t} phi(k_j) v_j^T`` is recomputed from the cached keys at each step,
O(t d^2) instead of their O(d^2) state update, because transformers' cache keeps keys, not the
``(S, Z)`` sums; qkv's own ``GPT.generate`` carries those sums (``LinearState``) and decodes in
constant time per token.
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from ..attention.base import AttentionKernel
from ..registry import check_kwargs, lookup, names

__all__ = ["register", "registered", "layer_kernels", "KernelKey", "REFUSED", "DEFAULT_KNOBS", "PREFIX", "CARRIED",
           "UNIMPLEMENTED", "RECORD_KEY"]

PREFIX = "qkv-"
#: knobs ``register()`` gives a kernel beyond its own ``default_knobs`` (the sizes that fit the
#: model's length, filled in when a layer first calls it; a name with knobs of your own:
#: ``register("qkv-window-16", "window", radius=16)``): a pretrained model has separate W^Q, W^K
DEFAULT_KNOBS: Dict[str, Dict[str, Any]] = {
    "lsh": {"shared_qk": False, "seed": 0},
}
#: a kernel with a ``seed`` knob that is not given one gets this seed under ``register``: its random
#: features or rotations are then a function of the configuration (the seed, the head size), so that
#: train and eval mode, a copy, and a model saved and loaded again give the same outputs; nothing is
#: added to the checkpoint (which eager and sdpa still load)
DEFAULT_SEED = 0
#: kernels whose pattern relates a query's position to its keys' positions in one sequence (a band,
#: blocks, strides; lsh's chunks of one sequence sorted by hash): in a cross-attention layer — the
#: queries of one sequence reading the keys of another (an encoder-decoder's decoder reading the
#: encoder's output) — no such relation exists, so those layers run exact attention (``softmax``),
#: and the pattern serves the self-attention layers only
PATTERNED = frozenset({"window", "local-1d", "local-2d", "strided", "fixed", "lsh"})
# Pattern kernels whose blocks are anchored to absolute positions (``AttentionKernel.anchored``:
# local-1d, local-2d, fixed) would put a left-padded row's blocks at other tokens than the same
# prompt alone: its rows are shifted to start at their first real token before the kernel and
# back after (the others depend on distances only, which padding in front does not change).
#: kernels that cannot serve a pretrained model, and why
REFUSED: Dict[str, str] = {
    "linformer": "its learned projections E and F of the keys and values are in no pretrained checkpoint",
    "adaptive-span": "its learned spans are in no pretrained checkpoint",
    "relative": "its learned position terms (u, v, W_kR) are in no pretrained checkpoint",
    "gla": "its gates are computed from the tokens by learned projections that are in no pretrained softmax "
           "checkpoint (Kimi Linear's KDA, a GLA-like decay in a delta rule, is put in place by register(), "
           "qkv.hf.delta_rule)",
    "deltanet": "its writing strengths beta are computed from the tokens by learned projections that are in no "
                "pretrained softmax checkpoint",
    "gated-deltanet": "its gates are computed from the tokens by learned projections that are in no pretrained "
                      "softmax checkpoint; Qwen3-Next's own layers get qkv's gated delta rule from register() "
                      "(qkv.hf.delta_rule)",
    "linear-window": "its window factors (and Hedgehog feature maps) are learned by attention transfer and are in no "
                     "pretrained softmax checkpoint: linearize the model in qkv (a qkv llama with "
                     "attention='linear-window')",
}
#: kernels whose similarity has no temperature: transformers' ``scaling`` does not apply
_UNSCALED = frozenset({"linear", "efficient"})
#: keyword arguments transformers passes to attention functions that change no qkv kernel's answer,
#: and why — the names of its ``TransformersKwargs`` and ``FlashAttentionKwargs`` (which its models
#: pass to every attention function), the inputs a model forwards with them, and the arguments
#: that only eager's mask carries. ``dropout``, ``scaling``, ``is_causal`` and
#: ``output_attentions`` are honoured (see the attention function). Any other argument with a value
#: (not None) is refused by name: a name that does change nothing may be added here
CARRIED: Dict[str, str] = {
    "position_ids": "positions are already in the queries and keys (rotary) or the embeddings; packing is in the mask",
    "cu_seq_lens_q": "packed sequences: the mask keeps each to itself, as for eager and sdpa (refused when the "
                     "mask does not: _check_in_mask)",
    "cu_seq_lens_k": "packed sequences: the mask keeps each to itself, as for eager and sdpa (refused when the "
                     "mask does not: _check_in_mask)",
    "max_length_q": "packed sequences: the mask keeps each to itself, as for eager and sdpa",
    "max_length_k": "packed sequences: the mask keeps each to itself, as for eager and sdpa",
    "seq_idx": "packed sequences: the mask keeps each to itself, as for eager and sdpa",
    "sliding_window": "the window is in the mask (a full mask, which qkv-softmax takes and the other kernels refuse; "
                      "refused when the mask does not hold it: _check_in_mask)",
    "deterministic": "flash attention's choice of a deterministic backward; no kernel here is nondeterministic",
    "output_hidden_states": "what the model returns, not what attention computes",
    "output_router_logits": "what the model returns, not what attention computes",
    "return_dict": "what the model returns, not what attention computes",
    "num_items_in_batch": "the loss's normaliser",
    "use_cache": "the layer updates the KV cache before attention; the keys and values here include it",
    "past_key_values": "the layer updates the KV cache before attention; the keys and values here include it",
    "cache_position": "the layer updates the KV cache before attention; the mask places the queries",
    "encoder_hidden_states": "a cross-attention layer projects them into the keys and values given here",
    "encoder_attention_mask": "a cross-attention layer's padding is in the mask given here",
    "input_ids": "a model input forwarded along",
    "inputs_embeds": "a model input forwarded along",
    "token_type_ids": "a model input forwarded along",
    "decoder_input_ids": "a model input forwarded along",
    "decoder_attention_mask": "a model input forwarded along (the decoder's mask is given here)",
    "decoder_inputs_embeds": "a model input forwarded along",
}
#: arguments that change attention's answer, which qkv's kernels do not compute: refused by name
#: when given (not None), with what the argument does
UNIMPLEMENTED: Dict[str, str] = {
    "sinks": "adds attention sinks (a learned logit per head in the softmax)",
    "position_bias": "adds a position bias to the scores",
    "indices": "restricts each query to the keys a sparse indexer selected (top-k); eager and sdpa take it "
               "folded into the mask",
    "block_indices": "restricts each query to the key blocks a sparse indexer selected; eager and sdpa take it "
                     "folded into the mask",
    "cache": "a paged KV cache that the attention function itself must update (continuous batching)",
}

_registered: Dict[str, Tuple[str, Dict[str, Any]]] = {}  # attn_implementation -> (kernel name, knobs)
_warned: set = set()
#: the field of a saved transformers ``config.json`` that records the qkv kernel (and its knobs) the
#: model ran under, beside ``attn_implementation`` (see ``_record_in_saved_configs``)
RECORD_KEY = "qkv_attention"
#: the attribute of a transformers attention layer that keeps the kernels built for it (a plain
#: dict, not a submodule: nothing is added to the layer's state_dict, which eager and sdpa still load)
KERNELS_ATTR = "_qkv_kernels"


@dataclass(frozen=True)
class KernelKey:
    """What a layer's kernel is built from: calls with equal keys share one kernel (and its random
    features). ``dropout`` is 0 for a kernel that applies none, so that training and evaluation
    share one; ``knobs`` as sorted ``(name, repr(value))`` pairs."""

    impl: str  # the attn_implementation that asked for it
    kernel: str  # the kernel's registry name (``softmax`` in a cross-attention layer)
    knobs: Tuple[Tuple[str, str], ...]
    causal: bool
    dropout: float
    heads: int
    d_head: int
    device: str


def layer_kernels(module: torch.nn.Module) -> Dict[KernelKey, AttentionKernel]:
    """The kernels built for transformers attention layer ``module``, by what they were built from
    (empty for a layer no qkv kernel served)."""
    return module.__dict__.get(KERNELS_ATTR, {})


def _refusal(kernel: str, knobs: Dict[str, Any]) -> Optional[str]:
    """Why ``kernel`` with ``knobs`` cannot serve a pretrained model, or None."""
    if kernel in REFUSED:
        return REFUSED[kernel]
    cls = lookup("attention", kernel)
    params = inspect.signature(cls.__init__).parameters
    if cls.needs_seq_len:
        return "it needs the sequence length at construction"
    shared = knobs.get("shared_qk", params["shared_qk"].default if "shared_qk" in params else cls.shared_qk)
    if shared:
        return ("it shares queries and keys (keys are the normalised queries), and a pretrained model has separate "
                "key weights; lsh fits encoders with shared_qk=False")
    if kernel == "local-2d" and "image_size" not in knobs:
        return "it needs image_size=(H, W): its blocks are 2-D"
    return None


def register(name: Optional[str] = None, kernel: Optional[str] = None, **knobs: Any) -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """Make qkv kernels selectable as transformers' ``attn_implementation``.

    ``register()`` registers every kernel that fits a pretrained model as ``qkv-<kernel>`` (those
    that need knobs with :data:`DEFAULT_KNOBS`); ``register(name, kernel, **knobs)`` registers one,
    ``name`` starting with ``qkv-``. Each goes into both ``AttentionInterface`` and
    ``AttentionMaskInterface``. Returns ``{attn_implementation: (kernel, knobs)}`` of what was
    registered. A kernel that cannot serve a pretrained model raises ``ValueError`` with the reason
    (:data:`REFUSED`); unknown knobs raise ``TypeError``. ``register()`` also registers the
    kernels that cannot serve under their ``qkv-<kernel>`` names, as functions that raise that reason
    and list the names that exist — a model set to ``attn_implementation="qkv-linformer"`` says why
    at its first call. A kernel with a ``seed`` knob gets :data:`DEFAULT_SEED` unless given one.
    ``register()`` also puts qkv's gated delta rule in Qwen3-Next's layers and KDA in Kimi Linear's
    (``qkv.hf.delta_rule.patch``; ``unpatch()`` restores transformers' functions).
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError("qkv.hf.attention (qkv.integrations.huggingface) needs transformers: pip install 'qkv[hf]'") from e
    if name is None and kernel is None:
        if knobs:
            raise TypeError("knobs go with one kernel: register(name, kernel, **knobs)")
        wanted = {f"{PREFIX}{k}": (k, dict(DEFAULT_KNOBS.get(k, {}))) for k in names("attention")
                  if _refusal(k, DEFAULT_KNOBS.get(k, {})) is None}
        refused = {f"{PREFIX}{k}": _refusal(k, DEFAULT_KNOBS.get(k, {})) for k in names("attention")
                   if f"{PREFIX}{k}" not in wanted}
    else:
        if not isinstance(name, str) or not name.startswith(PREFIX) or len(name) == len(PREFIX):
            raise ValueError(f"name must be an attn_implementation starting with {PREFIX!r} (e.g. 'qkv-window-16'), got {name!r}")
        if not isinstance(kernel, str):
            raise TypeError(f"kernel must be a qkv kernel name (qkv.list_attention()), got {kernel!r}")
        cls = lookup("attention", kernel)  # an unknown name raises, listing the known ones
        why = _refusal(cls.registry_name, knobs)
        if why is not None:
            raise ValueError(f"attention {cls.registry_name!r} cannot serve a pretrained transformers model: {why}")
        check_kwargs(cls, {**knobs, "causal": False, "dropout": 0.0}, f"attention {cls.registry_name!r}")
        params = inspect.signature(cls.__init__).parameters
        own = set(cls.default_knobs(512, 1, 64))  # what the kernel fills in for itself (head arguments included)
        needed = [p for p, v in params.items() if v.default is inspect.Parameter.empty and v.kind is v.KEYWORD_ONLY
                  and p not in knobs and p not in own]
        if needed:
            raise TypeError(f"attention {cls.registry_name!r} needs {', '.join(needed)}: "
                            f"register({name!r}, {kernel!r}, {', '.join(f'{p}=...' for p in needed)})")
        wanted = {name: (cls.registry_name, dict(knobs))}
        refused = {}
    for impl, (kernel_name, kernel_knobs) in wanted.items():
        params = inspect.signature(lookup("attention", kernel_name).__init__).parameters
        if "seed" in params and kernel_knobs.get("seed") is None:
            kernel_knobs["seed"] = DEFAULT_SEED  # see DEFAULT_SEED: a function of the configuration
        AttentionInterface.register(impl, _attention_function(impl, kernel_name, kernel_knobs))
        AttentionMaskInterface.register(impl, _mask_function)
        _registered[impl] = (kernel_name, kernel_knobs)
    for impl, why in refused.items():
        if impl not in _registered:  # a name registered with knobs that fit (local-2d's image_size) stays
            AttentionInterface.register(impl, _refusing_function(impl, why))
            AttentionMaskInterface.register(impl, _refusing_function(impl, why))
    if name is None and kernel is None:
        from . import delta_rule

        delta_rule.patch()  # Qwen3-Next's gated delta rule, Kimi Linear's KDA on qkv's engine (delta_rule.unpatch())
    _explain_unknown_names()
    _record_in_saved_configs()
    return dict(wanted)


def _unknown_name_message(impl: str) -> str:
    """What to say of ``attn_implementation=impl`` (a ``qkv-`` name nothing was registered under)."""
    registered = ", ".join(sorted(_registered)) or "none"
    kernel = impl[len(PREFIX):]
    hint = ""
    try:
        canonical = lookup("attention", kernel).registry_name  # a name or an alias
    except (KeyError, ValueError):
        canonical = None
    if canonical is not None:
        hint = (f"; {kernel!r} is qkv's {canonical!r} kernel: register({impl!r}, {canonical!r}, **knobs) "
                f"registers it under this name")
    return (f"attn_implementation={impl!r}: no qkv kernel is registered for transformers under that name "
            f"(registered: {registered}){hint}; qkv's kernels: {', '.join(names('attention'))}")


def _explain_unknown_names() -> None:
    """Give an unknown ``qkv-`` name qkv's message: transformers refuses any name not registered with a
    list of its own implementations (eager, sdpa, ...), which says nothing of qkv's. Its check is
    wrapped once, for ``qkv-`` names only; every other name goes to it unchanged."""
    try:
        from transformers import PreTrainedModel
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:  # pragma: no cover - transformers without these names: its own message stays
        return
    check = getattr(PreTrainedModel, "get_correct_attn_implementation", None)
    if check is None or getattr(check, "_qkv_wrapped", False):
        return

    def get_correct_attn_implementation(self, requested_attention, *args, **kwargs):
        if isinstance(requested_attention, str) and requested_attention.startswith(PREFIX):
            _register_recorded(getattr(self, "config", None), requested_attention)
            if requested_attention not in ALL_ATTENTION_FUNCTIONS.valid_keys():
                raise ValueError(_unknown_name_message(requested_attention))
        return check(self, requested_attention, *args, **kwargs)

    get_correct_attn_implementation._qkv_wrapped = True
    get_correct_attn_implementation.__doc__ = check.__doc__
    PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation


def _jsonable(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _record_in_saved_configs() -> None:
    """Make a transformers config set to a registered ``qkv-`` implementation say so when saved:
    ``config.json`` gets ``attn_implementation`` (which transformers reads back as the implementation
    to load with, so a reload does not fall back to sdpa) and :data:`RECORD_KEY`, the kernel and its
    knobs (with which a reload registers the name when this process has not). Its ``to_dict`` is
    wrapped once; a config under any other implementation is written as before, without a record."""
    try:
        from transformers import PretrainedConfig
    except ImportError:  # pragma: no cover - register() has imported transformers already
        return
    to_dict = PretrainedConfig.to_dict
    if getattr(to_dict, "_qkv_wrapped", False):
        return

    def recording_to_dict(self) -> Dict[str, Any]:
        out = to_dict(self)
        out.pop(RECORD_KEY, None)  # a record read from config.json describes the implementation it was saved under
        impl = self.__dict__.get("_attn_implementation_internal")
        if isinstance(impl, str) and impl in _registered:
            kernel, knobs = _registered[impl]
            out["attn_implementation"] = impl
            out[RECORD_KEY] = {"attn_implementation": impl, "kernel": kernel, "knobs": _jsonable(knobs)}
        return out

    recording_to_dict._qkv_wrapped = True
    recording_to_dict.__doc__ = to_dict.__doc__
    PretrainedConfig.to_dict = recording_to_dict


def _register_recorded(config: Any, impl: str) -> None:
    """Before a model is set to ``impl``: register it from the record its config was saved with
    (:data:`RECORD_KEY`) when this process has not; refuse when ``impl`` is registered here as
    another kernel or with other knobs than the model was saved under."""
    record = getattr(config, RECORD_KEY, None)
    if not isinstance(record, dict) or record.get("attn_implementation") != impl:
        return
    kernel, knobs = record.get("kernel"), record.get("knobs") or {}
    if not isinstance(kernel, str) or not isinstance(knobs, dict):
        raise ValueError(f"attn_implementation={impl!r}: the config's {RECORD_KEY} is not a kernel name and its knobs: "
                         f"{record!r}")
    if impl in _registered:
        mine = (_registered[impl][0], _jsonable(_registered[impl][1]))
        if mine != (kernel, _jsonable(knobs)):
            raise ValueError(f"attn_implementation={impl!r}: the model was saved under qkv's {kernel!r} kernel with "
                             f"knobs {knobs}, and {impl!r} is registered here as {mine[0]!r} with {mine[1]}; register "
                             f"the saved kernel under another name and load with attn_implementation=that name")
        return
    register(impl, kernel, **knobs)


def registered() -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """What :func:`register` has registered so far: ``{attn_implementation: (kernel, knobs)}``."""
    return dict(_registered)


# ----------------------------------------------------------------------------- the mask


def _mask_function(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: Any = 0,
                   mask_function: Optional[Callable] = None, attention_mask: Optional[Tensor] = None,
                   use_vmap: bool = False, device: Any = "cpu", **kwargs: Any) -> Optional[Tensor]:
    """transformers' mask interface: the key-padding mask ``(B, 1, 1, N)`` (None without padding)
    for the plain causal and bidirectional patterns, queries aligned to the end of the keys; any
    other pattern as the full boolean mask ``(B, 1, M, N)``."""
    from transformers.masking_utils import (bidirectional_mask_function, causal_mask_function,
                                            prepare_padding_mask, sdpa_mask)

    mask_function = causal_mask_function if mask_function is None else mask_function
    q_offset, kv_offset = int(q_offset), int(kv_offset)
    aligned = q_offset + q_length == kv_offset + kv_length  # query i sits at key N - M + i
    if mask_function is bidirectional_mask_function or (mask_function is causal_mask_function and aligned):
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is None:
            return None
        padding = padding[:, kv_offset: kv_offset + kv_length].to(device=device, dtype=torch.bool)  # (B, N)
        if not torch.compiler.is_compiling() and bool(padding.all()):  # a traced graph cannot branch on values
            return None
        return padding[:, None, None, :]  # (B, 1, 1, N)
    for key in ("allow_is_causal_skip", "allow_is_bidirectional_skip", "allow_torch_fix"):
        kwargs.pop(key, None)
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                     allow_is_causal_skip=False, allow_is_bidirectional_skip=False, use_vmap=use_vmap,
                     device=device, **{k: v for k, v in kwargs.items() if k == "local_size"})


# ----------------------------------------------------------------------------- the attention


def _refusing_function(impl: str, why: str) -> Callable:
    """An attention (and mask) function for a kernel that cannot serve a pretrained model: it raises
    ``ValueError`` with the reason and the names that can, at the first call."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        usable = ", ".join(sorted(_registered)) or "none registered"
        raise ValueError(f"attn_implementation={impl!r}: attention {impl[len(PREFIX):]!r} cannot serve a pretrained "
                         f"transformers model: {why}. qkv kernels registered for transformers: {usable} "
                         f"(qkv.hf.attention.register(name, kernel, **knobs) adds one)")

    refuse.__name__ = refuse.__qualname__ = f"qkv_refused_{impl[len(PREFIX):].replace('-', '_')}"
    return refuse


def is_cross_attention(module: torch.nn.Module) -> bool:
    """Whether transformers calls ``module`` as cross-attention (queries of one sequence, keys and
    values of another): an attention that says so (``is_cross_attention``, BERT's
    ``BertCrossAttention`` class), or a decoder's attention that is not causal (BART, mBART, Marian,
    Pegasus, Whisper and their kin build their decoder's cross-attention as ``is_decoder=True`` and
    ``is_causal=False``, its self-attention causal)."""
    if getattr(module, "is_cross_attention", False) is True or "CrossAttention" in type(module).__name__:
        return True
    return getattr(module, "is_decoder", False) is True and getattr(module, "is_causal", None) is False


def _leading_padding(mask: Optional[Tensor]) -> Optional[Tensor]:
    """``(B,)`` the number of masked keys before each row's first allowed key, for a key-padding
    mask ``(B, 1, 1, N)`` with some row padded in front; None when no row is."""
    if mask is None or mask.shape[-2] != 1 or mask.shape[1] != 1:
        return None
    row = mask[:, 0, 0, :]  # (B, N)
    lead = torch.where(row.any(-1), row.to(torch.int8).argmax(-1), torch.zeros_like(row[:, 0], dtype=torch.long))
    if torch.compiler.is_compiling():
        return lead  # a traced graph cannot branch on values: rows rolled by 0 are as they were
    return lead if bool(lead.any()) else None


def _roll_rows(x: Tensor, shift: Tensor) -> Tensor:
    """Row ``b`` of ``x (B, H|1, L, E)`` rolled by ``-shift[b]`` along dim -2: position ``shift[b]`` to 0."""
    L = x.shape[-2]
    idx = (torch.arange(L, device=x.device) + shift.view(-1, 1)) % L  # (B, L)
    return x.gather(-2, idx.view(-1, 1, L, 1).expand(x.shape[0], x.shape[1], L, x.shape[-1]))


def _anchored_call(built: AttentionKernel, query: Tensor, key: Tensor, value: Tensor, mask: Tensor, lead: Tensor,
                   need_weights: bool):
    """``built`` on a left-padded batch as on each row alone: every row (queries placed in the keys'
    frame, aligned to its end) rolled to start at its first real key, the kernel run on the whole
    frame, the output rows rolled back and the queries' rows taken. Cost: a frame of ``N`` queries
    when ``M < N`` (a cached decoding step), instead of ``M``."""
    M, N = query.shape[-2], key.shape[-2]
    frame_q = query if M == N else torch.nn.functional.pad(query, (0, 0, N - M, 0))  # (B, H, N, E)
    out = built(_roll_rows(frame_q, lead), _roll_rows(key, lead), _roll_rows(value, lead),
                mask=_roll_rows(mask[:, :, 0, :, None], lead)[..., 0][:, :, None, :], need_weights=need_weights)
    back = (-lead) % N
    output = _roll_rows(out.output, back)[:, :, N - M:]
    weights = None
    if out.weights is not None:  # (B, H, N, N): rows and columns back
        w = _roll_rows(out.weights, back)[:, :, N - M:]
        weights = _roll_rows(w.transpose(-1, -2), back).transpose(-1, -2)
    return output, weights


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, H_kv, N, E)`` -> ``(B, H_kv * n_rep, N, E)``: each key/value head serves ``n_rep`` query heads."""
    if n_rep == 1:
        return x
    B, H, N, E = x.shape
    return x[:, :, None].expand(B, H, n_rep, N, E).reshape(B, H * n_rep, N, E)


def _max_len(module: torch.nn.Module, length: int) -> int:
    """The longest sequence the model takes (its config's positions), else the first call's length."""
    config = getattr(module, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return max(1, length)


def _kernel(module: torch.nn.Module, impl: str, kernel: str, knobs: Dict[str, Any], causal: bool, dropout: float,
            heads: int, d_head: int, device: torch.device, length: int = 1) -> AttentionKernel:
    """The kernel of one attention layer, built on its first call and kept on the layer
    (``layer_kernels``: random features stay fixed); the knobs not given are the kernel's own
    ``default_knobs`` for the model's length, as in qkv's own models."""
    cls = lookup("attention", kernel)
    if dropout > 0 and not cls.applies_dropout:
        if (impl, "dropout") not in _warned:
            _warned.add((impl, "dropout"))
            warnings.warn(f"attention {kernel!r} forms no attention-weight matrix and applies no dropout: the "
                          f"model's attention dropout ({dropout}) is not applied", stacklevel=4)
        dropout = 0.0  # before the key: training and eval share one kernel (and its random features)
    key = KernelKey(impl, kernel, tuple(sorted((k, repr(v)) for k, v in knobs.items())), causal, dropout, heads,
                    d_head, str(device))
    kernels = module.__dict__.setdefault(KERNELS_ATTR, {})
    if key not in kernels:
        if torch.compiler.is_exporting():  # built inside the trace, its buffers would be the trace's fake tensors
            raise ValueError(f"{impl}: {type(module).__name__} builds its qkv kernel at its first call; call the model "
                             f"once before exporting it (torch.export), then export")
        try:
            built = cls(causal=causal, dropout=dropout, **cls.knobs(_max_len(module, length), heads, d_head, knobs, with_heads=True))
        except ValueError as e:
            role = "a decoder (causal attention)" if causal else "an encoder"
            raise ValueError(f"{impl}: {e}; {type(module).__name__} is {role}") from None
        kernels[key] = built.to(device)
    return kernels[key]


def _boolean_mask(impl: str, mask: Optional[Tensor]) -> Optional[Tensor]:
    """transformers' mask as qkv's (True = may attend): a boolean mask as it is, an additive float
    mask (0 = attend, the dtype's minimum = masked) compared with 0; one that adds other score
    biases is refused."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    allowed = mask == 0
    if not torch.compiler.is_compiling() and not bool((allowed | (mask <= torch.finfo(mask.dtype).min / 2)).all()):
        raise ValueError(f"{impl}: the attention mask adds score biases, which qkv's kernels do not take")
    return allowed


def _check_arguments(impl: str, kernel: str, layer: str, kwargs: Dict[str, Any]) -> None:
    """Refuse, by name, every argument in ``kwargs`` (beyond the honoured ones) that is given and
    is not in :data:`CARRIED`: those of :data:`UNIMPLEMENTED` with what they do, any other as unknown
    — none is dropped without a word."""
    for name, value in kwargs.items():
        if value is None or name in CARRIED or name in ("output_attentions", "softcap", "s_aux"):
            continue
        if name in UNIMPLEMENTED:
            raise ValueError(f"{impl}: {layer} passes {name}=, which {UNIMPLEMENTED[name]}; qkv's {kernel!r} kernel "
                             f"does not compute it (it would be ignored): use attn_implementation='eager'")
        raise ValueError(f"{impl}: {layer} passes {name}=, an argument qkv's {kernel!r} kernel does not know "
                         f"(it would be ignored); if it changes nothing in attention, add it to "
                         f"qkv.hf.attention.CARRIED; else use attn_implementation='eager'")


def _check_in_mask(impl: str, layer: str, kwargs: Dict[str, Any], mask: Optional[Tensor], n_queries: int,
                   n_keys: int) -> None:
    """Refuse the carried patterns that the mask does not hold — with a padding mask or none, they
    would be dropped: packed sequences (``cu_seq_lens_q``/``_k`` bounding more than one), whose mask
    transformers builds from ``position_ids`` only without a KV cache, and a ``sliding_window``
    shorter than the keys (one query, a decoding step, has its window in its one mask row: the
    keys before the window must be masked there)."""
    if mask is not None and mask.shape[-2] != 1:
        return  # a full pattern: transformers' mask function put the window or the packing in it
    window = kwargs.get("sliding_window")
    if isinstance(window, int) and not isinstance(window, bool) and window < n_keys and (
            n_queries > 1 or mask is None or bool(mask[..., : n_keys - window].any())):
        raise ValueError(f"{impl}: {layer} passes sliding_window={window} for {n_keys} keys, and its mask does not "
                         f"hold the window (a padding mask or none); the window would be dropped")
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        bounds = kwargs.get(name)
        if isinstance(bounds, Tensor) and bounds.numel() > 2:
            raise ValueError(f"{impl}: {layer} passes {name}= for {bounds.numel() - 1} packed sequences, and its mask "
                             f"does not keep them apart (transformers builds that mask from position_ids without a KV "
                             f"cache: use_cache=False); each would attend to the others' tokens")


def _attention_function(impl: str, kernel: str, knobs: Dict[str, Any]) -> Callable:
    """transformers' attention signature around qkv kernel ``kernel`` built with ``knobs``."""

    def attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                  dropout: float = 0.0, scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                  **kwargs: Any) -> Tuple[Tensor, Optional[Tensor]]:
        B, H, M, E = query.shape  # (B, H, M, E); key, value (B, H_kv, N, E)
        _check_arguments(impl, kernel, type(module).__name__, kwargs)
        n_rep = H // key.shape[1]
        key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)  # (B, H, N, E)
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", False))
        mask = _boolean_mask(impl, attention_mask)
        _check_in_mask(impl, type(module).__name__, kwargs, mask, M, key.shape[-2])
        if mask is not None and mask.shape[-2] != 1:  # the full pattern (causality included) is in the mask
            causal = False
        use, own = kernel, dict(knobs)
        if kernel in PATTERNED and is_cross_attention(module):
            use, own = "softmax", {}  # PATTERNED: no pattern between two sequences
            if (impl, "cross") not in _warned:
                _warned.add((impl, "cross"))
                warnings.warn(f"{impl}: {type(module).__name__} is cross-attention (queries of one sequence, keys of "
                              f"another), where the {kernel!r} pattern has no meaning; it runs exact softmax attention "
                              f"there, and {kernel!r} in the self-attention layers", stacklevel=2)
        if use == "softmax" and "scale" not in own:
            own["scale"] = scaling  # transformers' own factor (None: 1/sqrt(E))
        if kwargs.get("softcap") is not None:  # Gemma 2: c tanh(scores / c), a knob of the kernels that form scores
            if "softcap" not in inspect.signature(lookup("attention", use).__init__).parameters:
                raise ValueError(f"{impl}: {type(module).__name__} passes softcap=, which caps the scores (tanh "
                                 f"softcapping); qkv's {use!r} kernel forms no score of each query-key pair to cap: use "
                                 f"qkv-softmax, qkv-window or attn_implementation='eager'")
            own["softcap"] = float(kwargs["softcap"])
        sinks = kwargs.get("s_aux")
        if sinks is not None:  # GPT-OSS: a learned logit per head in the softmax's denominator
            if "sinks" not in inspect.signature(lookup("attention", use).__init__).parameters:
                raise ValueError(f"{impl}: {type(module).__name__} passes s_aux=, which adds attention sinks (a learned "
                                 f"logit per head in the softmax); qkv's {use!r} kernel forms no softmax over scores to "
                                 f"add it to: use qkv-softmax, qkv-window or attn_implementation='eager'")
            if not isinstance(sinks, Tensor) or tuple(sinks.shape) != (H,):
                raise ValueError(f"{impl}: {type(module).__name__} passes s_aux= of shape "
                                 f"{tuple(getattr(sinks, 'shape', ()))}; expected one logit per head, ({H},)")
            own["sinks"] = True
        built = _kernel(module, impl, use, own, causal, float(dropout), H, E, query.device, key.shape[-2])
        if sinks is not None:
            built._parameters["sinks"] = sinks  # the layer's own logits (trained there), not a copy
        built.train(module.training)
        if use != "softmax" and use not in _UNSCALED and scaling is not None:
            query = query * (scaling * math.sqrt(E))  # the kernel divides by sqrt(E): softmax(scaling q k^T)
        if mask is not None and mask.shape[-2] != 1 and built.supports_mask != "full":
            window = kwargs.get("sliding_window")
            what = (f"its sliding_window={window} is a pattern" if window is not None else "its attention pattern is "
                    "not plain causal or bidirectional (a sliding window, packed sequences or a static cache)")
            raise ValueError(f"{impl}: {type(module).__name__}: {what}, and attention {use!r} takes key-padding masks "
                             f"only; use qkv-softmax, or a dynamic cache without packing")
        need_weights = bool(kwargs.get("output_attentions", False))
        lead = _leading_padding(mask) if built.anchored else None
        if lead is not None:  # anchored blocks start at each row's first real token
            output, weights = _anchored_call(built, query, key, value, mask, lead, need_weights)
        else:
            out = built(query, key, value, mask=mask, need_weights=need_weights)
            output, weights = out.output, out.weights
        return output.transpose(1, 2).contiguous(), weights  # (B, M, H, E)

    attention.__name__ = attention.__qualname__ = f"qkv_attention_{kernel.replace('-', '_')}"
    attention.__doc__ = f"qkv's {kernel!r} kernel ({knobs or 'default knobs'}) as a transformers attention function."
    return attention
