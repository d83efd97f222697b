"""A run's model as a directory other tools read: ``qkv export RUN OUT [--format huggingface|qkv]``.

``huggingface``: what ``transformers.pipeline(..., model=OUT)`` needs, beside the weights that
``save_pretrained(format="huggingface")`` writes (``config.json``, ``model.safetensors``):

- the run's tokenizer as ``tokenizer.json`` + ``tokenizer_config.json`` (the ``tokenizers``
  library's format, which ``AutoTokenizer.from_pretrained`` loads): a checkpoint's WordPiece
  tokenizer (a run started ``--init`` from MiniLM) as it is, with the ``[CLS] text [SEP]`` frame
  that qkv's task adds, no fixed padding, and ``model_max_length`` the task's ``max_len`` (so
  ``truncation=True`` cuts as the task does); a character vocabulary as a vocabulary of single
  characters (unknown ones ``<unk>``), a byte vocabulary byte-level; either gives qkv's ids and
  decodes to qkv's text (except that a text holding a special token's own string, ``<eos>``, reads
  it as that token, as every transformers tokenizer does). A word vocabulary that qkv splits with its own rules is refused (export
  ``--format qkv``);
- ``id2label``/``label2id`` in ``config.json`` from the task's ``class_names`` (``LABEL_i`` only
  for a task that names none);
- for a language model, the special ids in ``config.json`` and a ``generation_config.json``
  (greedy, as ``qkv generate --temperature 0``).

``qkv``: the run's ``model/`` as ``save_pretrained`` writes it, its ``vocab.json`` and, when the
task reads a checkpoint's tokenizer, that ``tokenizer.json``.

``OUT`` appears only complete (``qkv._io.atomic_folder``): an existing ``OUT`` must be empty or an
earlier export, which is then replaced. An export is known by its marker (``EXPORT_MARKER``, which
every export writes) and by holding only files an export writes: a folder of the user's own that
holds the same file names (a transformers model's ``config.json`` and ``model.safetensors``) is
refused, never replaced.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from .._errors import UserError, user_input
from .._io import atomic_folder

__all__ = ["FORMATS", "export_run", "write_hf_tokenizer", "hf_tokenizer"]

FORMATS = ("huggingface", "qkv")
#: every file an export writes (an existing OUT holding only these is an earlier export, replaced)
EXPORT_FILES = frozenset({"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                          "special_tokens_map.json", "generation_config.json", "vocab.json"})
#: the file by which an export is known (what run and format wrote it): a folder without it is not one
EXPORT_MARKER = ".qkv-export.json"


def _is_export(folder: Path) -> bool:
    """An earlier ``qkv export`` (its marker, and only files an export writes), which may be replaced."""
    names = {p.name for p in folder.iterdir()}
    if EXPORT_MARKER not in names or not names <= EXPORT_FILES | {EXPORT_MARKER}:
        return False
    try:
        marker = json.loads((folder / EXPORT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(marker, dict) and marker.get("format") in FORMATS


def export_run(run: Any, out: Union[str, Path], format: str = "huggingface") -> Path:
    """Write ``run`` (a ``qkv.runs.Run`` or its directory) into the folder ``out`` in ``format``
    (``FORMATS``); returns ``out``. Everything is checked and written in a temporary folder beside
    ``out``, which becomes ``out`` in one rename. Raises ``UserError`` for what cannot be exported."""
    from .. import runs

    if format not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    if not isinstance(run, runs.Run):
        run = runs.load(run)
    out = Path(out)
    if out.resolve() == Path(run.directory).resolve() or Path(run.directory).resolve() in out.resolve().parents:
        raise UserError(f"OUT {out} is inside the run {run.directory}; export to a folder of its own")
    with atomic_folder(out, _is_export) as tmp:
        if format == "qkv":
            _write_qkv(run, tmp)
        else:
            _write_huggingface(run, tmp)
        marker = {"format": format, "run": str(Path(run.directory).resolve())}
        (tmp / EXPORT_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
    return out


def _write_qkv(run: Any, folder: Path) -> None:
    from ..runs import TOKENIZER_FILE, _save_vocab

    run.model.save_pretrained(folder)
    _save_vocab(run.task, folder)
    path = getattr(getattr(run.task, "vocab", None), "path", None)
    if path is not None and Path(path).name == TOKENIZER_FILE:
        shutil.copyfile(path, folder / TOKENIZER_FILE)


def _write_huggingface(run: Any, folder: Path) -> None:
    model, task = run.model, run.task
    vocab = getattr(task, "vocab", None)
    if vocab is None:
        raise UserError(f"task {run.settings.task!r} reads no text (no vocabulary): a Hugging Face pipeline has no "
                        f"tokenizer for it; export --format qkv")
    with user_input():  # an architecture or option transformers has no counterpart for
        model.save_pretrained(folder, format="huggingface")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    specials = write_hf_tokenizer(vocab, folder, model_max_length=_max_length(model, task))
    for key in ("pad", "bos", "eos", "unk"):
        if f"{key}_token" in specials:
            config[f"{key}_token_id"] = specials[f"{key}_token_id"]
    if getattr(model.config, "head", None) == "classification":
        names = _class_names(task, model.config.num_labels)
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if model.can_generate() and getattr(model.config, "head", "lm") == "lm":
        generation = {"do_sample": False, **{f"{k}_token_id": config[f"{k}_token_id"] for k in ("bos", "eos", "pad")
                                             if f"{k}_token_id" in config}}
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n",
                                                       encoding="utf-8")


def _max_length(model: Any, task: Any) -> int:
    """The longest input the model reads as trained: the task's ``max_len`` (tokens per example,
    specials included) when it has one, else the model's positions."""
    return int(getattr(task, "max_len", None) or model.config.max_len)


