"""What every qkv model shares: a ``Config`` dataclass, ``from_config``, named ``presets``, and
``save_pretrained`` / ``from_pretrained`` (``config.json`` + ``model.safetensors``; loading never
unpickles). Models register with ``@register("model", name)``.

``config.json`` is flat, as in Hugging Face: ``{"model_type": "gpt", "n_layers": 4, ...}``; the
older nested layout ``{"model": "gpt", "config": {...}}`` still loads.

Sizes are checked before anything is allocated: ``from_config`` first builds the model on PyTorch's
``meta`` device (shapes only, no memory) and refuses a configuration whose parameters and buffers
would not fit in the memory this machine has available (``estimate_bytes``), or whose size cannot
be estimated there (a width too large for PyTorch to address): an estimate that cannot be made is
a refusal, never a pass.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .._io import settle_directory
from .._modelfile import CheckpointError, check_weights, load_dtype, load_model_tensors, read_model_config, save_model
from ..registry import lookup

__all__ = ["ModelOutput", "QKVModel", "config_from_dict", "check_field", "short_repr", "load_pretrained",
           "available_memory", "MODEL_TYPE_KEY"]

#: the key of ``config.json`` naming the registered model (Hugging Face's ``model_type``)
MODEL_TYPE_KEY = "model_type"

@dataclass
class ModelOutput:
    """What a model's ``forward`` returns.

    loss:    scalar training loss when targets were given, else None.
    logits:  the prediction scores.
    weights: attention weights when asked for (``need_weights=True``): model-specific structure
             (e.g. a list with one ``(B, H, M, N)`` tensor per layer), documented by each model.
    state:   what continues the computation (KV caches, memories), when asked for.
    aux:     named extra losses or statistics (e.g. ponder cost, span loss).
    hidden:  the last hidden states ``(B, L, d_model)`` of Transformer-family models (after the
             final LayerNorm where the stack has one), else None.
    """

    loss: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    weights: Any = None
    state: Any = None
    aux: Dict[str, Any] = field(default_factory=dict)
    hidden: Optional[Tensor] = None


# a pytree node, so that torch.export and torch.compile can return it from a traced graph
torch.utils._pytree.register_dataclass(ModelOutput, serialized_type_name="qkv.models.base.ModelOutput")


def config_from_dict(config_class: type, values: Dict[str, Any]) -> Any:
    """Build ``config_class`` from a dict (e.g. a parsed ``config.json``), rejecting unknown keys
    and values not of their field's declared type (``check_field``) with a clear message, before the
    config's own range checks run."""
    if not isinstance(values, dict):
        raise TypeError(f"a {config_class.__name__} is built from a dict, got {type(values).__name__}")
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(str(k) for k in set(values) - known)
    if unknown:
        raise ValueError(f"unknown {config_class.__name__} field(s) {unknown}; known: {sorted(known)}")
    hints = typing.get_type_hints(config_class)
    for name, value in values.items():
        check_field(name, hints.get(name, Any), value)
    tuples = {f.name for f in dataclasses.fields(config_class) if "tuple" in str(f.type).lower()}
    return config_class(**{k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in values.items()})


