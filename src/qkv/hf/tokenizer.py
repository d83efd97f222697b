"""How a qkv model reads text, for transformers: a run's vocabulary as a ``tokenizers`` tokenizer
(``tokenizer.json`` + ``tokenizer_config.json``, which ``AutoTokenizer.from_pretrained`` loads),
and the files a pipeline needs beside a Hugging Face checkpoint (special ids, class names, a
language model's generation settings).

``remember_text(model, task)`` keeps a run's vocabulary on its model (``qkv.runs.Run`` does it
when a run is loaded or assembled); ``save_pretrained(dir, format="huggingface")``
(``qkv.hf.checkpoints``) then calls ``write_pipeline_files``, so that a model saved from Python
is read by a pipeline as ``qkv export`` writes it (``qkv.hf.export``, which uses the same code).
A model that holds no vocabulary is written as weights only. This module imports ``qkv.tasks``
and no run or checkpoint code (``runs`` and ``checkpoints`` import it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from .._errors import UserError

__all__ = ["hf_tokenizer", "write_hf_tokenizer", "remember_text", "write_pipeline_files", "TEXT_ATTR"]


#: the attribute of a qkv model that keeps how its run reads text (``remember_text``): a plain
#: dict entry, not a submodule or buffer (nothing is added to the state_dict)
TEXT_ATTR = "_qkv_text"


def remember_text(model: Any, task: Any) -> None:
    """Keep on ``model`` what a pipeline needs to read text as ``task`` does: its vocabulary, its
    ``max_len`` and its class names; ``save_pretrained(dir, format="huggingface")`` then writes the
    tokenizer and labels beside the weights (``write_pipeline_files``), as ``qkv export`` does. A
    run's model gets it when the run is loaded or assembled (``qkv.runs.Run``); a task without a
    vocabulary leaves nothing."""
    vocab = getattr(task, "vocab", None)
    max_length = None if model is None else _max_length(model, task)
    if vocab is None or max_length is None:  # (a model without positions, an RNN's: no transformers format)
        return
    model.__dict__[TEXT_ATTR] = {"vocab": vocab, "max_length": max_length,
                                 "class_names": getattr(task, "class_names", None)}


def write_pipeline_files(model: Any, folder: Union[str, Path]) -> None:
    """Beside the Hugging Face weights and ``config.json`` in ``folder``: the tokenizer of the text
    ``model`` was trained on (``remember_text``; nothing for a model that holds none), its special
    ids and class names in ``config.json``, and for a language model ``generation_config.json``.
    A vocabulary that no tokenizers tokenizer reproduces raises ``UserError`` with the reason."""
    text = getattr(model, "__dict__", {}).get(TEXT_ATTR)
    if text is None:
        return
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    generates = model.can_generate() and getattr(model.config, "head", "lm") == "lm"
    specials = write_hf_tokenizer(text["vocab"], folder, model_max_length=text["max_length"],
                                  padding_side="left" if generates else "right")
    for key in ("pad", "bos", "eos", "unk"):
        if f"{key}_token" in specials:
            config[f"{key}_token_id"] = specials[f"{key}_token_id"]
    if getattr(model.config, "head", None) == "classification":
        names = _class_names(text["class_names"], model.config.num_labels)
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if generates:
        # max_length: GPT-2's learned positions end at n_positions; transformers' generation has no
        # sliding context (qkv generate re-reads the last max_len tokens past it), so it stops there
        generation = {"do_sample": False, "max_length": int(model.config.max_len),
                      **{f"{k}_token_id": config[f"{k}_token_id"] for k in ("bos", "eos", "pad") if f"{k}_token_id" in config}}
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n",
                                                       encoding="utf-8")


def _max_length(model: Any, task: Any) -> Optional[int]:
    """The longest input the model reads as trained: the task's ``max_len`` (tokens per example,
    specials included) when it has one, else the model's positions (None: neither has a length)."""
    length = getattr(task, "max_len", None) or getattr(getattr(model, "config", None), "max_len", None)
    return None if length is None else int(length)


def _class_names(names: Any, n: int) -> List[str]:
    if names is None or len(names) != n:
        return [f"LABEL_{i}" for i in range(n)]
    return [str(name) for name in names]


# ----------------------------------------------------------------------------- tokenizers


