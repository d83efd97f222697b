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

A model directory changes as a whole (``qkv._io.atomic_directory``): a process killed while
saving leaves the old model or the new one, never new weights beside an old ``config.json``.

What every format's loading checks, in this order, is here once: the config file parses into a
JSON object (``read_config``: one line naming the file, whatever it holds); the weights file's
header names no tensor the model has no place for and gives every one the shape the config
makes (``check_layout``, before any tensor is read); the tensors have the model's dtype and hold
no NaN or inf (``check_weights``).

Nothing here calls ``torch.load``: a file cannot execute code when it is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from ._errors import UserError
from ._io import atomic_directory, atomic_write, settle_directory

__all__ = [
    "CheckpointError",
    "read_config",
    "read_layout",
    "check_layout",
    "check_weights",
    "load_dtype",
    "tensors_checksum",
    "read_header",
    "read_tensors",
    "write_tensors",
    "write_safetensors",
    "expand_aliases",
    "save_model",
    "load_model_state",
    "read_model_config",
    "load_model_tensors",
    "RUN_FILE",
]

_ALIASES_KEY = "qkv_aliases"
_CHECKSUM_KEY = "qkv_sha256"
#: the file that makes a directory a run (``qkv.runs`` writes it), not a model directory: a model
#: directory beside it (``config.json``) is read as a run's, by the command and ``--init`` alike
RUN_FILE = "run.json"
#: a config.json larger than this is not a model's configuration
MAX_CONFIG_BYTES = 64 * 2**20


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
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:  # RuntimeError: safe_open of a file removed meanwhile
        raise CheckpointError(f"checkpoint file {str(path)!r} is corrupt or truncated: {_first_line(e)}") from None


def read_tensors(path: Path) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """All tensors and the header metadata of a safetensors file, with clear errors; the tensors'
    checksum is verified when the file has one."""
    metadata = read_header(path)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:  # RuntimeError: safe_open of a file removed meanwhile
        raise CheckpointError(f"checkpoint file {str(path)!r} is corrupt or truncated: {_first_line(e)}") from None
    expected = metadata.get(_CHECKSUM_KEY)
    if expected is not None and tensors_checksum(tensors) != expected:
        raise CheckpointError(f"checkpoint file {str(path)!r} is corrupt: its tensors do not match the checksum in its header")
    return tensors, metadata


def write_tensors(path: Path, tensors: Mapping[str, Tensor], metadata: Dict[str, str]) -> Path:
    unique, aliases = _dedupe(tensors)
    metadata = dict(metadata)
    metadata[_ALIASES_KEY] = json.dumps(aliases)
    metadata[_CHECKSUM_KEY] = tensors_checksum(unique)
    return atomic_write(path, lambda tmp: write_safetensors(unique, tmp, metadata))


def write_safetensors(tensors: Dict[str, Tensor], path: str, metadata: Dict[str, str]) -> None:
    """``safetensors.torch.save_file``, whose failure to write (``SafetensorError`` "... (os error
    28)") is given back as the ``OSError`` it is, so that a full disk is one line
    (``qkv._io.unwritable``), not a serializer's error."""
    try:
        save_file(tensors, path, metadata=metadata)
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), path) from None


def _alias_table(metadata: Mapping[str, str], path: Path) -> Dict[str, str]:
    try:
        aliases = json.loads(metadata.get(_ALIASES_KEY, "{}"))
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"checkpoint file {str(path)!r} has a corrupt alias table: {_first_line(e)}") from None
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise CheckpointError(f"checkpoint file {str(path)!r} has a corrupt alias table: expected names to names")
    return aliases


def expand_aliases(tensors: Dict[str, Tensor], metadata: Mapping[str, str], path: Path) -> Dict[str, Tensor]:
    aliases = _alias_table(metadata, path)
    for alias, canonical in aliases.items():
        if canonical not in tensors:
            raise CheckpointError(f"checkpoint file {str(path)!r}: alias {alias!r} names missing tensor {canonical!r}")
        tensors[alias] = tensors[canonical]
    return tensors


