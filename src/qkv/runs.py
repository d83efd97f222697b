"""A run as a library object: its settings, its directory, its training and its evaluation.

The ``qkv`` command, the reproductions and the benchmarks all go through this module::

    import qkv.runs

    settings = qkv.runs.resolve("gpt", "shakespeare-char", overrides={"d_model": 64, "train.steps": 200})
    with qkv.runs.Run.create("runs/main", settings) as run:   # checked, locked, run.json written
        metrics = run.train()
    with qkv.runs.Run.open("runs/main", overrides={"train.steps": 400}) as run:  # resume it
        run.train()
    metrics = qkv.runs.load("runs/main").evaluate("test", max_examples=512)

**Settings** (``resolve``), lowest first: the config's defaults, the model's ``train_defaults``, the
preset (``preset=``, else the model's ``default_preset``, a CPU-sized one), what the task determines
(vocabulary size, special ids, ``model_hints``), then ``overrides``. An override is ``key: value``
for a model-config field (``"attention_kwargs.radius": 8`` sets one key of a dict field),
``"task.key"`` for a task option and ``"train.key"`` for a ``TrainConfig`` field; a ``str`` value
is read as the command line reads it (``qkv._values.parse_value`` against the field's type).

**A run directory** holds ``run.json`` (model, task, preset, their options and the training
settings: ``Settings.record()``), the trainer's ``train_config.json``, ``metrics.jsonl`` and
``checkpoints/``, and the final ``model/`` (``save_pretrained`` + the task's ``vocab.json``). One
process writes it at a time (``qkv.train.lock.RunLock``, taken before anything is read from an
existing directory and held until ``Run.close``). Nothing in it changes until every check passed.

**Resuming** (``Run.open``) takes the run's own settings; an override that contradicts them is
refused, except those that do not change the trajectory (``RESUME_MAY_CHANGE``: ``steps`` to extend
a run, evaluation, saving, logging, device), which are announced.

Errors in what was asked for are ``qkv.UserError`` (one line on the command line); anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import json
import os
import random
import re
import shutil
import sys
import typing
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

from ._errors import UserError, user_input
from ._io import atomic_path, output_folder
from ._machine import announce
from ._values import guess_value, parse_value

__all__ = ["Settings", "Run", "resolve", "start", "load", "split_overrides", "forward_progress",
           "RUN_FILE", "VOCAB_FILE", "RESUME_MAY_CHANGE"]

RUN_FILE = "run.json"
VOCAB_FILE = "vocab.json"
#: training settings a resumed run may change (they do not alter the updates it computes)
RESUME_MAY_CHANGE = frozenset({"steps", "eval_every", "eval_batches", "eval_max_examples", "save_every", "keep_last",
                               "log_every", "device", "progress", "tensorboard",
                               "context_parallel"})  # a checkpoint written under one P resumes under another
_RUN_KEYS = ("model", "task", "task_options", "model_config")
#: a checkpoint's tokenizer (task option ``tokenizer``), copied into the run directory
TOKENIZER_FILE = "tokenizer.json"


def _keep_tokenizer(out: Path, options: Mapping[str, Any]) -> Dict[str, Any]:
    """``options`` naming the run's own copy of the checkpoint tokenizer they name (relative to the
    run), copied into ``out``: the run no longer depends on the checkpoint staying where it was."""
    path = options.get("tokenizer")
    if not isinstance(path, (str, os.PathLike)):  # none, or a tokenizer object given through the API
        return dict(options)
    source = Path(str(path)).expanduser()
    source = source / TOKENIZER_FILE if source.is_dir() else source
    copy = out / TOKENIZER_FILE
    if source.resolve() != copy.resolve():
        with atomic_path(copy) as tmp:
            shutil.copyfile(source, tmp)
    return {**options, "tokenizer": TOKENIZER_FILE}


def _task_options_at(run: Path, options: Mapping[str, Any]) -> Dict[str, Any]:
    """The task options of a run in ``run`` with its own tokenizer copy's path made whole. The
    path must stay inside the run (a run keeps its own copy, ``_keep_tokenizer``): one that leads
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


Say = Callable[[str], None]


# ----------------------------------------------------------------------------- typed overrides


