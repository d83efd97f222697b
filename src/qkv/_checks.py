"""Input validation at the public boundary: every message names the argument, what was expected
and what was given."""

from __future__ import annotations

import weakref
from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor


def tensor(name: str, x: object, ndim: Optional[int | Iterable[int]] = None, floating: bool = False) -> Tensor:
    """Check that ``x`` is a tensor (of rank ``ndim``, floating point when asked)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            want = " or ".join(f"{d}-D" for d in allowed)
            raise ValueError(f"{name} must be {want}, got shape {tuple(x.shape)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def same(name_a: str, a: int, name_b: str, b: int, what: str) -> None:
    """Check that two sizes agree."""
    if a != b:
        raise ValueError(f"{what} of {name_a} ({a}) and {name_b} ({b}) must match")


def same_dtype(name: str, x: Tensor, owner: str, param: Tensor) -> None:
    """Check that input ``x`` has the dtype of ``owner``'s parameter ``param`` (TypeError naming both;
    under autocast the module casts, so any input dtype is accepted)."""
    if x.dtype != param.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"{name} has dtype {x.dtype} but the parameters of {owner} are {param.dtype}; convert the "
                        f"input (.to({param.dtype})) or the module (.to({x.dtype}))")


#: the last few id tensors found in range: ``id(tensor) -> (weak reference, version, vocab_size)``.
_checked_ids: "dict[int, tuple[weakref.ref, int, int]]" = {}


def token_ids(name: str, ids: object, vocab_size: int) -> Tensor:
    """Check a ``(B, L)`` tensor of token ids: ``torch.long`` or ``torch.int32`` (what
    ``nn.Embedding`` takes) with every value in ``[0, vocab_size)``.

    The range needs the values (on an accelerator, one device sync for both ends). A model checks its
    ids at its boundary and its parts check them again; a tensor already found in range for this
    ``vocab_size`` and not written since (its version counter, shared with its views) is not read again.
    Under ``torch.compile``/``torch.export`` tracing the values are not read (shape and dtype still are)."""
    tensor(name, ids, ndim=2)
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an integer (torch.long) tensor of token ids, got dtype {ids.dtype}")
    if not ids.numel() or torch.compiler.is_compiling():
        # A graph being traced (torch.compile, torch.export) must not branch on the values: the range
        # is checked eagerly only (an out-of-range id in a compiled graph is the embedding's error).
        return ids
    tracked = not ids.is_inference()  # (inference tensors keep no version counter: always read)
    seen = _checked_ids.get(id(ids)) if tracked else None
    if seen is not None and seen[0]() is ids and seen[1:] == (ids._version, vocab_size):
        return ids
    lo, hi = torch.stack(torch.aminmax(ids)).tolist()
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} must lie in [0, {vocab_size}), got min {lo}, max {hi}")
    return ids_in_range(ids, vocab_size)


def ids_in_range(ids: Tensor, vocab_size: int) -> Tensor:
    """Record ``ids`` as already known to lie in ``[0, vocab_size)`` (a decoding loop's tokens, drawn
    from ``vocab_size`` logits), so that ``token_ids`` does not read them again until they are written."""
    if not ids.is_inference():
        if len(_checked_ids) >= 8:
            _checked_ids.pop(next(iter(_checked_ids)))
        _checked_ids[id(ids)] = (weakref.ref(ids), ids._version, vocab_size)
    return ids


def positive_int(name: str, value: object, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


def probability(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def _bool_tensor(name: str, m: object) -> None:
    if not isinstance(m, Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor or None, got {type(m).__name__}")
    if m.dtype != torch.bool:
        raise TypeError(f"{name} must have dtype torch.bool (True = may attend), got {m.dtype}")


def mask(name: str, m: Optional[Tensor], shape: Sequence[int]) -> Optional[Tensor]:
    """Check a boolean mask that must broadcast to ``shape``; returns it unchanged."""
    if m is None:
        return None
    _bool_tensor(name, m)
    try:
        torch.broadcast_shapes(tuple(m.shape), tuple(shape))
    except RuntimeError:
        raise ValueError(f"{name} of shape {tuple(m.shape)} does not broadcast to {tuple(shape)}") from None
    if m.dim() > len(shape):
        raise ValueError(f"{name} has {m.dim()} dims; expected at most {len(shape)} (shape {tuple(shape)})")
    return m


def attention_mask(name: str, m: Optional[Tensor], B: int, M: int, N: int, H: Optional[int] = None) -> Optional[Tensor]:
    """Check an attention mask (bool, True = may attend) and give it a fixed rank.

    Accepts ``(B, N)`` — a key-padding mask — or ``(B, M, N)``, and with ``H`` given also
    ``(B, H, M, N)``; any size but ``N`` may be 1 (broadcast). Returns ``(B|1, M|1, N)``, or
    ``(B|1, H|1, M|1, N)`` when ``H`` is given.
    """
    if m is None:
        return None
    _bool_tensor(name, m)
    full = (B, M, N) if H is None else (B, H, M, N)
    if m.dim() == 2:
        if m.shape[0] not in (1, B) or m.shape[1] != N:
            raise ValueError(f"a 2-D {name} is a key-padding mask and must be (batch={B}, n_keys={N}), got "
                             f"{tuple(m.shape)}; pass an (M, N) pattern as {name}[None]" + ("" if H is None else "[None]"))
        m = m.unsqueeze(1)  # (B, 1, N)
    elif m.dim() == 4 and H is None or m.dim() not in (2, 3, 4):
        want = "2-D (B, N) or 3-D (B, M, N)" + ("" if H is None else " or 4-D (B, H, M, N)")
        raise ValueError(f"{name} must be {want}, got shape {tuple(m.shape)}")
    if H is not None and m.dim() == 3:
        m = m.unsqueeze(1)  # (B, 1, M|1, N)
    what = ("batch", "queries", "keys") if H is None else ("batch", "heads", "queries", "keys")
    for size, want, label in zip(m.shape, full, what):
        if size not in (1, want) or (label == "keys" and size != want):
            raise ValueError(f"{name} of shape {tuple(m.shape)} does not fit {full}: its {label} size is {size}, expected "
                             f"{want}" + ("" if label == "keys" else " or 1"))
    return m
