"""An offline, self-contained HTML page to explore attention (``qkv viz RUN --html OUT.html``).

The page holds the weights as JSON and ~200 lines of plain JavaScript: no CDN, no network, one
file that opens in any browser. It shows, for one or several models of the same task:

* a selector for the model, the layer / hop / attention group, and the head;
* the *text view*: the query tokens in a row; hovering (or clicking) one colours every key token
  by the weight the query puts on it, with the weight in a tooltip and in ``data-weight``;
* the heat map of the selected head (rows: queries, columns: keys), the hovered query's row
  outlined, a cell's weight shown under the pointer;
* *all heads side by side*: every head of the selected layer as a small heat map; clicking one
  selects it.

Input: ``AttentionView`` objects (``qkv.viz``), one per model.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple, Union

from ._errors import UserError
from ._io import atomic_write_text, output_file
from .viz import AttentionView

__all__ = ["render_html", "write_html", "split_panel_name", "script_json"]

PathLike = Union[str, Path]


def split_panel_name(name: str) -> Tuple[str, str]:
    """``"decoder L1 H3"`` -> ``("decoder L1", "H3")``; a name without a head is its own group."""
    m = re.match(r"^(.*?)\s+(H\d+)$", name)
    return (m.group(1), m.group(2)) if m else (name, "")


def _model_payload(name: str, view: AttentionView, digits: int = 4) -> Dict[str, Any]:
    panels = []
    for title, w in view.panels:
        w = w.detach().float().cpu()
        if w.dim() != 2:
            raise ValueError(f"panel {title!r} must be 2-D (queries, keys), got shape {tuple(w.shape)}")
        M, N = w.shape
        x_labels, y_labels = view.labels_for(title)
        x = list(x_labels) if x_labels is not None and len(x_labels) == N else [str(j) for j in range(N)]
        y = list(y_labels) if y_labels is not None and len(y_labels) == M else [str(i) for i in range(M)]
        group, head = split_panel_name(title)
        panels.append({"name": title, "group": group, "head": head or "—", "rows": M, "cols": N,
                       "w": [round(float(v), digits) for v in w.reshape(-1).tolist()], "x": x, "y": y})
    if not panels:
        raise UserError(f"model {name!r} has no attention panels to show (its layers return no attention weights)")
    return {"name": name, "title": view.title, "caption": view.caption, "panels": panels}


# The template's slots; each is filled once, in a single pass (``render_html``).
_SLOT = re.compile(r"__(TITLE|DATA)__")

# Characters that could end or re-open markup inside <script> (``</script>``, ``<!--``) or that old
# JavaScript parsers take as line ends (U+2028, U+2029); JSON strings may hold them as \u escapes.
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(value: Any) -> str:
    """``value`` as JSON safe to place verbatim inside ``<script>...</script>``: ``<``, ``>``, ``&``,
    U+2028 and U+2029 written as JSON's ``\\u`` escapes, e.g. ``\\u003c`` for ``<`` (they can only occur
    inside JSON strings, where the escape means the same character), so no string in it can close the
    element."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "".join(_SCRIPT_UNSAFE.get(c, c) for c in text)


def render_html(views: Sequence[Tuple[str, AttentionView]], title: str = "qkv attention") -> str:
    """The page for ``views``: ``(model name, AttentionView)`` pairs (at least one)."""
    if not views:
        raise ValueError("render_html needs at least one (name, AttentionView)")
    if not isinstance(title, str):
        raise TypeError(f"title must be a string, got {type(title).__name__}")
    payload = {"title": title, "models": [_model_payload(n, v) for n, v in views]}
    values = {"TITLE": html.escape(title), "DATA": script_json(payload)}
    # One pass over the template: a value is never scanned again, so a title holding "__DATA__"
    # (or the data holding "__TITLE__") stays text.
    return _SLOT.sub(lambda m: values[m.group(1)], _TEMPLATE)


