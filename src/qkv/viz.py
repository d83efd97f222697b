"""Pictures of attention: heat maps with token labels (one panel per layer and head),
sparsity patterns and scalar curves. PNG via matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import masks
from ._errors import UserError
from ._nn import evaluating
from ._plot import PathLike, pyplot, save_figure
from .attention import build_attention
from .registry import lookup

__all__ = ["attention_panels", "plot_attention", "plot_attention_grid", "plot_pattern", "save_figure", "pyplot",
           "AttentionView", "attention_view", "show_token", "kernel_pattern", "plot_kernel_pattern"]


def attention_panels(weights: Any, name: str = "attention", example: int = 0) -> List[Tuple[str, Tensor]]:
    """Flatten a model's attention weights into named ``(M, N)`` panels for one example.

    Accepts a tensor ``(B, H, M, N)``, ``(B, M, N)`` or ``(M, N)``, a list/tuple of them (one per
    layer) or a dict of such (e.g. ``{"encoder": [...], "cross": [...]}``); ``None`` entries are
    skipped.
    """
    panels: List[Tuple[str, Tensor]] = []
    if weights is None:
        return panels
    if isinstance(weights, dict):
        for key, value in weights.items():
            panels += attention_panels(value, f"{key}" if name == "attention" else f"{name}/{key}", example)
        return panels
    if isinstance(weights, (list, tuple)):
        for i, value in enumerate(weights):
            panels += attention_panels(value, f"{name} L{i}", example)
        return panels
    if not isinstance(weights, Tensor):
        raise TypeError(f"weights must be a tensor, list or dict of tensors, got {type(weights).__name__}")
    w = weights.detach().float().cpu()
    if w.dim() == 4:
        return [(f"{name} H{h}", w[example, h]) for h in range(w.shape[1])]
    if w.dim() == 3:
        return [(name, w[example])]
    if w.dim() == 2:
        return [(name, w)]
    raise ValueError(f"attention weights must be 2-D to 4-D, got shape {tuple(w.shape)}")


def _weight_range(ws: Sequence[Tensor]) -> Tuple[float, float]:
    """The colour scale of panels ``ws``: ``(0, 1)`` for attention weights (so one colour bar reads
    every panel and pictures of different runs compare), the data's range for anything else."""
    lo = min(float(w.min()) for w in ws) if ws else 0.0
    hi = max(float(w.max()) for w in ws) if ws else 1.0
    if lo >= 0.0 and hi <= 1.0:
        return 0.0, 1.0
    return min(lo, 0.0), max(hi, lo + 1e-12)


def _draw(ax, w: Tensor, x_labels: Optional[Sequence[str]], y_labels: Optional[Sequence[str]], title: str,
          vrange: Optional[Tuple[float, float]] = None, axis_names: Tuple[str, str] = ("key", "query")) -> Any:
    vmin, vmax = vrange if vrange is not None else _weight_range([w])
    im = ax.imshow(w.numpy(), cmap="viridis", aspect="auto", interpolation="nearest", vmin=vmin, vmax=vmax)
    ax.set_title(title, fontsize=8)
    M, N = w.shape
    if x_labels is not None and len(x_labels) == N and N <= 80:
        ax.set_xticks(range(N))
        ax.set_xticklabels(x_labels, rotation=90, fontsize=6)
    if y_labels is not None and len(y_labels) == M and M <= 80:
        ax.set_yticks(range(M))
        ax.set_yticklabels(y_labels, fontsize=6)
    ax.set_xlabel(axis_names[0], fontsize=7)
    ax.set_ylabel(axis_names[1], fontsize=7)
    return im


def plot_attention(weights: Tensor, path: PathLike, x_labels: Optional[Sequence[str]] = None,
                   y_labels: Optional[Sequence[str]] = None, title: str = "attention") -> Path:
    """One heat map of ``(M, N)`` weights (rows: queries, columns: keys) written to ``path``."""
    w = weights.detach().float().cpu()
    if w.dim() != 2:
        raise ValueError(f"weights must be 2-D (M, N), got shape {tuple(w.shape)}")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4, w.shape[1] * 0.18 + 2), max(3, w.shape[0] * 0.18 + 1.5)), layout="constrained")
    im = _draw(ax, w, x_labels, y_labels, title)
    fig.colorbar(im, ax=ax, fraction=0.04, label="attention weight")
    return save_figure(fig, path, dpi=120)


