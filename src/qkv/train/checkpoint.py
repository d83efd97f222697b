"""Checkpoints as safetensors: written atomically, read without unpickling.

A *training checkpoint* is one ``.safetensors`` file holding everything needed to continue a run
exactly: model parameters and buffers (``model/<name>``), the optimizer's state tensors
(``optim/<param index>/<name>``, e.g. AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``), the random
number generators' states (``rng/<rank>/...``) and, as JSON in the safetensors header metadata
(key ``"qkv"``), the step, the optimizer's param groups and scalar state, the scheduler's state,
Python's and NumPy's scalar RNG state and caller-supplied ``extra`` data. One file means one
atomic ``os.replace``: a reader sees the old checkpoint or the new one, never half of each.

The file format (safetensors written atomically, tied tensors stored once, a SHA-256 of the
tensors in the header, checked on every read) and the model directories of ``save_pretrained``
are ``qkv._modelfile``'s; they are re-exported here. ``CheckpointManager.latest_intact`` skips a
corrupt newest checkpoint (with a warning) and gives the previous intact one.

Nothing here calls ``torch.load``: a checkpoint cannot execute code when it is read.
"""

from __future__ import annotations

import json
import os
import random
import re
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .._io import atomic_write, atomic_write_text
from .._modelfile import (CheckpointError, check_layout, check_weights, expand_aliases, load_model_state, load_model_tensors,
                          read_model_config, read_header, read_tensors, save_model, write_tensors)

__all__ = [
    "CheckpointError",
    "atomic_write",
    "atomic_write_text",
    "capture_rng_state",
    "restore_rng_state",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint_meta",
    "read_carried_state",
    "CheckpointManager",
    "save_model",
    "load_model_state",
    "read_model_config",
    "load_model_tensors",
]

FORMAT = "qkv-train-checkpoint/1"
_META_KEY = "qkv"
#: header fields every training checkpoint has
_REQUIRED = {"step": int, "extra": dict, "rng": list}


# ----------------------------------------------------------------------------------------------
# Random number generators
# ----------------------------------------------------------------------------------------------


