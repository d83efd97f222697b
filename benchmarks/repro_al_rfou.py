"""Reproduce docs/reproductions/al-rfou.md in one command: Al-Rfou et al. 2018, "Character-Level
Language Modeling with Deeper Self-Attention" (arXiv:1808.04444), §2.2 and §4.2 — the auxiliary
losses let a deep character Transformer train, where the same network trained on the final
next-character loss alone does worse.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_al_rfou.py --seeds 3     # ~15 min on one core
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_al_rfou.py --quick       # smoke run (seconds)

Both arms are the ``al-rfou`` model (``qkv train al-rfou``) with the paper's wiring — the original
Transformer's post-LN residuals, learned positions, a deep stack — on shakespeare-char, the same
seeds, steps, batch and learning-rate schedule (``qkv.runs``, what the command line runs):

- **auxiliary losses** (the paper's): every intermediate layer predicts the next character through
  the shared head, each dropped after the fraction l / (2n) of training, and every layer that
  predicts also predicts the character 2 steps ahead (weight 0.5) — ``aux_schedule="paper"``;
- **none**: ``aux_layer_losses=false``, ``n_targets=1`` — the top layer's next-character loss only.

The measurement is held-out bits per character of the top layer (what both models are used for);
per-seed values and the computed verdict go to ``docs/reproductions/claims.json``.
"""

from __future__ import annotations

# What this script's claims depend on (benchmarks/claims.py: a claim is stale when one of these, or this
# script, changed since the commit it was measured at): claim id or "*" -> paths, "@group" = claims.GROUPS.
DEPENDS = {'*': ['@training',
       '@transformer',
       '@text',
       'src/qkv/models/transformer/al_rfou.py',
       'src/qkv/models/transformer/gpt.py',
       'src/qkv/bench/common.py']}

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _repro import smoke_dir, train_fresh  # noqa: E402
import claims  # noqa: E402  (benchmarks/claims.py: the claims table and its verdicts)

from qkv.bench import common  # noqa: E402
from qkv.models import AlRfouConfig, AlRfouLM  # noqa: E402
from qkv.tasks import build_task  # noqa: E402
from qkv.viz import pyplot, save_figure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reproductions" / "al-rfou.md"
RESULTS = ROOT / "docs" / "reproductions" / "al-rfou.json"
IMG = ROOT / "docs" / "reproductions" / "img"
OUT = ROOT / "runs" / "repro_al_rfou"
PAPER = "Al-Rfou et al. 2018, Character-Level Language Modeling with Deeper Self-Attention (arXiv:1808.04444)"
ARMS = {"auxiliary losses": {"aux_layer_losses": True, "n_targets": 2},
        "none (top layer's next-character loss)": {"aux_layer_losses": False, "n_targets": 1}}


def run_arm(args, label: str, extra: Dict[str, Any], seed: int, steps: int) -> Dict[str, Any]:
    """One arm, one seed: train ``steps`` updates, then test bits per character and the curve."""
    task = build_task("shakespeare-char", block_size=args.context)
    torch.manual_seed(seed)
    model = AlRfouLM(AlRfouConfig(vocab_size=task.vocab.size, n_layers=args.layers, d_model=args.d_model,
                                  n_heads=4, d_ff=4 * args.d_model, max_len=args.context, dropout=0.0,
                                  residual="post-ln", **extra))
    out = OUT / f"{'aux' if extra['aux_layer_losses'] else 'none'}-{steps}-s{seed}"
    seconds = train_fresh(model, task, out, steps, args.batch_size, args.lr, warmup=args.warmup, seed=seed,
                          weight_decay=0.0)
    metrics = task.evaluate(model, "test", max_examples=args.eval_examples)
    print(f"{label:>40} seed {seed}, {steps} steps: test {metrics['bpc']:.4f} bpc, {seconds:.0f} s", flush=True)
    return {"bpc": metrics["bpc"], "seconds": round(seconds, 1), "params": sum(p.numel() for p in model.parameters())}


