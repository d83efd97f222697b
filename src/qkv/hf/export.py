"""A run's model as a directory other tools read: ``qkv export RUN OUT [--format huggingface|qkv]``.

``huggingface``: what ``transformers.pipeline(..., model=OUT)`` needs — the weights and the files
that ``save_pretrained(format="huggingface")`` writes for a run's model (``config.json``,
``model.safetensors``, and the tokenizer and labels of ``qkv.hf.tokenizer``, the same code):

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
earlier export, which is then replaced. An export is known by its marker (``EXPORT_MARKER``, which
every export writes) and by holding only files an export writes: a folder of the user's own that
holds the same file names (a transformers model's ``config.json`` and ``model.safetensors``) is
refused, never replaced.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Union

from .._errors import UserError, user_input
from .._io import atomic_folder
from .tokenizer import hf_tokenizer, remember_text, write_hf_tokenizer, write_pipeline_files  # noqa: F401

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
    if getattr(task, "vocab", None) is None:
        raise UserError(f"task {run.settings.task!r} reads no text (no vocabulary): a Hugging Face pipeline has no "
                        f"tokenizer for it; export --format qkv")
    remember_text(model, task)
    with user_input():  # an architecture or option transformers has no counterpart for
        if _is_gpt_classifier(model):
            _save_gpt_classifier(model, folder)
            write_pipeline_files(model, folder)
        else:
            model.save_pretrained(folder, format="huggingface")  # the pipeline files with it


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
