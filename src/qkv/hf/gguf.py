"""GGUF files (llama.cpp's single-file checkpoints) read as transformers Llama checkpoints.

A GGUF file holds a model's hyper-parameters and tokenizer as typed key/value metadata, and its
weights as tensors (often block-quantized) under llama.cpp's names. :func:`read_gguf` reads one
with the ``gguf`` package -- the file is parsed, nothing in it is executed -- and returns what a
transformers ``LlamaForCausalLM`` checkpoint holds: a ``LlamaConfig`` dict, a float32 state dict
under transformers' names, and the tokenizer rebuilt from the metadata. :func:`convert_gguf`
writes them as a checkpoint directory (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``, ``generation_config.json``), in one piece. ``qkv data fetch smollm2``
converts SmolLM2-135M-Instruct this way (``qkv.tasks.data.smollm2_dir``).

What reading undoes:

- **Rotary row order.** transformers' Llama rotates the two halves of a head against each other
  (``rotate_half``: dimension ``i`` pairs with ``i + E/2``); llama.cpp rotates adjacent pairs
  (``2i`` with ``2i + 1``), so its converter reorders the rows of ``W_q`` and ``W_k`` within each
  head: transformers' row ``p·E/2 + i`` (half ``p`` in {0, 1}, pair ``i``) is the GGUF's row
  ``2i + p``. :func:`unpermute_rotary_rows` puts them back; the scores ``q·k`` are the same either
  way, because both sides are reordered alike.
- **Quantization.** Every tensor is de-quantized to float32 by ``gguf.quants.dequantize`` (Q4_1: a
  block of 32 weights is ``w = d·q + m``, ``q`` 4 bits, ``d`` and ``m`` float16) -- the values
  transformers' own GGUF loader computes.
- **Tied embeddings.** A file without ``output.weight`` uses ``token_embd.weight`` as its output
  layer: ``tie_word_embeddings`` and no ``lm_head.weight`` in the state dict.

Everything the header states is checked before a weight is read: the architecture (llama only),
the hyper-parameters, every tensor's name, shape and type; then each de-quantized tensor must be
finite. What is wrong is one ``qkv.UserError`` naming the file.

The tokenizer (``tokenizer.ggml.model == "gpt2"``: byte-level BPE) is rebuilt with ``tokenizers``
from the vocabulary, merges, token types and special ids, the pre-tokenizer chosen by
``tokenizer.ggml.pre`` as llama.cpp chooses it. One deliberate difference from transformers'
GGUF tokenizer (5.23): for ``"smollm"`` llama.cpp (and SmolLM2's own ``tokenizer.json``) splits
off every number character before the GPT-2 split, which transformers does not. ASCII digits come
out the same (the vocabulary merges no digits), but a number character that is not ASCII after a
space (``" ½"``, ``" ²"``) is two tokens here, as the model saw it in training, and one there.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np
import torch

from .._errors import UserError
from .._io import atomic_folder
from ..tasks import data

__all__ = ["GGUFCheckpoint", "GGUFTokenizer", "read_gguf", "convert_gguf", "unpermute_rotary_rows"]

PathLike = Union[str, "os.PathLike[str]"]

#: the files :func:`convert_gguf` writes (a folder holding only these is an earlier conversion it may replace)
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                    "generation_config.json")

#: ``tokenizer.ggml.pre`` -> whether number characters are split off one by one before the GPT-2
#: split (llama.cpp's pre-tokenizers built on the GPT-2 pattern; others are refused)
_PRE_TOKENIZERS = {"gpt2": False, "smollm": True, "starcoder": True}
#: llama.cpp's token types (``tokenizer.ggml.token_type``)
_CONTROL, _USER_DEFINED = 3, 4


class GGUFCheckpoint(NamedTuple):
    """What :func:`read_gguf` returns: ``config, state_dict, tokenizer = read_gguf(path)``."""

    config: Dict[str, Any]              # transformers' LlamaConfig keys
    state_dict: Dict[str, torch.Tensor]  # transformers' names, float32
    tokenizer: "GGUFTokenizer"


@dataclass(frozen=True)
class GGUFTokenizer:
    """The tokenizer a GGUF file describes: a ``tokenizers.Tokenizer`` and what transformers keeps
    beside it (``tokenizer_config.json``). ``special`` maps ``bos_token``/``eos_token``/``unk_token``/
    ``pad_token`` to their text (those the file names)."""

    backend: Any  # tokenizers.Tokenizer
    special: Dict[str, str] = field(default_factory=dict)
    chat_template: Optional[str] = None
    add_bos_token: bool = False
    add_eos_token: bool = False
    model_max_length: Optional[int] = None

    def config(self) -> Dict[str, Any]:
        """``tokenizer_config.json``: what ``transformers.AutoTokenizer`` reads beside ``tokenizer.json``."""
        config: Dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **self.special,
                                  "add_bos_token": self.add_bos_token, "add_eos_token": self.add_eos_token,
                                  "clean_up_tokenization_spaces": False}
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return config

    def save(self, folder: PathLike) -> Path:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder`` (which must exist):
        what ``transformers.AutoTokenizer.from_pretrained(folder)`` reads. Returns ``folder``."""
        folder = Path(folder)
        self.backend.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(_json(self.config()), encoding="utf-8")
        return folder


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- the rotary row order


