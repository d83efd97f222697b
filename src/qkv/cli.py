"""The ``qkv`` command: list, data, train, eval, generate, translate, viz, bench.

A run directory (``--out``) holds ``run.json`` (model, task, preset, their options and the training
settings), the trainer's ``train_config.json``, ``metrics.jsonl`` and ``checkpoints/``, the final
``model/`` (``save_pretrained`` + the task's ``vocab.json``) and ``attention.png`` from ``qkv viz``.

Options come from the dataclasses: every ``TrainConfig`` field is a flag (``--batch-size``);
model-config fields, task options and training fields can all be set with
``--set key=value`` / ``--set task.key=value`` / ``--set train.key=value``, parsed and
type-checked against the field's annotation; ``--set attention_kwargs.radius=8`` sets one key of a
dict field.

Where a value comes from, lowest first: the config's defaults, the model's preset (``--preset``,
else its ``default_preset``, a CPU-sized one) and ``train_defaults``, what the task determines
(vocabulary size, special ids, ``model_hints``), then the command line. ``--resume`` takes the
run's own settings instead; a flag that contradicts them is refused, except those that do not
change the trajectory (``RESUME_MAY_CHANGE``: ``--steps`` to extend a run, evaluation, saving,
logging, device), which are announced.

Layout, for adding to it: each command is a ``_cmd_NAME(args) -> int`` function and a block in
``build_parser``; user errors raise ``CLIError`` (one line on stderr, exit status 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import typing
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["main", "parse_value", "build_parser", "CLIError", "RESUME_MAY_CHANGE"]

RUN_FILE = "run.json"
VOCAB_FILE = "vocab.json"
#: training settings a resumed run may change (they do not alter the updates it computes)
RESUME_MAY_CHANGE = frozenset({"steps", "eval_every", "eval_batches", "eval_max_examples", "save_every", "keep_last",
                               "log_every", "device", "progress", "tensorboard"})


class CLIError(ValueError):
    """A user error on the command line (printed without a traceback)."""


# ----------------------------------------------------------------------------- typed values


def parse_value(annotation: Any, text: str, name: str) -> Any:
    """Parse ``text`` as a value of type ``annotation`` (int, float, bool, str, Optional[...],
    Tuple[...], Literal[...], dict/list as JSON); raise ``CLIError`` naming ``name`` otherwise."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union:
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return parse_value(arg, text, name)
            except CLIError as e:
                errors.append(str(e))
        raise CLIError(errors[0] if errors else f"{name}: cannot parse {text!r}")
    if origin is typing.Literal:
        for arg in args:
            if str(arg) == text:
                return arg
        raise CLIError(f"{name} must be one of {list(args)}, got {text!r}")
    if annotation is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise CLIError(f"{name} must be a bool (true/false), got {text!r}")
    if annotation is int:
        try:
            return int(text)
        except ValueError:
            raise CLIError(f"{name} must be an int, got {text!r}") from None
    if annotation is float:
        try:
            value = float(text)
        except ValueError:
            raise CLIError(f"{name} must be a float, got {text!r}") from None
        if not math.isfinite(value):
            raise CLIError(f"{name} must be a finite float, got {text!r}")
        return value
    if annotation is str:
        return text
    if origin in (tuple, list) or annotation in (tuple, list):
        items = _json_or_none(text)
        if not isinstance(items, list):
            items = [t for t in text.split(",") if t != ""]
        if args and args[-1] is not Ellipsis and len(args) != len(items):
            raise CLIError(f"{name} needs {len(args)} comma-separated values, got {text!r}")
        types = [args[0]] * len(items) if args and args[-1] is Ellipsis else list(args) or [str] * len(items)
        values = [v if not isinstance(v, str) else parse_value(t, v, name) for t, v in zip(types, items)]
        return tuple(values) if origin is tuple or annotation is tuple else values
    if origin is dict or annotation is dict:
        value = _json_or_none(text)
        if not isinstance(value, dict):
            raise CLIError(f"{name} must be a JSON object, e.g. '{{\"key\": 1}}', got {text!r}")
        return value
    value = _json_or_none(text)
    return text if value is None else value


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _fields(cls: type) -> Dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, str) for f in dataclasses.fields(cls)}


