"""A run directory: its files, the checks before a run goes into one, and its writer lock.

It holds ``run.json`` (``Settings.record()``), the trainer's ``train_config.json``,
``metrics.jsonl`` and ``checkpoints/``, the final ``model/`` (``save_pretrained`` + the task's
``vocab.json``) and, for a task read with a checkpoint's tokenizer, its own ``tokenizer.json``
(with the ``tokenizer_config.json`` beside it that names a language model's specials).

A run has an id (``run_id`` in run.json, drawn when the run is made and kept when it is resumed),
which it writes into the ``model/`` it saves (``MODEL_ID_FILE``): a ``model/`` that is not the
run's own — a link out of the run, or a copy of another run's, whose id differs — is refused
(``own_model``) rather than read with this run's tokenizer and task. (A ``model/`` of an older
qkv has no id: it is read as the run's.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from .._errors import UserError
from .._io import atomic_path, output_folder
from .._modelfile import RUN_FILE
from ..tasks.vocab import vocab_to_dict
from ..train import CheckpointManager, RunLock, read_checkpoint_meta
from ..train.checkpoint import atomic_write_text
from .settings import Say, TrainConfig

VOCAB_FILE = "vocab.json"
#: a checkpoint's tokenizer (task option ``tokenizer``), copied into the run directory
TOKENIZER_FILE = "tokenizer.json"
#: transformers' file beside it: a language model's special tokens (``CheckpointTokenizer``), copied too
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
#: run.json's field holding the run's id, and the file in its model/ holding the id of the run that saved it
RUN_ID_KEY = "run_id"
MODEL_ID_FILE = "qkv-run.json"
_RUN_KEYS = ("model", "task", "task_options", "model_config")


def rank() -> int:
    """This process's rank under torchrun (0 alone: only rank 0 writes)."""
    return int(os.environ.get("RANK", "0"))


def lock(locks: contextlib.ExitStack, directory: Path) -> None:
    """Take ``directory``'s writer lock into ``locks`` (rank 0 only: it alone writes)."""
    if rank() == 0:
        locks.enter_context(RunLock(directory))


# ----------------------------------------------------------------------------- checks before a run goes in


def check_out(out: Path) -> None:
    """``out`` can be a run directory: a directory (or creatable) and writable, else a UserError."""
    parent = output_folder(out, f"--out {out}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: {parent} is not writable")


def has_checkpoints(out: Path) -> bool:
    return bool(CheckpointManager(out / "checkpoints").checkpoints())


def refuse_foreign_directory(out: Path) -> None:
    """A new run goes into a new or empty directory, or one that already holds a qkv run (run.json
    or checkpoints); a directory of other files (a data folder, an exported model) is refused
    rather than filled with a run beside them.

    Rank 0 alone checks (under torchrun): it alone writes, and another rank looking while rank 0
    writes the run's first files (a temporary run.json, the tokenizer copy) would take them for
    foreign files and stop — rank 0 checked the directory before writing any of them."""
    if rank() != 0 or not out.is_dir() or (out / RUN_FILE).is_file() or has_checkpoints(out):
        return
    foreign = sorted(p.name for p in out.iterdir() if p.name != ".lock")
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise UserError(f"--out {out}: holds files that are not a qkv run ({shown}); choose a new or empty directory")


def refuse_fresh_over_checkpoints(out: Path) -> None:
    if has_checkpoints(out):
        raise UserError(f"{out} already holds a run with checkpoints; continue it with --resume or choose another --out")


def finished_or_corrupt(out: Path, config: TrainConfig, say: Say) -> bool:
    """Resume checks: refuse when every checkpoint is corrupt; True (and say so) when the run is
    already at ``config.steps`` with its final model."""
    manager = CheckpointManager(out / "checkpoints")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each corrupt checkpoint warns; one error says it below
        intact = manager.latest_intact()
    if manager.checkpoints() and intact is None:
        raise UserError(f"--resume: every checkpoint in {out / 'checkpoints'} is corrupt (checksum or header); "
                        "nothing to resume from — remove them to start over")
    done = read_checkpoint_meta(intact)["step"] if intact is not None else 0
    if done >= config.steps and (out / "model" / "config.json").is_file():
        say(f"--resume: the run in {out} is finished at step {done} (--steps {config.steps}); "
            f"nothing to do — extend it with --resume --steps N, N > {done}")
        return True
    return False


# ----------------------------------------------------------------------------- its files


#: the record of a linearization (``qkv linearize``) in its output directory, naming its last stage's run
LINEARIZE_RECORD = "linearize.json"


def final_run(directory: Path) -> Path:
    """The run a linearization directory stands for (its last stage, ``qkv.linearize``), else ``directory``."""
    directory = Path(directory)
    record = directory / LINEARIZE_RECORD
    if (directory / RUN_FILE).is_file() or not record.is_file():
        return directory
    info = read_json(record)
    if not isinstance(info, dict):
        raise UserError(f"{record} is corrupt: expected a JSON object, got {type(info).__name__}")
    stage = info.get("final")
    if not isinstance(stage, str) or not (directory / stage / RUN_FILE).is_file():
        raise UserError(f"{directory} is a linearization that has not finished (no final stage in {record})")
    return directory / stage


