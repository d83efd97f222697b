"""A registry without magic: ``@register("attention", "name")`` on a class, explicit imports in
the package ``__init__`` files, constructor type hints as the spec, unknown kwargs raising."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Dict

from torch import nn

from ._errors import UserError

__all__ = ["register", "lookup", "names", "describe", "build", "check_kwargs"]

_REGISTRIES: Dict[str, Dict[str, type]] = {}


def register(kind: str, name: str, *aliases: str) -> Callable[[type], type]:
    """Class decorator: make ``cls`` buildable as ``build(kind, name)`` (and by each alias)."""

    def decorator(cls: type) -> type:
        table = _REGISTRIES.setdefault(kind, {})
        for key in (name, *aliases):
            if key in table and table[key] is not cls:
                raise ValueError(f"{kind} {key!r} is already registered to {table[key].__name__}")
            table[key] = cls
        cls.registry_name = name
        return cls

    return decorator


KINDS = ("attention", "model", "task", "positional", "residual", "score")


def _table(kind: str) -> Dict[str, type]:
    if kind not in KINDS and kind not in _REGISTRIES:
        raise ValueError(f"unknown registry kind {kind!r}; known: {sorted(set(KINDS) | set(_REGISTRIES))}")
    return _REGISTRIES.setdefault(kind, {})


def lookup(kind: str, name: str) -> type:
    """The class registered as ``name``; ``ValueError`` naming close matches otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a str, got {type(name).__name__}")
    table = _table(kind)
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UserError(f"unknown {kind} {name!r}.{hint} Known: {', '.join(sorted(set(c.registry_name for c in table.values()))) or 'none yet'}")
    return table[name]


def names(kind: str) -> list[str]:
    """Canonical names (aliases left out), in registration order."""
    seen: list[str] = []
    for cls in _table(kind).values():
        if cls.registry_name not in seen:
            seen.append(cls.registry_name)
    return seen


def describe(cls: type) -> str:
    """A class's one-line description: the first paragraph of its docstring, on one line."""
    doc = (inspect.getdoc(cls) or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def check_kwargs(cls: type, kwargs: Dict[str, Any], what: str) -> None:
    """Raise ``TypeError`` naming any keyword that ``cls.__init__`` does not take."""
    params = inspect.signature(cls.__init__).parameters
    # A class that inherits nn.Module.__init__(*args, **kwargs) takes no options at all.
    own_init = cls.__init__ is not nn.Module.__init__
    if own_init and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params) - {"self"})
    if unknown:
        accepted = sorted(p for p in params if p != "self")
        raise TypeError(f"{what} got unknown argument(s) {unknown}; it accepts {accepted}")


def build(kind: str, name: str, **kwargs: Any) -> Any:
    """Instantiate the class registered as ``name`` with ``kwargs`` (unknown kwargs raise)."""
    cls = lookup(kind, name)
    check_kwargs(cls, kwargs, f"{kind} {name!r}")
    return cls(**kwargs)
