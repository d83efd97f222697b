"""Hugging Face checkpoints of BERT and GPT-2, in and out of qkv's ``BERT`` and ``GPT``.

A Hugging Face checkpoint is a directory with ``config.json`` (``model_type`` ``"bert"`` or
``"gpt2"``) and ``model.safetensors``. The weights are read from safetensors only: a directory
that holds ``pytorch_model.bin`` (a pickle, which can run code when loaded) is refused, and
nothing in it is opened. Every difference between the two architectures and qkv's stack is
either an option of the stack or a weight layout written down here, once:

=====================================  ========================================================
transformers                           qkv
=====================================  ========================================================
BERT: post-LN blocks, erf GELU,        ``residual="post-ln"``, ``activation="gelu"``,
LayerNorm eps 1e-12, token types,      ``layer_norm_eps``, ``n_segments`` (``type_vocab_size``),
embedding LayerNorm, pooler,           ``embedding_norm``, ``BERT.pooler``,
MLM decoder tied to the embeddings     ``mlm_decoder.weight`` is the token table
GPT-2: pre-LN blocks + ``ln_f``,       ``residual="pre-ln"`` (its final LayerNorm),
tanh GELU (``gelu_new``),              ``activation="gelu-tanh"``,
token types through ``wte``,           ``Embeddings(token_segments=True)``,
tied ``lm_head``                       ``tie_embeddings``
GPT-2's ``Conv1D`` stores ``W`` as     transposed to ``nn.Linear``'s ``(out, in)``
``(in, out)``; ``c_attn`` fuses        split into ``q_proj``, ``k_proj``, ``v_proj``
``[W_q W_k W_v]``
=====================================  ========================================================

``load`` maps the tensors and checks every one (names, shapes, nothing missing, nothing left
over) before any weight is copied. A plain ``BertModel`` (no MLM, NSP or classification head)
loads as a BERT with ``head="encoder"``, which builds no head; asked for a head it lacks
(``head="classification"``), that head starts fresh and is named in one warning. ``save`` writes the
inverse, which ``transformers``' ``AutoModelFor...from_pretrained`` loads with equal outputs.
Neither needs transformers installed.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .._io import settle_directory
from .._modelfile import CheckpointError, check_layout, check_weights, load_dtype, read_config
from ..registry import lookup, names
from ..models.base import CHECKPOINT_FORMATS, CheckpointFormat, finite, short_repr
from ..models.transformer.bert import BERT
from ..models.transformer.gpt import GPT

__all__ = ["is_huggingface", "load", "save", "refuse_kernel", "from_hf", "Family", "FAMILIES", "HF_ACTIVATIONS",
           "PICKLE_FILES"]

PathLike = Union[str, os.PathLike]

WEIGHTS = "model.safetensors"
INDEX = f"{WEIGHTS}.index.json"  # a sharded checkpoint's map of tensor -> shard file
#: weight files that are pickles (or other formats qkv does not read); never opened
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack",
                "model.ckpt.index")
#: transformers' activation names -> qkv's (``qkv.blocks.ACTIVATIONS``)
HF_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu-tanh", "gelu_pytorch_tanh": "gelu-tanh",
                  "gelu_fast": "gelu-tanh"}
_QKV_TO_HF_ACTIVATION = {"gelu": "gelu", "relu": "relu", "gelu-tanh": "gelu_new"}

# the architectures (config.json "architectures") whose tensors qkv represents, and BERT's head for each
_BERT_HEADS = {"BertModel": "encoder", "BertForPreTraining": "pretraining", "BertForMaskedLM": "pretraining",
               "BertForNextSentencePrediction": "pretraining", "BertForSequenceClassification": "classification"}
_GPT2_ARCHITECTURES = ("GPT2Model", "GPT2LMHeadModel")
#: config fields a checkpoint fixes (they shape the weights or the function); overrides may set the others
_FIXED = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len", "n_segments", "activation", "residual",
          "positional", "layer_norm_eps", "tie_embeddings", "linear", "norm", "glu", "n_kv_heads", "d_head", "bias",
          "qkv_bias", "qk_norm", "rope_theta", "rope_scaling")


@dataclass(frozen=True)
class Family:
    """A family of transformers architectures that one qkv model represents, beside BERT and GPT-2
    (``qkv/hf/llama.py``: Llama, Mistral, Qwen2, Qwen3), registered in ``FAMILIES`` by model_type.

    model_class: the qkv class. read_config: ``config dict -> (architecture, config fields)``,
    refusing what it cannot represent (``CheckpointError``). rules: ``(config, tensor names) ->
    (rules, tied copies)``. ignorable: names of buffers that carry no weights. write_config: the
    qkv config -> transformers' ``config.json`` (raising ``ValueError`` for what has no counterpart).
    fixed: the config fields the weights fix (overrides may not set them).
    """

    model_class: type
    read_config: Callable[[Dict[str, Any]], Tuple[str, Dict[str, Any]]]
    rules: Callable[[Any, Any], Tuple[List["Rule"], Dict[str, str]]]
    ignorable: Callable[[str], bool]
    write_config: Callable[[Any], Dict[str, Any]]
    fixed: Tuple[str, ...] = ()


#: model_type -> Family, for the architectures beyond bert and gpt2 (filled by ``qkv/hf/llama.py``)
FAMILIES: Dict[str, Family] = {}


def _error(message: str) -> Exception:

    return CheckpointError(message)


# ----------------------------------------------------------------------------- tensor layouts


@dataclass(frozen=True)
class Rule:
    """One Hugging Face tensor and the qkv tensor(s) it holds.

    layout: ``"same"``; ``"t"`` (a ``Conv1D`` weight ``(in, out)`` is ``nn.Linear``'s transposed);
    ``"qkv_t"`` (``c_attn.weight (d, 3d)`` = ``[W_q^T W_k^T W_v^T]``); ``"qkv"`` (``c_attn.bias``).
    group: ``"base"`` (required) or the head it belongs to (absent as a whole: starts fresh).
    """

    hf: str
    ours: Tuple[str, ...]
    layout: str = "same"
    group: str = "base"

    def to_qkv(self, t: Tensor) -> List[Tensor]:
        if self.layout == "same":
            return [t]
        if self.layout == "t":
            return [t.t()]
        if self.layout == "qkv_t":
            return [w.t() for w in t.chunk(3, dim=1)]  # (d, 3d) -> three (d, d), each transposed
        return list(t.chunk(3, dim=0))  # "qkv": (3d,) -> three (d,)

    def to_hf(self, ts: Sequence[Tensor]) -> Tensor:
        if self.layout == "same":
            return ts[0]
        if self.layout == "t":
            return ts[0].t()
        if self.layout == "qkv_t":
            return torch.cat([w.t() for w in ts], dim=1)  # three (d, d) -> (d, 3d)
        return torch.cat(list(ts), dim=0)


def _pair(hf: str, ours: str, group: str = "base", layout: str = "same", bias: bool = True) -> List[Rule]:
    """``weight`` (and ``bias``) of one layer."""
    rules = [Rule(f"{hf}.weight", (f"{ours}.weight",), layout, group)]
    if bias:
        rules.append(Rule(f"{hf}.bias", (f"{ours}.bias",), "same", group))
    return rules


def _bert_rules(n_layers: int, base: str) -> List[Rule]:
    """BERT (``modeling_bert``): ``base`` is ``"bert."`` in the ``BertFor...`` models, ``""`` in ``BertModel``."""
    e = f"{base}embeddings"
    rules = [Rule(f"{e}.word_embeddings.weight", ("stack.embed.token.weight",)),
             Rule(f"{e}.position_embeddings.weight", ("stack.embed.positional.embedding.weight",)),
             Rule(f"{e}.token_type_embeddings.weight", ("stack.embed.segment.weight",)),
             *_pair(f"{e}.LayerNorm", "stack.embed.norm")]
    for i in range(n_layers):
        hf, ours = f"{base}encoder.layer.{i}", f"stack.layers.{i}"
        rules += [*_pair(f"{hf}.attention.self.query", f"{ours}.self_attn.q_proj"),
                  *_pair(f"{hf}.attention.self.key", f"{ours}.self_attn.k_proj"),
                  *_pair(f"{hf}.attention.self.value", f"{ours}.self_attn.v_proj"),
                  *_pair(f"{hf}.attention.output.dense", f"{ours}.self_attn.out_proj"),
                  *_pair(f"{hf}.attention.output.LayerNorm", f"{ours}.res_self.norm"),
                  *_pair(f"{hf}.intermediate.dense", f"{ours}.ff.w1"),
                  *_pair(f"{hf}.output.dense", f"{ours}.ff.w2"),
                  *_pair(f"{hf}.output.LayerNorm", f"{ours}.res_ff.norm")]
    rules += _pair(f"{base}pooler.dense", "pooler", "pooler")
    rules += [*_pair("cls.predictions.transform.dense", "mlm_transform.0", "mlm"),
              *_pair("cls.predictions.transform.LayerNorm", "mlm_transform.2", "mlm"),
              Rule("cls.predictions.bias", ("mlm_decoder.bias",), "same", "mlm")]
    rules += _pair("cls.seq_relationship", "nsp_head", "nsp")
    rules += _pair("classifier", "classifier", "classifier")
    return rules


def _gpt2_rules(n_layers: int, base: str, tied: bool) -> List[Rule]:
    """GPT-2 (``modeling_gpt2``): ``base`` is ``"transformer."`` in ``GPT2LMHeadModel``, ``""`` in ``GPT2Model``."""
    rules = [Rule(f"{base}wte.weight", ("stack.embed.token.weight",)),
             Rule(f"{base}wpe.weight", ("stack.embed.positional.embedding.weight",))]
    for i in range(n_layers):
        hf, ours = f"{base}h.{i}", f"stack.layers.{i}"
        attn = tuple(f"{ours}.self_attn.{p}_proj" for p in "qkv")
        rules += [*_pair(f"{hf}.ln_1", f"{ours}.res_self.norm"),
                  Rule(f"{hf}.attn.c_attn.weight", tuple(f"{a}.weight" for a in attn), "qkv_t"),
                  Rule(f"{hf}.attn.c_attn.bias", tuple(f"{a}.bias" for a in attn), "qkv"),
                  *_pair(f"{hf}.attn.c_proj", f"{ours}.self_attn.out_proj", layout="t"),
                  *_pair(f"{hf}.ln_2", f"{ours}.res_ff.norm"),
                  *_pair(f"{hf}.mlp.c_fc", f"{ours}.ff.w1", layout="t"),
                  *_pair(f"{hf}.mlp.c_proj", f"{ours}.ff.w2", layout="t")]
    rules += _pair(f"{base}ln_f", "stack.final_norm")
    if not tied:
        rules.append(Rule("lm_head.weight", ("lm_head.weight",), "same", "lm_head"))
    return rules


def _tables(model_type: str, c: Any, names: Any) -> Tuple[List[Rule], Dict[str, str]]:
    """``(rules, tied)`` for a checkpoint whose tensor names are ``names``: the weight rules of
    config ``c``, with the prefix the file uses (``bert.``/``transformer.`` when a head model wrote
    it, none for a bare ``BertModel``/``GPT2Model``), and the tied copies (a copy's name -> the
    name of the tensor it repeats)."""
    if model_type in FAMILIES:
        return FAMILIES[model_type].rules(c, names)
    if model_type == "bert":
        base = "bert." if any(k.startswith("bert.") for k in names) else ""
        tied = {"cls.predictions.decoder.weight": f"{base}embeddings.word_embeddings.weight",
                "cls.predictions.decoder.bias": "cls.predictions.bias"}
        return _bert_rules(c.n_layers, base), tied
    base = "transformer." if any(k.startswith("transformer.") for k in names) else ""
    tied = {"lm_head.weight": f"{base}wte.weight"} if c.tie_embeddings else {}
    return _gpt2_rules(c.n_layers, base, c.tie_embeddings), tied


def _ignorable(name: str, model_type: str) -> bool:
    """Buffers older transformers saved that carry no weights (position ids, GPT-2's causal mask)."""
    if model_type in FAMILIES:
        return FAMILIES[model_type].ignorable(name)
    if model_type == "bert":
        return name.endswith(("embeddings.position_ids", "embeddings.token_type_ids"))
    return name.endswith((".attn.bias", ".attn.masked_bias"))


#: the head groups each BERT head setting uses (the pooled [CLS] feeds NSP and the classifier)
_BERT_GROUPS = {"pretraining": ("pooler", "mlm", "nsp"), "classification": ("pooler", "classifier"),
                "encoder": ("pooler",)}
_HEAD_NAMES = {"pooler": "pooler (pooler.dense)", "mlm": "masked-LM head (cls.predictions)",
               "nsp": "next-sentence head (cls.seq_relationship)", "classifier": "classifier",
               "lm_head": "LM head (lm_head)"}


# ----------------------------------------------------------------------------- configs


def _read_json(path: Path) -> Dict[str, Any]:
    return read_config(path)  # one line naming the file, whatever it holds (qkv._modelfile)


def is_huggingface(directory: PathLike) -> bool:
    """Whether ``directory/config.json`` is a transformers config (not a qkv one): it names
    ``transformers_version``/``architectures``, or a ``model_type`` with transformers' size fields."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return False
    try:
        config = read_config(path)
    except CheckpointError:  # the qkv format's reader says what is wrong with it
        return False
    if "model_type" not in config or not isinstance(config["model_type"], str):
        return False
    if "transformers_version" in config or "architectures" in config:
        return True
    model_type = config["model_type"]
    if model_type != "bert" and model_type in names("model"):
        return False  # a qkv model's own config (e.g. 'lstm-seq', which has a hidden_size of its own)
    return model_type == "gpt2" or ("d_model" not in config and any(k in config for k in ("hidden_size", "n_embd")))


def _get(config: Dict[str, Any], key: str, default: Any, kind: type = int) -> Any:
    """``config[key]`` (transformers' default when absent), checked: an int is >= 1 (every int
    qkv reads is a size or a count), a float a finite number (its range is the config's check)."""
    value = config.get(key, default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if not ok:
        want = {bool: "a bool", float: "a finite number"}.get(kind, "an int >= 1")
        raise _error(f"{key} must be {want}, got {short_repr(value)}")
    return value


def _activation(config: Dict[str, Any], key: str, default: str) -> str:
    name = config.get(key, default)
    if not isinstance(name, str) or name not in HF_ACTIVATIONS:
        raise _error(f"{key}={short_repr(name)} is not an activation qkv represents; expected one of {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]


def _architecture(config: Dict[str, Any], known: Sequence[str], default: str) -> str:
    names = config.get("architectures") or [default]
    if not isinstance(names, list) or len(names) != 1 or not isinstance(names[0], str) or names[0] not in known:
        raise _error(f"architectures={short_repr(names)}; qkv reads one of {sorted(known)}")
    return names[0]


def _refuse(config: Dict[str, Any], key: str, allowed: Any, what: str) -> None:
    if key in config and config[key] not in allowed:
        raise _error(f"{key}={short_repr(config[key])} is not supported ({what}); expected {allowed[0]!r}")


def _bert_config(config: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """transformers' ``BertConfig`` (its defaults where a field is absent) -> (architecture, BERTConfig fields)."""
    arch = _architecture(config, _BERT_HEADS, "BertModel")
    _refuse(config, "position_embedding_type", ("absolute",), "qkv's BERT has absolute learned positions")
    _refuse(config, "is_decoder", (False,), "a BERT decoder is not represented")
    _refuse(config, "add_cross_attention", (False,), "a BERT with cross-attention is not represented")
    _refuse(config, "problem_type", (None, "single_label_classification"), "qkv's classifier is single-label")
    values = {
        "vocab_size": _get(config, "vocab_size", 30522), "d_model": _get(config, "hidden_size", 768),
        "n_layers": _get(config, "num_hidden_layers", 12), "n_heads": _get(config, "num_attention_heads", 12),
        "d_ff": _get(config, "intermediate_size", 3072), "activation": _activation(config, "hidden_act", "gelu"),
        "dropout": float(_get(config, "hidden_dropout_prob", 0.1, float)),
        "attention_dropout": float(_get(config, "attention_probs_dropout_prob", 0.1, float)),
        "max_len": _get(config, "max_position_embeddings", 512), "n_segments": _get(config, "type_vocab_size", 2),
        "layer_norm_eps": float(_get(config, "layer_norm_eps", 1e-12, float)),
        "residual": "post-ln", "positional": "learned", "head": _BERT_HEADS[arch],
    }
    if arch == "BertForSequenceClassification":
        labels = config.get("id2label")
        if labels is not None and not isinstance(labels, dict):
            raise _error(f"id2label must be an object of class names, got {short_repr(labels)}")
        values["num_labels"] = len(labels) if isinstance(labels, dict) and labels else _get(config, "num_labels", 2)
    return arch, values


def _gpt2_config(config: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """transformers' ``GPT2Config`` (its defaults where a field is absent) -> (architecture, GPTConfig fields)."""
    arch = _architecture(config, _GPT2_ARCHITECTURES, "GPT2LMHeadModel")
    _refuse(config, "scale_attn_weights", (True,), "qkv scales scores by 1/sqrt(head_dim)")
    _refuse(config, "scale_attn_by_inverse_layer_idx", (False,), "no per-layer score scaling in qkv")
    _refuse(config, "add_cross_attention", (False,), "a GPT-2 with cross-attention is not represented")
    d = _get(config, "n_embd", 768)
    values = {
        "vocab_size": _get(config, "vocab_size", 50257), "d_model": d, "n_layers": _get(config, "n_layer", 12),
        "n_heads": _get(config, "n_head", 12), "d_ff": 4 * d if config.get("n_inner") is None else _get(config, "n_inner", 0),
        "activation": _activation(config, "activation_function", "gelu_new"),
        "dropout": float(_get(config, "resid_pdrop", 0.1, float)),
        "attention_dropout": float(_get(config, "attn_pdrop", 0.1, float)),
        "max_len": _get(config, "n_positions", 1024),
        "layer_norm_eps": float(_get(config, "layer_norm_epsilon", 1e-5, float)),
        "tie_embeddings": _get(config, "tie_word_embeddings", True, bool),
        "residual": "pre-ln", "positional": "learned",
    }
    return arch, values


#: the transformers class qkv's BERT saves as, for each head
_BERT_SAVED_AS = {"classification": "BertForSequenceClassification", "pretraining": "BertForPreTraining",
                  "encoder": "BertModel"}


def _hf_bert_config(c: Any) -> Dict[str, Any]:
    arch = _BERT_SAVED_AS[c.head]
    config = {"architectures": [arch], "model_type": "bert", "vocab_size": c.vocab_size, "hidden_size": c.d_model,
              "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
              "hidden_act": _QKV_TO_HF_ACTIVATION[c.activation], "hidden_dropout_prob": c.dropout,
              "attention_probs_dropout_prob": c.attention_dropout, "max_position_embeddings": c.max_len,
              "type_vocab_size": max(c.n_segments, 1), "layer_norm_eps": c.layer_norm_eps,
              "position_embedding_type": "absolute", "tie_word_embeddings": True, "pad_token_id": 0}
    if c.head == "classification":
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(c.num_labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(c.num_labels)}
    return config


def _hf_gpt2_config(c: Any) -> Dict[str, Any]:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": c.vocab_size,
            "n_embd": c.d_model, "n_layer": c.n_layers, "n_head": c.n_heads, "n_inner": c.d_ff,
            "activation_function": _QKV_TO_HF_ACTIVATION[c.activation], "resid_pdrop": c.dropout,
            "embd_pdrop": c.dropout, "attn_pdrop": c.attention_dropout, "n_positions": c.max_len,
            "layer_norm_epsilon": c.layer_norm_eps, "tie_word_embeddings": c.tie_embeddings,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "bos_token_id": None, "eos_token_id": None}


# ----------------------------------------------------------------------------- reading


def _check_files(directory: Path) -> Path:
    """``directory/model.safetensors``, or one line saying what is there instead."""
    weights = directory / WEIGHTS
    if weights.is_file():
        return weights
    pickles = [name for name in PICKLE_FILES if (directory / name).exists()]
    if pickles:
        raise _error(f"{directory} holds {', '.join(pickles)} and no {WEIGHTS}: qkv reads weights from safetensors only "
                     f"and never unpickles (a pickle can run code); save the model with safe_serialization=True")
    if (directory / INDEX).is_file():
        return directory / INDEX
    raise _error(f"{directory} has no {WEIGHTS}: expected a Hugging Face checkpoint (config.json + {WEIGHTS})")


def _read_tensors(weights: Path) -> Dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise _error(f"{weights} is not a safetensors file (corrupt, truncated or another format): {e}") from None


def _read_shards(index: Path) -> Dict[str, Tensor]:
    """The tensors of a sharded checkpoint: ``index``'s ``weight_map`` names each tensor's shard (a
    safetensors file beside it); a shard outside the directory, missing, or holding other tensors
    than the map says is refused."""
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise _error(f"{index}: weight_map must be an object of tensor name -> shard file")
    tensors: Dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        path = index.parent / shard
        if Path(shard).name != shard or not path.is_file():
            raise _error(f"{index} names shard {shard!r}, which is not a file beside it")
        part = _read_tensors(path)
        listed = {k for k, v in weight_map.items() if v == shard}
        if set(part) != listed:
            raise _error(f"{path} holds {_names(set(part) ^ listed)} against what {index.name} lists for it")
        tensors.update(part)
    return tensors


def _names(names: Sequence[str], limit: int = 6) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _model_class(model_type: str, cls: Optional[type]) -> type:

    known = {"bert": BERT, "gpt2": GPT, **{k: f.model_class for k, f in FAMILIES.items()}}
    wanted = known.get(model_type) if isinstance(model_type, str) else None
    if wanted is None:
        raise _error(f"model_type={short_repr(model_type)} is not an architecture qkv represents; expected one of "
                     f"{sorted(known)}")
    if cls is not None and cls is not wanted:
        raise _error(f"a Hugging Face {model_type!r} checkpoint loads into qkv.models.{wanted.__name__}, not "
                     f"{cls.__name__} (choose its kernel with {wanted.__name__}.from_pretrained(dir, attention=...))")
    return wanted


def load(cls: Optional[type], directory: PathLike, map_location: str = "cpu", **overrides: Any) -> Any:
    """Build qkv's ``BERT``/``GPT`` from the Hugging Face checkpoint in ``directory``.

    Args:
        cls: ``BERT`` or ``GPT`` (None: chosen by ``model_type``).
        overrides: config fields the checkpoint does not fix (``attention``, ``attention_kwargs``,
            ``dropout``, ``head``, ``num_labels``, ...); a kernel that applies no attention dropout
            (``linear``, ``performer``, ``efficient``) gets ``attention_dropout=0``. A kernel with learned parameters of its own
            (Linformer's projections) or with shared query/key weights (``lsh``) is refused: the
            checkpoint has no weights for the one and separate key weights for the other.
    Raises:
        CheckpointError (a ``ValueError``): an unsupported ``model_type``, architecture or option;
        a pickle instead of safetensors; missing or unexpected tensors; a wrong shape.
    """
    directory = settle_directory(directory)  # a save killed mid-swap: finish it
    config_path = directory / "config.json"
    config = _read_json(config_path)
    weights = _check_files(directory)
    if weights.name == INDEX:  # sharded: the shards' headers are checked as each is read
        tensors = _read_shards(weights)
        return _build(cls, config, tensors, config_path, weights, overrides, header=False).to(map_location)
    return _build(cls, config, None, config_path, weights, overrides).to(map_location)


def from_hf(cls: Optional[type], config: Dict[str, Any], state_dict: Dict[str, Tensor], **overrides: Any) -> Any:
    """Build a qkv model from a transformers config dict and a state dict with transformers' tensor
    names (float tensors; tied copies may be left out) — ``from_pretrained`` without the files,
    the same checks (every field, every tensor's name and shape, nothing missing or left over)."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (transformers' config.json), got {type(config).__name__}")
    if not isinstance(state_dict, dict) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                   for k, v in state_dict.items()):
        raise TypeError("state_dict must be a dict of str -> torch.Tensor with transformers' tensor names")
    return _build(cls, config, dict(state_dict), Path("<config>"), Path("<state_dict>"), overrides, header=False)


def _build(cls: Optional[type], config: Dict[str, Any], tensors: Optional[Dict[str, Tensor]], config_path: Path,
           weights: Path, overrides: Dict[str, Any], header: bool = True) -> Any:
    """The model of ``config`` with the checkpoint's tensors (read from ``weights`` when ``tensors`` is None)."""
    model_type, model_cls, arch, values = _checked_config(config, config_path, cls)
    fixed = sorted(set(overrides) & (set(_FIXED) | set(FAMILIES[model_type].fixed if model_type in FAMILIES else ())))
    if fixed:
        raise ValueError(f"{fixed} are fixed by the checkpoint in {config_path.parent}; override only fields that keep "
                         f"the weights' shapes (attention, attention_kwargs, dropout, head, num_labels, ...)")
    values.update(overrides)
    kernel = lookup("attention", values.get("attention", "softmax"))
    if not kernel.applies_dropout and "attention_dropout" not in overrides:
        values["attention_dropout"] = 0.0  # a kernel that forms no weight matrix takes no attention dropout
    model = _checked_model(model_cls, values, config_path, overrides)  # sizes are checked before anything is allocated
    _refuse_kernel(model)
    if tensors is None:
        if header:
            _check_header(weights, model, model_type)  # names and shapes, before a tensor is read
        tensors = _read_tensors(weights)
    rules, tied = _tables(model_type, model.config, tensors)
    rules, tensors, tied = _without_absent_heads(model, rules, tensors, tied)
    model = _checked_weights(model, rules, tensors, weights)  # one dtype (the model's), no NaN or inf
    fresh = _copy(model, rules, tensors, tied, model_type, weights)
    if model_type == "bert":  # name the heads this head setting uses; the others are idle
        fresh = [g for g in fresh if g in _BERT_GROUPS[model.config.head]]
    if fresh:
        warnings.warn(f"{config_path.parent} ({arch}) has no {', '.join(_HEAD_NAMES[g] for g in fresh)}: "
                      f"{'it starts' if len(fresh) == 1 else 'they start'} fresh", stacklevel=4)
    return model


def _checked_config(config: Dict[str, Any], path: Path, cls: Optional[type]) -> Tuple[str, type, str, Dict[str, Any]]:
    """``(model_type, qkv class, architecture, config fields)`` of a transformers config, or one
    ``CheckpointError`` line naming the file and the field: every value qkv reads is checked for its
    type and range here and by ``QKVModel.from_config`` (the checks of the qkv format) before any
    tensor is built."""
    try:
        model_type = config.get("model_type")
        model_cls = _model_class(model_type, cls)
        read = FAMILIES[model_type].read_config if model_type in FAMILIES else (
            _bert_config if model_type == "bert" else _gpt2_config)
        arch, values = read(config)
    except CheckpointError as e:
        raise _error(f"{path}: {e}") from None
    return model_type, model_cls, arch, values


def _checked_model(model_cls: type, values: Dict[str, Any], path: Path, overrides: Dict[str, Any]) -> Any:
    """``model_cls.from_config(values)``; a value it refuses (a NaN epsilon, a size beyond memory or
    beyond what can be estimated) is a ``CheckpointError`` naming the file (and the overrides)."""
    try:
        return model_cls.from_config(values)
    except (ValueError, TypeError) as e:
        given = f" with {', '.join(sorted(overrides))} given" if overrides else ""
        raise _error(f"{path}{given}: {e}") from None


def _check_header(weights: Path, model: Any, model_type: str) -> Dict[str, Any]:
    """The file's layout, checked from its header against every tensor any head of ``model`` can
    take (``qkv._modelfile.check_layout``): a tensor with no place or of another shape is refused
    before anything is read (a sparse 4 GiB extra tensor costs nothing)."""
    from .._modelfile import read_layout

    layout = read_layout(weights)
    mine = model.state_dict()
    rules, tied = _tables(model_type, model.config, layout)
    expected = {r.hf: tuple(r.to_hf([mine[o] for o in r.ours]).shape) for r in rules if all(o in mine for o in r.ours)}
    expected.update({name: expected[target] for name, target in tied.items() if target in expected})
    # a tensor this configuration of the model has no place for (a head it does not build, no token
    # types), or a tied copy of one: the file may hold it, and it is not read
    optional = {r.hf for r in rules if not all(o in mine for o in r.ours)}
    optional |= {name for name, target in tied.items() if target in optional}
    check_layout(weights, expected, optional=lambda n: n in optional or _ignorable(n, model_type))
    return layout


def _checked_weights(model: Any, rules: List[Rule], tensors: Dict[str, Tensor], weights: Path) -> Any:
    """``model`` in the dtype of the file's weights when they all have one (as the qkv format
    loads), after the qkv format's own check (``qkv._modelfile.check_weights``): a tensor of another
    dtype than the others (one float16 among float32) or holding NaN or inf is refused, named as
    the file names it."""
    state, names = {}, {}
    for rule in rules:
        if rule.hf in tensors and tensors[rule.hf].is_floating_point():
            for ours, part in zip(rule.ours, rule.to_qkv(tensors[rule.hf])):
                state[ours], names[ours] = part, rule.hf
    model = load_dtype(state, model)
    check_weights(weights, state, model, names=names)
    return model


def _without_absent_heads(model: Any, rules: List[Rule], tensors: Dict[str, Tensor],
                          tied: Dict[str, str]) -> Tuple[List[Rule], Dict[str, Tensor], Dict[str, str]]:
    """The rules, tensors and tied names left when ``model`` has no place for some heads (a BERT
    with ``head="encoder"`` builds none): the checkpoint's tensors of those heads are not read, as
    transformers' ``BertModel`` reads a ``BertForPreTraining`` checkpoint."""
    mine = model.state_dict()
    absent = [r for r in rules if r.group != "base" and not all(o in mine for o in r.ours)]
    if not absent:
        return rules, tensors, tied
    dropped = {r.hf for r in absent}
    if not hasattr(model, "mlm_decoder"):  # the MLM decoder's tied copies go with its head
        dropped |= {name for name in tied if name.startswith("cls.predictions.")}
    return ([r for r in rules if r not in absent], {k: v for k, v in tensors.items() if k not in dropped},
            {k: v for k, v in tied.items() if k not in dropped})


def refuse_kernel(model: Any) -> None:
    """Raise ``ValueError`` when ``model``'s attention kernel cannot take a pretrained model's
    attention weights (shared queries and keys; learned parameters of its own), with the reason:
    what ``from_pretrained(dir, attention=...)`` refuses (``qkv train --init`` says the same)."""
    _refuse_kernel(model)


def _refuse_kernel(model: Any) -> None:
    """A kernel that cannot take a pretrained model's attention weights, with the reason."""
    for block in model.stack.layers:
        mha = block.self_attn
        name = mha.kernel.registry_name
        if mha.k_proj is None:
            raise ValueError(f"attention {name!r} shares queries and keys (shared_qk, Reformer): a pretrained model has "
                             f"separate key weights, which it cannot use; choose another kernel")
        learned = [n for n, p in mha.kernel.named_parameters()]
        if learned:
            raise ValueError(f"attention {name!r} has learned parameters of its own ({_names(learned)}) that no "
                             f"pretrained checkpoint holds; choose a kernel without them")


def _copy(model: Any, rules: List[Rule], tensors: Dict[str, Tensor], tied: Dict[str, str], model_type: str,
          weights: Path) -> List[str]:
    """Check then copy ``tensors`` into ``model`` by ``rules``; returns the head groups left fresh."""
    mine = model.state_dict()
    by_group: Dict[str, List[Rule]] = {}
    for rule in rules:
        by_group.setdefault(rule.group, []).append(rule)
    fresh, use = [], []
    for group, group_rules in by_group.items():
        present = [r for r in group_rules if r.hf in tensors]
        if group != "base" and not present:
            fresh.append(group)
            continue
        missing = [r.hf for r in group_rules if r.hf not in tensors]
        if missing:
            raise _error(f"{weights} lacks {_names(missing)} (a {model_type} checkpoint of {model.config.n_layers} "
                         f"layers needs them)")
        use += group_rules
    covered = {r.hf for r in use} | set(tied)
    extra = [k for k in tensors if k not in covered and not _ignorable(k, model_type)]
    if extra:
        raise _error(f"{weights} holds tensors qkv's {type(model).__name__} has no place for: {_names(extra)}")
    for name, target in tied.items():  # tied copies (older checkpoints store them): must be the same tensor
        if name in tensors and target in tensors and not torch.equal(tensors[name], tensors[target]):
            raise _error(f"{weights}: {name} differs from {target}; qkv ties them (untied output weights are not represented)")
    state = {}
    for rule in use:
        t = tensors[rule.hf]
        expected = tuple(rule.to_hf([mine[o] for o in rule.ours]).shape)
        if tuple(t.shape) != expected:
            raise _error(f"{weights}: {rule.hf} has shape {tuple(t.shape)}, expected {expected} (from config.json)")
        if not t.is_floating_point():
            raise _error(f"{weights}: {rule.hf} has dtype {t.dtype}, expected a floating-point tensor")
        for o, part in zip(rule.ours, rule.to_qkv(t)):
            state[o] = part.to(mine[o].dtype)
    owned = {o for r in rules for o in r.ours}
    unmapped = [n for n in mine if n not in owned and ".kernel." not in n and n not in _tied_targets(model)]
    if unmapped:  # a qkv parameter no rule covers: the mapping is incomplete for this configuration
        raise _error(f"qkv's {type(model).__name__} has tensors no Hugging Face {model_type} tensor fills: {_names(unmapped)}")
    with torch.no_grad():
        for name, value in state.items():
            mine[name].copy_(value)
    return fresh


def _tied_targets(model: Any) -> set:
    """qkv parameters that are the token table under another name (BERT's MLM decoder, a tied LM head)."""
    names = set()
    if hasattr(model, "mlm_decoder"):
        names.add("mlm_decoder.weight")
    if getattr(model.config, "tie_embeddings", False):
        names.add("lm_head.weight")
    names |= {f"target_heads.{i}.weight" for i in range(len(getattr(model, "target_heads", ())))}
    return names


# ----------------------------------------------------------------------------- writing


def _check_representable(model: Any) -> str:
    """The transformers model_type ``model`` saves as, or one line saying why it cannot."""

    c = model.config
    for kind, family in FAMILIES.items():
        if type(model) is family.model_class:
            return kind
    if type(model) is BERT:
        kind, residual = "bert", "post-ln"
    elif type(model) is GPT:  # exactly GPT: Al-Rfou's LM (a subclass) adds heads GPT-2 has no place for
        kind, residual = "gpt2", "pre-ln"
        if c.head != "lm":
            raise ValueError(f"format='huggingface' writes GPT as GPT2LMHeadModel; head={c.head!r} has no place in it")
    else:
        raise ValueError(f"format='huggingface' writes BERT and GPT (transformers' bert and gpt2); "
                         f"{type(model).__name__} has no transformers counterpart")
    wanted = {"attention": "softmax", "positional": "learned", "residual": residual, "linear": "dense"}
    for key, value in wanted.items():
        if getattr(c, key) != value:
            raise ValueError(f"format='huggingface': {key}={getattr(c, key)!r} has no counterpart in transformers' "
                             f"{kind}; expected {value!r}")
    if c.attention_kwargs not in ({}, {"scale": None}):
        raise ValueError(f"format='huggingface': attention_kwargs={c.attention_kwargs!r}; transformers' {kind} has none")
    if c.activation not in _QKV_TO_HF_ACTIVATION:
        raise ValueError(f"format='huggingface': activation={c.activation!r}; expected one of {sorted(_QKV_TO_HF_ACTIVATION)}")
    return kind


def save(model: Any, directory: PathLike) -> Path:
    """Write ``model`` (qkv's ``BERT`` or ``GPT``) as a Hugging Face checkpoint: ``config.json``
    and ``model.safetensors`` with transformers' names and layouts (``BertForPreTraining`` or
    ``BertForSequenceClassification``; ``GPT2LMHeadModel``). The directory is replaced as a whole
    (``qkv._io.atomic_directory``): transformers, like qkv, finds the old model or the new one."""
    from .._io import atomic_directory
    from .._modelfile import write_safetensors
    from .tokenizer import write_pipeline_files

    kind = _check_representable(model)
    c = model.config
    mine = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    if kind in FAMILIES:
        config = FAMILIES[kind].write_config(c)  # raises for what has no counterpart
        kind = config["model_type"]
        rules, _ = FAMILIES[kind].rules(c, ())
        skip = set()
    elif kind == "bert":
        rules = _bert_rules(c.n_layers, "" if c.head == "encoder" else "bert.")  # BertModel's names have no prefix
        skip = {"pretraining": {"classifier"}, "classification": {"mlm", "nsp"}, "encoder": {"mlm", "nsp", "classifier"}}[c.head]
        config = _hf_bert_config(c)
    else:
        rules = _gpt2_rules(c.n_layers, "transformer.", c.tie_embeddings)
        skip = set()
        config = _hf_gpt2_config(c)
    token_types = f"{'' if c.head == 'encoder' else 'bert.'}embeddings.token_type_embeddings.weight" if kind == "bert" else ""
    tensors = {r.hf: r.to_hf([mine[o] for o in r.ours]).contiguous().clone() for r in rules
               if r.group not in skip and not (r.hf == token_types and kind == "bert" and c.n_segments == 0)}
    if kind == "bert" and c.n_segments == 0:  # one all-zero token type: transformers' default ids add nothing
        tensors[token_types] = torch.zeros(1, c.d_model, dtype=mine["stack.embed.token.weight"].dtype)
    directory = Path(directory)
    with atomic_directory(directory) as tmp:
        write_safetensors(tensors, str(tmp / WEIGHTS), {"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        write_pipeline_files(model, tmp)  # the tokenizer of a run's model (qkv.hf.export.remember_text)
    return directory


class _HuggingFace(CheckpointFormat):
    """``from_pretrained`` / ``save_pretrained(format="huggingface")``: transformers' ``bert`` and ``gpt2``."""

    def recognizes(self, directory: Path) -> bool:
        return is_huggingface(directory)

    def load(self, cls: Optional[type], directory: Path, map_location: str, **overrides: Any) -> Any:
        return load(cls, directory, map_location, **overrides)

    def save(self, model: Any, directory: PathLike) -> Path:
        return save(model, directory)

    def from_state(self, cls: Optional[type], config: Dict[str, Any], state_dict: Dict[str, Tensor],
                   **overrides: Any) -> Any:
        return from_hf(cls, config, state_dict, **overrides)


CHECKPOINT_FORMATS["huggingface"] = _HuggingFace()
