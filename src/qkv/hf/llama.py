"""transformers' Llama, Mistral, Qwen2 and Qwen3 checkpoints in and out of qkv's ``Llama``
(``models/transformer/llama.py``): one family of ``qkv.hf.checkpoints`` (``FAMILIES``), read and
written by its ``load`` / ``save`` / ``from_hf`` with their checks.

=========================================  =====================================================
transformers                               qkv (``LlamaConfig``)
=========================================  =====================================================
hidden_size, intermediate_size,            d_model, d_ff, n_layers, n_heads,
num_hidden_layers, num_attention_heads,    n_kv_heads (grouped-query attention),
num_key_value_heads, head_dim              d_head (None when hidden_size / heads)
rms_norm_eps, max_position_embeddings      layer_norm_eps (RMSNorm), max_len
rope_parameters (or the older rope_theta   rope_theta, rope_scaling (default, linear, dynamic,
+ rope_scaling)                            yarn, llama3; another type is refused)
hidden_act (silu)                          activation, glu=True (SwiGLU)
tie_word_embeddings                        tie_embeddings
attention_bias (Llama, Qwen3: q k v o),    bias=False with qkv_bias / attention bias
mlp_bias; Qwen2: q k v biases              qkv_bias=True (Qwen2)
sliding_window (Mistral)                   sliding_window (the ``window`` kernel)
q_norm, k_norm (Qwen3)                     qk_norm=True
=========================================  =====================================================

Tensors: ``model.embed_tokens`` -> ``stack.embed.token``; ``model.layers.i.self_attn.{q,k,v,o}_proj``
-> ``stack.layers.i.self_attn.{q,k,v,out}_proj``; ``input_layernorm`` / ``post_attention_layernorm``
-> ``res_self.norm`` / ``res_ff.norm``; ``mlp.{gate,up,down}_proj`` -> ``ff.{w1,v,w2}`` (SwiGLU's
``W``, ``V``, ``W2``); ``model.norm`` -> ``stack.final_norm``; ``lm_head`` (absent when tied).
Both rotate halves of each head (``qkv.rotary``), so no weight is permuted.

A llama.cpp GGUF file (``.gguf``) is read as the same checkpoint: ``Llama.from_pretrained(FILE)``
(or ``QKVModel.from_pretrained``) takes ``qkv.hf.gguf.read_gguf``'s config and de-quantized float32
state dict through ``from_hf`` -- no file is written -- registered as the ``"gguf"`` checkpoint
format (read only: qkv writes none; ``save_pretrained(dir, format="huggingface")`` writes what
llama.cpp's converter reads).

Refused in one line: a rope type qkv has not (``longrope``, ...), ``partial_rotary_factor`` < 1,
``pretraining_tp`` > 1, per-layer sliding windows (Qwen's ``use_sliding_window``), an activation
other than silu/gelu, Llama's ``attention_bias`` without ``mlp_bias`` on the output projection's
side (o biased, MLP not: qkv's ``bias`` covers both).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from ..models.base import CHECKPOINT_FORMATS, CheckpointFormat
from ..models.transformer.llama import Llama
from ..rotary import ROPE_TYPES
from .checkpoints import FAMILIES, HF_ACTIVATIONS, Family, Rule, _architecture, _error, _get, _pair, _refuse
from ..models.base import short_repr

__all__ = ["llama_rules", "llama_config", "hf_llama_config"]

_ARCHITECTURES = {"llama": ("LlamaForCausalLM", "LlamaModel"), "mistral": ("MistralForCausalLM", "MistralModel"),
                  "qwen2": ("Qwen2ForCausalLM", "Qwen2Model"), "qwen3": ("Qwen3ForCausalLM", "Qwen3Model")}
#: transformers' default when a field is absent from config.json, per model_type
_DEFAULTS = {"llama": {"num_key_value_heads": None, "max_position_embeddings": 2048, "vocab_size": 32000},
             "mistral": {"num_key_value_heads": 8, "max_position_embeddings": 4096 * 32, "vocab_size": 32000,
                         "sliding_window": 4096},
             "qwen2": {"num_key_value_heads": 32, "max_position_embeddings": 32768, "vocab_size": 151936},
             "qwen3": {"num_key_value_heads": 32, "max_position_embeddings": 32768, "vocab_size": 151936,
                       "head_dim": 128}}
_QKV_ACTIVATIONS = {"silu": "silu", "swish": "silu", **HF_ACTIVATIONS}
_TO_HF_ACTIVATION = {"silu": "silu", "gelu": "gelu", "gelu-tanh": "gelu_pytorch_tanh", "relu": "relu"}


def llama_rules(c: Any, names: Any) -> Tuple[List[Rule], Dict[str, str]]:
    """``(rules, tied)``: transformers' tensor names of config ``c`` (``names`` unused: one layout)."""
    rules = [Rule("model.embed_tokens.weight", ("stack.embed.token.weight",))]
    qkv_bias = c.bias if c.qkv_bias is None else c.qkv_bias
    for i in range(c.n_layers):
        hf, ours = f"model.layers.{i}", f"stack.layers.{i}"
        for p in "qkv":
            rules += _pair(f"{hf}.self_attn.{p}_proj", f"{ours}.self_attn.{p}_proj", bias=qkv_bias)
        rules += _pair(f"{hf}.self_attn.o_proj", f"{ours}.self_attn.out_proj", bias=c.bias)
        if c.qk_norm:
            rules += [Rule(f"{hf}.self_attn.q_norm.weight", (f"{ours}.self_attn.q_norm.weight",)),
                      Rule(f"{hf}.self_attn.k_norm.weight", (f"{ours}.self_attn.k_norm.weight",))]
        rules += [Rule(f"{hf}.input_layernorm.weight", (f"{ours}.res_self.norm.weight",)),
                  Rule(f"{hf}.post_attention_layernorm.weight", (f"{ours}.res_ff.norm.weight",)),
                  *_pair(f"{hf}.mlp.gate_proj", f"{ours}.ff.w1", bias=c.bias),
                  *_pair(f"{hf}.mlp.up_proj", f"{ours}.ff.v", bias=c.bias),
                  *_pair(f"{hf}.mlp.down_proj", f"{ours}.ff.w2", bias=c.bias)]
    rules.append(Rule("model.norm.weight", ("stack.final_norm.weight",)))
    if not c.tie_embeddings:
        rules.append(Rule("lm_head.weight", ("lm_head.weight",)))
    return rules, ({"lm_head.weight": "model.embed_tokens.weight"} if c.tie_embeddings else {})


