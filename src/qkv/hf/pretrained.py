"""A run that starts from a pretrained checkpoint directory: ``qkv train MODEL --task TASK --init DIR``
where ``DIR`` is a Hugging Face checkpoint (``config.json`` + ``model.safetensors``, e.g.
``qkv data fetch minilm``) or a qkv model directory written by ``save_pretrained`` — not a run
(a run directory holds ``run.json`` and is read by the CLI as before).

The new model takes the checkpoint's architecture (``from_pretrained``, so a Hugging Face config
is translated by ``qkv/hf/checkpoints.py``), the task's head fields
(``init_task_fields``: BERT's ``head`` and ``num_labels``) and the user's ``--set``; its weights
come from the checkpoint except the new task's head (``init_fresh``). A Hugging Face checkpoint
reads ids of its own tokenizer, so a task that takes ``tokenizer=`` gets the checkpoint's
``tokenizer.json`` (``qkv.tasks.pretrained_vocab``), and a task that builds its own vocabulary is
refused; so is a tokenizer with more ids than the checkpoint's vocabulary (``check_vocabulary``),
and a kernel that cannot take the pretrained attention weights (``check_kernel``: ``lsh``'s shared
queries and keys would drop the key projections), as ``from_pretrained`` refuses it — before
anything is written.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

from .._modelfile import RUN_FILE

__all__ = ["is_checkpoint_dir", "task_options", "init_config", "check_vocabulary", "check_kernel"]


def is_checkpoint_dir(path: Any) -> bool:
    """A model directory (``config.json``, no ``run.json``): a Hugging Face checkpoint or a
    ``save_pretrained`` directory."""
    directory = Path(str(path))
    return directory.is_dir() and (directory / "config.json").is_file() and not (directory / RUN_FILE).exists()


def _is_huggingface(directory: Path) -> bool:
    from .checkpoints import is_huggingface

    return is_huggingface(directory)


def task_options(path: Any, task_cls: type, options: Dict[str, Any]) -> Dict[str, Any]:
    """The task's options with the checkpoint's tokenizer (``tokenizer=DIR``) when ``path`` is a
    Hugging Face checkpoint; a task that cannot take one is refused with the reason."""
    directory = Path(str(path)).expanduser()
    if not is_checkpoint_dir(directory) or not _is_huggingface(directory):
        return options
    takes = "tokenizer" in inspect.signature(task_cls.__init__).parameters
    name = getattr(task_cls, "registry_name", task_cls.__name__)
    if not takes:
        raise ValueError(f"--init {path}: a Hugging Face checkpoint reads the ids of its own tokenizer, and task {name!r} "
                         f"builds its own vocabulary (it takes no tokenizer=); choose a task that takes one (bbc-news, shakespeare-char)")
    if options.get("tokenizer") is None:
        if not (directory / "tokenizer.json").is_file():
            raise ValueError(f"--init {path}: the checkpoint has no tokenizer.json; give the task one with "
                             f"--set task.tokenizer=DIR")
        options = {**options, "tokenizer": str(directory.resolve())}
    return options


def init_config(path: Any, model_cls: type, head: Dict[str, Any], user: Dict[str, Any],
                say: Callable[[str], None] = print, task: Any = None) -> Tuple[Dict[str, Any], Any]:
    """``(config values, source model)`` for a run initialised from the checkpoint in ``path``:
    its architecture, then the task's ``head`` fields, then the user's settings, checked
    (``check_vocabulary`` against ``task`` when given, ``check_kernel``). What the checkpoint
    lacks (a ``BertModel``'s classifier) is said through ``say`` in one line, once the checks passed."""
    directory = Path(str(path)).expanduser()
    # a Hugging Face checkpoint is read with the new head, so that what it lacks is said of that head
    as_head = {"head": head["head"]} if "head" in head and _is_huggingface(directory) else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source = model_cls.from_pretrained(directory, **as_head)
    values = {**dataclasses.asdict(source.config), **head, **user}
    if task is not None:
        check_vocabulary(path, task, values)
    check_kernel(path, model_cls, values, source)
    for w in caught:
        say(str(w.message))
    return values, source


def check_vocabulary(path: Any, task: Any, values: Dict[str, Any]) -> None:
    """Refuse a task whose vocabulary has more ids than the checkpoint's token table
    (``values["vocab_size"]``): those ids have no embedding (an index error deep in training)."""
    size = getattr(getattr(task, "vocab", None), "size", None)
    rows = values.get("vocab_size")
    if isinstance(size, int) and isinstance(rows, int) and size > rows:
        raise ValueError(f"--init {path}: the task's tokenizer has {size} ids, more than the checkpoint's {rows} "
                         f"embeddings (vocab_size); ids {rows}..{size - 1} have none: use the checkpoint's own "
                         f"tokenizer (its tokenizer.json)")


def check_kernel(path: Any, model_cls: type, values: Dict[str, Any], source: Any) -> None:
    """Refuse ``values``' attention kernel when the new model would drop weights of ``source``'s
    encoder or start kernel parameters fresh that ``source`` lacks (``lsh`` shares queries and
    keys: no key projections; ``linformer`` learns projections no checkpoint holds), with the
    reason ``from_pretrained(dir, attention=...)`` gives. The model is built on the meta device
    (no memory); a config that does not build is left to the real build to report."""
    import torch

    from ..models.base import config_from_dict

    theirs = getattr(source, "config", None)
    if theirs is not None and (values.get("attention"), values.get("attention_kwargs")) == \
            (getattr(theirs, "attention", None), getattr(theirs, "attention_kwargs", None)):
        return  # the source's own kernel: its weights fit
    try:
        with torch.device("meta"):
            candidate = model_cls(config_from_dict(model_cls.config_class, values))
    except Exception:  # noqa: BLE001 - reported by the real build, with its own message
        return
    mine, source_names = set(candidate.state_dict()), set(source.state_dict())
    dropped = sorted(n for n in source_names - mine if n.startswith("stack."))
    fresh = sorted(n for n in mine - source_names if n.startswith("stack.") and ".kernel." in n)
    if not dropped and not fresh:
        return
    if hasattr(candidate, "stack"):
        from .checkpoints import refuse_kernel

        refuse_kernel(candidate)  # raises with the kernel's reason
    names = ", ".join((dropped or fresh)[:4])
    raise ValueError(f"--init {path}: attention {values.get('attention')!r} would "
                     f"{'drop the pretrained' if dropped else 'start fresh'} {names}; choose another kernel")