# ----------------------------------------------------------------------------------------------
# Model directories: config.json + model.safetensors
# ----------------------------------------------------------------------------------------------


def save_model(model: torch.nn.Module, config: Mapping[str, Any], directory: Union[str, os.PathLike]) -> Path:
    """Write ``directory/config.json`` and ``directory/model.safetensors``, the directory replaced
    as a whole (``qkv._io.atomic_directory``; the other files it held are kept).

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
    state = model.state_dict()
    with atomic_directory(directory) as tmp:
        write_tensors(tmp / "model.safetensors", state, {"format": "pt"})
        (tmp / "config.json").write_text(text + "\n", encoding="utf-8")
    return directory


def load_model_state(directory: Union[str, os.PathLike]) -> Tuple[Dict[str, Any], Dict[str, Tensor]]:
    """Read a directory written by ``save_model``: ``(config dict, state_dict)``.

    The state dict has every name the model had (tied names share one tensor), so
    ``model.load_state_dict(state)`` works with ``strict=True``.
    """
    directory = settle_directory(directory)
    return read_model_config(directory), load_model_tensors(directory)


def read_model_config(directory: Union[str, os.PathLike]) -> Dict[str, Any]:
    """The parsed ``config.json`` of a model directory (read before any weight is)."""
    config_path = Path(directory) / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"model directory {str(directory)!r} has no config.json")
    return read_config(config_path)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def read_config(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """A JSON config file as a dict, or one ``CheckpointError`` line naming the file: missing,
    unreadable, larger than ``MAX_CONFIG_BYTES``, not UTF-8 JSON, nested too deeply for the parser,
    an integer of more digits than Python converts, or not a JSON object."""
    path = Path(path)
    text = ""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise CheckpointError(f"config file {str(path)!r} is {size} bytes; a model config is at most {MAX_CONFIG_BYTES}")
        text = path.read_text(encoding="utf-8")
        value = json.loads(text)
    except RecursionError:
        field = _field_before(text, r"(?:[\[{]\s*){500}")
        raise CheckpointError(f"config file {str(path)!r}: {field}is nested too deeply to be a model config") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"config file {str(path)!r} is not valid JSON: {_first_line(e)}") from None
    except (OSError, ValueError) as e:  # UnicodeDecodeError; an integer of more digits than Python converts
        field = _field_before(text, r"-?\d{4000}")
        raise CheckpointError(f"config file {str(path)!r} is not valid JSON: {field}{_first_line(e)}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"config file {str(path)!r} must hold a JSON object, got {type(value).__name__}")
    return value


def _field_before(text: str, value: str) -> str:
    """``"field NAME: "`` for the first ``"NAME": <value>`` in ``text`` (to name what a parser
    that stopped without a position refused), else ``""``."""
    found = re.search(r'"((?:[^"\\]|\\.){1,100})"\s*:\s*' + value, text[:MAX_CONFIG_BYTES])
    return f"field {found.group(1)!r}: " if found else ""


def read_layout(path: Union[str, os.PathLike]) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` of a safetensors file, from its header: no tensor is read."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: (str(f.get_slice(name).get_dtype()), tuple(f.get_slice(name).get_shape())) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:  # RuntimeError: safe_open of a file removed meanwhile
        raise CheckpointError(f"checkpoint file {str(path)!r} is not a safetensors file (corrupt, truncated or another "
                              f"format): {_first_line(e)}") from None


def _list(names: List[str], limit: int = 4) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


#: what a model directory whose weights do not fit its config.json most likely is
_MIXED = (" (from config.json); the weights and the config beside them come from different models (written by hand, "
          "or half-written by an older qkv)")


def check_layout(path: Union[str, os.PathLike], expected: Mapping[str, Tuple[int, ...]],
                 optional: Callable[[str], bool] = lambda name: False,
                 required: Optional[List[str]] = None, mismatch: str = _MIXED) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """Check a safetensors file's header against the tensors a model expects (``{name: shape}``),
    before anything is read: a tensor it has no place for (unless ``optional(name)``), one of
    another shape, or one of ``required`` missing is a one-line ``CheckpointError`` naming the
    file and the tensors (and ``mismatch``: what a wrong shape means). A 4 GiB tensor that does not
    belong is refused without reading it. Returns the layout (``read_layout``)."""
    path = Path(path)
    layout = read_layout(path)
    extra = [n for n in layout if n not in expected and not optional(n)]
    wrong = [n for n in layout if n in expected and tuple(layout[n][1]) != tuple(expected[n])]
    missing = [n for n in (required or []) if n not in layout]
    if wrong:
        first = wrong[0]
        more = f" (and {len(wrong) - 1} more tensors)" if len(wrong) > 1 else ""
        raise CheckpointError(f"{str(path)!r}: {first} has shape {tuple(layout[first][1])}, expected "
                              f"{tuple(expected[first])}{more}{mismatch}")
    if extra and missing:
        raise CheckpointError(f"{str(path)!r} holds {len(extra)} tensor(s) the model has no place for ({_list(extra)}) "
                              f"and lacks {len(missing)} it needs ({_list(missing)}){mismatch}")
    if extra:
        raise CheckpointError(f"{str(path)!r} holds {len(extra)} tensor(s) the model has no place for: {_list(extra)}")
    if missing:
        raise CheckpointError(f"{str(path)!r} lacks {len(missing)} tensor(s) the model needs: {_list(missing)}")
    return layout


def load_model_tensors(directory: Union[str, os.PathLike], model: Optional[torch.nn.Module] = None) -> Dict[str, Tensor]:
    """The state dict in a model directory's ``model.safetensors`` (tied names share one tensor);
    with ``model``, the file's header is first checked against it (``check_layout``: every name
    and shape, aliases included), so that a file that does not fit is refused before it is read."""
    weights = Path(directory) / "model.safetensors"
    if model is not None:
        expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        aliases = _alias_table(read_header(weights), weights)
        stray = [a for a, c in aliases.items() if a not in expected or c not in expected]
        if stray:
            raise CheckpointError(f"{str(weights)!r}: its alias table names tensor(s) the model has no place for: {_list(stray)}")
        check_layout(weights, expected, required=[n for n in expected if n not in aliases])
    tensors, metadata = read_tensors(weights)
    return expand_aliases(tensors, metadata, weights)


def load_dtype(state: Mapping[str, Tensor], model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in the floating dtype of the weights in ``state`` when they all have one and the
    model all another (saved after ``.double()`` / ``.half()``: it loads so); else ``model`` as it
    is, and ``check_weights`` refuses a tensor of another dtype than the model's."""
    stored = {t.dtype for t in state.values() if t.is_floating_point()}
    built = {t.dtype for t in model.state_dict().values() if t.is_floating_point()}
    if len(stored) == 1 and len(built) == 1 and stored != built:
        return model.to(stored.pop())
    return model


def check_weights(path: Union[str, os.PathLike], state: Mapping[str, Tensor], model: "torch.nn.Module",
                  names: Optional[Mapping[str, str]] = None) -> None:
    """Refuse weights that would load silently wrong: a tensor whose dtype is not the model's
    (``load_state_dict`` would cast it) or a parameter holding NaN or inf. A ``CheckpointError`` names the
    file, the first such tensor (as the file names it: ``names`` maps the model's names to the
    file's, for another library's layout) and, for a dtype, the expected and the actual one."""
    expected = model.state_dict()
    names = names or {}
    for name, tensor in state.items():
        want = expected.get(name)
        if want is not None and tensor.dtype != want.dtype:
            raise CheckpointError(f"{str(path)!r}: tensor {names.get(name, name)!r} is {str(tensor.dtype).replace('torch.', '')}, "
                                  f"the model expects {str(want.dtype).replace('torch.', '')}")
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    for name, tensor in state.items():  # weights only: a buffer may hold inf on purpose (a best-so-far loss)
        if name in parameters and (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(f"{str(path)!r}: tensor {names.get(name, name)!r} holds {bad} non-finite value(s) (NaN or inf) "
                                  f"of {tensor.numel()}; these weights cannot be used")
