"""Character-level language modelling with linear attention's descendants: GLA and Gated DeltaNet
against the softmax GPT and plain linear attention, the same model and budget in every arm.

    PYTHONPATH=src python benchmarks/repro_gated_lm.py --seeds 3            # into claims.json, gated-lm.md, gated-lm.json
    PYTHONPATH=src python benchmarks/repro_gated_lm.py --seeds 3 --resume   # reuse the runs gated-lm.json holds
    PYTHONPATH=src python benchmarks/repro_gated_lm.py --quick              # smoke: 10 steps, 1 seed, a temp folder

Every arm is the same 2-layer GPT on ``shakespeare-char`` (width 128, 4 heads of 32, feed-forward
512, learned positions, no dropout, context 128) with the short causal convolution of 4 positions
on q, k, v (``short_conv=4``) and the output gate ``SiLU(x W_r) ⊙ o`` (``output_gate=True``) that
the GLA and Gated DeltaNet papers put around their memory — given to every arm, so the baselines
have them too and only the attention kernel differs: ``softmax`` (exact attention, an unbounded KV
cache: the paper's Transformer baseline), ``linear`` (Katharopoulos et al. 2020, ``S = sum phi(k)
v^T``, the additive state with no decay), ``gla`` (Yang et al. 2023, data-dependent decays per key
channel) and ``gated-deltanet`` (Yang et al. 2024, a decay per head and the delta rule). The
linear arms' states are 32 x 32 per head. The seed draws the initialisation and the batches;
test bits per character on the held-out split.

Claims (one-sided Welch at 5 %, per seed), GLA (arXiv:2312.06635, Table 2) and Gated DeltaNet
(arXiv:2412.06464, Table 3) each: (a) close to the softmax Transformer — test bpc within 0.05 of
softmax's (the tolerance of ``linear-transformer-lm``); (b) ahead of plain linear attention at the
same budget.
"""

from __future__ import annotations

# What this script's claims depend on (benchmarks/claims.py): claim id or "*" -> paths.
DEPENDS = {'*': ['@training', '@transformer', '@text', 'src/qkv/models/transformer/gpt.py',
                 'src/qkv/attention/linear.py', 'src/qkv/attention/feature_maps.py',
                 'src/qkv/attention/gated_linear.py', 'src/qkv/_chunkwise.py', 'src/qkv/blocks/gated.py']}

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import claims  # noqa: E402  (benchmarks/claims.py: the claims table and its verdicts)
from _repro import smoke_dir, train_fresh  # noqa: E402

from qkv._io import atomic_write_text  # noqa: E402
from qkv._seeding import stable_seed  # noqa: E402
from qkv.models.transformer.gpt import GPT, GPTConfig  # noqa: E402
from qkv.registry import build  # noqa: E402

DOC = ROOT / "docs" / "reproductions" / "gated-lm.md"
OUT = ROOT / "runs" / "repro_gated_lm"
KERNELS = ("softmax", "linear", "gla", "gated-deltanet")  # softmax first: the reference shows early what the budget gives
MARGIN = 0.05  # bpc: "close to softmax"
GLA = "Yang et al. 2023, Gated Linear Attention Transformers with Hardware-Efficient Training (arXiv:2312.06635)"
GATED_DELTANET = "Yang et al. 2024, Gated Delta Networks: Improving Mamba2 with Delta Rule (arXiv:2412.06464)"
SIZE = dict(n_layers=2, d_model=128, n_heads=4, d_ff=512, dropout=0.0, short_conv=4, output_gate=True)


def model_for(kernel: str, vocab_size: int, block: int, seed: int) -> GPT:
    """The arm's GPT with ``kernel`` as its attention, initialised from ``seed``."""
    torch.manual_seed(stable_seed("repro_gated_lm", seed))
    return GPT(GPTConfig(vocab_size=vocab_size, max_len=block, attention=kernel, **SIZE))


