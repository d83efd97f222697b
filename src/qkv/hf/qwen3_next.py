"""qkv's gated delta rule inside transformers' Qwen3-Next (``models/qwen3_next/modeling_qwen3_next.py``).

How the layer picks its function: ``Qwen3NextGatedDeltaNet.forward`` calls the module's globals
``torch_chunk_gated_delta_rule`` (prefill, training) and ``torch_recurrent_gated_delta_rule``
(one-token decoding with a cache) by name at each call. Each global is transformers'
``use_kernel_func_from_hub_with_fallback`` wrapper, which picks, once at import, a hub kernel (when
``kernels`` is installed and asked for), else fla's function (when ``flash-linear-attention`` is
installed), else the reference PyTorch function of that file. :func:`patch` replaces the two
globals — above the wrapper, so that qkv's functions serve whatever the wrapper would have picked,
and ``cu_seqlens`` (packed sequences), which the wrapper refuses on its PyTorch path, is honoured —
and keeps the originals; :func:`unpatch` puts them back. ``qkv.hf.attention.register()`` patches.

The functions: ``qkv.functional.chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``
(fla's signature and layout: ``(B, T, H, K)``, state ``(B, Hv, K, V)``). The layer passes its other
keyword arguments (transformers' ``**kwargs``) along; as transformers' own wrapper does, those the
function does not take are dropped, and every one it takes is honoured.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Callable, Dict, List, Tuple

from .. import functional

__all__ = ["patch", "unpatch", "patched", "MODULES"]

#: the transformers modules whose gated-delta-rule globals are replaced
MODULES: Tuple[str, ...] = ("transformers.models.qwen3_next.modeling_qwen3_next",)
#: global name -> qkv's function
_FUNCTIONS: Dict[str, Callable] = {
    "torch_chunk_gated_delta_rule": functional.chunk_gated_delta_rule,
    "torch_recurrent_gated_delta_rule": functional.fused_recurrent_gated_delta_rule,
}
_originals: Dict[Tuple[str, str], Callable] = {}  # (module, global) -> what was there


def _serving(function: Callable, name: str) -> Callable:
    """``function`` called with transformers' arguments: keywords it does not take are dropped."""
    taken = frozenset(inspect.signature(function).parameters)

    @functools.wraps(function)
    def call(*args, **kwargs):
        return function(*args, **{key: value for key, value in kwargs.items() if key in taken})

    call._qkv_serves = name
    return call


def patch() -> List[str]:
    """Put qkv's gated delta rule in place in every module of :data:`MODULES` that transformers has;
    returns ``["module.global", ...]`` patched (again: nothing changes)."""
    done = []
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a transformers without this model
            continue
        for name, function in _FUNCTIONS.items():
            current = getattr(module, name, None)
            if current is None:
                continue
            if not hasattr(current, "_qkv_serves"):
                _originals[(module_name, name)] = current
                setattr(module, name, _serving(function, name))
            done.append(f"{module_name}.{name}")
    return done


def unpatch() -> List[str]:
    """Give transformers its own functions back; returns what was restored."""
    restored = []
    for (module_name, name), original in list(_originals.items()):
        setattr(importlib.import_module(module_name), name, original)
        del _originals[(module_name, name)]
        restored.append(f"{module_name}.{name}")
    return restored


def patched() -> List[str]:
    """The globals that qkv's functions serve now."""
    return [f"{module_name}.{name}" for module_name, name in _originals]
