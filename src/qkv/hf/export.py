"""A run's model as a directory other tools read: ``qkv export RUN OUT [--format huggingface|qkv]``.

``huggingface``: what ``transformers.pipeline(..., model=OUT)`` needs, beside the weights that
``save_pretrained(format="huggingface")`` writes (``config.json``, ``model.safetensors``):

- the run's tokenizer as ``tokenizer.json`` + ``tokenizer_config.json`` (the ``tokenizers``
  library's format, which ``AutoTokenizer.from_pretrained`` loads): a checkpoint's WordPiece
  tokenizer (a run started ``--init`` from MiniLM) as it is, with the ``[CLS] text [SEP]`` frame
  that qkv's task adds (a pair ``[CLS] A [SEP] B [SEP]`` with ``token_type_ids`` 1 for ``B [SEP]``,
  as BERT's own tokenizer gives), no fixed padding, and ``model_max_length`` the task's ``max_len``
  (so ``truncation=True`` cuts as the task does); BERT's word vocabulary (``bert-pretrain``,
  ``bbc-news`` without ``--init``) as a WordLevel tokenizer that splits as ``qkv.tasks.bbc.tokenize``
  does, in the same frame; a character vocabulary as a vocabulary of single characters (unknown
  ones ``<unk>``), a byte vocabulary byte-level; each gives qkv's ids and decodes to qkv's text
  (except that a text holding a special token's own string, ``<eos>`` or ``[MASK]``, reads it as
  that token, as every transformers tokenizer does). A language model's tokenizer pads on the left
  (a batch of prompts generates each as alone). Any other word vocabulary, split by qkv's own
  rules, is refused (export ``--format qkv``);
- a GPT classifier as ``GPT2ForSequenceClassification`` (its classifier's bias moved into the
  final norm's, which only the classifier reads there: ``_save_gpt_classifier``); a BERT
  ``bert-pretrain`` model as ``BertForPreTraining``, which the fill-mask pipeline reads;
- ``id2label``/``label2id`` in ``config.json`` from the task's ``class_names`` (``LABEL_i`` only
  for a task that names none);
- for a language model, the special ids in ``config.json`` and a ``generation_config.json``
  (greedy, as ``qkv generate --temperature 0``; ``max_length`` the model's positions: a pipeline
  generates up to them and stops there, where ``qkv generate`` goes on with a sliding context that
  transformers' GPT-2 does not have — asked for more tokens with ``max_new_tokens``, it raises).

``qkv``: the run's ``model/`` as ``save_pretrained`` writes it, its ``vocab.json`` and, when the
task reads a checkpoint's tokenizer, that ``tokenizer.json``.

``OUT`` appears only complete (``qkv._io.atomic_folder``): an existing ``OUT`` must be empty or an
earlier export (only files an export writes), which is then replaced.
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


def _is_export(folder: Path) -> bool:
    names = {p.name for p in folder.iterdir()}
    return "config.json" in names and names <= EXPORT_FILES


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
        if _is_gpt_classifier(model):
            _save_gpt_classifier(model, folder)
        else:
            model.save_pretrained(folder, format="huggingface")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    generates = model.can_generate() and getattr(model.config, "head", "lm") == "lm"
    specials = write_hf_tokenizer(vocab, folder, model_max_length=_max_length(model, task),
                                  padding_side="left" if generates else "right")
    for key in ("pad", "bos", "eos", "unk"):
        if f"{key}_token" in specials:
            config[f"{key}_token_id"] = specials[f"{key}_token_id"]
    if getattr(model.config, "head", None) == "classification":
        names = _class_names(task, model.config.num_labels)
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


def _is_gpt_classifier(model: Any) -> bool:
    from ..models import GPT

    return type(model) is GPT and model.config.head == "classification"


def _save_gpt_classifier(model: Any, folder: Path) -> None:
    """A GPT classifier (``head="classification"``) as transformers' ``GPT2ForSequenceClassification``:
    the body as ``GPT2LMHeadModel`` writes it (``save_pretrained(format="huggingface")``), the LM head
    dropped and the classifier ``W_y`` as ``score``. Both classify the last real token's final
    hidden state ``h = LN_f(x)``; GPT-2's ``score`` has no bias, so qkv's bias ``b`` moves into the
    final norm's: ``W (beta + W^+ b) = W beta + b`` for ``W (C, d)`` of full row rank (``W^+`` its
    pseudo-inverse), exact up to rounding; the LM head that also reads ``LN_f`` is not written."""
    import dataclasses

    import torch
    from safetensors.torch import load_file, save_file

    from ..models import GPT

    W, b = model.classifier.weight.detach().cpu(), model.classifier.bias.detach().cpu()  # (C, d), (C,)
    if int(torch.linalg.matrix_rank(W.double())) < W.shape[0]:
        raise ValueError(f"the classifier's {W.shape[0]} rows are not independent: its bias cannot move into GPT-2's "
                         f"final norm (GPT2ForSequenceClassification's score has no bias); export --format qkv")
    body = GPT(dataclasses.replace(model.config, head="lm"))
    body.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("classifier.")}, strict=False)
    body.save_pretrained(folder, format="huggingface")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors.pop("lm_head.weight", None)
    beta = tensors["transformer.ln_f.bias"]
    shift = torch.linalg.pinv(W.double()) @ b.double()  # (d,): W shift = b
    tensors["transformer.ln_f.bias"] = (beta.double() + shift).to(beta.dtype).contiguous()
    tensors["score.weight"] = W.to(beta.dtype).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(architectures=["GPT2ForSequenceClassification"], num_labels=model.config.num_labels)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


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
    if isinstance(vocab, (CheckpointTokenizer, BertVocab)):  # segment ids: the pair template's type ids
        config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    ids = {f"{k}_id": tok.token_to_id(v) for k, v in specials.items()}
    return {**specials, **ids}