def run(args, results_path: Path) -> Dict:
    """Each kernel once per seed (seed-major, one training at a time): test bpc; each run is written
    to ``results_path`` as soon as it ends (``--resume`` skips those already there)."""
    task = build("task", "shakespeare-char", block_size=args.block)
    results = {"settings": vars_of(args), "runs": {k: {} for k in args.kernels}}
    if args.resume and results_path.exists():
        saved = json.loads(results_path.read_text())
        if saved.get("settings") == results["settings"]:
            results = saved
            results["runs"] = {k: saved["runs"].get(k, {}) for k in args.kernels}
    for seed in range(args.seeds):
        for kernel in args.kernels:
            if str(seed) in results["runs"][kernel]:
                continue
            model = model_for(kernel, task.vocab.size, args.block, seed)
            seconds = train_fresh(model, task, args.out / f"{kernel}-s{seed}", args.steps, args.batch_size, args.lr,
                                  warmup=args.warmup, weight_decay=0.0, seed=seed)
            metrics = task.evaluate(model, "test", max_examples=args.eval_examples)
            results["runs"][kernel][str(seed)] = {"bpc": metrics["bpc"], "loss": metrics["loss"],
                                                  "train_seconds": round(seconds, 1),
                                                  "parameters": sum(p.numel() for p in model.parameters())}
            print(f"{kernel} seed {seed}: test {metrics['bpc']:.4f} bpc ({seconds:.0f} s)", flush=True)
            atomic_write_text(results_path, json.dumps(results, indent=1) + "\n")
    return results


def vars_of(args) -> Dict:
    return {k: getattr(args, k) for k in ("steps", "batch_size", "lr", "warmup", "block", "eval_examples")}


def per_seed(results: Dict, kernel: str, key: str = "bpc") -> List[float]:
    runs = results["runs"].get(kernel, {})
    return [runs[s][key] for s in sorted(runs, key=int)]


def budget(args) -> str:
    return (f"shakespeare-char, context {args.block}; 2-layer GPT, width 128, 4 heads of 32 (linear arms' state 32 x 32 "
            f"per head), feed-forward 512, short convolution of 4 on q, k, v and the output gate in every arm; "
            f"{args.steps} updates of {args.batch_size} sequences, AdamW lr {args.lr}, warm-up {args.warmup}; test bpc on "
            f"{args.eval_examples} held-out windows; CPU, one thread")


def command(args) -> str:
    return (f"PYTHONPATH=src python benchmarks/repro_gated_lm.py --seeds {args.seeds} --steps {args.steps} "
            f"--batch-size {args.batch_size} --kernels {' '.join(args.kernels)}")


CLAIMS = [  # (id, model, paper, ours, baseline, margin, claim)
    ("gla-vs-softmax-char-lm", "gpt (attention=gla)", GLA, "gla", "softmax", MARGIN,
     "A GLA Transformer language model is close to the softmax Transformer's quality at the same size and budget "
     "(Table 2; here: shakespeare-char test bpc within 0.05 of softmax attention's)."),
    ("gla-vs-linear-char-lm", "gpt (attention=gla)", GLA, "gla", "linear", 0.0,
     "Data-dependent gating makes linear attention a better language model (Table 2; here: shakespeare-char test bpc "
     "below plain linear attention's at the same size and budget)."),
    ("gated-deltanet-vs-softmax-char-lm", "gpt (attention=gated-deltanet)", GATED_DELTANET, "gated-deltanet",
     "softmax", MARGIN,
     "A Gated DeltaNet language model is close to the softmax Transformer's quality at the same size and budget "
     "(Table 3; here: shakespeare-char test bpc within 0.05 of softmax attention's)."),
    ("gated-deltanet-vs-linear-char-lm", "gpt (attention=gated-deltanet)", GATED_DELTANET, "gated-deltanet", "linear",
     0.0,
     "Gating and the delta rule make linear attention a better language model (here: shakespeare-char test bpc below "
     "plain linear attention's at the same size and budget)."),
]


def record(results: Dict, args) -> Dict[str, str]:
    verdicts = {}
    for cid, model, paper, kernel, against, margin, claim in CLAIMS:
        ours, base = per_seed(results, kernel), per_seed(results, against)
        if len(ours) < claims.MIN_SEEDS or len(base) < claims.MIN_SEEDS:
            continue
        others = "; ".join(f"{k} {claims.fmt(per_seed(results, k))}" for k in args.kernels
                           if k not in (kernel, against) and per_seed(results, k))
        said = (f"test bpc {kernel} {claims.fmt(ours)}, {against} {claims.fmt(base)} (per seed "
                f"{[round(x, 3) for x in ours]} vs {[round(x, 3) for x in base]})"
                + (f", tolerance {margin:g}" if margin else "") + (f"; {others}" if others else ""))
        entry = claims.record(
            id=cid, model=model, paper=paper, claim=claim, better="lower", margin=margin, measured=True,
            command=command(args), ours=ours, baseline=base, budget=budget(args),
            why={"reproduced": said,
                 "not reproduced": said + ": " + claims.gap(ours, base, "lower", margin, unit="bpc")})
        verdicts[cid] = entry["verdict"]
    return verdicts


