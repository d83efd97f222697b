"""Reproduce docs/reproductions/smollm2-kernels.md: qkv's causal kernels inside a real pretrained
language model, with no training.

    PYTHONPATH=src .venv/bin/python benchmarks/repro_smollm2_kernels.py --windows 2 --window 128   # the page's run
    PYTHONPATH=src .venv/bin/python benchmarks/repro_smollm2_kernels.py --quick                     # a smoke run

SmolLM2-135M-Instruct (``qkv data fetch smollm2``) is read by ``Llama.from_pretrained(dir,
attention=NAME, attention_kwargs=KNOBS)`` once per registered causal kernel (``qkv.list_attention``,
``supports_causal``): the same pretrained weights, only the attention between the projections
swapped (the efficient-attention papers' "swap into a pretrained model without fine-tuning"
setting: Choromanski et al. 2020; Kasai et al. 2021). Each model scores the same fixed Shakespeare
slice (the test split of ``shakespeare-char``, ``--windows`` consecutive windows of ``--window``
tokens, each window read afresh, ``qkv.bench.models.window_nll``); reported: the per-token
perplexity, its ratio to softmax's, and the wall time. A kernel that draws random features
(``performer``) is run once per ``--seeds`` (mean and spread). A kernel that cannot take the
pretrained attention weights (learned parameters of its own: ``relative``, ``adaptive-span``, the
gated kernels' gate projections; causal LSH shares queries and keys, and a pretrained model has
separate key weights) is listed with ``from_pretrained``'s reason. ``window`` at a radius past the window length is
softmax exactly (the first row checks it: the same perplexity).

Knobs are each kernel's own for a context of the window length (``default_knobs(W, heads,
d_head)``: e.g. a local radius of ``W / 8``, ``sqrt(W)`` strides, Performer's
``d log d`` features).

``--quick`` scores 2 windows of 32 tokens with one seed and writes to a temporary folder, never
to docs/reproductions.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _repro import smoke_dir  # noqa: E402

import qkv  # noqa: E402
from qkv.bench import common  # noqa: E402
from qkv.bench.models import heldout_text, window_nll  # noqa: E402
from qkv.models import Llama  # noqa: E402
from qkv.registry import lookup  # noqa: E402
from qkv.tasks import data  # noqa: E402
from qkv.tasks.pretrained_vocab import CheckpointTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "reproductions"
#: kernels that draw random numbers: one run per seed
SEEDED = ("performer", "lsh")


def causal_kernels() -> List[str]:
    """Every registered kernel that can attend causally, softmax first."""
    found = [n for n in qkv.list_attention() if lookup("attention", n).supports_causal]
    return sorted(found, key=lambda n: n != "softmax")


def knobs(name: str, window: int, n_heads: int, d_head: int) -> Dict[str, Any]:
    """The kernel's own settings for a context of ``window`` tokens (``default_knobs``), without
    the shape ``MultiHeadAttention`` fills in."""
    found = lookup("attention", name).default_knobs(window, n_heads, d_head)
    return {k: v for k, v in found.items() if k not in ("n_heads", "head_dim", "d_head")}


def load(checkpoint: Path, name: str, kwargs: Dict[str, Any]) -> Llama:
    """The checkpoint with kernel ``name`` in every layer (transformers' notices silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Llama.from_pretrained(checkpoint, attention=name, attention_kwargs=kwargs).eval()


def perplexity(model: Llama, ids: torch.Tensor, window: int) -> float:
    nll, count = window_nll(lambda x: model(x).logits, ids, window)
    return math.exp(nll / count)


def measure(args: argparse.Namespace) -> Dict[str, Any]:
    checkpoint = Path(args.checkpoint) if args.checkpoint else data.smollm2_dir()
    tok = CheckpointTokenizer(checkpoint)
    text = heldout_text("shakespeare")
    n = args.windows * args.window + 1
    ids = torch.tensor(tok.encode(text[: 12 * n]), dtype=torch.long)[:n]
    if ids.numel() < n:
        raise SystemExit(f"the held-out Shakespeare has {ids.numel()} tokens, fewer than {n}")
    rows: List[Dict[str, Any]] = []
    reference: Optional[float] = None
    shape = None
    plan = [("window", {"radius": args.window}, "radius = window length: softmax exactly")]
    plan = [("softmax", {}, "")] + plan + [(k, None, "") for k in causal_kernels() if k != "softmax"]
    for name, given, note in plan:
        seeds = args.seeds if name in SEEDED else [None]
        values, seconds, refused = [], [], None
        for seed in seeds:
            if shape is None:
                config = load(checkpoint, "softmax", {}).config
                shape = (config.n_heads, config.head_size())
            kwargs = dict(given) if given is not None else knobs(name, args.window, *shape)
            if seed is not None:
                kwargs["seed"] = seed
                torch.manual_seed(seed)
            try:
                model = load(checkpoint, name, kwargs)
            except (ValueError, TypeError) as err:  # a kernel that cannot take the pretrained weights: its reason
                refused = str(err).splitlines()[0]
                break
            start = time.perf_counter()
            with torch.no_grad():
                values.append(perplexity(model, ids, args.window))
            seconds.append(time.perf_counter() - start)
        if refused is not None:
            rows.append({"kernel": name, "knobs": kwargs, "refused": refused})
            print(f"{name}: refused ({refused})", flush=True)
            continue
        ppl = statistics.fmean(values)
        if name == "softmax":
            reference = ppl
        row = {"kernel": name, "knobs": kwargs if seeds == [None] else {k: v for k, v in kwargs.items() if k != "seed"},
               "seeds": [s for s in seeds if s is not None], "perplexity": values, "mean": ppl,
               "std": statistics.stdev(values) if len(values) > 1 else 0.0, "ratio": ppl / reference,
               "seconds": statistics.fmean(seconds), "note": note}
        rows.append(row)
        print(f"{name} {row['knobs']}: perplexity {ppl:.3f} (x{row['ratio']:.3f} softmax), {row['seconds']:.1f} s",
              flush=True)
    return {"checkpoint": "SmolLM2-135M-Instruct (qkv data fetch smollm2, float32)", "windows": args.windows,
            "window": args.window, "tokens": args.windows * args.window, "text": "shakespeare-char's test split",
            "seeds": args.seeds, "threads": args.threads, "rows": rows}


def _short(note: str, limit: int = 180) -> str:
    """A refusal cut for the table (its list of tensor names can be long; the JSON keeps it whole)."""
    return note if len(note) <= limit else note[:limit].rsplit(", ", 1)[0] + ", ..."


def page(results: Dict[str, Any], command: str, machine: Dict[str, Any]) -> str:
    table = common.markdown_table(
        ["kernel", "knobs", "perplexity", "/ softmax", "seconds", "note"],
        [[r["kernel"], json.dumps(r["knobs"]), "refused" if "refused" in r else
          (f"{r['mean']:.3f}" + (f" ± {r['std']:.3f} ({len(r['seeds'])} seeds)" if r.get("seeds") else "")),
          "" if "refused" in r else f"{r['ratio']:.3f}", "" if "refused" in r else f"{r['seconds']:.1f}",
          _short(r.get("refused", r.get("note", "")))] for r in results["rows"]])
    return "\n".join([
        "# qkv's causal kernels in SmolLM2-135M, no training", "",
        "Each registered causal kernel replaces softmax in every layer of the real pretrained SmolLM2-135M-Instruct "
        "(`Llama.from_pretrained(dir, attention=NAME, attention_kwargs=KNOBS)`; the weights untouched), which then "
        f"scores the same held-out Shakespeare: {results['windows']} window(s) of {results['window']} tokens of "
        f"{results['text']} ({results['tokens']} tokens), each window read afresh. Perplexity is per SmolLM2 token; "
        "'/ softmax' is the ratio to the unchanged model's. Kernels with random features are run once per seed "
        "(mean ± standard deviation). `window` with a radius of the window length sees every earlier token: it is "
        "softmax, and its row must equal softmax's.", "",
        f"Run: `{command}` on {common.machine_line(machine)}, {results['date']}.", "",
        table, "",
        "The full size (the lead's run; roughly half an hour of one idle core): `PYTHONPATH=src .venv/bin/python "
        "benchmarks/repro_smollm2_kernels.py --windows 16 --window 1024 --seeds 0 1 2 --threads 1`.", ""])


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=None, help="the SmolLM2 directory (default: qkv data fetch smollm2)")
    p.add_argument("--windows", type=int, default=16, help="consecutive windows of the held-out slice")
    p.add_argument("--window", type=int, default=1024, help="tokens per window")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the kernels with random features")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2 windows of 32 tokens, one seed, into a temporary folder")
    args = p.parse_args(argv)
    if args.quick:
        args.windows, args.window, args.seeds = 2, 32, args.seeds[:1]
    for flag, value in (("--windows", args.windows), ("--window", args.window), ("--threads", args.threads)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    torch.set_num_threads(args.threads)
    out = smoke_dir("smollm2-kernels") if args.quick else DOCS
    command = "PYTHONPATH=src .venv/bin/python benchmarks/repro_smollm2_kernels.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    machine = common.describe_machine(torch.device("cpu"))
    results = {**measure(args), "date": common.now_iso(), "command": command.strip()}
    common.write_json(out / "smollm2-kernels.json", {**results, "machine": machine})
    (out / "smollm2-kernels.md").write_text(page(results, command.strip(), machine), encoding="utf-8")
    print(f"written to {out}/smollm2-kernels.md", flush=True)
    return results


if __name__ == "__main__":
    main()