#: the largest side of one heat map in a grid, in inches (its cells shrink beyond 62 rows or columns)
PANEL_INCHES = 10.0


def _plot_panels(panels: Sequence[Tuple[str, Tensor]], path: PathLike,
                 labels_for: Any, heading: str = "", dpi: int = 110,
                 axis_names: Tuple[str, str] = ("key", "query")) -> Path:
    """``panels`` as a grid of heat maps (4 to a row) on one colour scale with one colour bar, and
    ``heading`` (wrapped to the figure's width) above them; ``labels_for(name)`` gives a panel's
    ``(key, query)`` labels. A constrained layout keeps the heading, the panels' titles and tick
    labels and the colour bar from overlapping one another or the figure's edge."""
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    M = max(w.shape[0] for _, w in panels)
    N = max(w.shape[1] for _, w in panels)
    # a panel's size: its cells, plus its tick labels (the key labels stand on end below it)
    key_labels = max(_label_inches(labels_for(name)[0], w.shape[1]) for name, w in panels)
    query_labels = max(_label_inches(labels_for(name)[1], w.shape[0]) for name, w in panels)
    # a cell per 0.16 inch up to 10 inches a panel (a long input's cells shrink rather than grow the figure)
    cell = (max(2.5, min(N * 0.16, PANEL_INCHES) + 1) + query_labels, max(2.2, min(M * 0.16, PANEL_INCHES) + 1) + key_labels)
    width = max(cell[0] * cols + 1.0, 4.5 if heading else 0.0)  # + the colour bar; room for a heading
    heading = _wrap(heading, width, fontsize=9) if heading else ""
    heading_inches = (heading.count("\n") + 1) * 9 * 1.3 / 72 + 0.1 if heading else 0.0
    plt = pyplot()
    fig, axes = plt.subplots(rows, cols, figsize=(width, cell[1] * rows + heading_inches), squeeze=False,
                             layout="constrained")
    vrange = _weight_range([w for _, w in panels])
    im = None
    for ax, (title, w) in zip(axes.flat, panels):
        xl, yl = labels_for(title)
        im = _draw(ax, w, xl, yl, title, vrange, axis_names)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    # fraction and pad are shares of the grid's width: about 0.6 and 0.15 inch whatever its size
    bar = fig.colorbar(im, ax=axes, fraction=0.6 / width, pad=0.15 / width, shrink=min(1.0, 0.9 / rows + 0.1), aspect=30)
    bar.set_label("weight", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    if heading:
        fig.suptitle(heading, fontsize=9)
    return save_figure(fig, path, dpi=dpi)


def _label_inches(labels: Optional[Sequence[str]], n: int, fontsize: float = 6) -> float:
    """How far ``_draw``'s tick labels for ``n`` rows or columns reach out from a panel (a
    character about 0.6 em), beyond the room every panel has."""
    if labels is None or len(labels) != n or n > 80:
        return 0.0
    return max(0.0, max((len(str(label)) for label in labels), default=0) * fontsize * 0.6 / 72 - 0.3)


def _wrap(text: str, width_inches: float, fontsize: float, max_lines: int = 4) -> str:
    """``text`` wrapped to lines that fit ``width_inches`` at ``fontsize`` points (a character
    about 0.6 em wide), at most ``max_lines`` of them (the last ending in an ellipsis when cut)."""
    chars = max(20, int(width_inches * 72 / (0.6 * fontsize)))
    lines = [wrapped for line in text.split("\n") for wrapped in (textwrap.wrap(line, chars, break_on_hyphens=False) or [""])]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: chars - 1] + "\u2026"
    return "\n".join(lines)


