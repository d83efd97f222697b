"""What every qkv model shares: a ``Config`` dataclass, ``from_config``, and
``save_pretrained`` / ``from_pretrained`` (``config.json`` + ``model.safetensors``; loading never
unpickles). Models register with ``@register("model", name)``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Union

from torch import Tensor, nn

from ..registry import lookup

__all__ = ["ModelOutput", "QKVModel", "config_from_dict", "load_pretrained"]

@dataclass
class ModelOutput:
    """What a model's ``forward`` returns.

    loss:    scalar training loss when targets were given, else None.
    logits:  the prediction scores.
    weights: attention weights when asked for (``need_weights=True``): model-specific structure
             (e.g. a list with one ``(B, H, M, N)`` tensor per layer), documented by each model.
    state:   what continues the computation (KV caches, memories), when asked for.
    aux:     named extra losses or statistics (e.g. ponder cost, span loss).
    """

    loss: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    weights: Any = None
    state: Any = None
    aux: Dict[str, Any] = field(default_factory=dict)


def config_from_dict(config_class: type, values: Dict[str, Any]) -> Any:
    """Build ``config_class`` from a dict, rejecting unknown keys with a clear message."""
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {config_class.__name__} field(s) {unknown}; known: {sorted(known)}")
    tuples = {f.name for f in dataclasses.fields(config_class) if "tuple" in str(f.type).lower()}
    return config_class(**{k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in values.items()})


class QKVModel(nn.Module):
    """Base class of qkv's models: ``Model(config)``, ``from_config``, ``save_pretrained``,
    ``from_pretrained``. Subclasses set ``config_class`` and are registered as ``"model"``."""

    config_class: ClassVar[type]
    registry_name: ClassVar[str] = ""
    #: the task kinds (docs/contracts.md) whose batches ``forward`` takes; None: not declared.
    task_kinds: ClassVar[Optional[frozenset]] = None
    #: config fields the new task sets when a run starts from another run's weights (``--init``)
    init_task_fields: ClassVar[tuple] = ()
    #: parameter-name prefixes that start fresh under ``--init`` (the new task's head)
    init_fresh: ClassVar[tuple] = ()

    def __init__(self, config: Any) -> None:
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    @classmethod
    def from_config(cls, config: Union[Any, Dict[str, Any]]) -> "QKVModel":
        """Build from a ``config_class`` instance or a plain dict of its fields."""
        if isinstance(config, dict):
            config = config_from_dict(cls.config_class, config)
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

    def save_pretrained(self, directory: Union[str, os.PathLike]) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory`` (each atomically;
        tied parameters stored once)."""
        from ..train.checkpoint import save_model

        meta = {"model": self.registry_name, "config": dataclasses.asdict(self.config)}
        return save_model(self, meta, directory)

    @classmethod
    def from_pretrained(cls, directory: Union[str, os.PathLike], map_location: str = "cpu") -> "QKVModel":
        """Load a model written by ``save_pretrained`` (any registered model when called on
        ``QKVModel``; this class otherwise). A missing, corrupt or truncated file raises
        ``CheckpointError`` (a ``ValueError``) naming it; nothing is unpickled."""
        from ..train.checkpoint import CheckpointError, load_model_state

        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory} is not a directory written by save_pretrained")
        meta, state = load_model_state(directory)
        try:
            name, values = meta["model"], meta["config"]
        except (KeyError, TypeError):
            raise CheckpointError(f"{directory / 'config.json'} is not a qkv model config (no 'model'/'config' keys)") from None
        if cls is not QKVModel and name != cls.registry_name:
            raise ValueError(f"{directory} holds a {name!r} model, not {cls.registry_name!r}")
        model = (lookup("model", name) if cls is QKVModel else cls).from_config(values)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise CheckpointError(f"{directory / 'model.safetensors'} does not fit a {name!r} model: {e}") from None
        return model.to(map_location)


def load_pretrained(directory: Union[str, os.PathLike], map_location: str = "cpu") -> QKVModel:
    """Load any registered qkv model from a ``save_pretrained`` directory."""
    return QKVModel.from_pretrained(directory, map_location)
