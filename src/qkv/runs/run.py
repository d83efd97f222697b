"""``Run``: a run directory with its settings, task and model, held under its writer lock while it
trains; and ``start``, the one way to begin (or resume) a run from Python, what ``qkv train`` does."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from .._errors import UserError, user_input
from .._machine import announce
from ..hf.tokenizer import remember_text
from ..registry import lookup
from ..tasks import build_task
from . import directory as files
from . import evaluation, training
from .directory import RUN_FILE, check_out, has_checkpoints, refuse_foreign_directory, refuse_fresh_over_checkpoints
from .resolution import resolve
from .restore import resumed, trained
from .settings import Say, Settings, check_task_kind, classes, train_config


class Run:
    """A run directory with its settings, task and model.

    Made by ``start`` (a new run, or one resumed), ``Run.of`` (a model and task a script built) or
    ``load`` (a trained one, to evaluate or sample; no lock). A run made to train holds the
    directory's writer lock until ``close`` (or the end of a ``with`` block). ``finished`` is True
    when a resumed run is already at its step count with its final model: ``train`` then has
    nothing to do.
    """

    def __init__(self, directory: Path, settings: Settings, task: Any, model: Any, *, config: Any = None,
                 resume: bool = False, finished: bool = False) -> None:
        self.directory = Path(directory)
        self.settings = settings
        self.task = task
        self.model = model
        self.config = config
        self.resume = resume
        self.finished = finished
        self._locks = contextlib.ExitStack()
        self._locked = False

    # -- lifetime

    def close(self) -> None:
        """Release the directory's writer lock."""
        self._locks.close()
        self._locked = False

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _lock(self) -> None:
        """Take the directory's writer lock for the run's lifetime (once)."""
        if not self._locked:
            files.lock(self._locks, self.directory)
            self._locked = True

    @classmethod
    def _guarded(cls, directory: str | os.PathLike, build: Callable[["Run"], None]) -> "Run":
        """A Run in ``directory`` (checked to be one), filled in by ``build``; its lock is
        released when ``build`` fails."""
        run = cls(Path(directory), None, None, None)  # type: ignore[arg-type]
        check_out(run.directory)
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

        def build(run: "Run") -> None:
            out = run.directory
            if out.is_dir():  # one writer per run directory: locked before anything is read from it
                run._lock()
            if not resume:
                refuse_fresh_over_checkpoints(out)
            config = train_config(settings.train, out)
            if resume and files.finished_or_corrupt(out, config, say):
                run.finished, run.settings, run.task, run.model = True, settings, settings._task, settings._model
                return
            built = settings._task
            if built is None:  # settings made by hand, not by resolve
                with user_input():
                    built = build_task(settings.task, **settings.task_options)
            run._assemble(dataclasses.replace(settings, _task=built), config, resume=resume)

        return cls._guarded(directory, build)

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
        """Resume the run in ``directory`` with its own settings, locked (``restore.resumed`` says
        which ``overrides`` it takes). Check ``finished`` before ``train``."""

        def build(run: "Run") -> None:
            out = run.directory
            if out.is_dir():
                run._lock()
            settings, config = resumed(out, overrides, model, task, preset, say)
            if files.finished_or_corrupt(out, config, say):
                run.finished, run.settings = True, settings
                return
            options = files.task_options_at(out, settings.task_options)  # its own tokenizer's path made whole
            with user_input():
                built = build_task(settings.task, **options)
            check_task_kind(lookup("model", settings.model), settings.model, built, settings.task)
            run._assemble(dataclasses.replace(settings, task_options=options, _task=built), config, resume=True)

        return cls._guarded(directory, build)

    def _assemble(self, settings: Settings, config: Any, *, resume: bool) -> None:
        """The one build sequence of ``create`` and ``open``: the model (built and seeded unless
        given; ``init``'s weights copied in), checked against the task, then the directory made,
        locked and recorded (``run.json``, with the model's full config and the task's own
        tokenizer copy)."""
        out, task, model = self.directory, settings._task, settings._model
        if model is None:
            model = training.build_model(lookup("model", settings.model), settings.model_config, config.seed)
        if settings._init_model is not None:
            with user_input():  # e.g. a source whose shapes do not fit
                fresh = model.init_from(settings._init_model)
            print(f"qkv: initialised from {settings.init}; fresh: {', '.join(fresh) or 'nothing'}")
        training.check_fits(model, task, settings.task)
        training.check_splits(model, task, config)
        if (out / RUN_FILE).is_file():  # its final save would write into another run's model/
            files.own_model(out)
        out.mkdir(parents=True, exist_ok=True)
        if not self._locked:  # a new directory: lock it now, and check again that no run got there meanwhile
            self._lock()
            if not resume:
                refuse_fresh_over_checkpoints(out)
        train = {k: v for k, v in dataclasses.asdict(config).items() if k != "out_dir"}
        self.settings = dataclasses.replace(settings, model_config=dataclasses.asdict(model.config), train=train,
                                            task_options=files.keep_tokenizer(out, settings.task_options))
        self.task, self.model, self.config, self.resume = task, model, config, resume
        remember_text(model, task)  # save_pretrained(format="huggingface") writes its tokenizer too
        if files.rank() == 0:  # under torchrun only rank 0 writes (the others would race it for run.json)
            files.write_run(out, self.settings.record())

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Run":
        """A run's task and model for evaluation or sampling (its final ``model/`` if present, else
        its latest intact checkpoint), in eval mode; not locked."""
        directory = files.final_run(Path(directory))  # a linearization directory: its last stage's run
        settings, task, model = trained(directory)
        remember_text(model, task)  # save_pretrained(format="huggingface") writes its tokenizer too
        return cls(directory, settings, task, model)

    # -- using one

    def train(self, *, save: bool = True) -> Dict[str, float]:
        """Train (continuing the latest intact checkpoint when the run was opened or created to
        resume), then (``save``) save the final ``model/`` with the task's vocabulary; the
        trainer's last metrics."""
        if self.config is None:
            raise UserError(f"the run in {self.directory} was loaded to be used, not trained: resume it with qkv.runs.start(..., resume=True)")
        return training.train(self.model, self.task, self.config, self.directory, resume=self.resume, save=save)

    def with_overrides(self, overrides: Optional[Mapping[str, Any]]) -> Tuple[Any, Any]:
        """The run's task and model with evaluation-time options (``evaluation.with_overrides``)."""
        return evaluation.with_overrides(self.directory, self.settings, self.task, self.model, overrides)

    def evaluate(self, split: str = "test", *, max_examples: Optional[int] = None,
                 overrides: Optional[Mapping[str, Any]] = None, progress: bool = False) -> Dict[str, float]:
        """The task's metrics on ``split`` (at most ``max_examples``) plus what the model itself
        reports (``eval_report``, e.g. learned spans); ``overrides`` as in ``with_overrides``."""
        task, model = self.with_overrides(overrides)
        return evaluation.evaluate(task, model, split, max_examples, progress)