def write_html(path: PathLike, views: Sequence[Tuple[str, AttentionView]], title: str = "qkv attention") -> Path:
    """Write the page (atomically: a temporary file renamed into place) and return its path (no
    suffix: ``.html``; another suffix, a directory or a file in place of a folder: ``UserError``)."""
    path = output_file(path, (".html", ".htm"), ".html")
    return atomic_write_text(path, render_html(views, title))


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; color: #222; }
  h1 { font-size: 18px; margin: 0 0 8px; }
  .controls { display: flex; gap: 16px; flex-wrap: wrap; align-items: center; margin-bottom: 10px; }
  .controls label { font-weight: 600; }
  .caption { color: #555; margin: 4px 0 10px; white-space: pre-wrap; }
  .tokens { display: flex; flex-wrap: wrap; gap: 3px; margin: 4px 0 12px; max-width: 1100px; }
  .tok { font-family: ui-monospace, monospace; padding: 2px 4px; border: 1px solid #ccc; border-radius: 3px;
         cursor: default; min-width: 10px; text-align: center; white-space: pre; }
  .query .tok { cursor: pointer; background: #f4f4f4; }
  .query .tok.active { outline: 2px solid #d33; background: #ffe9e9; }
  .row { display: flex; gap: 24px; align-items: flex-start; flex-wrap: wrap; }
  canvas { image-rendering: pixelated; border: 1px solid #bbb; }
  .heads { display: flex; flex-wrap: wrap; gap: 12px; }
  .head { text-align: center; cursor: pointer; }
  .head.selected canvas { outline: 3px solid #d33; }
  #readout { font-family: ui-monospace, monospace; min-height: 1.5em; color: #333; }
  .section { font-weight: 600; margin-top: 10px; }
</style>
</head>
<body>
<h1>__TITLE__</h1>
<div class="controls">
  <span><label for="model">model</label> <select id="model"></select></span>
  <span><label for="group">layer</label> <select id="group"></select></span>
  <span><label for="head">head</label> <select id="head"></select></span>
  <span><label><input type="checkbox" id="allheads"> all heads side by side</label></span>
</div>
<div class="caption" id="caption"></div>
<div class="section">queries — hover or click one</div>
<div class="tokens query" id="queries"></div>
<div class="section">keys — coloured by the selected query's weight</div>
<div class="tokens keys" id="keys"></div>
<div id="readout"></div>
<div class="row">
  <div id="single"><canvas id="heat"></canvas></div>
  <div class="heads" id="heads"></div>
</div>
<script id="qkv-data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("qkv-data").textContent);
const $ = (id) => document.getElementById(id);
const state = { model: 0, group: null, head: null, query: 0, all: false };

function model() { return DATA.models[state.model]; }
function groups() { return [...new Set(model().panels.map(p => p.group))]; }
function panelsOf(group) { return model().panels.filter(p => p.group === group); }
function panel() {
  const ps = panelsOf(state.group);
  return ps.find(p => p.head === state.head) || ps[0];
}
function weight(p, i, j) { return p.w[i * p.cols + j]; }
function rowMax(p, i) { let m = 0; for (let j = 0; j < p.cols; j++) m = Math.max(m, weight(p, i, j)); return m; }
// viridis-like ramp from light to dark blue-green, readable under black text
function colour(t) {
  t = Math.max(0, Math.min(1, t));
  const r = Math.round(255 - t * (255 - 33)), g = Math.round(255 - t * (255 - 113)), b = Math.round(255 - t * (255 - 181));
  return `rgb(${r},${g},${b})`;
}
function fillSelect(sel, values, current) {
  sel.innerHTML = "";
  for (const v of values) { const o = document.createElement("option"); o.value = v; o.textContent = v; sel.appendChild(o); }
  sel.value = current;
}

function drawHeat(canvas, p, cell, highlight) {
  canvas.width = p.cols * cell; canvas.height = p.rows * cell;
  const ctx = canvas.getContext("2d");
  let max = 0; for (const v of p.w) max = Math.max(max, v);
  for (let i = 0; i < p.rows; i++) for (let j = 0; j < p.cols; j++) {
    ctx.fillStyle = colour(max > 0 ? weight(p, i, j) / max : 0);
    ctx.fillRect(j * cell, i * cell, cell, cell);
  }
  if (highlight !== null && highlight < p.rows) {
    ctx.strokeStyle = "#d33"; ctx.lineWidth = 2;
    ctx.strokeRect(1, highlight * cell + 1, p.cols * cell - 2, cell - 2);
  }
}

function showQuery(i) {
  const p = panel();
  state.query = Math.max(0, Math.min(p.rows - 1, i));
  document.querySelectorAll("#queries .tok").forEach((el, k) => el.classList.toggle("active", k === state.query));
  const m = rowMax(p, state.query);
  document.querySelectorAll("#keys .tok").forEach((el, j) => {
    const w = weight(p, state.query, j);
    el.style.background = colour(m > 0 ? w / m : 0);
    el.dataset.weight = w.toFixed(4);
    el.title = `${p.x[j]}: ${w.toFixed(4)}`;
  });
  const top = [...Array(p.cols).keys()].sort((a, b) => weight(p, state.query, b) - weight(p, state.query, a)).slice(0, 3);
  $("readout").textContent = `${p.name} · query ${state.query} «${p.y[state.query]}» → ` +
    top.map(j => `«${p.x[j]}» ${weight(p, state.query, j).toFixed(3)}`).join(", ");
  $("readout").dataset.query = String(state.query);
  drawSingle();
}

function drawSingle() {
  const p = panel();
  const cell = Math.max(4, Math.min(18, Math.floor(520 / Math.max(p.rows, p.cols))));
  drawHeat($("heat"), p, cell, state.query);
  const heads = $("heads"); heads.innerHTML = "";
  $("single").style.display = state.all ? "none" : "";
  if (!state.all) return;
  for (const q of panelsOf(state.group)) {
    const box = document.createElement("div"); box.className = "head" + (q.head === p.head ? " selected" : "");
    box.dataset.head = q.head;
    const c = document.createElement("canvas");
    drawHeat(c, q, Math.max(2, Math.min(8, Math.floor(220 / Math.max(q.rows, q.cols)))), state.query);
    box.appendChild(c);
    const lab = document.createElement("div"); lab.textContent = q.head; box.appendChild(lab);
    box.addEventListener("click", () => { state.head = q.head; state.all = false; $("allheads").checked = false; render(); });
    heads.appendChild(box);
  }
}

function render() {
  const m = model();
  $("caption").textContent = [m.title, m.caption].filter(Boolean).join("\n");
  const gs = groups();
  if (!gs.includes(state.group)) state.group = gs[0];
  fillSelect($("group"), gs, state.group);
  const hs = panelsOf(state.group).map(p => p.head);
  if (!hs.includes(state.head)) state.head = hs[0];
  fillSelect($("head"), hs, state.head);
  const p = panel();
  const qs = $("queries"), ks = $("keys"); qs.innerHTML = ""; ks.innerHTML = "";
  p.y.forEach((t, i) => {
    const el = document.createElement("span"); el.className = "tok"; el.textContent = t; el.dataset.index = i;
    el.addEventListener("mouseenter", () => showQuery(i)); el.addEventListener("click", () => showQuery(i));
    qs.appendChild(el);
  });
  p.x.forEach((t, j) => { const el = document.createElement("span"); el.className = "tok"; el.textContent = t; el.dataset.index = j; ks.appendChild(el); });
  showQuery(Math.min(state.query, p.rows - 1));
}

fillSelect($("model"), DATA.models.map(m => m.name), DATA.models[0].name);
$("model").addEventListener("change", e => { state.model = DATA.models.findIndex(m => m.name === e.target.value); render(); });
$("group").addEventListener("change", e => { state.group = e.target.value; render(); });
$("head").addEventListener("change", e => { state.head = e.target.value; render(); });
$("allheads").addEventListener("change", e => { state.all = e.target.checked; drawSingle(); });
$("heat").addEventListener("mousemove", e => {
  const p = panel(), r = e.target.getBoundingClientRect();
  const cell = e.target.width / p.cols;
  const i = Math.floor((e.clientY - r.top) / cell), j = Math.floor((e.clientX - r.left) / cell);
  if (i >= 0 && i < p.rows && j >= 0 && j < p.cols) {
    if (i !== state.query) showQuery(i);
    e.target.title = `«${p.y[i]}» → «${p.x[j]}»: ${weight(p, i, j).toFixed(4)}`;
  }
});
document.addEventListener("keydown", e => {
  if (e.key === "ArrowRight") showQuery(state.query + 1);
  if (e.key === "ArrowLeft") showQuery(state.query - 1);
});
render();
</script>
</body>
</html>
"""