def _class_names(task: Any, n: int) -> List[str]:
    names = getattr(task, "class_names", None)
    if names is None or len(names) != n:
        return [f"LABEL_{i}" for i in range(n)]
    return [str(name) for name in names]


# ----------------------------------------------------------------------------- tokenizers


def hf_tokenizer(vocab: Any) -> Any:
    """``(tokenizers.Tokenizer, special tokens)`` that encodes text to ``vocab``'s ids: a
    ``CheckpointTokenizer`` (its own tokenizer, framed ``[CLS] text [SEP]``), a ``CharVocab`` or a
    ``ByteVocab``. Special tokens: ``{"pad_token": "<pad>", ...}`` for ``tokenizer_config.json``."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError as e:
        raise UserError("exporting a tokenizer needs the `tokenizers` library: pip install 'qkv[hf]'") from e
    from ..tasks.pretrained_vocab import CheckpointTokenizer
    from ..tasks.vocab import ByteVocab, CharVocab

    if isinstance(vocab, CheckpointTokenizer):
        tok = Tokenizer.from_file(str(vocab.path))
        tok.no_padding()  # a pipeline pads its own batches; truncation: model_max_length
        tok.no_truncation()
        cls, sep = "[CLS]", "[SEP]"
        tok.post_processor = processors.TemplateProcessing(  # qkv's tasks read [CLS] text [SEP]
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, vocab.cls_id), (sep, vocab.sep_id)])
        specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": cls, "sep_token": sep, "mask_token": "[MASK]"}
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


def write_hf_tokenizer(vocab: Any, folder: Union[str, Path], model_max_length: Optional[int] = None) -> Dict[str, Any]:
    """Write ``vocab`` (see ``hf_tokenizer``) into ``folder`` as ``tokenizer.json``,
    ``tokenizer_config.json`` and ``special_tokens_map.json``; returns the special tokens and
    their ids (``{"pad_token": "<pad>", "pad_token_id": 0, ...}``)."""
    folder = Path(folder)
    tok, specials = hf_tokenizer(vocab)
    tok.save(str(folder / "tokenizer.json"))
    config: Dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                              **specials}
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    ids = {f"{k}_id": tok.token_to_id(v) for k, v in specials.items()}
    return {**specials, **ids}