def unpermute_rotary_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``W_q`` or ``W_k`` ``(n_heads·E, d_in)`` from llama.cpp's row order (pairs ``(2i, 2i+1)``
    rotated together) to transformers' (halves ``(i, i + E/2)``): row ``h·E + p·E/2 + i`` of the
    result is row ``h·E + 2i + p`` of ``weight``."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (n_heads * d_head, d_in), got shape {tuple(weight.shape)}")
    rows, d_in = weight.shape
    if n_heads <= 0 or rows % n_heads or (rows // n_heads) % 2:
        raise ValueError(f"n_heads must split the {rows} rows of weight into heads of an even width, got {n_heads}")
    d_head = rows // n_heads
    w = weight.reshape(n_heads, d_head // 2, 2, d_in)  # (H, i, p, d_in): GGUF row 2i + p
    return w.transpose(1, 2).reshape(rows, d_in)       # (H, p, i, d_in): transformers' row p·E/2 + i


# --------------------------------------------------------------------------- reading


def _gguf_package() -> Any:
    try:
        import gguf
    except ImportError:
        raise UserError("reading a GGUF file needs the `gguf` package: pip install 'qkv[hf]'") from None
    return gguf


def _open(path: Path) -> Any:
    """The file's ``GGUFReader`` (header parsed, tensors mapped, nothing de-quantized)."""
    gguf = _gguf_package()
    if not path.is_file():
        raise UserError(f"{path}: no such GGUF file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise UserError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as err:
        if "GGMLQuantizationType" in str(err):  # the enum refusing a tensor's type code
            raise UserError(f"{path}: a tensor has an unknown quantization type ({err})") from None
        raise UserError(f"{path} is truncated or damaged: its header or tensors cannot be read "
                        f"({type(err).__name__}: {err})") from None
    if reader.byte_order != "I":
        raise UserError(f"{path}: a GGUF file of the other byte order; only this machine's is read")
    return reader


def _metadata(reader: Any, path: Path) -> Dict[str, Any]:
    try:
        return {key: f.contents() for key, f in reader.fields.items() if not key.startswith("GGUF.")}
    except (ValueError, IndexError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: its metadata cannot be read ({type(err).__name__}: {err})") from None


def _count(meta: Mapping[str, Any], key: str, path: Path, default: Optional[int] = None) -> int:
    """A positive integer the metadata states (or ``default`` when it is absent)."""
    value = meta.get(key, default)
    if value is None:
        raise UserError(f"{path}: the metadata lacks {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"{path}: {key} must be a positive integer, got {value!r}")
    return value


def _real(meta: Mapping[str, Any], key: str, path: Path, default: Optional[float] = None) -> float:
    """A positive finite number the metadata states, as the shortest decimal its float32 rounds to
    (``1e-05``, not ``9.999999747378752e-06``)."""
    value = meta.get(key, default)
    if value is None:
        raise UserError(f"{path}: the metadata lacks {key}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{path}: {key} must be a positive finite number, got {value!r}")
    return float(str(np.float32(value)))


def _llama_config(meta: Mapping[str, Any], tensor_names: List[str], path: Path) -> Dict[str, Any]:
    """The ``LlamaConfig`` dict the metadata describes (``llama.*`` keys; special ids from ``tokenizer.ggml.*``)."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise UserError(f"{path}: general.architecture is {arch!r}; qkv reads llama GGUF files only")
    d_model = _count(meta, "llama.embedding_length", path)
    n_heads = _count(meta, "llama.attention.head_count", path)
    n_kv_heads = _count(meta, "llama.attention.head_count_kv", path, default=n_heads)
    if d_model % n_heads or n_heads % n_kv_heads:
        raise UserError(f"{path}: {n_heads} heads ({n_kv_heads} key-value heads) do not divide the width {d_model}")
    d_head = _count(meta, "llama.attention.key_length", path, default=d_model // n_heads)
    for key in ("llama.attention.value_length", "llama.rope.dimension_count"):
        if _count(meta, key, path, default=d_head) != d_head:
            raise UserError(f"{path}: {key} is {meta[key]}, not the head width {d_head}; qkv reads llama files whose "
                            "rotary covers whole heads and whose values are as wide as their keys")
    if d_head % 2:
        raise UserError(f"{path}: the head width {d_head} is odd; rotary embeddings rotate pairs")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise UserError(f"{path}: llama.rope.scaling.type is {scaling!r}; qkv reads unscaled rotary embeddings only")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab_size = _count(meta, "llama.vocab_size", path, default=len(tokens) if isinstance(tokens, list) else None)
    rope_theta = _real(meta, "llama.rope.freq_base", path, default=10000.0)
    config: Dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": d_model,
        "intermediate_size": _count(meta, "llama.feed_forward_length", path),
        "num_hidden_layers": _count(meta, "llama.block_count", path),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv_heads,
        "head_dim": d_head,
        "hidden_act": "silu",
        "max_position_embeddings": _count(meta, "llama.context_length", path),
        "rms_norm_eps": _real(meta, "llama.attention.layer_norm_rms_epsilon", path),
        "rope_theta": rope_theta,  # transformers 4's key; 5 reads rope_parameters
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False,
        "mlp_bias": False,
        # llama.cpp writes an output layer only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    for key in ("bos", "eos", "pad"):
        token_id = meta.get(f"tokenizer.ggml.{'padding' if key == 'pad' else key}_token_id")
        if token_id is not None:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
                raise UserError(f"{path}: the {key} token id {token_id!r} is not in the vocabulary of {vocab_size}")
            config[f"{key}_token_id"] = token_id
    return config


def _expected_tensors(config: Mapping[str, Any]) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """llama.cpp's tensor name -> (transformers' name, its shape) for a llama of ``config``."""
    V, D, F = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    expected = {"token_embd.weight": ("model.embed_tokens.weight", (V, D)),
                "output_norm.weight": ("model.norm.weight", (D,))}
    if not config["tie_word_embeddings"]:
        expected["output.weight"] = ("lm_head.weight", (V, D))
    for i in range(config["num_hidden_layers"]):
        hf = f"model.layers.{i}"
        expected.update({
            f"blk.{i}.attn_norm.weight": (f"{hf}.input_layernorm.weight", (D,)),
            f"blk.{i}.attn_q.weight": (f"{hf}.self_attn.q_proj.weight", (q_rows, D)),
            f"blk.{i}.attn_k.weight": (f"{hf}.self_attn.k_proj.weight", (kv_rows, D)),
            f"blk.{i}.attn_v.weight": (f"{hf}.self_attn.v_proj.weight", (kv_rows, D)),
            f"blk.{i}.attn_output.weight": (f"{hf}.self_attn.o_proj.weight", (D, q_rows)),
            f"blk.{i}.ffn_norm.weight": (f"{hf}.post_attention_layernorm.weight", (D,)),
            f"blk.{i}.ffn_gate.weight": (f"{hf}.mlp.gate_proj.weight", (F, D)),
            f"blk.{i}.ffn_up.weight": (f"{hf}.mlp.up_proj.weight", (F, D)),
            f"blk.{i}.ffn_down.weight": (f"{hf}.mlp.down_proj.weight", (D, F)),
        })
    return expected


def _check_tensors(reader: Any, expected: Mapping[str, Tuple[str, Tuple[int, ...]]], path: Path) -> Dict[str, Any]:
    """The file's tensors by name, once each one ``expected`` names is there with its shape and a
    weight type, and no other is; nothing is de-quantized yet."""
    gguf = _gguf_package()
    tensors = {t.name: t for t in reader.tensors}
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise UserError(f"{path} lacks {len(missing)} tensor(s) of its llama model: {', '.join(missing[:3])}"
                        f"{' ...' if len(missing) > 3 else ''}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise UserError(f"{path} holds tensor(s) a llama model of its metadata does not have: {', '.join(extra[:3])}"
                        f"{' ...' if len(extra) > 3 else ''}")
    integers = {gguf.GGMLQuantizationType[n] for n in ("I8", "I16", "I32", "I64")}
    for name, (_, shape) in expected.items():
        tensor = tensors[name]
        stated = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # GGUF lists the fastest dimension first
        if stated != shape:
            raise UserError(f"{path}: tensor {name} has shape {stated}, but the metadata makes it {shape}")
        if tensor.tensor_type in integers:
            raise UserError(f"{path}: tensor {name} is {tensor.tensor_type.name}, an integer type, not a weight")
    return tensors


def _dequantize(tensor: Any, shape: Tuple[int, ...], path: Path) -> torch.Tensor:
    """One tensor as float32 of ``shape`` (a copy: nothing stays mapped to the file)."""
    gguf = _gguf_package()
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise UserError(f"{path}: tensor {tensor.name} is {tensor.tensor_type.name}, a quantization type the gguf "
                        "package cannot de-quantize") from None
    weight = torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))
    finite = torch.isfinite(weight)
    if not bool(finite.all()):
        raise UserError(f"{path}: tensor {tensor.name} holds {int((~finite).sum())} non-finite value(s)")
    return weight


def read_gguf(path: PathLike, tensors: bool = True) -> GGUFCheckpoint:
    """Read a llama GGUF file as a transformers checkpoint: ``config, state_dict, tokenizer``.

    Args:
        path: the ``.gguf`` file (read in place, never executed).
        tensors: False reads only the header: the state dict is empty, the file's tensors are
            still checked against the config (names, shapes, types).

    Returns:
        A :class:`GGUFCheckpoint`: ``config`` (``LlamaConfig`` keys), ``state_dict`` (transformers'
        names, float32, ``W_q``/``W_k`` rows in transformers' rotary order; no ``lm_head.weight``
        when the embeddings are tied) and ``tokenizer`` (:class:`GGUFTokenizer`).

    Raises:
        UserError (one line naming the file): not a GGUF file, truncated or damaged, another
        architecture than llama, hyper-parameters qkv does not read, a tensor missing, extra, of
        the wrong shape, of an unknown or integer type, or holding non-finite values; a tokenizer
        that is not byte-level BPE.
    """
    path = Path(path)
    reader = _open(path)
    meta = _metadata(reader, path)
    config = _llama_config(meta, [t.name for t in reader.tensors], path)
    expected = _expected_tensors(config)
    found = _check_tensors(reader, expected, path)
    tokenizer = _tokenizer(meta, config, path)
    state_dict: Dict[str, torch.Tensor] = {}
    if tensors:
        rows_per_head = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
        for name, (hf_name, shape) in expected.items():
            weight = _dequantize(found[name], shape, path)
            kind = name.split(".")[-2]
            if kind in rows_per_head:
                weight = unpermute_rotary_rows(weight, rows_per_head[kind])
            state_dict[hf_name] = weight
    return GGUFCheckpoint(config, state_dict, tokenizer)


# --------------------------------------------------------------------------- the tokenizer


def _byte_spelling() -> Dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as one printable character (printable Latin-1 bytes
    as themselves, the other 68 as the characters from U+0100 on), as byte-level BPE vocabularies spell tokens."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in kept}
    for n, b in enumerate(b for b in range(256) if b not in spelling):
        spelling[b] = chr(256 + n)
    return spelling


def _tokenizer(meta: Mapping[str, Any], config: Mapping[str, Any], path: Path) -> GGUFTokenizer:
    """The byte-level BPE tokenizer the ``tokenizer.ggml.*`` metadata describes."""
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError:
        raise UserError("reading a GGUF file's tokenizer needs the `tokenizers` library: pip install 'qkv[hf]'") from None
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2":
        raise UserError(f"{path}: tokenizer.ggml.model is {kind!r}; qkv reads byte-level BPE tokenizers ('gpt2') only")
    if pre not in _PRE_TOKENIZERS:
        raise UserError(f"{path}: tokenizer.ggml.pre is {pre!r}; qkv knows {', '.join(sorted(_PRE_TOKENIZERS))}")
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens or ())
    if not isinstance(tokens, list) or len(tokens) != config["vocab_size"] or len(types) != len(tokens):
        raise UserError(f"{path}: tokenizer.ggml.tokens must list the {config['vocab_size']} tokens of the vocabulary "
                        f"(and token_type one type each), got {len(tokens) if isinstance(tokens, list) else tokens!r} "
                        f"tokens and {len(types)} types")
    if not isinstance(merges, list) or not merges:
        raise UserError(f"{path}: a byte-level BPE tokenizer needs tokenizer.ggml.merges")

    # A normal token is stored in the byte alphabet; one that is not (a mislabelled file) is respelled.
    spelling = _byte_spelling()
    alphabet = set(spelling.values())
    spelled = [t if kind_ != 1 or set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))
               for t, kind_ in zip(tokens, types)]
    vocab = {token: i for i, token in enumerate(spelled)}
    if len(vocab) != len(spelled):
        twice = next(t for i, t in enumerate(spelled) if vocab[t] != i)
        raise UserError(f"{path}: the vocabulary lists the token {twice!r} twice")
    pairs = [tuple(m.split(" ")) for m in merges]
    bad = next((m for m, pair in zip(merges, pairs) if len(pair) != 2 or not all(pair)), None)
    if bad is not None:
        raise UserError(f"{path}: the merge {bad!r} is not two tokens separated by one space")
    try:
        backend = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    except Exception as err:  # the Rust side names the merge whose token is missing
        raise UserError(f"{path}: its merges do not fit its vocabulary ({err})") from None

    # pre-tokenization as llama.cpp does it for this `pre`: number characters one by one, then GPT-2's pattern
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
                                                      byte_level]) if _PRE_TOKENIZERS[pre] else byte_level)
    backend.decoder = decoders.ByteLevel()
    # control tokens (<|im_start|>) are special and matched whole; user-defined ones matched whole too
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, kind_ in zip(spelled, types) if kind_ == _CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, kind_ in zip(spelled, types) if kind_ == _USER_DEFINED])

    special = {}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < len(spelled):
                raise UserError(f"{path}: tokenizer.ggml.{key}_token_id {token_id!r} is not in the vocabulary")
            special[name] = spelled[token_id]
    add_bos, add_eos = bool(meta.get("tokenizer.ggml.add_bos_token", False)), bool(meta.get("tokenizer.ggml.add_eos_token", False))
    for flag, name in ((add_bos, "bos_token"), (add_eos, "eos_token")):
        if flag and name not in special:
            raise UserError(f"{path}: the tokenizer adds a {name} but the metadata names none")
    first = [special["bos_token"]] if add_bos else []
    last = [special["eos_token"]] if add_eos else []
    backend.post_processor = processors.TemplateProcessing(
        single=" ".join([*first, "$A", *last]), pair=" ".join([*first, "$A", *last, *first, "$B:1", *last]),
        special_tokens=[(t, vocab[t]) for t in dict.fromkeys(first + last)])
    template = meta.get("tokenizer.chat_template")
    return GGUFTokenizer(backend, special, template if isinstance(template, str) else None, add_bos, add_eos,
                         config["max_position_embeddings"])


# --------------------------------------------------------------------------- converting


def _is_conversion(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but what :func:`convert_gguf` writes (an earlier conversion)."""
    return all(p.name in CHECKPOINT_FILES for p in folder.iterdir())


def convert_gguf(gguf_path: PathLike, out_dir: PathLike) -> Path:
    """Write a llama GGUF file as a transformers checkpoint directory ``out_dir``: ``config.json``,
    ``model.safetensors`` (float32), ``tokenizer.json``, ``tokenizer_config.json`` and
    ``generation_config.json``, which ``transformers.AutoModelForCausalLM``/``AutoTokenizer`` and
    qkv's ``from_pretrained`` read.

    ``out_dir`` appears whole or not at all (``qkv._io.atomic_folder``); it must be new, empty, or
    an earlier conversion. Everything :func:`read_gguf` refuses is refused before anything is written.
    Returns ``out_dir``.
    """
    from safetensors.torch import save_file

    config, state_dict, tokenizer = read_gguf(gguf_path)
    generation = {key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id") if key in config}
    with atomic_folder(out_dir, _is_conversion) as tmp:
        (tmp / "config.json").write_text(_json({**config, "torch_dtype": "float32"}), encoding="utf-8")
        save_file(state_dict, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save(tmp)
        (tmp / "generation_config.json").write_text(_json(generation), encoding="utf-8")
    return Path(out_dir)


def _derive_smollm2(folder: Path, force: bool) -> None:
    """``qkv data fetch smollm2``'s last step: the verified GGUF converted beside it (once; again with ``force``)."""
    out = folder / data.SMOLLM2_FOLDER
    if force or not all((out / name).is_file() for name in CHECKPOINT_FILES):
        convert_gguf(folder / data.SMOLLM2_GGUF, out)


data.register_derived("smollm2", _derive_smollm2)
