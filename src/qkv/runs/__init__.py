"""A run as a library object: its settings, its directory, its training and its evaluation.

The ``qkv`` command, the reproductions and the benchmarks all go through this package. From
Python, ``start`` begins a run (or resumes one), as ``qkv train`` does, and ``load`` opens a
trained one::

    import qkv.runs

    with qkv.runs.start("gpt", "shakespeare-char", "runs/main", overrides={"d_model": 64, "train.steps": 200}) as run:
        metrics = run.train()                     # checked, locked, run.json written, trained, saved
    with qkv.runs.start("gpt", "shakespeare-char", "runs/main", overrides={"train.steps": 400}, resume=True) as run:
        run.train()                               # continued from its latest checkpoint
    metrics = qkv.runs.load("runs/main").evaluate("test", max_examples=512)

**Settings** (``resolution.py``), lowest first: the config's defaults, the model's ``train_defaults``,
the preset (``preset=``, else the model's ``default_preset``, a CPU-sized one), what the task
determines (``Task.model_hints()``: vocabulary size, special ids, classes, lengths), then
``overrides``. An override is ``key: value`` for a model-config field (``"attention_kwargs.radius":
8`` sets one key of a dict field), ``"task.key"`` for a task option and ``"train.key"`` for a
``TrainConfig`` field; a ``str`` value is read as the command line reads it
(``qkv._values.parse_value`` against the field's type). ``settings.apply_overrides`` applies them,
the one place that does.

**A run directory** (``directory.py``) holds ``run.json`` (model, task, preset, their options and
the training settings: ``Settings.record()``), the trainer's ``train_config.json``,
``metrics.jsonl`` and ``checkpoints/``, and the final ``model/`` (``save_pretrained`` + the task's
``vocab.json``). One process writes it at a time (``qkv.train.lock.RunLock``, taken before anything
is read from an existing directory and held until ``Run.close``). Nothing in it changes until
every check passed.

**Resuming** (``restore.py``) takes the run's own settings; an override that contradicts them is
refused, except those that do not change the trajectory (``RESUME_MAY_CHANGE``: ``steps`` to extend
a run, evaluation, saving, logging, device), which are announced.

**Training** (``training.py``) builds the model seeded with the training seed and saves the final
model; **evaluation** (``evaluation.py``) takes evaluation-time options. ``run.py`` holds ``Run``
(``Run.create`` / ``Run.open`` share one build sequence) and ``start``. Below ``start``,
``resolve`` + ``Run.create`` (the tests), ``Run.open`` and ``Run.of`` (scripts that build their own
model and task: the reproductions, ``qkv bench lra``) are its parts, not other ways in.

Errors in what was asked for are ``qkv.UserError`` (one line on the command line); anything else
is a bug and keeps its traceback.
"""

from .directory import RUN_FILE, TOKENIZER_FILE, VOCAB_FILE
from .directory import save_vocab as _save_vocab  # the name qkv.integrations.export imports
from .evaluation import forward_progress
from .resolution import resolve
from .restore import RESUME_MAY_CHANGE
from .run import Run, load, start
from .settings import Settings, apply_overrides, check_device, fields_of, init_params, split_overrides, typed

__all__ = ["start", "load", "Run", "Settings", "resolve", "apply_overrides", "split_overrides", "forward_progress",
           "RUN_FILE", "VOCAB_FILE", "TOKENIZER_FILE", "RESUME_MAY_CHANGE", "fields_of", "init_params", "typed",
           "check_device"]
