"""A run's settings and the override language: ``Settings`` (what ``run.json`` records), the typed
``key: value`` overrides (``apply_overrides``, the one place they are applied), and the checks of
what the settings name (the model, its task, the device)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import typing
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from .. import tasks
from .._errors import UserError, user_input
from .._values import guess_value, parse_value
from ..registry import lookup
from ..train import TrainConfig

Say = Callable[[str], None]


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


TRAIN_FIELDS = fields_of(TrainConfig)


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


def apply_overrides(values: Mapping[str, Any], given: Mapping[str, Any], fields: Dict[str, Any], what: str, *,
                    resuming: Optional[Path] = None, may_change: typing.AbstractSet[str] = frozenset(),
                    say: Optional[Say] = None) -> Dict[str, Any]:
    """``values`` with the overrides ``given`` applied, each checked and typed against ``fields``
    (``typed``; ``what`` names them in errors, e.g. ``"model 'gpt'"``).

    ``resuming``: the directory of the run whose ``values`` these are. A given value must then
    repeat the run's, unless its key is in ``may_change`` (the change is ``say``-d); a contradiction
    is a ``UserError`` that says how to resume or start anew.
    """
    given = typed(given, fields, what, base=dict(values))
    if resuming is not None:
        for key, value in given.items():
            if key not in values or _canon(values[key]) == _canon(value):
                continue
            if key not in may_change:
                raise UserError(f"{what} option {key}={value!r} contradicts the run in {resuming} ({key}={values[key]!r}); "
                                "drop it to resume, or start a new run with another --out")
            if say is not None:
                say(f"resuming with {key}={value!r} (the run had {values[key]!r})")
    return {**values, **given}


# ----------------------------------------------------------------------------- checks


def train_config(values: Dict[str, Any], out: Path) -> TrainConfig:
    """The trainer's config of training settings ``values`` writing into ``out``."""
    try:
        return TrainConfig(**{**values, "out_dir": str(out)})
    except (TypeError, ValueError) as e:
        raise UserError(f"training settings: {e}") from None


def check_device(device: str) -> None:
    """A device this machine has ("auto", "cpu", "cuda", "cuda:1", "mps"), else a UserError."""
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
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {device!r}: MPS is not available here (use --device cpu)")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {device!r}: qkv trains on cpu, cuda or mps")


def classes(model: str, task: str) -> Tuple[type, str, type]:
    """The model class, the form of ``task`` it reads (``task_for_model``) and that task's class."""
    with user_input():
        model_cls = lookup("model", model)
        task = tasks.task_for_model(task, model_cls)  # e.g. bbc-news as token ids for BERT
        return model_cls, task, lookup("task", task)


def check_task_kind(model_cls: type, model: str, task: Any, task_name: str) -> None:
    """A model that declares the task kinds it trains on (``task_kinds``) refuses the others."""
    task_kinds = model_cls.task_kinds
    if task_kinds is not None and task.kind not in task_kinds:
        raise UserError(f"model {model!r} trains on {sorted(task_kinds)} tasks; {task_name!r} is a {task.kind!r} task")


def model_hints(task: Any, fields: Mapping[str, Any]) -> Dict[str, Any]:
    """The config fields among ``fields`` that ``task`` determines (its ``model_hints``)."""
    return {k: v for k, v in task.model_hints().items() if k in fields}