def capture_rng_state() -> Dict[str, Any]:
    """The states of torch (CPU, every CUDA device), NumPy's and Python's global generators."""
    state: Dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of ``capture_rng_state``."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = list(state["cuda"])
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def _rng_to_stored(rank: int, state: Mapping[str, Any]) -> Tuple[Dict[str, Tensor], Dict[str, Any]]:
    """Tensors and JSON for one rank's RNG state."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    version, internal, gauss_next = state["python"]
    tensors = {
        f"rng/{rank}/torch": state["torch"].to("cpu"),
        f"rng/{rank}/numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
    }
    for i, s in enumerate(state.get("cuda", [])):
        tensors[f"rng/{rank}/cuda/{i}"] = s.to("cpu")
    meta = {
        "numpy": [kind, int(pos), int(has_gauss), float(cached)],
        "python": [version, list(internal), gauss_next],
        "n_cuda": len(state.get("cuda", [])),
    }
    return tensors, meta


def _rng_from_stored(rank: int, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]) -> Dict[str, Any]:
    kind, pos, has_gauss, cached = meta["numpy"]
    keys = tensors[f"rng/{rank}/numpy_keys"].numpy().astype(np.uint32)
    version, internal, gauss_next = meta["python"]
    state: Dict[str, Any] = {
        "torch": tensors[f"rng/{rank}/torch"],
        "numpy": (kind, keys, pos, has_gauss, cached),
        "python": (version, tuple(internal), gauss_next),
    }
    if meta["n_cuda"]:
        state["cuda"] = [tensors[f"rng/{rank}/cuda/{i}"] for i in range(meta["n_cuda"])]
    return state


# ----------------------------------------------------------------------------------------------
# Training checkpoints
# ----------------------------------------------------------------------------------------------


def _split_optimizer_state(optimizer: torch.optim.Optimizer) -> Tuple[Dict[str, Tensor], Dict[str, Any]]:
    """Flatten ``optimizer.state_dict()``: tensors under ``optim/<index>/<name>``, the rest as JSON."""
    sd = optimizer.state_dict()
    tensors: Dict[str, Tensor] = {}
    scalars: Dict[str, Dict[str, Any]] = {}
    for index, entry in sd["state"].items():
        for name, value in entry.items():
            if isinstance(value, Tensor):
                tensors[f"optim/{index}/{name}"] = value
            else:
                scalars.setdefault(str(index), {})[name] = value
    for group in sd["param_groups"]:
        for key, value in group.items():
            if isinstance(value, Tensor):
                raise TypeError(f"optimizer param group entry {key!r} is a tensor; use a float")
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars, "class": type(optimizer).__name__}


def _join_optimizer_state(optimizer: torch.optim.Optimizer, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]) -> Dict[str, Any]:
    state: Dict[int, Dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim/"):
            _, index, name = key.split("/", 2)
            state.setdefault(int(index), {})[name] = value
    for index, entries in meta["scalars"].items():
        state.setdefault(int(index), {}).update(entries)
    # JSON turned tuples (AdamW's betas) into lists; give them back the current groups' types.
    groups = []
    for saved, current in zip(meta["param_groups"], optimizer.param_groups):
        groups.append({k: tuple(v) if isinstance(current.get(k), tuple) else v for k, v in saved.items()})
    return {"state": state, "param_groups": groups}


def save_checkpoint(
    path: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    scheduler: Optional[torch.optim.lr_scheduler.LRScheduler] = None,
    *,
    step: int,
    rng_states: Optional[List[Mapping[str, Any]]] = None,
    extra: Optional[Mapping[str, Any]] = None,
    carried: Optional[List[Mapping[str, Tensor]]] = None,
) -> Path:
    """Write a training checkpoint to ``path`` atomically.

    Args:
        model: the (unwrapped) module; its ``state_dict()`` is saved, tied tensors once.
        optimizer, scheduler: saved when given (scheduler state must be JSON-serialisable, as the
            ``qkv.train.schedules`` ones are).
        step: number of optimizer updates done.
        rng_states: one ``capture_rng_state()`` per rank (index = rank); default: this process's.
        extra: JSON-serialisable data kept in the header (e.g. the training config).
        carried: per rank, the named tensors of the model state carried between batches
            (Transformer-XL's memory); ``read_carried_state`` gives them back.
    Returns the path written.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    tensors: Dict[str, Tensor] = {f"model/{k}": v for k, v in model.state_dict().items()}
    meta: Dict[str, Any] = {"format": FORMAT, "step": step, "extra": dict(extra or {})}
    if optimizer is not None:
        optim_tensors, meta["optimizer"] = _split_optimizer_state(optimizer)
        tensors.update(optim_tensors)
    if scheduler is not None:
        meta["scheduler"] = scheduler.state_dict()
    for rank, named in enumerate(carried or []):
        tensors.update({f"carry/{rank}/{name}": t.detach().cpu().contiguous() for name, t in named.items()})
    meta["rng"] = []
    for rank, state in enumerate(rng_states if rng_states is not None else [capture_rng_state()]):
        rng_tensors, rng_meta = _rng_to_stored(rank, state)
        tensors.update(rng_tensors)
        meta["rng"].append(rng_meta)
    try:
        header = json.dumps(meta)
    except TypeError as e:
        raise TypeError(f"checkpoint metadata (scheduler state or extra) is not JSON-serialisable: {e}") from e
    return write_tensors(Path(path), tensors, {_META_KEY: header})


def read_checkpoint_meta(path: str | os.PathLike) -> Dict[str, Any]:
    """The JSON header of a training checkpoint (step, extra, ...), without loading tensors."""
    path = Path(path)
    return _parse_meta(read_header(path), path)


def read_carried_state(path: str | os.PathLike, rank: int = 0) -> Dict[str, Tensor]:
    """The carried-state tensors ``save_checkpoint(carried=...)`` stored for ``rank`` (``{}`` if none)."""
    path = Path(path)
    tensors, _ = read_tensors(path)
    prefix = f"carry/{rank}/"
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def _parse_meta(metadata: Mapping[str, str], path: Path) -> Dict[str, Any]:
    if _META_KEY not in metadata:
        raise CheckpointError(f"checkpoint file {str(path)!r} is not a qkv training checkpoint (no {_META_KEY!r} header)")
    try:
        meta = json.loads(metadata[_META_KEY])
    except (ValueError, RecursionError) as e:  # not JSON, nested too deeply, a 5,000-digit integer
        raise CheckpointError(f"checkpoint file {str(path)!r} has a corrupt header: "
                              f"{str(e).splitlines()[0] if str(e) else 'nested too deeply'}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise CheckpointError(f"checkpoint file {str(path)!r} has format {found!r}; expected {FORMAT!r}")
    for key, kind in _REQUIRED.items():
        if not isinstance(meta.get(key), kind):
            raise CheckpointError(f"checkpoint file {str(path)!r}: its header has no valid {key!r} field")
    return meta


def load_checkpoint(
    path: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    scheduler: Optional[torch.optim.lr_scheduler.LRScheduler] = None,
    *,
    rank: Optional[int] = 0,
    strict: bool = True,
) -> Dict[str, Any]:
    """Restore a training checkpoint written by ``save_checkpoint`` in place.

    Args:
        model, optimizer, scheduler: restored when given (the optimizer/scheduler must have been
            saved too).
        rank: whose RNG states to restore; ``None`` leaves the generators alone. A rank the
            checkpoint has no state for raises ``CheckpointError``.
        strict: passed to ``model.load_state_dict``.
    Returns the header: ``{"step": int, "extra": dict, ...}``.
    Raises ``CheckpointError`` (naming the file) for a missing, truncated or corrupt file or one
    whose contents do not fit the model/optimizer.
    """
    path = Path(path)
    _parse_meta(read_header(path), path)
    _check_layout_fits(path, model, strict)  # from the header, before any tensor is read
    tensors, metadata = read_tensors(path)
    meta = _parse_meta(metadata, path)
    tensors = expand_aliases(tensors, metadata, path)
    try:
        _load_into(path, tensors, meta, model, optimizer, scheduler, rank, strict)
    except (KeyError, TypeError, IndexError) as e:
        raise CheckpointError(f"checkpoint file {str(path)!r} lacks a field it needs: {e}") from None
    return meta


def _check_layout_fits(path: Path, model: torch.nn.Module, strict: bool) -> None:
    """Refuse, from the file's header (``qkv._modelfile.check_layout``), a tensor outside a training
    checkpoint's families (``model/``, ``optim/``, ``rng/``, ``carry/``) or a ``model/`` tensor the
    model has no place for (``strict``) or of another shape: a sparse 4 GiB stray tensor costs nothing."""
    expected = {f"model/{name}": tuple(t.shape) for name, t in model.state_dict().items()}
    others = ("optim/", "rng/", "carry/") + (() if strict else ("model/",))
    check_layout(path, expected, optional=lambda name: name.startswith(others),
                 mismatch="; the checkpoint does not fit the model (another architecture or size)")


def _load_into(path: Path, tensors: Dict[str, Tensor], meta: Dict[str, Any], model: torch.nn.Module,
               optimizer: Optional[torch.optim.Optimizer], scheduler: Any, rank: Optional[int], strict: bool) -> None:
    model_state = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    check_weights(path, model_state, model)
    try:
        model.load_state_dict(model_state, strict=strict)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint file {str(path)!r} does not fit the model: {e}") from e
    if optimizer is not None:
        if "optimizer" not in meta:
            raise CheckpointError(f"checkpoint file {str(path)!r} holds no optimizer state")
        try:
            optimizer.load_state_dict(_join_optimizer_state(optimizer, tensors, meta["optimizer"]))
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint file {str(path)!r} does not fit the optimizer: {e}") from e
    if scheduler is not None:
        if "scheduler" not in meta:
            raise CheckpointError(f"checkpoint file {str(path)!r} holds no scheduler state")
        scheduler.load_state_dict(meta["scheduler"])
    if rank is not None:
        if not 0 <= rank < len(meta["rng"]):
            raise CheckpointError(f"checkpoint file {str(path)!r} has RNG states for {len(meta['rng'])} rank(s), not for rank {rank}")
        restore_rng_state(_rng_from_stored(rank, tensors, meta["rng"][rank]))


class CheckpointManager:
    """The checkpoints of one run: ``<directory>/step-00000100.safetensors`` files, the last
    ``keep_last`` of them kept, and a ``latest`` file naming the newest (written atomically after
    the checkpoint itself, so it never names a file that is not complete)."""

    _PATTERN = re.compile(r"^step-(\d+)\.safetensors$")

    def __init__(self, directory: str | os.PathLike, keep_last: Optional[int] = 3) -> None:
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last must be an int >= 1 or None (keep all), got {keep_last!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last

    def path_for(self, step: int) -> Path:
        return self.directory / f"step-{step:08d}.safetensors"

    def checkpoints(self) -> List[Path]:
        """Complete checkpoint files, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := self._PATTERN.match(p.name))]
        return [p for _, p in sorted(found)]

    def latest(self) -> Optional[Path]:
        """The checkpoint ``latest`` names, else the newest file present, else None."""
        pointer = self.directory / "latest"
        if pointer.is_file():
            target = self.directory / pointer.read_text(encoding="utf-8").strip()
            if target.is_file():
                return target
        found = self.checkpoints()
        return found[-1] if found else None

    def latest_intact(self) -> Optional[Path]:
        """The newest checkpoint that reads back whole (header and checksum); a corrupt one is
        reported with a warning and skipped. None when there is none."""
        newest = self.latest()
        candidates = [p for p in reversed(self.checkpoints()) if p != newest]
        for path in ([newest] if newest is not None else []) + candidates:
            try:
                _parse_meta(read_tensors(path)[1], path)
            except CheckpointError as e:
                warnings.warn(f"{e}; trying the previous checkpoint", stacklevel=2)
                continue
            return path
        return None

    def load_latest(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    scheduler: Any = None, *, rank: Optional[int] = 0, strict: bool = True,
                    attempts: int = 10) -> Optional[Tuple[Path, Dict[str, Any]]]:
        """``load_checkpoint`` of the newest checkpoint that reads back whole, into ``model`` (and
        ``optimizer``, ``scheduler``); ``(its path, its header)``, or None when there is none.

        For a reader beside a run that is still training (``qkv eval``, ``qkv generate``): the
        writer may remove the checkpoint being read (``keep_last``) or write newer ones meanwhile.
        A checkpoint that vanishes under the reader is not an error: the list is read again and
        the newest one loaded (at most ``attempts`` times). A corrupt one is skipped with a warning,
        as by ``latest_intact``. Nothing is loaded into ``model`` from a checkpoint that failed."""
        for _ in range(attempts):
            vanished = False
            newest = self.latest()
            for path in ([newest] if newest is not None else []) + [p for p in reversed(self.checkpoints()) if p != newest]:
                try:
                    return path, load_checkpoint(path, model, optimizer, scheduler, rank=rank, strict=strict)
                except CheckpointError as e:
                    if not path.exists():  # removed while it was read: the writer moved on
                        vanished = True
                        break
                    warnings.warn(f"{e}; trying the previous checkpoint", stacklevel=2)
            if not vanished:
                return None
        raise CheckpointError(f"the checkpoints in {str(self.directory)!r} were replaced faster than they could be read "
                              f"({attempts} tries); retry, or save less often (--save-every)")

    def save(self, step: int, model: torch.nn.Module, optimizer=None, scheduler=None, **kwargs: Any) -> Path:
        """``save_checkpoint`` to ``path_for(step)``, point ``latest`` at it, drop old ones."""
        path = save_checkpoint(self.path_for(step), model, optimizer, scheduler, step=step, **kwargs)
        atomic_write_text(self.directory / "latest", path.name + "\n")
        if self.keep_last is not None:
            for old in self.checkpoints()[: -self.keep_last]:
                if old != path:
                    old.unlink(missing_ok=True)
        for pattern in (".step-*.tmp", ".latest.*.tmp"):  # left by a writer that died mid-write
            for stale in self.directory.glob(pattern):
                stale.unlink(missing_ok=True)
        return path