def short_repr(value: Any) -> str:
    """``repr(value)`` for an error message, cut to one short line (a 4,000-digit integer, whose
    ``repr`` may even be refused, a long list)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of {int(abs(value).bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def finite(value: Any) -> bool:
    """Whether a number is finite as a float (an integer too large for one is not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _type_ok(annotation: Any, value: Any) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return True
    if origin is Union:
        return any(_type_ok(arg, value) for arg in args)
    if annotation is type(None):
        return value is None
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
    if annotation is str:
        return isinstance(value, str)
    if origin in (tuple, list) or annotation in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if not args:
            return True
        if args[-1] is Ellipsis:
            return all(_type_ok(args[0], v) for v in value)
        if origin is list:
            return all(_type_ok(args[0], v) for v in value)
        return len(args) == len(value) and all(_type_ok(a, v) for a, v in zip(args, value))
    if origin is dict or annotation is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return True  # another declared type: the config's own checks judge it


def _describe(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Union:
        return " or ".join(_describe(a) for a in args)
    if annotation is type(None):
        return "null"
    if annotation is float:
        return "a finite number"
    if annotation in (int, str, bool):
        return f"a{'n' if annotation is int else ''} {annotation.__name__}"
    if origin in (tuple, list) or annotation in (tuple, list):
        return "a list" + (f" of {_describe(args[0])}" if args else "")
    if origin is dict or annotation is dict:
        return "an object with string keys"
    if origin is typing.Literal:
        return f"one of {list(args)}"
    return str(annotation)


def check_field(name: str, annotation: Any, value: Any) -> None:
    """Refuse a config value that is not of its field's declared type (``int``, ``float``: a finite
    number, ``str``, ``bool``, ``Optional``/``Tuple``/``Dict`` of them): a ``TypeError`` naming the
    field, what it must be and what it is. Every model's config goes through this when built from
    a dict, whatever file or format the dict came from."""
    if not _type_ok(annotation, value):
        raise TypeError(f"{name} must be {_describe(annotation)}, got {short_repr(value)}")


class CheckpointFormat(abc.ABC):
    """Another library's checkpoint layout that ``QKVModel.from_pretrained`` reads and
    ``save_pretrained(format=name)`` writes; registered in ``CHECKPOINT_FORMATS`` by the module that
    implements it (``qkv/hf/checkpoints.py``: ``"huggingface"``, registered when ``qkv`` is
    imported), so that this floor imports none of the models and no higher floor. ``writes``
    False: a format read only (a llama.cpp GGUF file), not offered to ``save_pretrained``."""

    writes: bool = True

    @abc.abstractmethod
    def recognizes(self, directory: Path) -> bool:
        """Whether ``directory`` holds a checkpoint of this format."""

    @abc.abstractmethod
    def load(self, cls: Optional[type], directory: Path, map_location: str, **overrides: Any) -> "QKVModel":
        """The model in ``directory`` (as ``cls`` when given; else the architecture it holds)."""

    @abc.abstractmethod
    def save(self, model: "QKVModel", directory: Union[str, os.PathLike]) -> Path:
        """Write ``model`` in this format into ``directory``."""


#: format name -> reader/writer of another library's checkpoints (filled on ``import qkv``)
CHECKPOINT_FORMATS: Dict[str, CheckpointFormat] = {}


class QKVModel(nn.Module):
    """Base class of qkv's models: ``Model(config)``, ``from_config``, ``save_pretrained``,
    ``from_pretrained``. Subclasses set ``config_class`` and are registered as ``"model"``.

    The hooks the trainer, the tasks and the command line call are declared here with defaults
    that do nothing (docs/contracts.md); a model overrides the ones it needs:
    ``set_step``/``on_evaluate`` (the trainer, before each update and after each evaluation),
    ``carries_state`` with ``export_state``/``import_state`` (state carried between batches and
    through checkpoints), ``eval_report`` (``qkv eval``), ``visualize`` (``qkv viz``),
    ``generate`` (``qkv generate``/``translate``; ``can_generate`` says whether it is there),
    ``train_defaults`` (``qkv train``) and ``input_key`` (which form of a task it reads).
    """

    config_class: ClassVar[type]
    registry_name: ClassVar[str] = ""
    #: the task kinds (docs/contracts.md) whose batches ``forward`` takes; None: not declared.
    task_kinds: ClassVar[Optional[frozenset]] = None
    #: config fields the new task sets when a run starts from another run's weights (``--init``)
    init_task_fields: ClassVar[tuple] = ()
    #: parameter-name prefixes that start fresh under ``--init`` (the new task's head)
    init_fresh: ClassVar[tuple] = ()
    #: tasks this model trains on as it is (``qkv list model``; their kinds when task_kinds is None)
    suggested_tasks: ClassVar[Tuple[str, ...]] = ()
    #: named configurations, e.g. ``{"paper": {}, "cpu": {"n_layers": 4, ..., "train": {"steps": 600}}}``:
    #: config fields to set, plus an optional ``"train"`` dict of ``TrainConfig`` fields
    #: (``qkv train MODEL --preset NAME``).
    presets: ClassVar[Dict[str, Dict[str, Any]]] = {}
    #: the preset ``qkv train`` uses without ``--preset`` (a CPU-sized one); None: the config's defaults.
    default_preset: ClassVar[Optional[str]] = None
    #: a training recipe (``TrainConfig`` fields, e.g. ``{"lr": 1e-3, "steps": 500}``) that ``qkv train``
    #: uses unless the preset or the command line says otherwise.
    train_defaults: ClassVar[Dict[str, Any]] = {}
    #: the batch key of the model's main input (``"input_ids"``, ``"doc"``, ...); a task that comes in
    #: several forms (``Task.variants``) is given in the form that has this key. None: not declared.
    input_key: ClassVar[Optional[str]] = None
    #: True when ``forward(..., state=, return_state=True)`` continues the previous batch: on a stream
    #: task the trainer passes ``out.state`` from one batch to the next (Transformer-XL's memory).
    carries_state: ClassVar[bool] = False
    #: ``qkv train --context-parallel P`` (``qkv.parallel``): True when the model may run on sequence
    #: shards, each rank feeding ``L/P`` positions of every sequence — every mixing across positions
    #: is a self-attention kernel or a positional scheme, and the loss a mean over positions — and the
    #: answer is then that of one process; otherwise the reason it cannot, a sentence the user reads.
    #: What depends on the config: ``context_parallel_refusal``. Default: refused, never checked.
    context_parallel: ClassVar[Union[bool, str]] = ("it does not declare that its sequences can be split "
                                                    "(QKVModel.context_parallel)")

    def __init__(self, config: Any) -> None:
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    # ----------------------------------------------------------------------------- hooks (no-op defaults)

    def set_step(self, step: int, total_steps: Optional[int] = None) -> None:
        """Called by the trainer before each update with the update's index and the run's length
        (losses or redraws scheduled over training). Default: nothing."""

    def on_evaluate(self, metrics: Dict[str, float]) -> None:
        """Called by the trainer after each periodic evaluation with its metrics (e.g. ``valid_loss``).
        Default: nothing."""

    def context_parallel_refusal(self) -> Optional[str]:
        """Why this model, with its config, cannot run on sequence shards (``context_parallel``), or
        None when it can. Override to refuse a config (a head that reads one position). Default:
        the class's declaration."""
        declared = type(self).context_parallel
        return None if declared is True else str(declared)

    def export_state(self, state: Any) -> Dict[str, Tensor]:
        """The carried ``state`` (``carries_state``) as named tensors for a checkpoint. Default: none."""
        return {}

    def import_state(self, tensors: Dict[str, Tensor]) -> Any:
        """Inverse of ``export_state``: the carried state from a checkpoint's tensors. Default: None."""
        return None

    def eval_report(self) -> Dict[str, float]:
        """What the model reports about itself beside the task's metrics in ``qkv eval`` (e.g.
        learned spans). Default: nothing."""
        return {}

    def visualize(self, path: Union[str, os.PathLike]) -> Optional[Path]:
        """Draw what is the model's own (e.g. its learned spans) to the PNG ``path`` for ``qkv viz``;
        returns the path written, or None when there is nothing to draw (the default)."""
        return None

    def generate(self, *args: Any, **kwargs: Any) -> Tensor:
        """Generate from the model (docs/contracts.md: language models ``generate(input_ids,
        max_new_tokens, ...)``, sequence-to-sequence ``generate(src_ids, src_mask=, ...)``).
        Default: this kind of model does not generate (``can_generate()`` is False): a TypeError,
        as transformers raises for a model that is not generative."""
        raise TypeError(f"a {self.registry_name or type(self).__name__} model does not generate "
                        "(can_generate() is False); the language and sequence-to-sequence models do")

    @classmethod
    def can_generate(cls) -> bool:
        """Whether the model implements ``generate``."""
        return cls.generate is not QKVModel.generate

    # ----------------------------------------------------------------------------- building, saving

    @classmethod
    def from_config(cls, config: Union[Any, Dict[str, Any]]) -> "QKVModel":
        """Build from a ``config_class`` instance or a plain dict of its fields."""
        if isinstance(config, dict):
            config = config_from_dict(cls.config_class, config)
        cls.check_size(config)
        return cls(config)

    def init_from(self, source: nn.Module) -> List[str]:
        """Copy ``source``'s parameters and buffers into this model by name (fine-tuning a
        pre-trained run), except those under :attr:`init_fresh`; returns the names that start
        fresh (not copied). A copied tensor whose shape differs raises ``ValueError`` naming it."""
        theirs = source.state_dict()
        mine = self.state_dict()
        fresh = [n for n in mine if n not in theirs or n.startswith(self.init_fresh)]
        for name in mine:
            if name in fresh:
                continue
            if tuple(theirs[name].shape) != tuple(mine[name].shape):
                raise ValueError(f"cannot initialise {name!r} of shape {tuple(mine[name].shape)} from a tensor of "
                                 f"shape {tuple(theirs[name].shape)} (the runs differ in vocabulary or size)")
        self.load_state_dict({n: theirs[n] for n in mine if n not in fresh}, strict=False)
        return fresh

    @classmethod
    def preset(cls, name: str) -> Dict[str, Any]:
        """The preset ``name`` (config fields, and ``"train"`` settings when it has them)."""
        if name not in cls.presets:
            known = ", ".join(sorted(cls.presets)) or "none"
            raise ValueError(f"model {cls.registry_name or cls.__name__!r} has no preset {name!r}; its presets: {known}")
        return dict(cls.presets[name])

    @classmethod
    def estimate_bytes(cls, config: Any) -> Optional[int]:
        """Bytes of parameters and buffers of ``cls(config)``, found by building it on the ``meta``
        device (no memory is allocated); None when the model cannot be built there (too large for
        PyTorch to address, or an ``__init__`` that needs real data), which ``check_size`` refuses.

        The time this takes does not grow with the repeat counts (``n_layers``, ``n_decoder_layers``,
        ``n_targets``, ...: :func:`_repeat_fields`): a count above ``_EXACT_REPEATS`` is estimated
        from models built with 1 and 2 repeats, extrapolated linearly (each repeat adds the same
        parameters), so ``n_layers=10**9`` is refused at once instead of building 10**9 modules."""
        return cls._estimate(config)[0]

    @classmethod
    def _estimate(cls, config: Any) -> Tuple[Optional[int], str]:
        """``(bytes, "")``, or ``(None, why it cannot be estimated)``."""
        large = {k: v for k, v in _repeat_fields(config).items() if v > _EXACT_REPEATS}
        if large and dataclasses.is_dataclass(config):
            failure: Optional[BaseException] = None
            for low in (1, 2):  # a model may need more than one repeat
                try:
                    base = cls._meta_bytes(dataclasses.replace(config, **{k: low for k in large}))
                    total = base
                    for name, count in large.items():
                        more = cls._meta_bytes(dataclasses.replace(config, **{**{k: low for k in large}, name: low + 1}))
                        total += (more - base) * (count - low)
                    return total, ""
                except Exception as e:  # noqa: BLE001 - that many repeats is not a valid model: try the next
                    failure = e
            _raise_if_refused(failure)
            return None, _why_not(failure)
        try:
            return cls._meta_bytes(config), ""
        except Exception as e:  # noqa: BLE001 - too large to address, or an __init__ that needs real data
            _raise_if_refused(e)
            return None, _why_not(e)

    @classmethod
    def _meta_bytes(cls, config: Any) -> int:
        """Bytes of parameters and buffers of ``cls(config)`` built on the meta device."""
        with torch.device("meta"):
            model = cls(config)
        tensors = list(model.parameters()) + list(model.buffers())
        seen, total = set(), 0
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        return total

    @classmethod
    def check_size(cls, config: Any) -> None:
        """Refuse a config whose model would not fit in the available memory, or whose size cannot
        be estimated (``estimate_bytes``: an estimate that cannot be made is a refusal, never a
        pass), before allocating."""
        need, why = cls._estimate(config)
        if need is None:
            raise ValueError(f"{type(config).__name__} describes a model whose size cannot be estimated before "
                             f"allocating it ({why}); check its sizes ({_size_fields(config)})")
        have = available_memory()
        if have is not None and need > have:
            raise ValueError(f"{type(config).__name__} describes a model of {_human_bytes(need)} of parameters and "
                             f"buffers, more than the {_human_bytes(have)} of memory available; check its sizes "
                             f"({_size_fields(config)})")

    def save_pretrained(self, directory: Union[str, os.PathLike], format: str = "qkv") -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory`` (tied parameters stored
        once), the directory replaced as a whole: a reader, or a process killed at any moment, finds
        the old model or the new one, never a mix (``qkv._io.atomic_directory``; other files in it are
        kept). Another ``format`` writes that format's checkpoint
        (``CHECKPOINT_FORMATS``): ``"huggingface"`` one that transformers' ``AutoModel...from_pretrained``
        loads (BERT and GPT; ``qkv/hf/checkpoints.py``)."""
        if format != "qkv":
            writable = [name for name, f in CHECKPOINT_FORMATS.items() if f.writes]
            if format not in writable:
                raise ValueError(f"format must be one of {['qkv', *writable]}, got {format!r}")
            return CHECKPOINT_FORMATS[format].save(self, directory)
        meta = {MODEL_TYPE_KEY: self.registry_name, **dataclasses.asdict(self.config)}
        return save_model(self, meta, directory)

    @classmethod
    def from_pretrained(cls, directory: Union[str, os.PathLike], map_location: str = "cpu",
                        **overrides: Any) -> "QKVModel":
        """Load a model written by ``save_pretrained`` (any registered model when called on
        ``QKVModel``; this class otherwise), or a Hugging Face checkpoint of an architecture qkv
        represents (``bert``, ``gpt2``, ``llama``, ...: ``qkv/hf/checkpoints.py``), or a llama.cpp
        ``.gguf`` file (``qkv/hf/llama.py``: de-quantized to float32, in memory). ``overrides``:
        config fields that do not change the weights' shapes (e.g. ``attention="window",
        attention_kwargs={"radius": 16}``, ``dropout``).

        Both formats are checked alike, in this order (``qkv._modelfile``): ``config.json`` parses
        into an object; every value is of its field's type and range (a finite number, an int, a
        name; ``from_config``) and the model fits in memory, or its size could not be estimated
        (``check_size``), before any tensor is built; the weights file's header names no tensor the
        model has no place for and gives each the shape the config makes, before any tensor is read;
        the weights have one floating dtype (a model saved in one, e.g. after ``.double()``, loads in
        it) and hold no NaN or inf. Anything else raises ``CheckpointError`` (a ``ValueError``,
        printed as one line by ``qkv``) naming the file and the field or tensor; nothing is unpickled.
        A directory whose save was killed mid-swap is finished first (``qkv._io.settle_directory``)."""
        directory = settle_directory(directory)  # a save killed mid-swap: finish it
        for reader in CHECKPOINT_FORMATS.values():  # another library's checkpoint (Hugging Face; a GGUF file)
            if reader.recognizes(directory):
                return reader.load(None if cls is QKVModel else cls, directory, map_location, **overrides)
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory} is not a model directory (config.json + model.safetensors, written by "
                                    f"save_pretrained or a Hugging Face checkpoint) nor a checkpoint file (.gguf)")
        config_path = directory / "config.json"
        meta = read_model_config(directory)  # the sizes are checked (from_config) before the weights are read
        if isinstance(meta.get("config"), dict) and "model" in meta:
            name, values = meta["model"], meta["config"]  # the older nested layout
        elif MODEL_TYPE_KEY in meta:
            values = dict(meta)
            name = values.pop(MODEL_TYPE_KEY)
        else:
            raise CheckpointError(f"{config_path} is not a qkv model config (no {MODEL_TYPE_KEY!r} field)")
        if not isinstance(name, str):
            raise CheckpointError(f"{config_path}: {MODEL_TYPE_KEY} must be a model name, got {short_repr(name)}")
        if cls is not QKVModel and name != cls.registry_name:
            raise ValueError(f"{directory} holds a {name!r} model, not {cls.registry_name!r}")
        try:
            model_cls = lookup("model", name) if cls is QKVModel else cls
            model = model_cls.from_config({**values, **overrides})
        except (ValueError, TypeError) as e:  # a value of the file (or an override) refused: one line naming both
            raise CheckpointError(f"{config_path}: {e}") from None
        state = load_model_tensors(directory, model)  # the header is checked against the model before reading
        model = load_dtype(state, model)  # saved after .double() / .half(): load so
        check_weights(directory / "model.safetensors", state, model)  # no silent cast, no NaN or inf
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            raise CheckpointError(f"{directory / 'model.safetensors'} does not fit a {name!r} model: "
                                  f"{' '.join(line.strip() for line in first[:3])[:300]}") from None
        return model.to(map_location)


def available_memory() -> Optional[int]:
    """Bytes of memory available to this process (Linux ``MemAvailable``, else physical memory)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