def _ignorable(name: str) -> bool:
    """Rotary frequencies older checkpoints saved: computed, not weights."""
    return name.endswith("rotary_emb.inv_freq")


def _rope(config: Dict[str, Any]) -> Tuple[float, Dict[str, Any]]:
    """``(rope_theta, rope_scaling)`` from ``rope_parameters`` (transformers 5) or the older
    ``rope_theta`` + ``rope_scaling``; a type qkv has not, or a partial rotation, is refused."""
    params = config.get("rope_parameters")
    if params is None:
        params = dict(config.get("rope_scaling") or {})
        params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if not isinstance(params, dict):
        raise _error(f"rope_parameters must be an object, got {short_repr(params)}")
    params = dict(params)
    kind = params.pop("rope_type", params.pop("type", "default"))
    if kind not in ROPE_TYPES:
        raise _error(f"rope_type={short_repr(kind)} is not a rotary scaling qkv has; expected one of {sorted(ROPE_TYPES)}")
    partial = params.pop("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise _error(f"partial_rotary_factor={short_repr(partial)} is not supported (qkv rotates whole heads); expected 1.0")
    theta = _get(params, "rope_theta", 10000.0, float)
    params.pop("rope_theta")
    return float(theta), ({} if kind == "default" else {"rope_type": kind, **params})


def llama_config(config: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """transformers' Llama/Mistral/Qwen2/Qwen3 config (their defaults where a field is absent) ->
    (architecture, ``LlamaConfig`` fields)."""
    model_type = config["model_type"]
    defaults = _DEFAULTS[model_type]
    arch = _architecture(config, _ARCHITECTURES[model_type], _ARCHITECTURES[model_type][0])
    _refuse(config, "pretraining_tp", (1, None), "no tensor-parallel slicing of the projections in qkv")
    _refuse(config, "use_sliding_window", (False,), "per-layer sliding windows are not represented")
    layer_types = config.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or set(layer_types) - {"full_attention"}):
        if not (model_type == "mistral" and set(layer_types) <= {"sliding_attention"}):
            raise _error(f"layer_types={short_repr(layer_types)}: per-layer attention types are not represented")
    act = config.get("hidden_act", "silu")
    if act not in _QKV_ACTIVATIONS:
        raise _error(f"hidden_act={short_repr(act)} is not a gate qkv represents; expected one of {sorted(_QKV_ACTIVATIONS)}")
    d, heads = _get(config, "hidden_size", 4096), _get(config, "num_attention_heads", 32)
    kv_heads = config.get("num_key_value_heads", defaults["num_key_value_heads"])
    kv_heads = heads if kv_heads is None else _get({"num_key_value_heads": kv_heads}, "num_key_value_heads", heads)
    head_dim = config.get("head_dim", defaults.get("head_dim"))
    head_dim = None if head_dim is None or head_dim == d // heads and d % heads == 0 else _get(
        {"head_dim": head_dim}, "head_dim", 1)
    attention_bias = _get(config, "attention_bias", False, bool) if model_type in ("llama", "qwen3") else False
    if attention_bias and model_type == "qwen3":
        raise _error("attention_bias=True: Qwen3 with biased attention and a bias-free MLP is not represented "
                     "(qkv's bias covers both); expected False")
    mlp_bias = _get(config, "mlp_bias", False, bool) if model_type == "llama" else False
    if attention_bias != mlp_bias and model_type == "llama":
        raise _error(f"attention_bias={attention_bias} with mlp_bias={mlp_bias}: qkv's bias covers the output "
                     f"projection and the MLP together; expected them equal")
    theta, scaling = _rope(config)
    window = config.get("sliding_window", defaults.get("sliding_window")) if model_type == "mistral" else None
    values = {
        "vocab_size": _get(config, "vocab_size", defaults["vocab_size"]), "d_model": d,
        "n_layers": _get(config, "num_hidden_layers", 32), "n_heads": heads, "n_kv_heads": kv_heads,
        "d_head": head_dim, "d_ff": _get(config, "intermediate_size", 11008),
        "activation": _QKV_ACTIVATIONS[act], "glu": True, "residual": "pre-ln", "norm": "rmsnorm",
        "positional": "rotary", "rope_theta": theta, "rope_scaling": scaling,
        "max_len": _get(config, "max_position_embeddings", defaults["max_position_embeddings"]),
        "layer_norm_eps": float(_get(config, "rms_norm_eps", 1e-6, float)),
        "attention_dropout": float(_get(config, "attention_dropout", 0.0, float)), "dropout": 0.0,
        "tie_embeddings": _get(config, "tie_word_embeddings", False, bool),
        "bias": attention_bias or mlp_bias, "qkv_bias": True if model_type == "qwen2" else None,
        "qk_norm": model_type == "qwen3", "sliding_window": None if window is None else _get(
            {"sliding_window": window}, "sliding_window", 1),
    }
    return arch, values


