"""Restoring a run from its directory: the settings it resumes with (its own, with the few changes a
resumed run may take), and a trained run's task and model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

from .._errors import UserError, user_input
from ..models import QKVModel
from ..registry import lookup
from ..tasks import build_task
from ..train import CheckpointManager, TrainConfig
from .directory import own_model, read_run, run_train_settings, task_options_at
from .settings import (TRAIN_FIELDS, Say, Settings, apply_overrides, check_device, classes, fields_of, init_params,
                       split_overrides, train_config)

#: training settings a resumed run may change (they do not alter the updates it computes)
RESUME_MAY_CHANGE = frozenset({"steps", "eval_every", "eval_batches", "eval_max_examples", "save_every", "keep_last",
                               "log_every", "device", "progress", "tensorboard",
                               "context_parallel"})  # a checkpoint written under one P resumes under another


def resumed(out: Path, overrides: Optional[Mapping[str, Any]], model: Optional[str], task: Optional[str],
            preset: Optional[str], say: Say) -> Tuple[Settings, TrainConfig]:
    """The settings and training config of the run in ``out`` resumed with ``overrides``: its own,
    except the ``RESUME_MAY_CHANGE`` training settings (each change is said); any other value
    given must repeat the run's, and so must ``model``/``task``/``preset`` when given."""
    previous = read_run(out)
    model_cls, task_name, task_cls = classes(previous["model"], previous["task"])
    if model is not None and (previous["model"], previous["task"]) != (model, task):
        raise UserError(f"{out} holds a {previous['model']} run on {previous['task']}, not {model} on {task}")
    preset_name = previous.get("preset")
    if preset is not None and preset != preset_name:
        raise UserError(f"--preset {preset} contradicts the run in {out} (preset {preset_name}); drop it to resume")
    model_sets, task_sets, train_sets = split_overrides(overrides)
    config_values, task_options = dict(previous["model_config"]), dict(previous["task_options"])
    # checked only: a resumed run keeps its model and its task
    apply_overrides(config_values, model_sets, fields_of(model_cls.config_class), f"model {previous['model']!r}", resuming=out)
    apply_overrides(task_options, task_sets, init_params(task_cls), f"task {task_name!r}", resuming=out)
    train_values = run_train_settings(out, previous)
    train_values.pop("out_dir", None)
    dropped = sorted(set(train_values) - set(TRAIN_FIELDS))
    if dropped:  # a run written by an older qkv
        say(f"the run's settings {dropped} are no longer training options; ignored")
        train_values = {k: v for k, v in train_values.items() if k in TRAIN_FIELDS}
    train_values = apply_overrides(train_values, train_sets, TRAIN_FIELDS, "train", resuming=out,
                                   may_change=RESUME_MAY_CHANGE, say=say)
    config = train_config(train_values, out)
    check_device(config.device)
    return Settings(previous["model"], task_name, preset_name, task_options, config_values, train_values), config


def trained(directory: Path) -> Tuple[Settings, Any, Any]:
    """A run's settings, task and model (its final ``model/`` if present, else its latest intact
    checkpoint), the model in eval mode."""
    info = read_run(directory)
    with user_input():
        task = build_task(info["task"], **task_options_at(directory, info["task_options"]))
        final = own_model(directory, info)
        if (final / "config.json").is_file():
            model = QKVModel.from_pretrained(final)
        else:
            model = lookup("model", info["model"]).from_config(info["model_config"])
            # the run may still be training: a checkpoint removed while it is read gives way to a newer one
            if CheckpointManager(directory / "checkpoints").load_latest(model, rank=None) is None:
                raise UserError(f"{directory} has neither a final model/ nor a checkpoint yet")
    model.eval()
    settings = Settings(info["model"], info["task"], info.get("preset"), info["task_options"], info["model_config"],
                        run_train_settings(directory, info))
    return settings, task, model