def read_run(run: Path) -> Dict[str, Any]:
    """``run.json`` of the run in ``run``, checked to be whole; a UserError naming it otherwise."""
    path = run / RUN_FILE
    if not path.is_file():
        raise UserError(f"{run} is not a qkv run directory (no {RUN_FILE}); create one with `qkv train MODEL --task TASK --out {run}`")
    info = read_json(path)
    if not isinstance(info, dict):
        raise UserError(f"{path} is corrupt: expected a JSON object")
    missing = [k for k in _RUN_KEYS if k not in info]
    if missing:
        raise UserError(f"{path} is incomplete: no {', '.join(repr(k) for k in missing)} field")
    return info


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deeply, a 5,000-digit integer
        raise UserError(f"{path} is corrupt: {str(e).splitlines()[0] if str(e) else 'nested too deeply'}") from None


def write_run(run: Path, record: Dict[str, Any]) -> None:
    """Write ``run.json``: ``record`` with the run's id (the one run.json has, else a new one)."""
    previous = run_id(run) if (run / RUN_FILE).is_file() else None
    record = {**record, RUN_ID_KEY: previous or uuid.uuid4().hex}
    with atomic_path(run / RUN_FILE) as tmp:
        tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")


def run_id(run: Path, info: Optional[Mapping[str, Any]] = None) -> Optional[str]:
    """The id in the run's run.json (``info``, when already read); None for a run of an older qkv."""
    value = (read_run(run) if info is None else info).get(RUN_ID_KEY)
    if value is not None and not isinstance(value, str):
        raise UserError(f"{run / RUN_FILE} is corrupt: {RUN_ID_KEY} must be a string, got {type(value).__name__}")
    return value


def mark_model(run: Path) -> None:
    """Write the run's id into its ``model/`` (after ``save_pretrained``): the model is the run's own."""
    identity = run_id(run)
    if identity is not None:
        atomic_write_text(run / "model" / MODEL_ID_FILE, json.dumps({RUN_ID_KEY: identity}) + "\n")


def own_model(run: Path, info: Optional[Mapping[str, Any]] = None) -> Path:
    """The run's ``model/``, checked to be its own: one that leads out of the run (a link to another
    run's) or holds another run's id (a copy of it) is a ``UserError`` — its weights would be read
    with this run's tokenizer and task. A ``model/`` without an id (an older qkv's) passes."""
    final = run / "model"
    if not os.path.lexists(final):
        return final
    try:
        final.resolve().relative_to(run.resolve())
    except ValueError:
        raise UserError(f"{final} leads outside the run (to {final.resolve()}): a run reads only the model it saved; "
                        "remove the link, or use the other run itself") from None
    mark = final / MODEL_ID_FILE
    if not mark.is_file():
        return final
    written = read_json(mark)
    theirs = written.get(RUN_ID_KEY) if isinstance(written, dict) else None
    if not isinstance(theirs, str):
        raise UserError(f"{mark} is corrupt: expected {{{RUN_ID_KEY!r}: the id of the run that saved the model}}")
    mine = run_id(run, info)
    if theirs != mine:
        raise UserError(f"{final} was saved by another run ({MODEL_ID_FILE} holds run id {theirs!r}, {run / RUN_FILE} "
                        f"{mine!r}): a copy of another run's model is not read with this run's tokenizer and task; "
                        "use the other run itself, or remove the copy")
    return final


def run_train_settings(run: Path, info: Dict[str, Any]) -> Dict[str, Any]:
    """The training settings a run was started with (run.json, else the trainer's train_config.json)."""
    if isinstance(info.get("train"), dict):
        return dict(info["train"])
    path = run / "train_config.json"
    if path.is_file():
        values = read_json(path)
        if isinstance(values, dict):
            return values
    return {}


def save_vocab(task: Any, directory: Path) -> None:
    """The task's vocabulary beside the model, so that it decodes without the data."""
    data = vocab_to_dict(task.vocab)
    if data is not None:
        atomic_write_text(directory / VOCAB_FILE, json.dumps(data, ensure_ascii=False) + "\n")


def keep_tokenizer(out: Path, options: Mapping[str, Any]) -> Dict[str, Any]:
    """``options`` naming the run's own copy of the checkpoint tokenizer they name (relative to the
    run), copied into ``out``: the run no longer depends on the checkpoint staying where it was."""
    path = options.get("tokenizer")
    if not isinstance(path, (str, os.PathLike)):  # none, or a tokenizer object given through the API
        return dict(options)
    source = Path(str(path)).expanduser()
    source = source / TOKENIZER_FILE if source.is_dir() else source
    copy = out / TOKENIZER_FILE
    if rank() == 0 and source.resolve() != copy.resolve():  # under torchrun rank 0 alone writes
        with atomic_path(copy) as tmp:
            shutil.copyfile(source, tmp)
        beside = source.parent / TOKENIZER_CONFIG_FILE
        if beside.is_file():
            with atomic_path(out / TOKENIZER_CONFIG_FILE) as tmp:
                shutil.copyfile(beside, tmp)
    return {**options, "tokenizer": TOKENIZER_FILE}


def task_options_at(run: Path, options: Mapping[str, Any]) -> Dict[str, Any]:
    """The task options of a run in ``run`` with its own tokenizer copy's path made whole. The
    path must stay inside the run (a run keeps its own copy, ``keep_tokenizer``): one that leads
    out of it (``../../etc/passwd``, an absolute path, a link) is a ``UserError`` naming run.json."""
    path = options.get("tokenizer")
    if not isinstance(path, (str, os.PathLike)):
        return dict(options)
    full = run / Path(str(path))  # an absolute path stays itself
    try:
        full.resolve().relative_to(run.resolve())
    except ValueError:
        raise UserError(f"{run / RUN_FILE}: task option tokenizer={str(path)!r} leads outside the run directory; a run "
                        f"reads only its own copy ({TOKENIZER_FILE} in the run)") from None
    return {**options, "tokenizer": str(full)}
