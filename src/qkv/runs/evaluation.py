"""Evaluating a trained run: its task and model with evaluation-time options, the task's metrics,
and a progress bar that follows the model's forward calls."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from tqdm.auto import tqdm

from .._errors import UserError, user_input
from ..tasks import build_task
from .directory import task_options_at
from .settings import Settings, apply_overrides, fields_of, init_params, split_overrides
from .training import check_fits


def with_overrides(directory: Path, settings: Settings, task: Any, model: Any,
                   overrides: Optional[Mapping[str, Any]]) -> Tuple[Any, Any]:
    """The run's ``task`` and ``model`` with evaluation-time options: model options that change how
    it runs, not its weights (e.g. Transformer-XL's ``eval_mem_len``), and ``task.key`` task
    options. Training options are refused."""
    model_sets, task_sets, train_sets = split_overrides(overrides)
    if train_sets:
        raise UserError(f"qkv eval takes no training options, got {sorted(train_sets)}")
    if task_sets:
        options = apply_overrides(task_options_at(directory, settings.task_options), task_sets,
                                  init_params(type(task)), f"task {settings.task!r}")
        with user_input():
            task = build_task(settings.task, **options)
        check_fits(model, task, settings.task)
    if model_sets:
        values = apply_overrides(dataclasses.asdict(model.config), model_sets, fields_of(type(model.config)),
                                 f"model {settings.model!r}")
        with user_input():
            rebuilt = type(model).from_config(values)
        try:
            rebuilt.load_state_dict(model.state_dict())
        except RuntimeError as e:
            raise UserError(f"--set {sorted(model_sets)} changes the model's weights; eval can only change how it runs: {e}") from None
        model = rebuilt.eval()
    return task, model


def evaluate(task: Any, model: Any, split: str, max_examples: Optional[int], progress: bool) -> Dict[str, float]:
    """The task's metrics on ``split`` (at most ``max_examples``) plus what the model itself
    reports (``eval_report``, e.g. learned spans)."""
    model.eval()
    with forward_progress(model, f"evaluating on {split}", disable=not progress):
        metrics = task.evaluate(model, split, max_examples=max_examples)
    metrics.update(model.eval_report())
    return metrics


@contextlib.contextmanager
def forward_progress(model: Any, description: str, total: Optional[int] = None, unit: str = "batch",
                     disable: bool = False) -> Iterator[Any]:
    """A progress bar on stderr (when it is a terminal) that advances on each forward call of
    ``model`` (evaluation, generation)."""
    progress = tqdm(total=total, desc=description, unit=unit, leave=False, dynamic_ncols=True,
                    disable=disable or not sys.stderr.isatty())
    handle = model.register_forward_hook(lambda *_: progress.update(1))
    try:
        yield progress
    finally:
        handle.remove()
        progress.close()
