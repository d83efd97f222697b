"""qkv's tensor files: safetensors, written atomically, read without unpickling, checksummed.

A *model directory* (``save_model`` / ``load_model_state``) is what ``QKVModel.save_pretrained`` /
``from_pretrained`` use: ``config.json`` + ``model.safetensors``. Training checkpoints
(``qkv.train.checkpoint``) are tensor files of the same kind with a training header.

Tied weights (one tensor reachable under two names, e.g. an embedding shared with the output
layer) are stored once; the header lists the aliases and loading gives every name its tensor
back, so ``model.load_state_dict(state)`` re-fills both names and the tie survives.

Every file written here carries a SHA-256 of its tensors (names, dtypes, shapes and bytes) in its
header (key ``"qkv_sha256"``); reading verifies it, so a flipped bit is a ``CheckpointError``, not
silently wrong weights.

Nothing here calls ``torch.load``: a file cannot execute code when it is read.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Tuple, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from ._errors import UserError
from ._io import atomic_write, atomic_write_text

__all__ = [
    "CheckpointError",
    "check_weights",
    "tensors_checksum",
    "read_header",
    "read_tensors",
    "write_tensors",
    "expand_aliases",
    "save_model",
    "load_model_state",
    "read_model_config",
    "load_model_tensors",
]

_ALIASES_KEY = "qkv_aliases"
_CHECKSUM_KEY = "qkv_sha256"


class CheckpointError(UserError):
    """A checkpoint file is missing, truncated, corrupt, or does not match what loads it (a
    ``qkv.UserError``: the file, not qkv, is at fault)."""


# ----------------------------------------------------------------------------------------------
# Tensor files: tied tensors stored once, a checksum in the header
# ----------------------------------------------------------------------------------------------


def _dedupe(tensors: Mapping[str, Tensor]) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """Split ``tensors`` into unique CPU tensors and ``{alias: canonical name}`` for exact repeats.

    safetensors refuses tensors that share memory; an identical view (same storage, offset, shape,
    stride, dtype) is stored once, any other overlap is copied.
    """
    unique: Dict[str, Tensor] = {}
    aliases: Dict[str, str] = {}
    seen_view: Dict[tuple, str] = {}
    seen_storage: set = set()
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"tensor {name!r} must be a torch.Tensor, got {type(t).__name__}")
        t = t.detach()
        if t.device.type == "meta":
            raise ValueError(f"tensor {name!r} is on the meta device and has no data to save")
        ptr = t.untyped_storage().data_ptr() if t.numel() > 0 else None
        view = (t.device, ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if ptr is not None and view in seen_view:
            aliases[name] = seen_view[view]
            continue
        shared = ptr is not None and (t.device, ptr) in seen_storage
        t = t.to("cpu")
        # Copy whatever still shares memory (a slice of another tensor, a non-contiguous view).
        unique[name] = t.clone() if shared or not t.is_contiguous() else t
        if ptr is not None:
            seen_view[view] = name
            seen_storage.add((view[0], ptr))
    return unique, aliases


def tensors_checksum(tensors: Mapping[str, Tensor]) -> str:
    """SHA-256 over the tensors' names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def read_header(path: Path) -> Dict[str, str]:
    """The header metadata of a safetensors file, without reading its tensors, with clear errors."""
    from safetensors import safe_open

    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint file {str(path)!r} is corrupt or truncated: {e}") from e


def read_tensors(path: Path) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """All tensors and the header metadata of a safetensors file, with clear errors; the tensors'
    checksum is verified when the file has one."""
    metadata = read_header(path)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint file {str(path)!r} is corrupt or truncated: {e}") from e
    expected = metadata.get(_CHECKSUM_KEY)
    if expected is not None and tensors_checksum(tensors) != expected:
        raise CheckpointError(f"checkpoint file {str(path)!r} is corrupt: its tensors do not match the checksum in its header")
    return tensors, metadata