def hf_llama_config(c: Any) -> Dict[str, Any]:
    """qkv's ``LlamaConfig`` as transformers' config.json: ``qwen3`` with qk-norm, ``qwen2`` with
    biases on q/k/v only, ``mistral`` with a sliding window, else ``llama``."""
    wanted = {"attention": "window" if c.sliding_window else "softmax", "positional": "rotary", "residual": "pre-ln",
              "norm": "rmsnorm", "linear": "dense", "glu": True, "head": "lm"}
    for key, value in wanted.items():
        if getattr(c, key) != value:
            raise ValueError(f"format='huggingface': {key}={getattr(c, key)!r} has no counterpart in transformers' "
                             f"Llama family; expected {value!r}")
    if c.activation not in _TO_HF_ACTIVATION:
        raise ValueError(f"format='huggingface': activation={c.activation!r}; expected one of {sorted(_TO_HF_ACTIVATION)}")
    scored = sorted(k for k in ("alibi", "softcap", "sinks") if c.attention_kwargs.get(k) not in (None, False))
    if scored:  # score knobs transformers' Llama family has no field for
        raise ValueError(f"format='huggingface': attention_kwargs {scored} change the scores, which transformers' "
                         f"Llama family does not; save in qkv's format")
    qkv_bias = c.bias if c.qkv_bias is None else c.qkv_bias
    if c.qk_norm:
        model_type = "qwen3"
    elif qkv_bias and not c.bias:
        model_type = "qwen2"
    elif c.sliding_window:
        model_type = "mistral"
    else:
        model_type = "llama"
    if qkv_bias != c.bias and model_type != "qwen2":
        raise ValueError(f"format='huggingface': qkv_bias={c.qkv_bias} with bias={c.bias} is Qwen2's layout, which has "
                         f"no {'qk-norm' if c.qk_norm else 'sliding window'}")
    if c.sliding_window and model_type != "mistral":
        raise ValueError(f"format='huggingface': a sliding window with {'qk-norm' if c.qk_norm else 'q/k/v biases'} has "
                         f"no transformers counterpart in qkv's mapping")
    if c.bias and model_type not in ("llama", "qwen3"):
        raise ValueError(f"format='huggingface': biases everywhere (bias=True) are Llama's attention_bias + mlp_bias, "
                         f"not {model_type}'s")
    if c.bias and model_type == "qwen3":
        raise ValueError("format='huggingface': Qwen3 has no MLP biases (bias=True)")
    rope = {"rope_theta": c.rope_theta, "rope_type": "default", **c.rope_scaling}
    config = {"architectures": [_ARCHITECTURES[model_type][0]], "model_type": model_type, "vocab_size": c.vocab_size,
              "hidden_size": c.d_model, "intermediate_size": c.d_ff, "num_hidden_layers": c.n_layers,
              "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads or c.n_heads,
              "head_dim": c.head_size(), "hidden_act": _TO_HF_ACTIVATION[c.activation],
              "max_position_embeddings": c.max_len, "rms_norm_eps": c.layer_norm_eps,
              "tie_word_embeddings": c.tie_embeddings, "rope_parameters": rope,
              "attention_dropout": c.attention_dropout, "bos_token_id": None, "eos_token_id": None,
              "pad_token_id": None}
    if model_type == "llama":
        config.update(attention_bias=c.bias, mlp_bias=c.bias, pretraining_tp=1)
    elif model_type == "qwen3":
        config.update(attention_bias=False, use_sliding_window=False)
    elif model_type == "qwen2":
        config.update(use_sliding_window=False)
    else:
        config.update(sliding_window=c.sliding_window)
    return config


for _model_type in _ARCHITECTURES:  # the stack's fields are fixed for every family (checkpoints._FIXED); and the window
    FAMILIES[_model_type] = Family(Llama, llama_config, llama_rules, _ignorable, hf_llama_config, ("sliding_window",))


class _GGUF(CheckpointFormat):
    """``from_pretrained(FILE.gguf)``: a llama.cpp file read by ``qkv.hf.gguf.read_gguf`` (read only)."""

    writes = False

    def recognizes(self, directory: Path) -> bool:
        return directory.suffix.lower() == ".gguf" and directory.is_file()

    def load(self, cls: Optional[type], directory: Path, map_location: str, **overrides: Any) -> Any:
        from .checkpoints import from_hf
        from .gguf import read_gguf

        config, state_dict, _ = read_gguf(directory)
        return from_hf(cls, config, state_dict, **overrides).to(map_location)

    def save(self, model: Any, directory: Union[str, "os.PathLike[str]"]) -> Path:  # not offered (writes=False)
        raise ValueError("qkv reads GGUF files but writes none; save_pretrained(dir, format='huggingface') writes the "
                         "checkpoint llama.cpp's convert_hf_to_gguf.py reads")


CHECKPOINT_FORMATS["gguf"] = _GGUF()