#: repeat counts up to this are built exactly on the meta device; larger ones are extrapolated
_EXACT_REPEATS = 64


def _repeat_fields(config: Any) -> Dict[str, int]:
    """The config's integer fields that count repeated modules (layers, heads of their own, hops)."""
    if not dataclasses.is_dataclass(config):
        return {}
    names = ("n_targets", "n_hops", "n_read_heads", "n_out_heads", "n_levels")
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if (f.name.endswith("layers") or f.name in names)
            and isinstance(getattr(config, f.name), int) and not isinstance(getattr(config, f.name), bool)}


def _raise_if_refused(error: Optional[BaseException]) -> None:
    """Raise, as the ``ValueError`` it is, what a model's own checks refused while it was built on
    the meta device (an unknown or bad knob: ``attention 'window' got unknown argument(s) ['radious'];
    it accepts [...]``): the config's error, not a size that cannot be estimated."""
    text = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else ""
    if isinstance(error, (TypeError, ValueError)) and not isinstance(error, OverflowError) and text \
            and "overflow" not in text.lower() and "out of range" not in text.lower():
        raise ValueError(text) from error


def _why_not(error: Optional[BaseException]) -> str:
    """Why building a model on the meta device failed, in a few words."""
    text = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else type(error).__name__
    if isinstance(error, OverflowError) or "overflow" in text.lower():
        return "its tensors would be too large for PyTorch to address"
    return f"building it on the meta device failed: {type(error).__name__}: {text[:200]}"


def _human_bytes(n: float) -> str:
    if n >= 10**18:
        return "over 1000 PB"
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def _size_fields(config: Any) -> str:
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
    big = sorted(((v, k) for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)), reverse=True)[:3]
    return ", ".join(f"{k}={v if v < 10**30 else short_repr(v)}" for v, k in big)


def load_pretrained(directory: Union[str, os.PathLike], map_location: str = "cpu") -> QKVModel:
    """Load any registered qkv model from a ``save_pretrained`` directory."""
    return QKVModel.from_pretrained(directory, map_location)