def run_budget(args, steps: int) -> Dict[str, List[Dict[str, Any]]]:
    return {label: [run_arm(args, label, extra, seed, steps) for seed in range(args.seeds)]
            for label, extra in ARMS.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the pipeline, not the numbers")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (initialisation and batch order; claims need 3)")
    p.add_argument("--steps", type=int, default=600, help="training updates of each model")
    p.add_argument("--budgets", type=int, nargs="*", default=[],
                   help="larger step budgets, each with --seeds seeds, into the claim's budget curve")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reuse-main", action="store_true",
                   help="take the main budget's runs from docs/reproductions/al-rfou.json (same settings) and run "
                        "only --budgets")
    args = p.parse_args(argv)
    for name in ("seeds", "steps", "layers", "d_model", "context", "batch_size", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if any(b <= args.steps for b in args.budgets):
        p.error(f"--budgets must be larger than --steps ({args.steps}), got {args.budgets}")
    machine = common.machine_line(common.describe_machine(torch.device("cpu")))  # the load before it starts
    global DOC, IMG, OUT
    if args.quick:  # a smoke run never overwrites the published reproduction
        IMG = smoke_dir("al-rfou") / "img"
        DOC, OUT = IMG.parent / DOC.name, IMG.parent / "runs"
        args.seeds, args.steps, args.layers, args.d_model, args.context = 1, 6, 3, 16, 16
        args.budgets = [8] if args.budgets else []
    args.eval_examples = 16 if args.quick else 256
    torch.set_num_threads(args.threads)
    IMG.mkdir(parents=True, exist_ok=True)
    start = time.time()
    setting = {k: getattr(args, k) for k in ("seeds", "steps", "layers", "d_model", "context", "batch_size", "lr", "warmup")}
    saved = json.loads(RESULTS.read_text()) if RESULTS.is_file() and not args.quick else {}
    if args.reuse_main and saved.get("setting") != setting:
        p.error(f"--reuse-main: {RESULTS} holds a run of {saved.get('setting')}, not of {setting}")
    main_runs = saved["main"] if args.reuse_main else run_budget(args, args.steps)
    points = {steps: run_budget(args, steps) for steps in args.budgets}
    if args.reuse_main:  # the curve grows: earlier larger budgets stay unless rerun
        points = {**{int(k): v for k, v in saved.get("points", {}).items()}, **points}
    minutes = (time.time() - start) / 60 + (saved.get("minutes", 0.0) if args.reuse_main else 0.0)
    if not args.quick:
        RESULTS.write_text(json.dumps({"setting": setting, "minutes": round(minutes, 1), "main": main_runs,
                                       "points": {str(k): v for k, v in sorted(points.items())}}, indent=1) + "\n")
    aux_label, none_label = list(ARMS)
    bpc = {label: [r["bpc"] for r in runs] for label, runs in main_runs.items()}
    command = (f"OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_al_rfou.py --seeds {args.seeds}"
               + (f" --steps {args.steps}" if args.steps != 600 else "")
               + (f" --budgets {' '.join(map(str, args.budgets))}" if args.budgets else ""))
    budget = (f"shakespeare-char, {args.steps} updates of {args.batch_size} x {args.context} characters, "
              f"{args.layers} post-LN layers of d_model {args.d_model}; test bpc on {args.eval_examples} windows; "
              f"CPU, one thread")
    if not args.quick and args.seeds >= claims.MIN_SEEDS:
        fmt = claims.fmt
        ahead = [round(b - a, 3) for a, b in zip(bpc[aux_label], bpc[none_label])]
        claims.record(
            id="al-rfou-aux-losses", model="al-rfou", paper=PAPER, measured=True,
            claim="The auxiliary losses (intermediate layers and multiple targets) let a deep character-level "
                  "Transformer reach a lower bits per character than the same network trained on the final "
                  "next-character loss alone.",
            command=command, better="lower", ours=bpc[aux_label], baseline=bpc[none_label], budget=budget,
            why={"reproduced": f"test bpc with the auxiliary losses {fmt(bpc[aux_label])}, without "
                               f"{fmt(bpc[none_label])} (per seed, without minus with: {ahead})",
                 "not reproduced": f"test bpc with the auxiliary losses {fmt(bpc[aux_label])} against "
                                   f"{fmt(bpc[none_label])} without (per seed, without minus with: {ahead}): "
                                   + ("not significant by the one-sided Welch t-test at 5 %" if claims.mean(ahead) > 0 else
                                      "the auxiliary losses are behind")
                                   + f" at {args.layers} layers and {args.steps} updates; the top layer's loss is "
                                     f"one of up to {args.layers} summed layer losses (each plus 0.5 x its "
                                     f"two-ahead loss) until the schedule has dropped the lower layers, half-way"})
        for steps, runs in points.items():
            claims.add_point("al-rfou-aux-losses", f"{steps} steps", [r["bpc"] for r in runs[aux_label]],
                             [r["bpc"] for r in runs[none_label]])
    write_doc(args, main_runs, points, command, budget, machine, minutes)
    print(f"wrote {DOC} ({minutes:.1f} min)")


def write_doc(args, main_runs, points, command: str, budget: str, machine: str, minutes: float) -> None:
    fig, ax = pyplot().subplots(figsize=(6.5, 4))
    budgets = [(args.steps, main_runs), *points.items()]
    for i, label in enumerate(ARMS):
        for j, (steps, runs) in enumerate(budgets):
            values = [r["bpc"] for r in runs[label]]
            x = j + (i - 0.5) * 0.3
            ax.scatter([x] * len(values), values, color=f"C{i}", s=14, label=label if j == 0 else None)
            ax.hlines(claims.mean(values), x - 0.1, x + 0.1, color=f"C{i}")
    ax.set_xticks(range(len(budgets)), [f"{steps} updates" for steps, _ in budgets])
    ax.set_ylabel("test bits per character (each seed; bar: mean)")
    ax.set_title(f"{args.layers}-layer post-LN character Transformer, shakespeare-char")
    ax.legend(fontsize=8)
    save_figure(fig, IMG / "al-rfou-bpc.png")
    rows = []
    for steps, runs in [(args.steps, main_runs), *points.items()]:
        for label, rs in runs.items():
            values = [r["bpc"] for r in rs]
            rows.append([label, steps, ", ".join(f"{x:.4f}" for x in values), claims.fmt(values),
                         f"{sum(r['seconds'] for r in rs) / len(rs):.0f}"])
    params = {label: runs[0]["params"] for label, runs in main_runs.items()}
    text = f"""# Al-Rfou et al.: auxiliary losses for a deep character Transformer

{PAPER}, §2.2: a deep character-level Transformer LM trained with auxiliary losses — every
intermediate layer also predicts the next character (its loss dropped after the fraction l / (2n) of
training), and every predicting layer also predicts the character two steps ahead, weighted 0.5. The
paper's §4.2 ablation trains its 64-layer model without them and finds it converging more slowly and to
a worse loss.

Made by one command ({minutes:.1f} min in all, one thread; {machine}):

    {command}

Both arms are `qkv train al-rfou` models with the paper's post-LN wiring: {args.layers} layers, d_model
{args.d_model}, 4 heads, feed-forward {4 * args.d_model}, context {args.context}, no dropout; AdamW (lr
{args.lr}, warm-up {args.warmup}, cosine), batch {args.batch_size}, seeds 0..{args.seeds - 1} (initialisation
and batch order, the same for both arms). Parameters: {", ".join(f"{k} {v:,}" for k, v in params.items())}
(the two-steps-ahead head is used in training only). Budget: {budget}.

Test bits per character of the top layer (mean ± standard error; the verdict is computed in
[claims.json](claims.json)):

{common.markdown_table(["arm", "updates", "test bpc per seed", "mean", "seconds per run"], rows)}

![test bpc per seed](img/al-rfou-bpc.png)
"""
    DOC.write_text(text)


if __name__ == "__main__":
    main()