def plot_attention_grid(weights: Any, path: PathLike, x_labels: Optional[Sequence[str]] = None,
                        y_labels: Optional[Sequence[str]] = None, example: int = 0, max_panels: int = 32,
                        labels: Optional[Dict[str, Tuple[Sequence[str], Sequence[str]]]] = None) -> Path:
    """All layers and heads of a model's weights (see ``attention_panels``) as a grid of heat maps.

    ``labels`` maps a panel-name prefix (e.g. ``"cross"``) to its own ``(x_labels, y_labels)``.
    """
    panels = attention_panels(weights, example=example)[:max_panels]
    if not panels:
        raise ValueError("no attention weights to plot (did the model return weights with need_weights=True?)")
    view = AttentionView(panels, x_labels=x_labels, y_labels=y_labels, labels=dict(labels or {}))
    return _plot_panels(panels, path, view.labels_for)


def plot_pattern(mask: Tensor, path: PathLike, title: str = "pattern") -> Path:
    """A boolean ``(M, N)`` sparsity pattern (e.g. ``qkv.masks.materialize(...)``) as an image."""
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        raise ValueError(f"mask must be a 2-D tensor, got {getattr(mask, 'shape', type(mask).__name__)}")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(mask.detach().cpu().float().numpy(), cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
    density = mask.float().mean().item()
    ax.set_title(f"{title} ({density:.1%} of pairs)", fontsize=9)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    return save_figure(fig, path, dpi=120)


# ----------------------------------------------------------------------------- one input's attention


def show_token(token: str) -> str:
    """A token label that stays visible on a plot axis or a web page (space, newline, tab, empty)."""
    return {" ": "\u2423", "\n": "\u23ce", "\t": "\u21e5", "": "\u2205"}.get(token, token)


@dataclass
class AttentionView:
    """What a model attended to on one input, ready to draw as a PNG grid or an HTML page.

    panels:   named ``(M, N)`` weight matrices (rows: queries, columns: keys), e.g.
              ``"decoder L0 H1"``, ``"cross L1 H0"``, ``"hop 2"`` (``attention_panels`` names them).
    x_labels, y_labels: key and query labels shared by the panels (tokens, sentence numbers, ...).
    labels:   a panel-name prefix -> its own ``(key labels, query labels)`` (e.g. ``"cross"``).
    title, caption: what the input was (e.g. ``"source -> translation"``).
    cut:      ``(kept, given)`` when the given text had ``given`` tokens and only the first ``kept``
              are shown (``attention_view``'s ``max_len``); ``None`` when nothing was cut.
    axis_names: what the panels' columns and rows are (``("key", "query")``; an image view's
              maps: ``("column", "row")``).
    """

    panels: List[Tuple[str, Tensor]]
    x_labels: Optional[Sequence[str]] = None
    y_labels: Optional[Sequence[str]] = None
    labels: Dict[str, Tuple[Sequence[str], Sequence[str]]] = field(default_factory=dict)
    title: str = ""
    caption: str = ""
    cut: Optional[Tuple[int, int]] = None
    axis_names: Tuple[str, str] = ("key", "query")

    @classmethod
    def from_weights(cls, weights: Any, example: int = 0, **kwargs: Any) -> "AttentionView":
        """A view of a model's ``weights`` output (tensor, per-layer list or dict; see ``attention_panels``)."""
        return cls(attention_panels(weights, example=example), **kwargs)

    def labels_for(self, name: str) -> Tuple[Optional[Sequence[str]], Optional[Sequence[str]]]:
        """The ``(key, query)`` labels of the panel called ``name``."""
        matches = [prefix for prefix in self.labels if name.startswith(prefix)]
        if not matches:
            return self.x_labels, self.y_labels
        return self.labels[max(matches, key=len)]  # the most specific prefix wins

    def chosen(self, max_panels: int) -> List[Tuple[str, Tensor]]:
        """At most ``max_panels`` panels, the cross-attention ones (the alignment a reader looks for)
        first, then the others in order."""
        if max_panels < 1:
            raise ValueError(f"max_panels must be >= 1, got {max_panels}")
        cross = [p for p in self.panels if "cross" in p[0]]
        rest = [p for p in self.panels if "cross" not in p[0]]
        return (cross + rest)[:max_panels]

    def plot(self, path: PathLike, max_panels: int = 16) -> Path:
        """All (or the first ``max_panels`` chosen) panels as a grid of labelled heat maps."""
        panels = self.chosen(max_panels)
        if not panels:
            raise UserError("no attention weights to plot: the model's layers returned none (a model without "
                            "attention, e.g. seq2seq with --attention none, has nothing to show)")
        heading = "\n".join(t for t in (self.title, self.caption) if t)
        return _plot_panels(panels, path, self.labels_for, heading, axis_names=self.axis_names)


def attention_view(task: Any, model: Any, text: Optional[str] = None, max_len: int = 48) -> AttentionView:
    """Run ``model`` on one input of ``task`` with ``need_weights=True`` and label what it attended to.

    A task that knows its inputs best gives its own view (``Task.attention_view``); the
    language-model and sequence-to-sequence kinds are handled here, with token labels (``text`` is
    the input to show; default: a held-out passage, ``task.view_text(max_len)`` for a language
    model, of at most ``max_len`` tokens). A longer ``text`` is cut to ``max_len`` tokens and the
    view's ``cut`` says so; a sequence-to-sequence output stops at the task's ``max_target_len``.
    """
    own = task.attention_view(model, text=text, max_len=max_len)
    if own is not None:
        return own
    with evaluating(model):
        if task.kind == "lm":
            return _lm_view(task, model, text, max_len)
        if task.kind == "seq2seq":
            return _seq2seq_view(task, model, text, max_len)
    raise ValueError(f"no attention view for a {task.kind!r} task ({type(task).__name__}) yet")


def _lm_view(task: Any, model: Any, text: Optional[str], max_len: int) -> AttentionView:
    if text is None:
        own = getattr(task, "view_text", None)
        text = own(max_len) if callable(own) else task.examples(1)[0].get("text", "")
    given = task.vocab.encode(text)
    ids = given[:max_len]
    if not ids:
        raise ValueError("text encodes to no tokens")
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), need_weights=True)
    tokens = [show_token(task.vocab.decode([i])) for i in ids]
    return AttentionView.from_weights(out.weights, x_labels=tokens, y_labels=tokens, title=type(model).__name__,
                                      caption=task.vocab.decode(ids), cut=(len(ids), len(given)) if len(given) > len(ids) else None)