def write_tensors(path: Path, tensors: Mapping[str, Tensor], metadata: Dict[str, str]) -> Path:
    unique, aliases = _dedupe(tensors)
    metadata = dict(metadata)
    metadata[_ALIASES_KEY] = json.dumps(aliases)
    metadata[_CHECKSUM_KEY] = tensors_checksum(unique)
    return atomic_write(path, lambda tmp: save_file(unique, tmp, metadata=metadata))


def expand_aliases(tensors: Dict[str, Tensor], metadata: Mapping[str, str], path: Path) -> Dict[str, Tensor]:
    try:
        aliases = json.loads(metadata.get(_ALIASES_KEY, "{}"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint file {str(path)!r} has a corrupt alias table: {e}") from e
    for alias, canonical in aliases.items():
        if canonical not in tensors:
            raise CheckpointError(f"checkpoint file {str(path)!r}: alias {alias!r} names missing tensor {canonical!r}")
        tensors[alias] = tensors[canonical]
    return tensors


# ----------------------------------------------------------------------------------------------
# Model directories: config.json + model.safetensors
# ----------------------------------------------------------------------------------------------


def save_model(model: torch.nn.Module, config: Mapping[str, Any], directory: Union[str, os.PathLike]) -> Path:
    """Write ``directory/config.json`` and ``directory/model.safetensors`` (each atomically).

    ``config`` is a JSON-serialisable dict (e.g. ``dataclasses.asdict(model.config)``); tied
    weights are stored once and re-tied by ``load_model_state`` + ``load_state_dict``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    directory = Path(directory)
    try:
        text = json.dumps(dict(config), indent=2, sort_keys=True)
    except TypeError as e:
        raise TypeError(f"config is not JSON-serialisable: {e}") from e
    write_tensors(directory / "model.safetensors", model.state_dict(), {"format": "pt"})
    atomic_write_text(directory / "config.json", text + "\n")
    return directory


def load_model_state(directory: Union[str, os.PathLike]) -> Tuple[Dict[str, Any], Dict[str, Tensor]]:
    """Read a directory written by ``save_model``: ``(config dict, state_dict)``.

    The state dict has every name the model had (tied names share one tensor), so
    ``model.load_state_dict(state)`` works with ``strict=True``.
    """
    directory = Path(directory)
    return read_model_config(directory), load_model_tensors(directory)


def read_model_config(directory: Union[str, os.PathLike]) -> Any:
    """The parsed ``config.json`` of a model directory (read before any weight is)."""
    config_path = Path(directory) / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"model directory {str(directory)!r} has no config.json")
    try:
        return json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"config file {str(config_path)!r} is not valid JSON: {e}") from e


def load_model_tensors(directory: Union[str, os.PathLike]) -> Dict[str, Tensor]:
    """The state dict in a model directory's ``model.safetensors`` (tied names share one tensor)."""
    weights = Path(directory) / "model.safetensors"
    tensors, metadata = read_tensors(weights)
    return expand_aliases(tensors, metadata, weights)


def check_weights(path: Union[str, os.PathLike], state: Mapping[str, Tensor], model: "torch.nn.Module") -> None:
    """Refuse weights that would load silently wrong: a tensor whose dtype is not the model's
    (``load_state_dict`` would cast it) or a parameter holding NaN or inf. A ``CheckpointError`` names the
    file, the first such tensor and, for a dtype, the expected and the actual one."""
    expected = model.state_dict()
    for name, tensor in state.items():
        want = expected.get(name)
        if want is not None and tensor.dtype != want.dtype:
            raise CheckpointError(f"{str(path)!r}: tensor {name!r} is {str(tensor.dtype).replace('torch.', '')}, "
                                  f"the model expects {str(want.dtype).replace('torch.', '')}")
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    for name, tensor in state.items():  # weights only: a buffer may hold inf on purpose (a best-so-far loss)
        if name in parameters and (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(f"{str(path)!r}: tensor {name!r} holds {bad} non-finite value(s) (NaN or inf) "
                                  f"of {tensor.numel()}; these weights cannot be used")
