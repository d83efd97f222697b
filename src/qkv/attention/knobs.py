"""Example knobs of each kernel for a sequence length: what ``qkv bench`` measures a kernel with
and what ``qkv viz --pattern`` draws it with, unless the command line gives others."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

from ..registry import lookup

__all__ = ["DEFAULT_KWARGS", "kernel_kwargs"]

#: Knobs each kernel is benchmarked with unless ``--kernel-kwargs`` overrides them: a dict, or a
#: function of the length ``L`` for knobs that depend on it. Names that are not (yet) registered
#: are simply unused; a knob the kernel's constructor does not accept is dropped with a note.
DEFAULT_KWARGS: Dict[str, Union[Dict[str, Any], Callable[[int], Dict[str, Any]]]] = {
    "window": {"radius": 64},
    "local-1d": {"block": 128, "memory": 128},
    "local-2d": lambda L: {"image_size": (max(1, L // 32), 32), "block": (8, 32)},
    "strided": lambda L: {"stride": max(1, math.isqrt(L))},  # l ~ sqrt(n) (Child et al. 2019): O(n sqrt n)
    "fixed": lambda L: {"stride": max(1, math.isqrt(L)), "c": 8},
    "lsh": {"bucket_size": 64, "n_rounds": 2},
    "linear": {},
    "linformer": {"k": 256},
    "performer": {"nb_features": 256},
    "efficient": {},
    "adaptive-span": {"max_span": 512},
    "relative": {"mem_len": 0},
}


def kernel_kwargs(name: str, length: int, heads: int, head_dim: int,
                  overrides: Optional[Mapping[str, Any]] = None) -> tuple[Dict[str, Any], List[str]]:
    """The constructor kwargs for kernel ``name`` at sequence length ``length``, and notes.

    Starts from ``DEFAULT_KWARGS``, fills ``seq_len`` (kernels with ``needs_seq_len``), ``n_heads``
    and ``d_head``/``head_dim`` when the constructor takes them, then applies ``overrides`` (which,
    unlike the defaults, must all be accepted: the registry raises on unknown ones).
    """
    cls = lookup("attention", name)
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    notes: List[str] = []
    default = DEFAULT_KWARGS.get(cls.registry_name, {})
    kwargs = dict(default(length) if callable(default) else default)
    for key in list(kwargs):
        if key not in params and not takes_any:
            notes.append(f"default knob {key}={kwargs.pop(key)!r} dropped: {name} does not take it")
    auto = {"n_heads": heads, "d_head": head_dim, "head_dim": head_dim}
    if getattr(cls, "needs_seq_len", False) or "seq_len" in params:
        auto["seq_len"] = length
    for key, value in auto.items():
        if key in params and key not in kwargs:
            kwargs[key] = value
    kwargs.update(overrides or {})
    return kwargs, notes
