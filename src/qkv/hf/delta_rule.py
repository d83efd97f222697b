"""qkv's delta-rule functions inside transformers' linear-attention layers: the gated delta rule of
Qwen3-Next (``models/qwen3_next/modeling_qwen3_next.py``) and Kimi Delta Attention of Kimi Linear
(``models/kimi_linear/modeling_kimi_linear.py``), one mechanism for both, driven by :data:`PATCHES`.

How a layer picks its function: ``Qwen3NextGatedDeltaNet.forward`` and ``KimiLinearDeltaAttention.forward``
call their module's globals (``torch_chunk_gated_delta_rule`` / ``chunk_kimi_delta_attention`` for
prefill and training, ``torch_recurrent_gated_delta_rule`` / ``recurrent_kimi_delta_attention`` for
one-token decoding with a cache) by name at each call. Each global is transformers'
``use_kernel_func_from_hub_with_fallback`` wrapper, which picks, once at import, a hub kernel (when
``kernels`` is installed and asked for), else fla's function (when ``flash-linear-attention`` is
installed), else the reference PyTorch function of that file. :func:`patch` replaces the globals —
above the wrapper, so that qkv's functions serve whatever the wrapper would have picked, and
``cu_seqlens`` (packed sequences), which the wrapper refuses on its PyTorch path, is honoured — and
keeps the originals; :func:`unpatch` puts them back. ``qkv.hf.attention.register()`` patches every
model of the table.

The functions (``qkv.functional``) have fla's signatures; the globals they replace may not
(transformers' take ``query, key, value`` and put ``chunk_size`` sixth, where fla puts ``scale``). A
patched global is therefore called as the one it replaced: its arguments, positional or named, are
bound by the replaced function's signature, renamed to fla's (``query`` -> ``q``, ...), and, as
transformers' own wrapper does for its PyTorch functions, those qkv's function does not take (fla's
Triton-only flags, the layer's other ``**kwargs``) are dropped; every one it takes is honoured, but
for the chunk sizes of :data:`DROPPED` (a speed knob of transformers' fallback, not of the result).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from .. import functional

__all__ = ["patch", "unpatch", "patched", "PATCHES", "QWEN3_NEXT", "KIMI_LINEAR"]

QWEN3_NEXT = "transformers.models.qwen3_next.modeling_qwen3_next"
KIMI_LINEAR = "transformers.models.kimi_linear.modeling_kimi_linear"
#: transformers module -> {global name: qkv's function that replaces it}
PATCHES: Dict[str, Dict[str, Callable]] = {
    QWEN3_NEXT: {
        "torch_chunk_gated_delta_rule": functional.chunk_gated_delta_rule,
        "torch_recurrent_gated_delta_rule": functional.fused_recurrent_gated_delta_rule,
    },
    KIMI_LINEAR: {
        "chunk_kimi_delta_attention": functional.chunk_kda,
        "recurrent_kimi_delta_attention": functional.fused_recurrent_kda,
    },
}
#: transformers' argument names -> fla's (qkv.functional's)
RENAMED: Dict[str, str] = {"query": "q", "key": "k", "value": "v"}
#: global -> arguments of transformers' call not passed on: KDA's ``chunk_size`` is the chunking of
#: transformers' own fallback (64); the result does not depend on it, and qkv's per-channel engine is
#: fastest with its own (``chunk_kda``'s default, 8: 0.21 of transformers' fallback's forward time and
#: 0.08 of its forward + backward at T = 2,048, against 0.71 and 0.36 with chunks of 64; docs/benchmarks.md)
DROPPED: Dict[str, frozenset] = {"chunk_kimi_delta_attention": frozenset({"chunk_size"})}
_originals: Dict[Tuple[str, str], Callable] = {}  # (module, global) -> what was there


def _serving(function: Callable, replaced: Callable, name: str) -> Callable:
    """``function`` called as ``replaced`` is: arguments bound by ``replaced``'s signature, renamed by
    :data:`RENAMED`, those ``function`` does not take dropped."""
    theirs = inspect.signature(replaced)  # through the hub wrapper's __wrapped__: the function it wraps
    taken = frozenset(inspect.signature(function).parameters) - DROPPED.get(name, frozenset())

    @functools.wraps(function)
    def call(*args, **kwargs):
        named = {}
        for key, value in theirs.bind(*args, **kwargs).arguments.items():  # a call the original refuses raises
            kind = theirs.parameters[key].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)  # the layer's other keyword arguments
            elif kind is not inspect.Parameter.VAR_POSITIONAL:
                named[RENAMED.get(key, key)] = value
        return function(**{key: value for key, value in named.items() if key in taken})

    call._qkv_serves = name
    return call


def _modules(modules: Optional[Iterable[str]]) -> List[str]:
    chosen = list(PATCHES) if modules is None else [modules] if isinstance(modules, str) else list(modules)
    unknown = [m for m in chosen if m not in PATCHES]
    if unknown:
        raise ValueError(f"modules must be among {sorted(PATCHES)}, got {unknown}")
    return chosen


def patch(modules: Optional[Iterable[str]] = None) -> List[str]:
    """Put qkv's functions in place in ``modules`` (a name or names of :data:`PATCHES`; None: all) that
    transformers has; returns ``["module.global", ...]`` patched (again: nothing changes)."""
    done = []
    for module_name in _modules(modules):
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a transformers without this model
            continue
        for name, function in PATCHES[module_name].items():
            current = getattr(module, name, None)
            if current is None:
                continue
            if not hasattr(current, "_qkv_serves"):
                _originals[(module_name, name)] = current
                setattr(module, name, _serving(function, current, name))
            done.append(f"{module_name}.{name}")
    return done


def unpatch(modules: Optional[Iterable[str]] = None) -> List[str]:
    """Give transformers its own functions back in ``modules`` (None: all); returns what was restored."""
    chosen, restored = _modules(modules), []
    for (module_name, name), original in list(_originals.items()):
        if module_name in chosen:
            setattr(importlib.import_module(module_name), name, original)
            del _originals[(module_name, name)]
            restored.append(f"{module_name}.{name}")
    return restored


def patched(modules: Optional[Iterable[str]] = None) -> List[str]:
    """The globals of ``modules`` (None: all) that qkv's functions serve now."""
    chosen = _modules(modules)
    return [f"{module_name}.{name}" for module_name, name in _originals if module_name in chosen]