def hf_tokenizer(vocab: Any) -> Any:
    """``(tokenizers.Tokenizer, special tokens)`` that encodes text to ``vocab``'s ids: a
    ``CheckpointTokenizer`` (its own tokenizer: a WordPiece framed ``[CLS] text [SEP]``, a language
    model's as it is, its specials those of its ``tokenizer_config.json``), a ``CharVocab`` or a
    ``ByteVocab``. Special tokens: ``{"pad_token": "<pad>", ...}`` for ``tokenizer_config.json``."""
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    except ImportError as e:
        raise UserError("exporting a tokenizer needs the `tokenizers` library: pip install 'qkv[hf]'") from e
    from ..tasks.bbc import _WORD  # the pattern of a word in qkv.tasks.bbc.tokenize
    from ..tasks.bert_tasks import BertVocab
    from ..tasks.pretrained_vocab import CheckpointTokenizer
    from ..tasks.vocab import ByteVocab, CharVocab

    if isinstance(vocab, BertVocab):
        # qkv's split (qkv.tasks.bbc.tokenize): the runs of [a-z0-9'] of the lower-cased text, each
        # a word of the table (<unk> else); everything between them is dropped
        tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(vocab.words)}, unk_token="<unk>"))
        tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(_WORD.pattern), behavior="removed", invert=True)
        tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
        names = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in names])
        tok.post_processor = _bert_frame(vocab.cls_id, vocab.sep_id)
        return tok, dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), names))
    if isinstance(vocab, CheckpointTokenizer) and not vocab.wordpiece:  # a language model's (SmolLM2's): as it is
        tok = Tokenizer.from_file(str(vocab.path))
        tok.no_padding()
        tok.no_truncation()
        keys = {"pad_token": vocab.pad_id, "bos_token": vocab.bos_id, "eos_token": vocab.eos_id, "unk_token": vocab.unk_id}
        return tok, {key: vocab.words[i] for key, i in keys.items() if i >= 0}
    if isinstance(vocab, CheckpointTokenizer):
        tok = Tokenizer.from_file(str(vocab.path))
        tok.no_padding()  # a pipeline pads its own batches; truncation: model_max_length
        tok.no_truncation()
        tok.post_processor = _bert_frame(vocab.cls_id, vocab.sep_id)
        specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "mask_token": "[MASK]"}
        return tok, specials
    if isinstance(vocab, CharVocab):
        names = list(CharVocab.SPECIALS)  # ids 0 .. 3, then the characters in order
        table = {**{s: i for i, s in enumerate(names)}, **{c: i + len(names) for i, c in enumerate(vocab.chars)}}
        # BPE without merges: every character is looked up alone (no pre-tokenizer: spaces and
        # newlines are characters like the others); Fuse joins the pieces back without spaces
        tok = Tokenizer(models.BPE(vocab=table, merges=[], unk_token="<unk>"))
        tok.decoder = decoders.Fuse()
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in names])
        return tok, dict(zip(("pad_token", "bos_token", "eos_token", "unk_token"), names))
    if isinstance(vocab, ByteVocab):
        # the 256 bytes as GPT-2's printable stand-ins, in byte order: id b is byte b
        table = {ch: b for b, ch in enumerate(_bytes_to_unicode())}
        names = ["<pad>", "<bos>", "<eos>"]
        table.update({s: i for s, i in zip(names, (vocab.pad_id, vocab.bos_id, vocab.eos_id))})
        tok = Tokenizer(models.BPE(vocab=table, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in names])
        return tok, dict(zip(("pad_token", "bos_token", "eos_token"), names))
    raise UserError(f"a {type(vocab).__name__} splits text by qkv's own rules, which a tokenizers tokenizer does not "
                    f"reproduce; export --format qkv (the run's vocab.json), or train from a checkpoint's tokenizer "
                    f"(--init DIR)")


def _bert_frame(cls_id: int, sep_id: int) -> Any:
    """qkv's BERT tasks' frame: ``[CLS] A [SEP]``, a pair ``[CLS] A [SEP] B [SEP]`` with segment
    (token type) 1 for ``B [SEP]``."""
    from tokenizers import processors

    return processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                         special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])


def _bytes_to_unicode() -> List[str]:
    """GPT-2's byte-to-character table (``tokenizers``' ``ByteLevel`` uses the same): printable
    bytes stand for themselves, the others for the characters from U+0100 on, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_hf_tokenizer(vocab: Any, folder: Union[str, Path], model_max_length: Optional[int] = None,
                       padding_side: str = "right") -> Dict[str, Any]:
    """Write ``vocab`` (see ``hf_tokenizer``) into ``folder`` as ``tokenizer.json``,
    ``tokenizer_config.json`` and ``special_tokens_map.json``; returns the special tokens and
    their ids (``{"pad_token": "<pad>", "pad_token_id": 0, ...}``). ``padding_side``: where a
    batch's shorter rows are padded — ``"left"`` for a language model, whose next token follows
    each row's last real token (transformers' generation reads the last column). A checkpoint's
    WordPiece tokenizer also returns ``token_type_ids`` (0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``),
    which BERT reads for a pair of texts."""
    from ..tasks.bert_tasks import BertVocab
    from ..tasks.pretrained_vocab import CheckpointTokenizer

    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    folder = Path(folder)
    tok, specials = hf_tokenizer(vocab)
    tok.save(str(folder / "tokenizer.json"))
    config: Dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                              "padding_side": padding_side, **specials}
    if isinstance(vocab, BertVocab) or (isinstance(vocab, CheckpointTokenizer) and vocab.wordpiece):  # segment ids: the pair template's type ids
        config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    ids = {f"{k}_id": tok.token_to_id(v) for k, v in specials.items()}
    return {**specials, **ids}
