"""Typed values from text: the one parser behind ``qkv train --set key=value``, the training flags
and the benchmarks' ``--kernel-kwargs``/``--set`` options.

``parse_value(annotation, text, name)`` reads ``text`` as a value of the type a dataclass field or
a constructor argument declares; with ``typing.Any`` (no declared type) it guesses: a bool, None,
a Python or JSON literal (numbers, tuples, lists, dicts), else the text itself.
"""

from __future__ import annotations

import ast
import json
import math
import typing
from typing import Any, Dict, List

from ._errors import UserError

__all__ = ["parse_value", "guess_value", "parse_kernel_kwargs"]


def parse_value(annotation: Any, text: str, name: str = "value") -> Any:
    """Parse ``text`` as a value of type ``annotation`` (int, float, bool, str, Optional[...],
    Tuple[...], Literal[...], dict/list as JSON or comma-separated, Any: ``guess_value``); raise a
    ``UserError`` naming ``name`` otherwise."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union:
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return parse_value(arg, text, name)
            except UserError as e:
                errors.append(str(e))
        raise UserError(errors[0] if errors else f"{name}: cannot parse {text!r}")
    if origin is typing.Literal:
        for arg in args:
            if str(arg) == text:
                return arg
        raise UserError(f"{name} must be one of {list(args)}, got {text!r}")
    if annotation is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise UserError(f"{name} must be a bool (true/false), got {text!r}")
    if annotation is int:
        try:
            return int(text)
        except ValueError:
            raise UserError(f"{name} must be an int, got {text!r}") from None
    if annotation is float:
        try:
            value = float(text)
        except ValueError:
            raise UserError(f"{name} must be a float, got {text!r}") from None
        if not math.isfinite(value):
            raise UserError(f"{name} must be a finite float, got {text!r}")
        return value
    if annotation is str:
        return text
    if origin in (tuple, list) or annotation in (tuple, list):
        items = _json_or_none(text)
        if not isinstance(items, list):
            items = [t for t in text.split(",") if t != ""]
        # List[X] and Tuple[X, ...] hold any number of X; Tuple[X, Y] exactly one X and one Y
        homogeneous = origin is list or annotation is list or (args and args[-1] is Ellipsis)
        if args and not homogeneous and len(args) != len(items):
            raise UserError(f"{name} needs {len(args)} comma-separated values, got {text!r}")
        types = [args[0]] * len(items) if args and homogeneous else list(args) or [str] * len(items)
        values = [v if not isinstance(v, str) else parse_value(t, v, name) for t, v in zip(types, items)]
        return tuple(values) if origin is tuple or annotation is tuple else values
    if origin is dict or annotation is dict:
        value = _json_or_none(text)
        if not isinstance(value, dict):
            raise UserError(f"{name} must be a JSON object, e.g. '{{\"key\": 1}}', got {text!r}")
        return value
    return guess_value(text)


def guess_value(text: str) -> Any:
    """A value of no declared type: ``true``/``false`` as a bool, ``none``/``null`` as None, a
    Python literal (``3``, ``1e-3``, ``(8, 8)``, ``[1, 2]``, ``'a'``), a JSON one
    (``{"a": true}``), else the text itself (stripped of surrounding blanks)."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(stripped)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    value = _json_or_none(stripped)
    return stripped if value is None else value


def parse_kernel_kwargs(specs: List[str]) -> Dict[str, Dict[str, Any]]:
    """``--kernel-kwargs`` specs, knobs per kernel: ``['window:radius=128,block=64']`` ->
    ``{'window': {'radius': 128, 'block': 64}}`` (values as :func:`guess_value` reads them; commas
    inside brackets stay, ``image_size=(32,32)``); a ``UserError`` for a malformed spec."""
    parsed: Dict[str, Dict[str, Any]] = {}
    for spec in specs:
        name, sep, body = spec.partition(":")
        if not sep or not name.strip():
            raise UserError(f"--kernel-kwargs must look like 'name:key=value,...', got {spec!r}")
        knobs = parsed.setdefault(name.strip(), {})
        # Split on commas outside brackets so that tuples like image_size=(32,32) survive.
        depth, item, items = 0, "", []
        for ch in body:
            depth += ch in "([{"
            depth -= ch in ")]}"
            if ch == "," and depth == 0:
                items.append(item)
                item = ""
            else:
                item += ch
        items.append(item)
        for part in filter(str.strip, items):
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise UserError(f"--kernel-kwargs item must be key=value, got {part!r} in {spec!r}")
            knobs[key.strip()] = guess_value(value)
    return parsed


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
