"""What every qkv model shares: a ``Config`` dataclass, ``from_config``, and
``save_pretrained`` / ``from_pretrained`` (``config.json`` + ``model.safetensors``; loading never
unpickles). Models register with ``@register("model", name)``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, Optional, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from .._io import atomic_path, atomic_write_text
from ..registry import lookup

__all__ = ["ModelOutput", "QKVModel", "config_from_dict", "load_pretrained"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


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

    def save_pretrained(self, directory: Union[str, os.PathLike]) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory`` (each atomically).

        Tied parameters are stored once (safetensors forbids shared storage) and re-tied by
        construction on load.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors: Dict[str, Tensor] = {}
        seen: Dict[tuple, str] = {}
        for name, t in self.state_dict().items():
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
            if key in seen:
                continue  # a tied alias of an already stored tensor
            seen[key] = name
            tensors[name] = t.detach().contiguous().cpu()
        with atomic_path(directory / WEIGHTS_NAME) as tmp:
            save_file(tensors, str(tmp), metadata={"format": "pt", "model": self.registry_name})
        meta = {"model": self.registry_name, "config": dataclasses.asdict(self.config)}
        atomic_write_text(directory / CONFIG_NAME, json.dumps(meta, indent=2) + "\n")
        return directory

    @classmethod
    def from_pretrained(cls, directory: Union[str, os.PathLike], map_location: str = "cpu") -> "QKVModel":
        """Load a model written by ``save_pretrained`` (any registered model when called on
        ``QKVModel``; this class otherwise). Raises a clear error for a missing or corrupt file."""
        directory = Path(directory)
        config_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
        for p in (config_path, weights_path):
            if not p.is_file():
                raise FileNotFoundError(f"{p} not found: is {directory} a directory written by save_pretrained?")
        try:
            meta = json.loads(config_path.read_text())
            name, values = meta["model"], meta["config"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{config_path} is not a qkv model config ({e})") from None
        model_cls = lookup("model", name) if cls is QKVModel else cls
        if cls is not QKVModel and name != cls.registry_name:
            raise ValueError(f"{directory} holds a {name!r} model, not {cls.registry_name!r}")
        model = model_cls.from_config(values)
        try:
            tensors = load_file(str(weights_path), device=map_location)
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"{weights_path} is corrupt or truncated: {e}") from None
        expected = model.state_dict()
        missing = sorted(set(expected) - set(tensors))
        # names absent from the file must be tied aliases of stored tensors
        aliases = {n for n in missing if any(expected[n] is expected[m] or (
            expected[n].untyped_storage().data_ptr() == expected[m].untyped_storage().data_ptr()) for m in tensors if m in expected)}
        if set(missing) - aliases:
            raise ValueError(f"{weights_path} lacks parameters {sorted(set(missing) - aliases)[:5]} of {name!r}")
        unexpected = sorted(set(tensors) - set(expected))
        if unexpected:
            raise ValueError(f"{weights_path} has parameters {unexpected[:5]} that {name!r} does not")
        model.load_state_dict(tensors, strict=False)
        return model


def load_pretrained(directory: Union[str, os.PathLike], map_location: str = "cpu") -> QKVModel:
    """Load any registered qkv model from a ``save_pretrained`` directory."""
    return QKVModel.from_pretrained(directory, map_location)