def _seq2seq_view(task: Any, model: Any, text: Optional[str], max_len: int) -> AttentionView:
    source = text if text is not None else task.eval_pairs("test", 1)[0][0]
    batch = task.collate([(source, "")])
    longest = getattr(task, "max_target_len", None)  # + 1: room for <eos>
    with torch.no_grad():
        generated = model.generate(batch["src_ids"], src_mask=batch["src_mask"],
                                   max_new_tokens=min(max_len, longest + 1) if longest else max_len)
    target = task.decode_generated(generated[0].tolist())
    batch = task.collate([(source, target)])
    with torch.no_grad():
        out = model(**batch, need_weights=True)
    src = [show_token(task.vocab.decode([i])) for i in batch["src_ids"][0].tolist()]
    tgt = ["<bos>"] + [show_token(task.vocab.decode([i])) for i in batch["tgt_ids"][0, 1:].tolist()]
    # panel names: "encoder ...", "decoder_self ..." / "decoder ...", "decoder_cross ..." / "cross ..."
    labels = {"encoder": (src, src), "decoder": (tgt, tgt), "self": (tgt, tgt), "decoder_self": (tgt, tgt),
              "cross": (src, tgt), "decoder_cross": (src, tgt)}
    return AttentionView.from_weights(out.weights, x_labels=src, y_labels=tgt, labels=labels,
                                      title=type(model).__name__, caption=f"{source} -> {target}")


# ----------------------------------------------------------------------------- kernel patterns


#: longest sequence whose (length x length) pattern ``kernel_pattern`` draws (a picture, not a benchmark)
MAX_PATTERN_LENGTH = 4096


