"""The one error class that says "the user asked for something wrong".

A ``UserError`` is raised where a user's value (a name, an option, a path, a run directory) is
refused; the ``qkv`` command prints it as one line (``qkv: error: ...``, exit status 2). Any other
exception is a bug in qkv or below it and keeps its traceback.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["UserError", "user_input"]


class UserError(ValueError):
    """An error in what the user asked for, printed without a traceback (a ``ValueError``, so
    callers that catch ``ValueError`` keep working)."""


@contextlib.contextmanager
def user_input() -> Iterator[None]:
    """Inside the block, a ``ValueError``/``TypeError`` is the library refusing the user's values
    (a config field, a task option, a preset name): re-raised as a ``UserError`` with the same
    message. Wrap only calls whose arguments are the user's values, never training itself."""
    try:
        yield
    except UserError:
        raise
    except (ValueError, TypeError) as e:
        raise UserError(str(e)) from e