def fields_of(cls: type) -> Dict[str, Any]:
    """A dataclass's fields and their types."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, str) for f in dataclasses.fields(cls)}


def init_params(cls: type) -> Dict[str, Any]:
    """The keyword arguments of ``cls.__init__`` and their types (a task's options)."""
    hints = typing.get_type_hints(cls.__init__)
    params = inspect.signature(cls.__init__).parameters
    return {n: hints.get(n, str) for n, p in params.items() if n != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def split_overrides(overrides: Optional[Mapping[str, Any]]) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    """``{key: value}`` as (model, task, train) overrides: ``task.key`` and ``train.key`` go to the
    task and the training settings, every other key to the model's config."""
    model, task, train = {}, {}, {}
    for key, value in (overrides or {}).items():
        if key.startswith("task."):
            task[key[5:]] = value
        elif key.startswith("train."):
            train[key[6:]] = value
        else:
            model[key] = value
    return model, task, train


def typed(values: Mapping[str, Any], fields: Dict[str, Any], what: str, base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Check ``{key: value}`` against ``fields`` (a ``str`` value is parsed against the field's
    type); ``field.key`` sets one key of a dict field, starting from ``base[field]`` (e.g. the
    preset's or the run's value)."""
    out: Dict[str, Any] = {}
    for key, value in values.items():
        field, _, sub = key.partition(".")
        if field not in fields:
            close = difflib.get_close_matches(field, list(fields), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UserError(f"unknown {what} option {field!r}{hint}; known: {', '.join(sorted(fields))}")
        if not sub:
            out[key] = parse_value(fields[key], value, f"{what} option {key}") if isinstance(value, str) else value
            continue
        annotation = fields[field]
        if not (annotation is dict or typing.get_origin(annotation) is dict):
            raise UserError(f"{what} option {field!r} is not a dict, so {key!r} has no meaning; use --set {field}=VALUE")
        merged = dict(out.get(field, (base or {}).get(field)) or {})
        merged[sub] = guess_value(value) if isinstance(value, str) else value
        out[field] = merged
    return out


def _canon(value: Any) -> Any:
    """A value as JSON would give it back (tuples as lists), to compare run settings."""
    return json.loads(json.dumps(value, default=str))


def _refuse_contradictions(given: Dict[str, Any], run: Dict[str, Any], out: Path, what: str) -> None:
    for key, value in given.items():
        if key in run and _canon(run[key]) != _canon(value):
            raise UserError(f"{what} {key}={value!r} contradicts the run in {out} ({key}={run[key]!r}); "
                            "drop it to resume, or start a new run with another --out")


# ----------------------------------------------------------------------------- checks


def check_device(device: str) -> None:
    """A device this machine has ("auto", "cpu", "cuda", "cuda:1", "mps"), else a UserError."""
    import torch

    if device == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserError(f"--device {device!r} is not a device name (try cpu, cuda, cuda:0, auto)") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UserError(f"--device {device!r}: this machine has no CUDA device (use --device cpu)")
        if dev.index is not None and dev.index >= count:
            raise UserError(f"--device {device!r}: this machine has {count} CUDA device(s)")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UserError(f"--device {device!r}: MPS is not available here (use --device cpu)")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {device!r}: qkv trains on cpu, cuda or mps")


def _check_out(out: Path) -> None:
    """``out`` can be a run directory: a directory (or creatable) and writable, else a UserError."""
    parent = output_folder(out, f"--out {out}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: {parent} is not writable")


def _refuse_foreign_directory(out: Path) -> None:
    """A new run goes into a new or empty directory, or one that already holds a qkv run (run.json
    or checkpoints); a directory of other files (a data folder, an exported model) is refused
    rather than filled with a run beside them."""
    if not out.is_dir() or (out / RUN_FILE).is_file() or _has_checkpoints(out):
        return
    foreign = sorted(p.name for p in out.iterdir() if p.name != ".lock")
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise UserError(f"--out {out}: holds files that are not a qkv run ({shown}); choose a new or empty directory")


def _has_checkpoints(out: Path) -> bool:
    from .train import CheckpointManager

    return bool(CheckpointManager(out / "checkpoints").checkpoints())


def _refuse_fresh_over_checkpoints(out: Path) -> None:
    if _has_checkpoints(out):
        raise UserError(f"{out} already holds a run with checkpoints; continue it with --resume or choose another --out")


def _train_config(values: Dict[str, Any], out: Path) -> Any:
    from .train import TrainConfig

    try:
        return TrainConfig(**{**values, "out_dir": str(out)})
    except (TypeError, ValueError) as e:
        raise UserError(f"training settings: {e}") from None


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


# ----------------------------------------------------------------------------- settings


@dataclasses.dataclass
class Settings:
    """Everything that determines a run: what ``run.json`` records, and ``init`` (the run or
    checkpoint directory whose weights a new run starts from, which it does not).

    ``model_config`` holds the values given to ``from_config`` (the built model's full config once
    a run is created); ``train`` the ``TrainConfig`` fields but ``out_dir``.
    """

    model: str
    task: str
    preset: Optional[str]
    task_options: Dict[str, Any]
    model_config: Dict[str, Any]
    train: Dict[str, Any]
    init: Optional[str] = None
    # built while resolving (or by the caller: Run.of), handed to Run.create so that the data is
    # read once and a given model is used as it is
    _task: Any = dataclasses.field(default=None, repr=False, compare=False)
    _init_model: Any = dataclasses.field(default=None, repr=False, compare=False)
    _model: Any = dataclasses.field(default=None, repr=False, compare=False)

    def record(self) -> Dict[str, Any]:
        """The settings as ``run.json`` holds them."""
        return {"model": self.model, "task": self.task, "preset": self.preset, "task_options": self.task_options,
                "model_config": self.model_config, "train": self.train}


def _model_hints(task: Any, fields: Dict[str, Any]) -> Dict[str, Any]:
    """Fill config fields the task determines (vocabulary size, special ids, lengths)."""
    hints: Dict[str, Any] = {}
    vocab = getattr(task, "vocab", None)
    if vocab is not None:
        for key in ("vocab_size", "src_vocab_size", "tgt_vocab_size"):
            hints[key] = vocab.size
        for key in ("pad_id", "bos_id", "eos_id"):
            if hasattr(vocab, key):
                hints[key] = getattr(vocab, key)
    for key in ("d_input", "n_classes", "num_labels", "n_features", "max_sentences"):
        if hasattr(task, key):
            hints[key] = getattr(task, key)
    if getattr(task, "kind", None) == "lm" and hasattr(task, "block_size"):
        hints["max_len"] = max(task.block_size, 64)
    if getattr(task, "kind", None) in ("lm", "classification"):
        # a model with several heads (GPT, Reformer, BERT) takes the one the task's kind reads, and its classes
        hints["head"] = task.kind
        if task.kind == "classification" and hasattr(task, "n_classes") and "num_labels" not in hints:
            hints["num_labels"] = task.n_classes
    extra = getattr(task, "model_hints", None)
    if callable(extra):
        hints.update(extra())
    return {k: v for k, v in hints.items() if k in fields}


def _check_splits(model: Any, task: Any, config: Any) -> None:
    """``--context-parallel P``: refused before anything is written when the model cannot run on
    sequence shards, ``P`` does not divide the processes (torchrun's ``WORLD_SIZE``) or the task's
    sequences do not cut into ``P`` shards."""
    P = config.context_parallel
    if P == 1:
        return
    from .train.distributed import refuse_unsplittable

    refuse_unsplittable(model, bool(getattr(task, "stream", False) and model.carries_state))
    world = int(os.environ.get("WORLD_SIZE") or 1)
    if world % P:
        raise UserError(f"--context-parallel {P} must divide the number of processes ({world}): start them with "
                        f"torchrun --nproc_per_node {P} (or a multiple of {P}: data-parallel groups of {P})")
    main = task.get_batch("train", 1, 0).get(model.input_key)
    if main is not None and main.dim() >= 2 and main.shape[1] % P:
        raise UserError(f"--context-parallel {P}: the task's sequences of {main.shape[1]} positions do not cut into "
                        f"{P} equal shards; choose a length that is a multiple of {P} (e.g. --set task.block_size=...)")


def _check_fits(model: Any, task: Any, task_name: str) -> None:
    """A model with learned positions (``config.positional == "learned"``) cannot read sequences
    longer than its ``max_len``: refused here, naming both settings, rather than by the model's
    first forward deep inside training or evaluation."""
    config = getattr(model, "config", None)
    max_len = getattr(config, "max_len", None)
    if not max_len or getattr(config, "positional", None) != "learned":
        return
    batch = task.get_batch("train", 1, 0)
    for key in ("input_ids", "src_ids", "tgt_ids"):
        value = batch.get(key) if isinstance(batch, dict) else None
        if value is not None and value.dim() >= 2 and value.shape[-1] > max_len:
            option = next((k for k in ("max_len", "block_size", "seq_len") if hasattr(task, k)), None)
            shorter = f"--set task.{option}={max_len}" if option else "a shorter length for the task"
            raise UserError(f"task {task_name!r} gives {key} of {value.shape[-1]} positions, beyond the model's "
                            f"max_len={max_len} (learned positions): give the task {shorter} (the only way when "
                            f"--init fixes the positions), or a new model --set max_len={value.shape[-1]}")


def _classes(model: str, task: str) -> Tuple[type, str, type]:
    """The model class, the form of ``task`` it reads (``task_for_model``) and that task's class."""
    import qkv.tasks
    from .registry import lookup

    with user_input():
        model_cls = lookup("model", model)
        task = qkv.tasks.task_for_model(task, model_cls)  # e.g. bbc-news as token ids for BERT
        return model_cls, task, lookup("task", task)


def _check_task_kind(model_cls: type, model: str, task: Any, task_name: str) -> None:
    task_kinds = getattr(model_cls, "task_kinds", None)
    if task_kinds is not None and task.kind not in task_kinds:
        raise UserError(f"model {model!r} trains on {sorted(task_kinds)} tasks; {task_name!r} is a {task.kind!r} task")


def resolve(model: str, task: str, *, preset: Optional[str] = None, overrides: Optional[Mapping[str, Any]] = None,
            init: Optional[str] = None, say: Say = announce) -> Settings:
    """The settings of a new run of ``model`` on ``task`` (registry names), from the layers the
    module docstring lists; builds the task (its data) to learn what it determines.

    ``init``: a run directory or a pretrained checkpoint directory (Hugging Face ``bert``/``gpt2``,
    or a ``save_pretrained`` one) whose architecture and weights the new model starts from (the
    task's head starts fresh). Raises ``UserError`` for anything the layers refuse.
    """
    from .tasks import build_task
    from .train import TrainConfig

    model_cls, task, task_cls = _classes(model, task)
    model_sets, task_sets, train_sets = split_overrides(overrides)
    fields, train_fields = fields_of(model_cls.config_class), fields_of(TrainConfig)
    user_train = typed(train_sets, train_fields, "train")
    user_task = typed(task_sets, init_params(task_cls), f"task {task!r}")
    preset_name = preset or model_cls.default_preset
    with user_input():
        values = model_cls.preset(preset_name) if preset_name else {}
    if init and not preset:  # the architecture is --init's: the default preset gives its training recipe only
        values = {k: v for k, v in values.items() if k in ("train", "task")}
        preset_name = None
    preset_train = values.pop("train", {})
    task_options = {**values.pop("task", {}), **user_task}
    train_values = {**model_cls.train_defaults, **preset_train, **user_train}
    # evaluate (and so checkpoint) ten times per run unless told otherwise: a killed run resumes
    steps = train_values.get("steps", TrainConfig.steps)
    if isinstance(steps, int) and steps > 0:
        train_values.setdefault("eval_every", max(1, steps // 10))
    unknown_train = sorted(set(train_values) - set(train_fields))
    if unknown_train:
        raise UserError(f"model {model!r}: unknown training setting(s) {unknown_train}")
    check_device(_train_config(train_values, Path(".")).device)

    with user_input():
        if init:  # a Hugging Face checkpoint's tokenizer for the task
            from .integrations import pretrained

            task_options = pretrained.task_options(init, task_cls, task_options)
        built = build_task(task, **task_options)
    _check_task_kind(model_cls, model, built, task)
    config_values = {**values, **_model_hints(built, fields)}
    if "attention" in model_sets and "attention" not in fields:
        raise UserError(f"model {model!r} has no attention kernel option")
    config_values.update(typed(model_sets, fields, f"model {model!r}", base=config_values))
    init_model = None
    if init:
        config_values, init_model = _init_config(init, model, model_cls, config_values, typed(model_sets, fields, "model"),
                                                 built, task, say)
    return Settings(model, task, preset_name, task_options, config_values, train_values, init,
                    _task=built, _init_model=init_model)


def _init_config(init: str, model: str, model_cls: Any, values: Dict[str, Any], user: Dict[str, Any], task: Any,
                 task_name: str, say: Say):
    """``init``'s architecture, the new task's head fields (``init_task_fields``), then the user's
    overrides; and ``init``'s model, whose weights the new one starts from. A run whose vocabulary
    is not the new task's is refused: its token embeddings would mean other tokens."""
    from .integrations import pretrained
    from .tasks.vocab import vocab_to_dict

    head = {k: v for k, v in values.items() if k in model_cls.init_task_fields}
    if pretrained.is_checkpoint_dir(init):  # a Hugging Face checkpoint or a save_pretrained directory
        with user_input():
            return pretrained.init_config(init, model_cls, head, user, say=say, task=task)
    source = load(init)
    if source.settings.model != model:
        raise UserError(f"--init {init} holds a {source.settings.model!r} model, not {model!r}")
    theirs, ours = getattr(source.task, "vocab", None), getattr(task, "vocab", None)
    sizes = getattr(theirs, "size", None), getattr(ours, "size", None)
    if theirs is not None and ours is not None and (sizes[0] != sizes[1] or vocab_to_dict(theirs) != vocab_to_dict(ours)):
        raise UserError(f"--init {init}: its vocabulary ({source.settings.task}, {sizes[0]} tokens) is not that of task "
                        f"{task_name!r} ({sizes[1]} tokens); fine-tune on a task with the pre-training vocabulary")
    values = {**source.settings.model_config, **head, **user}
    with user_input():
        pretrained.check_kernel(init, model_cls, values, source.model)
    return values, source.model


def _build_model(model_cls: Any, values: Dict[str, Any], seed: int) -> Any:
    """``model_cls.from_config(values)`` after seeding every generator with ``seed`` (the same seed
    gives the same initial weights); a kernel knob the model needs and nobody gave (e.g. window's
    radius) becomes an error that says how to give it."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    try:
        with user_input():
            return model_cls.from_config(values)
    except UserError as e:
        cause = e.__cause__
        found = re.search(r"(\w+)\.__init__\(\) missing \d+ required (?:keyword-only |positional )?arguments?: (.+)", str(e))
        if not isinstance(cause, TypeError) or not found or "attention_kwargs" not in values:
            raise
        names = re.findall(r"'(\w+)'", found.group(2))
        sets = " ".join(f"--set attention_kwargs.{n}=VALUE" for n in names)
        raise UserError(f"attention {values.get('attention')!r} ({found.group(1)}) needs {', '.join(names)}: add {sets}") from None


# ----------------------------------------------------------------------------- run directories


def _read_run(run: Path) -> Dict[str, Any]:
    path = run / RUN_FILE
    if not path.is_file():
        raise UserError(f"{run} is not a qkv run directory (no {RUN_FILE}); create one with `qkv train MODEL --task TASK --out {run}`")
    try:
        info = json.loads(path.read_text())
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deeply, a 5,000-digit integer
        raise UserError(f"{path} is corrupt: {str(e).splitlines()[0] if str(e) else 'nested too deeply'}") from None
    if not isinstance(info, dict):
        raise UserError(f"{path} is corrupt: expected a JSON object")
    missing = [k for k in _RUN_KEYS if k not in info]
    if missing:
        raise UserError(f"{path} is incomplete: no {', '.join(repr(k) for k in missing)} field")
    return info


def _run_train_settings(run: Path, info: Dict[str, Any]) -> Dict[str, Any]:
    """The training settings a run was started with (run.json, else the trainer's train_config.json)."""
    if isinstance(info.get("train"), dict):
        return dict(info["train"])
    path = run / "train_config.json"
    if path.is_file():
        try:
            values = json.loads(path.read_text())
        except (ValueError, RecursionError) as e:
            raise UserError(f"{path} is corrupt: {str(e).splitlines()[0] if str(e) else 'nested too deeply'}") from None
        if isinstance(values, dict):
            return values
    return {}


def _save_vocab(task: Any, directory: Path) -> None:
    """The task's vocabulary beside the model, so that it decodes without the data."""
    from .tasks.vocab import vocab_to_dict

    data = vocab_to_dict(getattr(task, "vocab", None))
    if data is not None:
        from .train.checkpoint import atomic_write_text

        atomic_write_text(directory / VOCAB_FILE, json.dumps(data, ensure_ascii=False) + "\n")


class Run:
    """A run directory with its settings, task and model.

    Made by ``Run.create`` (a new run), ``Run.open`` (resume one) or ``load`` (a trained one, to
    evaluate or sample; no lock). ``create`` and ``open`` hold the directory's writer lock until
    ``close`` (or the end of a ``with`` block). ``finished`` is True when ``open`` found the run
    already at its step count with its final model: ``train`` then has nothing to do.
    """

    def __init__(self, directory: Path, settings: Settings, task: Any, model: Any, *, config: Any = None,
                 resume: bool = False, finished: bool = False, locks: Optional[contextlib.ExitStack] = None) -> None:
        self.directory = Path(directory)
        self.settings = settings
        self.task = task
        self.model = model
        self.config = config
        self.resume = resume
        self.finished = finished
        self._locks = locks or contextlib.ExitStack()

    # -- lifetime

    def close(self) -> None:
        """Release the directory's writer lock."""
        self._locks.close()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _lock(self) -> None:
        """Take the directory's writer lock for the run's lifetime (rank 0 only: it alone writes)."""
        from .train.lock import RunLock

        if _rank() == 0:
            self._locks.enter_context(RunLock(self.directory))

    @classmethod
    def _guarded(cls, directory: Path, build: Callable[["Run"], None]) -> "Run":
        """A Run whose lock is released when ``build`` (which fills it in) fails."""
        run = cls(directory, None, None, None)  # type: ignore[arg-type]
        try:
            build(run)
        except BaseException:
            run.close()
            raise
        return run

    # -- making one

    @classmethod
    def create(cls, directory: str | os.PathLike, settings: Settings, *, resume: bool = False, say: Say = announce) -> "Run":
        """A new run of ``settings`` (from ``resolve``) in ``directory``: checked (a directory that
        holds checkpoints is refused unless ``resume``, which then continues from them), locked,
        the model built (seeded with the training seed; ``settings.init``'s weights copied in) and
        ``run.json`` written. Nothing is written until every check has passed."""
        out = Path(directory)
        _check_out(out)

        def build(run: "Run") -> None:
            locked = out.is_dir()
            if locked:  # one writer per run directory: locked before anything is read from it
                run._lock()
            if not resume:
                _refuse_fresh_over_checkpoints(out)
            config = _train_config(settings.train, out)
            if resume and _finished_or_corrupt(out, config, say):
                run.finished, run.settings, run.task, run.model = True, settings, settings._task, settings._model
                return
            from .registry import lookup
            from .tasks import build_task

            task = settings._task
            if task is None:
                with user_input():
                    task = build_task(settings.task, **settings.task_options)
            model = settings._model
            if model is None:
                model = _build_model(lookup("model", settings.model), settings.model_config, config.seed)
            if settings._init_model is not None:
                with user_input():  # e.g. a source whose shapes do not fit
                    fresh = model.init_from(settings._init_model)
                print(f"qkv: initialised from {settings.init}; fresh: {', '.join(fresh) or 'nothing'}")
            _check_fits(model, task, settings.task)
            _check_splits(model, task, config)
            run.task, run.model, run.config, run.resume = task, model, config, resume
            run.settings = dataclasses.replace(settings, model_config=dataclasses.asdict(model.config),
                                               train={k: v for k, v in dataclasses.asdict(config).items() if k != "out_dir"})
            out.mkdir(parents=True, exist_ok=True)
            if not locked:  # a new directory: lock it now, and check again that no run got there meanwhile
                run._lock()
                if not resume:
                    _refuse_fresh_over_checkpoints(out)
            run.settings = dataclasses.replace(run.settings, task_options=_keep_tokenizer(out, run.settings.task_options))
            run._write()

        return cls._guarded(out, build)

    @classmethod
    def of(cls, directory: str | os.PathLike, model: Any, task: Any, train: Mapping[str, Any], *,
           task_options: Optional[Mapping[str, Any]] = None, resume: bool = False, say: Say = announce) -> "Run":
        """A new run of a ``model`` and ``task`` the caller built (scripts that assemble them, e.g.
        the reproductions and ``qkv bench lra``), with ``train`` (``TrainConfig`` fields but
        ``out_dir``): checked, locked and recorded as by ``create``, but the model is used as it is
        (not rebuilt, not re-seeded). ``run.json`` names the model's and the task's registry names,
        the model's config and ``task_options`` (what the task was built with, when known)."""
        settings = Settings(model.registry_name, task.registry_name, None, dict(task_options or {}),
                            dataclasses.asdict(model.config), dict(train), _task=task, _model=model)
        return cls.create(directory, settings, resume=resume, say=say)

    @classmethod
    def open(cls, directory: str | os.PathLike, *, overrides: Optional[Mapping[str, Any]] = None,
             model: Optional[str] = None, task: Optional[str] = None, preset: Optional[str] = None,
             say: Say = announce) -> "Run":
        """Resume the run in ``directory`` with its own settings, locked. ``overrides`` (keys as in
        ``resolve``) may change only ``RESUME_MAY_CHANGE`` training settings (each change is
        ``say``-d) or repeat the run's values; ``model``/``task``/``preset``, when given, must be
        the run's. Check ``finished`` before ``train``."""
        from .train import TrainConfig

        out = Path(directory)
        _check_out(out)

        def build(run: "Run") -> None:
            if out.is_dir():
                run._lock()
            previous = _read_run(out)
            model_cls, task_name, task_cls = _classes(previous["model"], previous["task"])
            if model is not None and (previous["model"], previous["task"]) != (model, task):
                raise UserError(f"{out} holds a {previous['model']} run on {previous['task']}, not {model} on {task}")
            preset_name = previous.get("preset")
            if preset is not None and preset != preset_name:
                raise UserError(f"--preset {preset} contradicts the run in {out} (preset {preset_name}); drop it to resume")
            model_sets, task_sets, train_sets = split_overrides(overrides)
            train_fields = fields_of(TrainConfig)
            user_train = typed(train_sets, train_fields, "train")
            user_task = typed(task_sets, init_params(task_cls), f"task {task_name!r}")
            config_values = dict(previous["model_config"])
            user_model = typed(model_sets, fields_of(model_cls.config_class), f"model {previous['model']!r}", base=config_values)
            _refuse_contradictions(user_model, config_values, out, "model option")
            task_options = dict(previous["task_options"])
            _refuse_contradictions(user_task, task_options, out, "task option")
            train_values = _run_train_settings(out, previous)
            train_values.pop("out_dir", None)
            dropped = sorted(set(train_values) - set(train_fields))
            if dropped:  # a run written by an older qkv
                say(f"the run's settings {dropped} are no longer training options; ignored")
                train_values = {k: v for k, v in train_values.items() if k in train_fields}
            fixed = {k: v for k, v in user_train.items() if k not in RESUME_MAY_CHANGE}
            _refuse_contradictions(fixed, train_values, out, "training setting")
            for key, value in user_train.items():
                if key in RESUME_MAY_CHANGE and key in train_values and _canon(train_values[key]) != _canon(value):
                    say(f"resuming with {key}={value!r} (the run had {train_values[key]!r})")
            train_values.update(user_train)
            config = _train_config(train_values, out)
            check_device(config.device)
            if _finished_or_corrupt(out, config, say):
                run.finished = True
                run.settings = Settings(previous["model"], task_name, preset_name, task_options, config_values, train_values)
                return
            from .tasks import build_task

            with user_input():
                built = build_task(task_name, **_task_options_at(out, task_options))
            _check_task_kind(model_cls, previous["model"], built, task_name)
            built_model = _build_model(model_cls, config_values, config.seed)
            _check_fits(built_model, built, task_name)
            _check_splits(built_model, built, config)
            run.task, run.model, run.config, run.resume = built, built_model, config, True
            run.settings = Settings(previous["model"], task_name, preset_name, task_options,
                                    dataclasses.asdict(built_model.config),
                                    {k: v for k, v in dataclasses.asdict(config).items() if k != "out_dir"})
            run._write()

        return cls._guarded(out, build)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Run":
        """A run's task and model for evaluation or sampling (its final ``model/`` if present, else
        its latest intact checkpoint), in eval mode; not locked."""
        from .models import QKVModel
        from .registry import lookup
        from .tasks import build_task
        from .train import CheckpointManager, load_checkpoint

        run = Path(directory)
        info = _read_run(run)
        with user_input():
            task = build_task(info["task"], **_task_options_at(run, info["task_options"]))
            final = run / "model"
            if (final / "config.json").is_file():
                model = QKVModel.from_pretrained(final)
            else:
                latest = CheckpointManager(run / "checkpoints").latest_intact()
                if latest is None:
                    raise UserError(f"{directory} has neither a final model/ nor a checkpoint yet")
                model = lookup("model", info["model"]).from_config(info["model_config"])
                load_checkpoint(latest, model, rank=None)
        model.eval()
        settings = Settings(info["model"], info["task"], info.get("preset"), info["task_options"], info["model_config"],
                            _run_train_settings(run, info))
        return cls(run, settings, task, model)

    def _write(self) -> None:
        with atomic_path(self.directory / RUN_FILE) as tmp:
            tmp.write_text(json.dumps(self.settings.record(), indent=2, default=str) + "\n")

    # -- using one

    def train(self, *, save: bool = True) -> Dict[str, float]:
        """Train (continuing the latest intact checkpoint when the run was opened or created to
        resume), then (``save``) save the final ``model/`` with the task's vocabulary; the
        trainer's last metrics."""
        from .train import Trainer

        if self.config is None:
            raise UserError(f"the run in {self.directory} was loaded to be used, not trained: use Run.open to resume it")
        metrics = Trainer(self.model, self.task, self.config).fit(resume=self.resume)
        if save and _rank() == 0:  # under torchrun only rank 0 writes
            self.model.save_pretrained(self.directory / "model")
            _save_vocab(self.task, self.directory / "model")
        return metrics

    def with_overrides(self, overrides: Optional[Mapping[str, Any]]) -> Tuple[Any, Any]:
        """The run's task and model with evaluation-time options: model options that change how
        it runs, not its weights (e.g. Transformer-XL's ``eval_mem_len``), and ``task.key`` task
        options. Training options are refused."""
        from .tasks import build_task

        task, model = self.task, self.model
        model_sets, task_sets, train_sets = split_overrides(overrides)
        if train_sets:
            raise UserError(f"qkv eval takes no training options, got {sorted(train_sets)}")
        if task_sets:
            options = {**_task_options_at(self.directory, self.settings.task_options),
                       **typed(task_sets, init_params(type(task)), f"task {self.settings.task!r}")}
            with user_input():
                task = build_task(self.settings.task, **options)
            _check_fits(model, task, self.settings.task)
        if model_sets:
            values = {**dataclasses.asdict(model.config),
                      **typed(model_sets, fields_of(type(model.config)), f"model {self.settings.model!r}")}
            with user_input():
                rebuilt = type(model).from_config(values)
            try:
                rebuilt.load_state_dict(model.state_dict())
            except RuntimeError as e:
                raise UserError(f"--set {sorted(model_sets)} changes the model's weights; eval can only change how it runs: {e}") from None
            model = rebuilt.eval()
        return task, model

    def evaluate(self, split: str = "test", *, max_examples: Optional[int] = None,
                 overrides: Optional[Mapping[str, Any]] = None, progress: bool = False) -> Dict[str, float]:
        """The task's metrics on ``split`` (at most ``max_examples``) plus what the model itself
        reports (``eval_report``, e.g. learned spans); ``overrides`` as in ``with_overrides``."""
        task, model = self.with_overrides(overrides)
        model.eval()
        with forward_progress(model, f"evaluating on {split}", disable=not progress):
            metrics = task.evaluate(model, split, max_examples=max_examples)
        metrics.update(model.eval_report())
        return metrics


def _finished_or_corrupt(out: Path, config: Any, say: Say) -> bool:
    """Resume checks: refuse when every checkpoint is corrupt; True (and say so) when the run is
    already at ``config.steps`` with its final model."""
    from .train import CheckpointManager, read_checkpoint_meta

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


def start(model: str, task: str, directory: Optional[str | os.PathLike] = None, *, preset: Optional[str] = None,
          overrides: Optional[Mapping[str, Any]] = None, init: Optional[str] = None, resume: bool = False,
          say: Say = announce) -> Run:
    """What ``qkv train`` does: ``resume`` and a run in ``directory`` (default ``runs/MODEL-TASK``)
    → ``Run.open``; else ``resolve`` + ``Run.create`` (with ``resume``, a directory that holds
    checkpoints but no run.json continues from them)."""
    if init and resume:
        raise UserError("--init starts a new run from another run's weights; it cannot be combined with --resume")
    _, task_name, _ = _classes(model, task)
    out = Path(directory or f"runs/{model}-{task_name}")
    _check_out(out)
    if resume and (out / RUN_FILE).is_file():
        return Run.open(out, overrides=overrides, model=model, task=task_name, preset=preset, say=say)
    if resume and not _has_checkpoints(out):
        say(f"--resume: {out} holds no run yet; starting a new one")
    _refuse_foreign_directory(out)  # the user's --out (scripts that keep files of their own use Run.of)
    return Run.create(out, resolve(model, task_name, preset=preset, overrides=overrides, init=init, say=say),
                      resume=resume, say=say)


def load(directory: str | os.PathLike) -> Run:
    """A trained run, to evaluate or sample from (``Run.load``)."""
    return Run.load(directory)


@contextlib.contextmanager
def forward_progress(model: Any, description: str, total: Optional[int] = None, unit: str = "batch",
                     disable: bool = False) -> Iterator[Any]:
    """A progress bar on stderr (when it is a terminal) that advances on each forward call of
    ``model`` (evaluation, generation)."""
    from tqdm.auto import tqdm

    progress = tqdm(total=total, desc=description, unit=unit, leave=False, dynamic_ncols=True,
                    disable=disable or not sys.stderr.isatty())
    handle = model.register_forward_hook(lambda *_: progress.update(1))
    try:
        yield progress
    finally:
        handle.remove()
        progress.close()