def write_page(doc: Path, results: Dict, args, verdicts: Dict[str, str]) -> None:
    seeds = max(len(per_seed(results, k)) for k in args.kernels)
    rows = []
    for kernel in args.kernels:
        bpc = per_seed(results, kernel)
        if not bpc:
            continue
        said = [f"{cid}: {v}" for cid, v in verdicts.items() if cid.startswith(kernel + "-vs-")]
        params = per_seed(results, kernel, "parameters")
        rows.append(f"| `{kernel}` | {claims.fmt(bpc)} | {', '.join(f'{x:.3f}' for x in bpc)} | {params[0]:,} | "
                    f"{claims.fmt(per_seed(results, kernel, 'train_seconds'))} | {'; '.join(said) or '—'} |")
    lines = [
        "# Character-level LM: GLA and Gated DeltaNet against softmax and linear attention", "",
        "Generated by `benchmarks/repro_gated_lm.py`; do not edit by hand. The claims and their verdicts are in "
        "[claims.json](claims.json) ([README](README.md)); the raw numbers in [gated-lm.json](gated-lm.json).", "",
        "GLA (Yang et al. 2023, Table 2) and Gated DeltaNet (Yang et al. 2024, Table 3) report language models close to "
        "a Transformer of the same size and ahead of earlier linear-time models. Here the same small GPT is trained "
        "with only its attention kernel changed, on Shakespeare's characters.", "",
        f"**Setting.** {budget(args)}. Every arm has the short convolution and the output gate (the papers' "
        "architecture around their memory), so the baselines have them too; the seed draws the initialisation and "
        f"the batches. `{command(args)}` ({time.strftime('%Y-%m-%d')}), {seeds} seed{'s' if seeds != 1 else ''}; "
        "mean ± standard error over seeds:", "",
        "| attention | test bpc | per seed | parameters | training seconds | verdicts |",
        "| --- | --- | --- | --- | --- | --- |", *rows, "",
        "Verdicts: one-sided Welch t-test at 5 % on the per-seed test bpc (`benchmarks/claims.py`): against "
        f"`softmax` with a tolerance of {MARGIN} bpc (\"close to\"), against `linear` with none (\"ahead of\"). "
        "Training seconds are wall-clock on a shared 2-core machine, one thread: indicative only (`qkv bench` "
        "measures speed).", ""]
    atomic_write_text(doc, "\n".join(lines))


def main(argv: List[str] = None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds per kernel (a claim needs 3)")
    p.add_argument("--steps", type=int, default=800, help="training updates per run")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=80)
    p.add_argument("--block", type=int, default=128, help="context (characters)")
    p.add_argument("--eval-examples", type=int, default=512, help="held-out windows scored")
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--resume", action="store_true", help="keep the runs gated-lm.json holds for the same settings")
    p.add_argument("--quick", action="store_true", help="10 updates, 1 seed, a temporary folder")
    args = p.parse_args(argv)
    for name in ("seeds", "steps", "threads", "batch_size", "block", "eval_examples"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for needed in ("softmax", "linear"):
        if needed not in args.kernels:
            p.error(f"--kernels must include {needed} (a baseline of the claims)")
    torch.set_num_threads(args.threads)
    doc = DOC
    if args.quick:
        doc = smoke_dir("gated_lm") / DOC.name
        args.steps, args.seeds, args.eval_examples = 10, 1, 32
    args.out = doc.parent / "runs" if args.quick else OUT
    results = run(args, doc.parent / "gated-lm.json")
    verdicts = record(results, args) if not args.quick else {}
    write_page(doc, results, args, verdicts)
    print(f"gated-lm: {verdicts or 'no verdict'}; wrote {doc}", flush=True)
    return results


if __name__ == "__main__":
    main()
