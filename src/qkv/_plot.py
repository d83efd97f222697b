"""matplotlib for qkv's pictures (attention maps, benchmark curves, a model's own figure): the
Agg backend, so PNG files are written without a display. matplotlib is imported on first use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union

from ._io import atomic_path, output_file

__all__ = ["pyplot", "save_figure"]

PathLike = Union[str, os.PathLike]


def pyplot():
    """matplotlib.pyplot on the Agg backend (PNG files, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: PathLike, dpi: int = 120) -> Path:
    """Lay out ``fig`` (unless it has its own layout engine, e.g. ``layout="constrained"``), write it
    to ``path`` (folders created; no suffix: ``.png``; a suffix matplotlib cannot write, a directory
    or a file in place of a folder is a ``UserError``, the figure closed) and close it. Returns the
    path written."""
    try:
        path = output_file(path, ("." + kind for kind in fig.canvas.get_supported_filetypes()), ".png")
        if fig.get_layout_engine() is None:
            fig.tight_layout()
        with atomic_path(path) as tmp:  # a reader (or a killed run) never sees half a PNG
            fig.savefig(tmp, dpi=dpi, format=path.suffix[1:])
    finally:
        pyplot().close(fig)
    return path