def start(model: str, task: str, directory: Optional[str | os.PathLike] = None, *, preset: Optional[str] = None,
          overrides: Optional[Mapping[str, Any]] = None, init: Optional[str] = None, resume: bool = False,
          say: Say = announce) -> Run:
    """Start a run of ``model`` on ``task`` (registry names) in ``directory`` (default
    ``runs/MODEL-TASK``), locked until it is closed: what ``qkv train`` does. ``overrides`` are
    ``key: value`` settings (module docstring); ``resume`` continues the run there (with
    ``Run.open``; a directory that holds checkpoints but no run.json continues from them), else a
    new one is made (``resolve`` + ``Run.create``)."""
    if init and resume:
        raise UserError("--init starts a new run from another run's weights; it cannot be combined with --resume")
    _, task_name, _ = classes(model, task)
    out = Path(directory or f"runs/{model}-{task_name}")
    check_out(out)
    if resume and (out / RUN_FILE).is_file():
        return Run.open(out, overrides=overrides, model=model, task=task_name, preset=preset, say=say)
    if resume and not has_checkpoints(out):
        say(f"--resume: {out} holds no run yet; starting a new one")
    refuse_foreign_directory(out)  # the user's --out (scripts that keep files of their own use Run.of)
    return Run.create(out, resolve(model, task_name, preset=preset, overrides=overrides, init=init, say=say),
                      resume=resume, say=say)


def load(directory: str | os.PathLike) -> Run:
    """A trained run, to evaluate or sample from (``Run.load``)."""
    return Run.load(directory)
