"""A new run's settings, layer over layer (lowest first): the config's defaults, the model's
``train_defaults``, the preset (``preset=``, else the model's ``default_preset``, a CPU-sized one),
what the task determines (``Task.model_hints``), then the overrides (``apply_overrides``).
``init=`` starts from another run's or a checkpoint's architecture and weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from .._errors import UserError, user_input
from .._machine import announce
from ..integrations import pretrained
from ..tasks import build_task
from ..tasks.vocab import vocab_to_dict
from .restore import trained
from .settings import (TRAIN_FIELDS, Say, Settings, TrainConfig, apply_overrides, check_device, check_task_kind, classes,
                       fields_of, init_params, model_hints, split_overrides, train_config)


def resolve(model: str, task: str, *, preset: Optional[str] = None, overrides: Optional[Mapping[str, Any]] = None,
            init: Optional[str] = None, say: Say = announce) -> Settings:
    """The settings of a new run of ``model`` on ``task`` (registry names), from the layers the
    module docstring lists; builds the task (its data) to learn what it determines.

    ``init``: a run directory or a pretrained checkpoint directory (Hugging Face ``bert``/``gpt2``,
    or a ``save_pretrained`` one) whose architecture and weights the new model starts from (the
    task's head starts fresh). Raises ``UserError`` for anything the layers refuse.
    """
    model_cls, task, task_cls = classes(model, task)
    model_sets, task_sets, train_sets = split_overrides(overrides)
    fields = fields_of(model_cls.config_class)
    preset_name = preset or model_cls.default_preset
    with user_input():
        values = model_cls.preset(preset_name) if preset_name else {}
    if init and not preset:  # the architecture is --init's: the default preset gives its training recipe only
        values = {k: v for k, v in values.items() if k in ("train", "task")}
        preset_name = None
    train_values = _train_values({**model_cls.train_defaults, **values.pop("train", {})}, train_sets, model)
    task_options = apply_overrides(values.pop("task", {}), task_sets, init_params(task_cls), f"task {task!r}")
    with user_input():
        if init:  # a Hugging Face checkpoint's tokenizer for the task
            task_options = pretrained.task_options(init, task_cls, task_options)
        built = build_task(task, **task_options)
    check_task_kind(model_cls, model, built, task)
    if "attention" in model_sets and "attention" not in fields:
        raise UserError(f"model {model!r} has no attention kernel option")
    config_values = apply_overrides({**values, **model_hints(built, fields)}, model_sets, fields, f"model {model!r}")
    init_model = None
    if init:
        user = apply_overrides({}, model_sets, fields, "model")
        config_values, init_model = _init_config(init, model, model_cls, config_values, user, built, task, say)
    return Settings(model, task, preset_name, task_options, config_values, train_values, init,
                    _task=built, _init_model=init_model)


def _train_values(values: Dict[str, Any], given: Dict[str, Any], model: str) -> Dict[str, Any]:
    """The training settings: ``values`` (the model's defaults, the preset's) with ``given``; a run
    evaluates (and so checkpoints) ten times unless told otherwise, so that a killed run resumes."""
    train_values = {**values, **apply_overrides({}, given, TRAIN_FIELDS, "train")}
    steps = train_values.get("steps", TrainConfig.steps)
    if isinstance(steps, int) and steps > 0:
        train_values.setdefault("eval_every", max(1, steps // 10))
    unknown = sorted(set(train_values) - set(TRAIN_FIELDS))
    if unknown:
        raise UserError(f"model {model!r}: unknown training setting(s) {unknown}")
    check_device(train_config(train_values, Path(".")).device)
    return train_values


def _init_config(init: str, model: str, model_cls: Any, values: Dict[str, Any], user: Dict[str, Any], task: Any,
                 task_name: str, say: Say) -> Tuple[Dict[str, Any], Any]:
    """``init``'s architecture, the new task's head fields (``init_task_fields``), then the user's
    overrides; and ``init``'s model, whose weights the new one starts from. A run whose vocabulary
    is not the new task's is refused: its token embeddings would mean other tokens."""
    head = {k: v for k, v in values.items() if k in model_cls.init_task_fields}
    if pretrained.is_checkpoint_dir(init):  # a Hugging Face checkpoint or a save_pretrained directory
        with user_input():
            return pretrained.init_config(init, model_cls, head, user, say=say, task=task)
    source, source_task, source_model = trained(Path(init))
    if source.model != model:
        raise UserError(f"--init {init} holds a {source.model!r} model, not {model!r}")
    theirs, ours = source_task.vocab, task.vocab  # None: a task without a vocabulary
    if theirs is not None and ours is not None and (theirs.size != ours.size or vocab_to_dict(theirs) != vocab_to_dict(ours)):
        raise UserError(f"--init {init}: its vocabulary ({source.task}, {theirs.size} tokens) is not that of task "
                        f"{task_name!r} ({ours.size} tokens); fine-tune on a task with the pre-training vocabulary")
    values = {**source.model_config, **head, **user}
    with user_input():
        pretrained.check_kernel(init, model_cls, values, source_model)
    return values, source_model