def _init_params(cls: type) -> Dict[str, Any]:
    import inspect

    hints = typing.get_type_hints(cls.__init__)
    params = inspect.signature(cls.__init__).parameters
    return {n: hints.get(n, str) for n, p in params.items() if n != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def _split_sets(pairs: Sequence[str]) -> Tuple[Dict[str, str], Dict[str, str], Dict[str, str]]:
    model, task, train = {}, {}, {}
    for pair in pairs:
        if "=" not in pair:
            raise CLIError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        if key.startswith("task."):
            task[key[5:]] = value
        elif key.startswith("train."):
            train[key[6:]] = value
        else:
            model[key] = value
    return model, task, train


def _typed(values: Dict[str, str], fields: Dict[str, Any], what: str, base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Parse ``{key: text}`` against ``fields``; ``field.key=value`` sets one key of a dict field
    (starting from ``base[field]``, e.g. the preset's or the run's value)."""
    out: Dict[str, Any] = {}
    for key, text in values.items():
        field, _, sub = key.partition(".")
        if field not in fields:
            import difflib

            close = difflib.get_close_matches(field, list(fields), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise CLIError(f"unknown {what} option {field!r}{hint}; known: {', '.join(sorted(fields))}")
        if not sub:
            out[key] = parse_value(fields[key], text, f"{what} option {key}")
            continue
        annotation = fields[field]
        if not (annotation is dict or typing.get_origin(annotation) is dict):
            raise CLIError(f"{what} option {field!r} is not a dict, so {key!r} has no meaning; use --set {field}=VALUE")
        current = out.get(field, (base or {}).get(field))
        merged = dict(current or {})
        value = _json_or_none(text)
        merged[sub] = text if value is None else value
        out[field] = merged
    return out


def _positive_int(text: str) -> int:
    value = parse_value(int, text, "value")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = parse_value(float, text, "value")
    except CLIError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a float >= 0, got {text!r}")
    return value


# ----------------------------------------------------------------------------- machine


def physical_cores() -> int:
    """Physical CPU cores (distinct (package, core) pairs of /proc/cpuinfo), else ``os.cpu_count()``."""
    try:
        cores, package = set(), "0"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "physical id":
                package = value.strip()
            elif key == "core id":
                cores.add((package, value.strip()))
        if cores:
            return min(len(cores), os.cpu_count() or len(cores))
    except OSError:
        pass
    return os.cpu_count() or 1


def default_threads(cores: int, load: float) -> int:
    """torch threads when ``--threads`` is not given: the ``cores`` that other work leaves free by
    the 1-minute ``load`` average (rounded), at least 1.

    torch's intra-op threads meet at the end of every operation, so one thread that another
    process keeps off its core stalls the others: on the shared 2-core machine of issue 20 (load
    about 7) an update of the main job took 2-5 s with 2 threads and 0.40 s with 1. An idle machine
    keeps every physical core.
    """
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    busy = math.floor(max(load, 0.0) + 0.5)  # cores' worth of other runnable work
    return max(1, min(cores, cores - busy))


def _set_threads(threads: Optional[int], warn_load: bool = False) -> int:
    """Set torch's threads: ``threads`` when given, else ``default_threads`` of this machine
    (``warn_load``: say so when the load leaves fewer threads than cores)."""
    import torch

    n = threads
    if n is None:
        cores, load = physical_cores(), _load_average()
        n = default_threads(cores, load)
        if warn_load and n < cores:
            _announce(f"the load average is {load:.1f} on {cores} cores: training with {n} thread(s), "
                      "which a busy machine runs faster (--threads N to choose)")
    torch.set_num_threads(n)
    return n


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0


def _add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=_positive_int, default=None,
                        help="CPU threads for torch (default: the physical cores that the load average leaves free, "
                             "at least 1)")


def _check_device(device: str) -> None:
    """A device this machine has ("auto", "cpu", "cuda", "cuda:1", "mps"), else a CLIError."""
    import torch

    if device == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise CLIError(f"--device {device!r} is not a device name (try cpu, cuda, cuda:0, auto)") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise CLIError(f"--device {device!r}: this machine has no CUDA device (use --device cpu)")
        if dev.index is not None and dev.index >= count:
            raise CLIError(f"--device {device!r}: this machine has {count} CUDA device(s)")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise CLIError(f"--device {device!r}: MPS is not available here (use --device cpu)")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise CLIError(f"--device {device!r}: qkv trains on cpu, cuda or mps")


def _check_out(out: Path) -> None:
    """``out`` can be a run directory: a directory (or creatable) and writable, else a CLIError."""
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out}: exists and is not a directory")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise CLIError(f"--out {out}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"--out {out}: {parent} is not writable")


# ----------------------------------------------------------------------------- runs


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
    extra = getattr(task, "model_hints", None)
    if callable(extra):
        hints.update(extra())
    return {k: v for k, v in hints.items() if k in fields}


_RUN_KEYS = ("model", "task", "task_options", "model_config")


def _load_run(run: str) -> Dict[str, Any]:
    path = Path(run) / RUN_FILE
    if not path.is_file():
        raise CLIError(f"{run} is not a qkv run directory (no {RUN_FILE}); create one with `qkv train MODEL --task TASK --out {run}`")
    try:
        info = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CLIError(f"{path} is corrupt: {e}") from None
    if not isinstance(info, dict):
        raise CLIError(f"{path} is corrupt: expected a JSON object")
    missing = [k for k in _RUN_KEYS if k not in info]
    if missing:
        raise CLIError(f"{path} is incomplete: no {', '.join(repr(k) for k in missing)} field")
    return info


def _run_train_settings(run: Path, info: Dict[str, Any]) -> Dict[str, Any]:
    """The training settings a run was started with (run.json, else the trainer's train_config.json)."""
    if isinstance(info.get("train"), dict):
        return dict(info["train"])
    path = run / "train_config.json"
    if path.is_file():
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise CLIError(f"{path} is corrupt: {e}") from None
        if isinstance(values, dict):
            return values
    return {}


def _restore(run: str) -> Tuple[Any, Any, Dict[str, Any]]:
    """The run's task and model (final ``model/`` if present, else the latest intact checkpoint)."""
    from qkv.models import QKVModel
    from qkv.registry import lookup
    from qkv.tasks import build_task
    from qkv.train import CheckpointManager, load_checkpoint

    info = _load_run(run)
    task = build_task(info["task"], **info["task_options"])
    final = Path(run) / "model"
    if (final / "config.json").is_file():
        model = QKVModel.from_pretrained(final)
    else:
        latest = CheckpointManager(Path(run) / "checkpoints").latest_intact()
        if latest is None:
            raise CLIError(f"{run} has neither a final model/ nor a checkpoint yet")
        model = lookup("model", info["model"]).from_config(info["model_config"])
        load_checkpoint(latest, model, rank=None)
    model.eval()
    return task, model, info


def _init_config(args: argparse.Namespace, model_cls: Any, values: Dict[str, Any], user: Dict[str, Any]):
    """``--init RUN``: RUN's architecture, the new task's head fields (``init_task_fields``), then
    the user's ``--set``; and RUN's model, whose weights the new one starts from."""
    if args.resume:
        raise CLIError("--init starts a new run from another run's weights; it cannot be combined with --resume")
    from qkv.integrations import pretrained

    if pretrained.is_checkpoint_dir(args.init):  # a Hugging Face checkpoint or a save_pretrained directory
        head = {k: v for k, v in values.items() if k in model_cls.init_task_fields}
        return pretrained.init_config(args.init, model_cls, head, user, say=_announce)
    _, source, info = _restore(args.init)
    if info["model"] != args.model:
        raise CLIError(f"--init {args.init} holds a {info['model']!r} model, not {args.model!r}")
    head = {k: v for k, v in values.items() if k in model_cls.init_task_fields}
    return {**info["model_config"], **head, **user}, source


def _build_model(model_cls: Any, values: Dict[str, Any]) -> Any:
    """``model_cls.from_config(values)``; a kernel knob the model needs and nobody gave (e.g.
    window's radius) becomes an error that says how to give it."""
    import re

    try:
        return model_cls.from_config(values)
    except TypeError as e:
        found = re.search(r"(\w+)\.__init__\(\) missing \d+ required (?:keyword-only |positional )?arguments?: (.+)", str(e))
        if not found or "attention_kwargs" not in values:
            raise
        names = re.findall(r"'(\w+)'", found.group(2))
        sets = " ".join(f"--set attention_kwargs.{n}=VALUE" for n in names)
        raise CLIError(f"attention {values.get('attention')!r} ({found.group(1)}) needs {', '.join(names)}: add {sets}") from None


def _announce(message: str) -> None:
    print(f"qkv: {message}", file=sys.stderr)


def _cmd_train(args: argparse.Namespace) -> int:
    import contextlib

    with contextlib.ExitStack() as held:  # the run directory's writer lock, once taken
        return _train(args, held)


def _lock_run(out: Path, held: Any) -> bool:
    """Take ``out``'s writer lock for the rest of the command (rank 0 only: it alone writes)."""
    from qkv.train.lock import RunLock

    if int(os.environ.get("RANK", "0")) == 0:
        held.enter_context(RunLock(out))
    return True


def _train(args: argparse.Namespace, held: Any) -> int:
    import random

    import numpy as np
    import torch

    import qkv.tasks  # noqa: F401  (registers tasks)
    from qkv.registry import lookup
    from qkv.tasks import build_task
    from qkv.train import CheckpointManager, TrainConfig, Trainer, read_checkpoint_meta

    # ---- every check first: nothing in the run directory changes until all have passed
    model_cls = lookup("model", args.model)
    args.task = qkv.tasks.task_for_model(args.task, model_cls)  # e.g. bbc-news as token ids for BERT
    task_cls = lookup("task", args.task)
    out = Path(args.out or f"runs/{args.model}-{args.task}")
    _check_out(out)
    # one writer per run directory: an existing one is locked before anything is read from it
    locked = out.is_dir() and _lock_run(out, held)
    model_sets, task_sets, train_sets = _split_sets(args.set or [])
    fields = _fields(model_cls.config_class)
    train_fields = _fields(TrainConfig)
    user_train = {k: getattr(args, k) for k in train_fields if getattr(args, k, None) is not None}
    user_train.update(_typed(train_sets, train_fields, "train"))
    user_task = _typed(task_sets, _init_params(task_cls), f"task {args.task!r}")

    if args.init and args.resume:
        raise CLIError("--init starts a new run from another run's weights; it cannot be combined with --resume")
    previous = _load_run(str(out)) if args.resume and (out / RUN_FILE).is_file() else None
    if args.resume and previous is None and not CheckpointManager(out / "checkpoints").checkpoints():
        _announce(f"--resume: {out} holds no run yet; starting a new one")
    if previous is not None:
        if (previous["model"], previous["task"]) != (args.model, args.task):
            raise CLIError(f"{out} holds a {previous['model']} run on {previous['task']}, not {args.model} on {args.task}")
        preset_name = previous.get("preset")
        if args.preset is not None and args.preset != preset_name:
            raise CLIError(f"--preset {args.preset} contradicts the run in {out} (preset {preset_name}); drop it to resume")
        config_values = dict(previous["model_config"])
        user_model = _typed(model_sets, fields, f"model {args.model!r}", base=config_values)
        if args.attention is not None:
            user_model["attention"] = args.attention
        _refuse_contradictions(user_model, config_values, out, "model option")
        task_options = dict(previous["task_options"])
        _refuse_contradictions(user_task, task_options, out, "task option")
        train_values = _run_train_settings(out, previous)
        train_values.pop("out_dir", None)
        dropped = sorted(set(train_values) - set(train_fields))
        if dropped:  # a run written by an older qkv
            _announce(f"the run's settings {dropped} are no longer training options; ignored")
            train_values = {k: v for k, v in train_values.items() if k in train_fields}
        fixed = {k: v for k, v in user_train.items() if k not in RESUME_MAY_CHANGE}
        _refuse_contradictions(fixed, train_values, out, "training setting")
        for key, value in user_train.items():
            if key in RESUME_MAY_CHANGE and key in train_values and _canon(train_values[key]) != _canon(value):
                _announce(f"resuming with {key}={value!r} (the run had {train_values[key]!r})")
        train_values.update(user_train)
    else:
        preset_name = args.preset or model_cls.default_preset
        preset = model_cls.preset(preset_name) if preset_name else {}
        preset_train = preset.pop("train", {})
        task_options = {**preset.pop("task", {}), **user_task}
        train_values = {**getattr(model_cls, "train_defaults", {}), **preset_train, **user_train}
        # evaluate (and so checkpoint) ten times per run unless told otherwise: a killed run resumes
        steps = train_values.get("steps", TrainConfig.steps)
        if isinstance(steps, int) and steps > 0:
            train_values.setdefault("eval_every", max(1, steps // 10))
    unknown_train = sorted(set(train_values) - set(train_fields))
    if unknown_train:
        raise CLIError(f"{out}: unknown training setting(s) {unknown_train}")
    train_values["out_dir"] = str(out)
    try:
        config = TrainConfig(**train_values)
    except (TypeError, ValueError) as e:
        raise CLIError(f"training settings: {e}") from None
    _check_device(config.device)
    if not args.resume and CheckpointManager(out / "checkpoints").checkpoints():
        raise CLIError(f"{out} already holds a run with checkpoints; continue it with --resume or choose another --out")
    if args.resume:
        manager = CheckpointManager(out / "checkpoints")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # each corrupt checkpoint warns; one error says it below
            intact = manager.latest_intact()
        if manager.checkpoints() and intact is None:
            raise CLIError(f"--resume: every checkpoint in {out / 'checkpoints'} is corrupt (checksum or header); "
                           "nothing to resume from — remove them to start over")
        done = read_checkpoint_meta(intact)["step"] if intact is not None else 0
        if done >= config.steps and (out / "model" / "config.json").is_file():
            _announce(f"--resume: the run in {out} is finished at step {done} (--steps {config.steps}); "
                      f"nothing to do — extend it with --resume --steps N, N > {done}")
            return 0

    if args.init:  # a Hugging Face checkpoint's tokenizer for the task
        from qkv.integrations import pretrained

        task_options = pretrained.task_options(args.init, task_cls, task_options)
    task = build_task(args.task, **task_options)
    task_kinds = getattr(model_cls, "task_kinds", None)
    if task_kinds is not None and task.kind not in task_kinds:
        raise CLIError(f"model {args.model!r} trains on {sorted(task_kinds)} tasks; {args.task!r} is a {task.kind!r} task")
    if previous is None:
        config_values = {**preset, **_model_hints(task, fields)}
        if args.attention is not None:
            if "attention" not in fields:
                raise CLIError(f"model {args.model!r} has no attention kernel option")
            config_values["attention"] = args.attention
        config_values.update(_typed(model_sets, fields, f"model {args.model!r}", base=config_values))
        if args.init:
            config_values, init_model = _init_config(args, model_cls, config_values, _typed(model_sets, fields, "model"))

    threads = _set_threads(args.threads, warn_load=True)
    # the same seed gives the same initial weights (and, through the trainer, the same batches)
    random.seed(config.seed)
    np.random.seed(config.seed % 2**32)
    torch.manual_seed(config.seed)
    model = _build_model(model_cls, config_values)
    if args.init:
        fresh = model.init_from(init_model)
        print(f"qkv: initialised from {args.init}; fresh: {', '.join(fresh) or 'nothing'}")

    # ---- all checks passed: write
    out.mkdir(parents=True, exist_ok=True)
    if not locked:  # a new directory: lock it now, and check again that no run got there meanwhile
        locked = _lock_run(out, held)
        if not args.resume and CheckpointManager(out / "checkpoints").checkpoints():
            raise CLIError(f"{out} already holds a run with checkpoints; continue it with --resume or choose another --out")
    train_record = {k: v for k, v in dataclasses.asdict(config).items() if k != "out_dir"}
    info = {"model": args.model, "task": args.task, "preset": preset_name, "task_options": task_options,
            "model_config": dataclasses.asdict(model.config), "train": train_record}
    from qkv._io import atomic_path

    with atomic_path(out / RUN_FILE) as tmp:
        tmp.write_text(json.dumps(info, indent=2, default=str) + "\n")
    n_params = sum(p.numel() for p in model.parameters())
    preset_note = f", preset {preset_name}" if preset_name else ""
    print(f"qkv: training {args.model} ({parameter_count(n_params)}{preset_note}) on {args.task} -> {out} "
          f"[{config.steps} steps, batch {config.batch_size}, {threads} thread(s)]", flush=True)
    trainer = Trainer(model, task, config)
    metrics = trainer.fit(resume=args.resume)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun only rank 0 writes
        model.save_pretrained(out / "model")
        _save_vocab(task, out / "model")
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
    return 0


def _canon(value: Any) -> Any:
    """A value as JSON would give it back (tuples as lists), to compare run settings."""
    return json.loads(json.dumps(value, default=str))


def _refuse_contradictions(given: Dict[str, Any], run: Dict[str, Any], out: Path, what: str) -> None:
    for key, value in given.items():
        if key in run and _canon(run[key]) != _canon(value):
            raise CLIError(f"{what} {key}={value!r} contradicts the run in {out} ({key}={run[key]!r}); "
                           "drop it to resume, or start a new run with another --out")


def _save_vocab(task: Any, directory: Path) -> None:
    """The task's vocabulary beside the model, so that it decodes without the data."""
    from qkv.tasks.vocab import vocab_to_dict

    data = vocab_to_dict(getattr(task, "vocab", None))
    if data is not None:
        from qkv.train.checkpoint import atomic_write_text

        atomic_write_text(directory / VOCAB_FILE, json.dumps(data, ensure_ascii=False) + "\n")


def _with_progress(model: Any, description: str, total: Optional[int] = None, unit: str = "batch"):
    """A progress bar that advances on each forward call of ``model`` (evaluation, generation)."""
    import contextlib

    from tqdm.auto import tqdm

    @contextlib.contextmanager
    def bar():
        progress = tqdm(total=total, desc=description, unit=unit, leave=False, dynamic_ncols=True,
                        disable=not sys.stderr.isatty())
        handle = model.register_forward_hook(lambda *_: progress.update(1))
        try:
            yield progress
        finally:
            handle.remove()
            progress.close()

    return bar()


def _eval_overrides(task: Any, model: Any, info: Dict[str, Any], pairs: Sequence[str]) -> Tuple[Any, Any]:
    """``qkv eval --set``: evaluation-time model options (e.g. Transformer-XL's ``eval_mem_len``)
    and task options (``task.key=value``) on a trained run; the weights must still fit."""
    from qkv.tasks import build_task

    model_sets, task_sets, train_sets = _split_sets(pairs)
    if train_sets:
        raise CLIError(f"qkv eval takes no training options, got {sorted(train_sets)}")
    if task_sets:
        options = {**info.get("task_options", {}), **_typed(task_sets, _init_params(type(task)), f"task {info['task']!r}")}
        task = build_task(info["task"], **options)
    if model_sets:
        values = {**dataclasses.asdict(model.config), **_typed(model_sets, _fields(type(model.config)), f"model {info['model']!r}")}
        rebuilt = type(model).from_config(values)
        try:
            rebuilt.load_state_dict(model.state_dict())
        except RuntimeError as e:
            raise CLIError(f"--set {sorted(model_sets)} changes the model's weights; eval can only change how it runs: {e}") from None
        model = rebuilt.eval()
    return task, model


def _cmd_eval(args: argparse.Namespace) -> int:
    import qkv.tasks  # noqa: F401

    _set_threads(args.threads)
    task, model, info = _restore(args.run)
    task, model = _eval_overrides(task, model, info, args.set or [])
    with _with_progress(model, f"evaluating on {args.split}"):
        metrics = task.evaluate(model, args.split, max_examples=args.max_examples)
    metrics.update(model.eval_report())  # what the model itself reports (e.g. learned spans)
    print(json.dumps({k: round(float(v), 4) for k, v in metrics.items()}))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    import qkv.tasks  # noqa: F401

    _set_threads(args.threads)
    task, model, info = _restore(args.run)
    options = _split_sets(args.set or [])[0]  # key=value strings; the task parses them
    written = task.write_samples(model, Path(args.out or Path(args.run) / "samples.png"), n=args.n, seed=args.seed,
                                 options=options)  # tasks whose samples are pictures draw them (images)
    if written is not None:
        print(written)
        return 0
    if task.kind != "lm":
        hint = " (try `qkv translate`)" if task.kind == "seq2seq" else ""
        raise CLIError(f"`qkv generate` samples from language models; {info['task']} is a {task.kind} task{hint}")
    if not model.can_generate():
        raise CLIError(f"a {info['model']} model cannot generate text (it has no generate method); "
                       "`qkv eval` and `qkv viz` work on this run")
    ids = task.vocab.encode(args.prompt) if args.prompt else [task.vocab.bos_id if hasattr(task.vocab, "bos_id") else 0]
    if not ids:
        raise CLIError("--prompt encodes to no tokens")
    gen = torch.Generator().manual_seed(args.seed)
    with _with_progress(model, "generating", total=args.max_new_tokens, unit="token"):
        out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, generator=gen)
    print(task.vocab.decode(out[0].tolist()))
    return 0


def _cmd_translate(args: argparse.Namespace) -> int:
    import qkv.tasks  # noqa: F401

    _set_threads(args.threads)
    task, model, info = _restore(args.run)
    if task.kind != "seq2seq":
        raise CLIError(f"`qkv translate` needs a sequence-to-sequence run; {info['task']} is a {task.kind} task")
    batch = task.collate([(text, "") for text in args.text])
    # an output that has not ended by the task's longest target (+ its <eos>) never will
    max_new = args.max_new_tokens or task.max_target_len + 1
    with _with_progress(model, "translating"):
        out = model.generate(batch["src_ids"], src_mask=batch["src_mask"], max_new_tokens=max_new, beam_size=args.beam)
    for text, row in zip(args.text, out.tolist()):
        print(f"{text}\t{task.decode_generated(row)}")
    return 0


def parameter_count(n: int) -> str:
    """``n`` parameters as a reader takes them in: every digit below a million ("12,345
    parameters"), three significant digits above ("1.23 M parameters", "1.5 B parameters")."""
    if n < 1_000_000:
        return f"{n:,} parameter{'' if n == 1 else 's'}"
    if n < 1_000_000_000:
        return f"{n / 1e6:.3g} M parameters"
    return f"{n / 1e9:,.3g} B parameters"


def _say_cut(view: Any) -> None:
    """One line when ``--text`` was longer than ``--max-len`` and only its start is shown."""
    if getattr(view, "cut", None):
        kept, given = view.cut
        print(f"text cut to {kept} tokens; pass --max-len {given}")


def _cmd_viz(args: argparse.Namespace) -> int:
    import qkv.tasks  # noqa: F401
    from qkv import viz

    _set_threads(args.threads)
    if args.pattern:  # a kernel's connectivity, no run needed
        path = Path(args.out or f"pattern-{args.pattern}-{args.length}.png")
        from qkv.bench.complexity import parse_kernel_kwargs

        knobs = parse_kernel_kwargs([f"{args.pattern}:{spec}" for spec in args.kernel_kwargs]).get(args.pattern, {})
        print(f"wrote {viz.plot_kernel_pattern(args.pattern, args.length, path, causal=args.causal, overrides=knobs)}")
        return 0
    if args.run is None:
        raise CLIError("qkv viz needs a RUN directory, or --pattern NAME --length N")
    task, model, info = _restore(args.run)
    if args.compare and not args.html:
        raise CLIError("--compare adds models to the --html page: give --html OUT.html too")
    if args.html:
        from qkv.viz_html import write_html

        views = [(Path(args.run).name or args.run, viz.attention_view(task, model, args.text, args.max_len))]
        _say_cut(views[0][1])
        for other in args.compare or []:
            _, other_model, other_info = _restore(other)
            if other_info.get("task") != info.get("task"):
                raise CLIError(f"--compare {other}: trained on {other_info.get('task')!r}, not {info.get('task')!r} "
                               "(the page compares models of the same task on the same input)")
            views.append((Path(other).name or other, viz.attention_view(task, other_model, args.text, args.max_len)))
        written = write_html(args.html, views, title=f"qkv attention: {info.get('task')}")
        print(f"wrote {written}")
        return 0
    path = Path(args.out or Path(args.run) / "attention.png")
    # tasks whose inputs are not token strings (images, sets, graphs) may draw their own picture
    written = task.visualize(model, path, text=args.text)
    if written is not None:
        print(f"wrote {written}")
        return 0
    view = viz.attention_view(task, model, args.text, args.max_len)
    _say_cut(view)
    if view.caption:
        print(view.caption)
    view.plot(path, max_panels=args.max_panels)
    if len(view.panels) > args.max_panels:
        print(f"showing {args.max_panels} of {len(view.panels)} panels (cross-attention first); --max-panels to see more")
    print(f"wrote {path}")
    own = model.visualize(path.with_name(path.stem + "-model.png"))  # a model's own picture (e.g. learned spans)
    if own is not None:
        print(f"wrote {own}")
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from qkv.tasks import DATASETS, fetch
    from qkv.tasks.data import cache_root

    if args.action == "list":
        print(f"data sets (cache: {cache_root(args.cache_dir)}):")
        for name, ds in DATASETS.items():
            cached = _data_cached(name, args.cache_dir)
            mark = {True: "cached ", False: "missing", None: "?      "}[cached]
            print(f"  {name:<14} {mark}  {ds['description']}  [{ds['licence']}; {ds['package']}]")
        return 0
    unknown = [n for n in args.names if n not in DATASETS]
    if unknown:
        raise CLIError(f"unknown data set(s) {unknown}; known: {', '.join(DATASETS)}")
    from tqdm.auto import tqdm

    names = args.names or list(DATASETS)
    with tqdm(names, desc="data", unit="set", disable=not sys.stderr.isatty(), leave=False) as bar:
        for name in bar:
            bar.set_postfix_str(name)
            folder = fetch([name], cache_dir=args.cache_dir, force=args.force)[name]
            tqdm.write(f"  {name:<14} {folder}")
    return 0


def _data_cached(name: str, cache_dir: Optional[str]) -> Optional[bool]:
    """Whether data set ``name`` is in the cache (None when that cannot be told without fetching)."""
    from qkv.tasks import data

    try:
        return data.is_cached(name, cache_dir)
    except (KeyError, ValueError):
        folder = data.cache_root(cache_dir) / name
        return folder.is_dir() and any(folder.iterdir())


def _task_kind(cls: type) -> str:
    return cls.kind or "?"


def _cmd_list(args: argparse.Namespace) -> int:
    import qkv
    import qkv.tasks  # noqa: F401
    from qkv.registry import describe, lookup, names

    sections = {"attention": "attention kernels", "model": "models", "task": "tasks"}
    tasks = {name: lookup("task", name) for name in names("task")}
    for kind, title in sections.items():
        if args.what not in (None, kind):
            continue
        try:
            listed = names(kind)
        except ValueError:
            listed = []
        print(f"{title}:")
        for name in listed:
            cls = lookup(kind, name)
            print(f"  {name:<22} {describe(cls)}")
            if kind == "model":
                suggested = [t for t in cls.suggested_tasks if t in tasks]
                kinds = sorted(cls.task_kinds or {_task_kind(tasks[t]) for t in suggested})
                presets = sorted(cls.presets)
                line = f"task kinds: {', '.join(kinds) or 'any'}; tasks: {', '.join(suggested) or '-'}"
                if presets:
                    line += f"; presets: {', '.join(presets)}"
                print(f"  {'':<22}   {line}")
            elif kind == "task":
                print(f"  {'':<22}   kind: {_task_kind(cls)}")
    return 0


# ----------------------------------------------------------------------------- parser


def _add_train_flags(parser: argparse.ArgumentParser) -> None:
    from qkv.train import TrainConfig

    group = parser.add_argument_group("training (TrainConfig fields)")
    defaults = TrainConfig()
    for name, annotation in _fields(TrainConfig).items():
        if name == "out_dir":
            continue
        flag = "--" + name.replace("_", "-")
        group.add_argument(flag, dest=name, default=None, metavar=name.upper(),
                           type=lambda text, a=annotation, n=name: _argparse_value(a, text, n),
                           help=f"default {getattr(defaults, name)!r}")


def _argparse_value(annotation: Any, text: str, name: str) -> Any:
    try:
        return parse_value(annotation, text, name)
    except CLIError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _version() -> str:
    import qkv

    return f"qkv {qkv.__version__}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qkv", description="The attention family on PyTorch: train, evaluate, look at and benchmark every model.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="list attention kernels, models (with their task kinds) and tasks",
                       description="List attention kernels, models and tasks. Example: qkv list model")
    p.add_argument("what", nargs="?", choices=["attention", "model", "task"], help="only this kind")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("data", help="fetch or list the real data sets (cached under $QKV_DATA or ~/.cache/qkv)",
                       description="Fetch or list the real data sets. Example: qkv data fetch shakespeare")
    p.add_argument("action", choices=["fetch", "list"])
    p.add_argument("names", nargs="*", help="data sets to fetch (default: all)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--force", action="store_true", help="fetch again even when cached")
    p.set_defaults(func=_cmd_data)

    p = sub.add_parser("train", help="train MODEL on --task",
                       description="Train MODEL on --task. Example: qkv train gpt --task shakespeare-char")
    p.add_argument("model", help="a model name (qkv list model)")
    p.add_argument("--task", required=True, help="a task name (qkv list task)")
    p.add_argument("--preset", default=None, help="a named configuration of the model (e.g. paper; qkv list model "
                                                 "shows them); default: the model's CPU-sized preset")
    p.add_argument("--attention", default=None, help="attention kernel name for Transformer-family models")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="model config field (KEY.SUB=VALUE sets one key of a dict field, e.g. attention_kwargs.radius=8); "
                        "task.KEY for task options; train.KEY for training fields")
    p.add_argument("--out", default=None, help="run directory (default runs/MODEL-TASK)")
    p.add_argument("--init", default=None, metavar="RUN", help="start from run RUN's weights, or a pretrained checkpoint "
                                                               "directory's (Hugging Face bert/gpt2, e.g. qkv data fetch minilm) "
                                                               "(fine-tuning; the task's head starts fresh)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest intact checkpoint, with the run's own settings "
                        "(--steps N extends it; a flag that contradicts the run is refused)")
    _add_threads(p)
    _add_train_flags(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="evaluate a run on its task's held-out split",
                       description="Evaluate a run. Example: qkv eval runs/main --split test --max-examples 512")
    p.add_argument("run")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--max-examples", type=_positive_int, default=None)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="evaluation-time model option (e.g. eval_mem_len=512) or task.KEY=VALUE; repeatable")
    _add_threads(p)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("generate", help="sample text from a language-model run",
                       description='Sample text from a language-model run. Example: qkv generate runs/main --prompt "ROMEO:"')
    p.add_argument("run")
    p.add_argument("--prompt", default="")
    p.add_argument("--max-new-tokens", type=_positive_int, default=200)
    p.add_argument("--temperature", type=_nonnegative_float, default=0.8)
    p.add_argument("--top-k", type=_positive_int, default=None)
    p.add_argument("--top-p", type=_nonnegative_float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=_positive_int, default=16, help="image tasks: samples in the PNG grid")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="image tasks: class=C, temperature=T")
    p.add_argument("--out", default=None, help="image tasks: PNG path (default RUN/samples.png)")
    _add_threads(p)
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("translate", help="translate text with a sequence-to-sequence run",
                       description="Translate with a sequence-to-sequence run. Example: qkv translate runs/rev 12345")
    p.add_argument("run")
    p.add_argument("text", nargs="+")
    p.add_argument("--beam", type=_positive_int, default=1)
    p.add_argument("--max-new-tokens", type=_positive_int, default=None,
                   help="longest output (default: the task's longest target + 1, for <eos>)")
    _add_threads(p)
    p.set_defaults(func=_cmd_translate)

    p = sub.add_parser("viz", help="plot a run's attention weights (every layer and head), or a kernel's pattern, as a PNG",
                       description='Plot a run\'s attention. Example: qkv viz runs/main --text "ROMEO: But, soft!"; '
                                   'a kernel\'s pattern: qkv viz --pattern strided --length 64 --kernel-kwargs stride=8')
    p.add_argument("run", nargs="?")
    p.add_argument("--pattern", default=None, metavar="NAME", help="plot which keys each query of kernel NAME sees")
    p.add_argument("--length", type=int, default=64, help="with --pattern: sequence length (default 64)")
    p.add_argument("--kernel-kwargs", action="append", default=[], metavar="KEY=VALUE,...",
                   help="with --pattern: the kernel's knobs, e.g. 'stride=8' or 'image_size=(8,8),block=(2,4)'")
    p.add_argument("--causal", action="store_true", help="with --pattern: the causal form")
    p.add_argument("--text", default=None, help="input to show (default: a held-out example)")
    p.add_argument("--out", default=None, help="PNG path (default RUN/attention.png)")
    p.add_argument("--max-len", type=_positive_int, default=48, help="tokens of the input shown (default 48)")
    p.add_argument("--max-panels", type=_positive_int, default=16)
    p.add_argument("--html", default=None, metavar="OUT.html",
                   help="write an offline, self-contained page to explore the attention interactively instead")
    p.add_argument("--compare", nargs="+", default=None, metavar="RUN",
                   help="with --html: more runs of the same task, selectable on the page")
    _add_threads(p)
    p.set_defaults(func=_cmd_viz)

    # `qkv bench ...` is handed to qkv.bench.main whole (see main()); listed here for `qkv --help`
    p = sub.add_parser("bench", help="benchmarks (qkv bench --help)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda a: _run_bench(a.rest))
    return parser


def _run_bench(argv: List[str]) -> int:
    """``qkv bench ARGS``: qkv.bench.main, with ``--threads`` defaulting to the physical cores, or
    to 1 (with a warning) when other processes already keep the CPU busy."""
    from qkv import bench

    argv = list(argv)
    if argv and argv[0] in bench.BENCHMARKS and not ({"-h", "--help"} & set(argv)) \
            and not any(a == "--threads" or a.startswith("--threads=") for a in argv):
        threads = physical_cores()
        load = _load_average()
        if load >= 0.5:
            _announce(f"warning: the load average is {load:.1f}; other processes use the CPU, so timings run "
                      "with --threads 1 (pass --threads N to choose)")
            threads = 1
        argv = [argv[0], "--threads", str(threads), *argv[1:]]
    return int(bench.main(argv) or 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "bench":  # its own parser, so that `qkv bench --help` is bench's help
            return _run_bench(argv[1:])
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except (CLIError, ValueError, TypeError, FileNotFoundError, PermissionError, NotADirectoryError) as e:
        print(f"qkv: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`qkv list | head`): stop quietly; point stdout at /dev/null so that
        # Python's own flush at exit does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("qkv: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