def kernel_pattern(name: str, length: int, causal: bool = False, overrides: Optional[Dict[str, Any]] = None,
                   seed: int = 0):
    """Which keys each query sees: ``(kernel, allowed (length, length) bool, how)``.

    ``how`` is ``"pattern"`` for kernels with a structural pattern (``kernel.pattern``) and
    ``"weights"`` for the others: the non-zero weights on a random input (dense and approximate
    kernels see every key; LSH's buckets depend on the input).
    """
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= MAX_PATTERN_LENGTH:
        raise UserError(f"length (--length) must be an int in 1 .. {MAX_PATTERN_LENGTH}: the picture is length x "
                        f"length, got {length!r}")
    cls = lookup("attention", name)
    overrides = dict(overrides or {})
    kwargs = cls.knobs(length, 1, 16, overrides, with_heads=True)  # the kernel's own knobs for the length, then the given
    causal = causal or cls.causal_only  # a causal-only kernel has no other picture
    kernel = build_attention(name, causal=causal, **kwargs) if cls.supports_causal else build_attention(name, **kwargs)
    if causal and not kernel.causal:
        raise ValueError(f"attention {name!r} cannot be causal")
    kernel.eval()
    mod = kernel.pattern(length, length)
    if mod is not None:
        return kernel, masks.materialize(mod, length, length), "pattern"
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, length, 16, generator=g) for _ in range(3))
    weights = kernel(q, k, v, need_weights=True).weights
    if weights is None:
        allowed = torch.ones(length, length, dtype=torch.bool)
        return kernel, allowed.tril() if kernel.causal else allowed, "all keys"
    return kernel, weights[0, 0] != 0, "weights"


def plot_kernel_pattern(name: str, length: int, path: PathLike, causal: bool = False,
                        overrides: Optional[Dict[str, Any]] = None, query: Optional[int] = None) -> Path:
    """The pictures of Child et al. 2019 (Fig. 3) and Parmar et al. 2018 (Fig. 2): left, the
    ``(query, key)`` connectivity matrix of kernel ``name``; right, the keys one query sees laid
    out in 2-D (rows of the stride / block for 1-D patterns, the image for ``local-2d``)."""
    kernel, allowed, how = kernel_pattern(name, length, causal, overrides)
    n = length
    width = getattr(kernel, "stride", None) or getattr(kernel, "block", None) or max(1, round(math.sqrt(n)))
    image = getattr(kernel, "image_size", None)
    if image is not None:
        H, W = image
        order = kernel.order()  # sequence position -> raster index
        seq_of = torch.empty_like(order)
        seq_of[order] = torch.arange(order.numel())
        i = int(seq_of[(H // 2) * W + W // 2]) if query is None else query  # a pixel in the middle
        layout = torch.full((H * W,), -1.0)
        layout[order[:n]] = 0.0
        layout[order[:n][allowed[i]]] = 1.0
        layout[order[i]] = 2.0
        grid = layout.view(H, W)
        where = f"image {H}x{W}, block-raster order"
    else:
        width = width if isinstance(width, int) else int(width[1])
        i = min(n - 1, (3 * n) // 4 + width // 2) if query is None else query
        rows = -(-n // width)
        layout = torch.full((rows * width,), -1.0)
        layout[:n] = 0.0
        layout[:n][allowed[i]] = 1.0
        layout[i] = 2.0
        grid = layout.view(rows, width)
        where = f"sequence in rows of {width}"
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 4))
    axes[0].imshow(allowed.float().numpy(), cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
    axes[0].set_title(f"{name} ({how}; {allowed.float().mean().item():.1%} of pairs)", fontsize=9)
    axes[0].set_xlabel("key j")
    axes[0].set_ylabel("query i")
    axes[1].imshow(grid.numpy(), cmap="viridis", interpolation="nearest", vmin=-1, vmax=2)
    axes[1].set_title(f"keys of query {i} (yellow): {int(allowed[i].sum())} of {n}\n{where}", fontsize=9)
    axes[1].set_xticks([])
    axes[1].set_yticks([])
    return save_figure(fig, path, dpi=120)
