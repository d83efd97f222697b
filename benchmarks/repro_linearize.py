"""Reproduce docs/reproductions/linearize.md: SmolLM2-135M made linear-time by attention transfer
(LoLCATs, Zhang et al. 2024, arXiv:2410.10254; Hedgehog, arXiv:2402.04347), on one CPU thread.

    PYTHONPATH=src .venv/bin/python benchmarks/repro_linearize.py --seeds 3 --threads 1   # the page's run
    PYTHONPATH=src .venv/bin/python benchmarks/repro_linearize.py --quick                 # a smoke run

For each variant (a kernel of ``qkv linearize``) and seed, ``qkv.linearize.linearize`` — what
``qkv linearize smollm2 --attention ... --task shakespeare-char`` runs — swaps every layer's softmax
attention of SmolLM2-135M-Instruct (``qkv data fetch smollm2``) for the kernel, trains the new
parameters by attention transfer on the training split of Shakespeare (``--steps`` updates of
``--batch`` windows of ``--block`` tokens), then fine-tunes rank-``--lora-rank`` LoRA adapters on
the four attention projections (``--finetune-steps``). Held-out perplexity (per token, windows of
``--eval-window`` tokens, each read afresh: ``qkv.bench.models.window_nll``) on the first
``--eval-tokens`` tokens of two texts no stage trains on — the test split of Shakespeare and the
Bible's test verses — of: softmax (the pretrained model), the bare swap (the new parameters at their
initial values: no training), after attention transfer, after the fine-tune. Per stage: the tokens it
read and its CPU minutes (``linearize.json``). Greedy completions of a few prompts by softmax and by
each variant's final model (seed 0) close the page.

Claims (one-sided Welch at 5 %, per seed, on the two texts' mean log-perplexity turned back into a
perplexity): for each variant that has new parameters, attention transfer recovers most of the gap
that the bare swap opens (the recovered fraction ``(bare - transfer) / (bare - softmax)`` of the
log-perplexity, per seed, above 0.5: LoLCATs §3.1); the best variant after the fine-tune within 1.2x
softmax's perplexity (non-inferiority, margin 0.2 on the ratio: the issue's goal at this scale).

``--quick``: one seed, 2 transfer and 1 fine-tune update of 32 tokens, 64 evaluation tokens, into a
temporary folder (never docs/reproductions).
"""

from __future__ import annotations

# What this script's claims depend on (benchmarks/claims.py): claim id or "*" -> paths.
DEPENDS = {'*': ['@training', 'src/qkv/linearize.py', 'src/qkv/attention/linear.py', 'src/qkv/attention/feature_maps.py',
                 'src/qkv/attention/linear_window.py', 'src/qkv/attention/gated_linear.py', 'src/qkv/_chunkwise.py',
                 'src/qkv/models/transformer/llama.py', 'src/qkv/models/transformer/gpt.py', 'src/qkv/hf/llama.py',
                 'src/qkv/rotary.py', 'src/qkv/tasks/lm.py', 'src/qkv/tasks/pretrained_vocab.py']}

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import claims  # noqa: E402  (benchmarks/claims.py: the claims table and its verdicts)
from _repro import smoke_dir  # noqa: E402

from qkv import runs  # noqa: E402
from qkv._io import atomic_write_text  # noqa: E402
from qkv.bench.models import heldout_text, window_nll  # noqa: E402
from qkv.linearize import kernel_for, linearize, swap_attention  # noqa: E402
from qkv.models import Llama  # noqa: E402
from qkv.tasks import data  # noqa: E402
from qkv.tasks.pretrained_vocab import CheckpointTokenizer  # noqa: E402

DOC = ROOT / "docs" / "reproductions" / "linearize.md"
OUT = ROOT / "runs" / "repro_linearize"
TEXTS = ("shakespeare", "bible")
#: variant -> (--attention, --feature-map, uses --window)
VARIANTS = {"hedgehog": ("linear", "hedgehog", False), "hedgehog-window": ("linear", "hedgehog", True),
            "gla": ("gla", None, False), "gated-deltanet": ("gated-deltanet", None, False),
            "performer": ("linear", "performer", False)}
PROMPTS = ("To be, or not to be,", "In the beginning God created", "The capital of France is")
LOLCATS = "Zhang et al. 2024, LoLCATs: On Low-Rank Linearizing of Large Language Models (arXiv:2410.10254)"
HEDGEHOG = "Zhang et al. 2024, The Hedgehog & the Porcupine: Expressive Linear Attentions with Softmax Mimicry (arXiv:2402.04347)"


def perplexities(model: Any, streams: Dict[str, torch.Tensor], window: int) -> Dict[str, float]:
    model.eval()
    out = {}
    for name, ids in streams.items():
        nll, count = window_nll(lambda x: model(x).logits, ids, window)
        out[name] = math.exp(nll / count)
    return out


def mean_ppl(ppl: Dict[str, float]) -> float:
    """The texts' perplexities combined as the exponential of their mean log."""
    return math.exp(sum(math.log(p) for p in ppl.values()) / len(ppl))


def complete(model: Any, tok: CheckpointTokenizer, new: int) -> List[str]:
    model.eval()
    texts = []
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt)])
        out = model.generate(ids, max_new_tokens=new, do_sample=False)
        texts.append(tok.decode(out[0, ids.shape[1]:].tolist()))
    return texts


def run(args, results_path: Path) -> Dict[str, Any]:
    source = str(data.smollm2_dir())
    tok = CheckpointTokenizer(source)
    streams = {name: torch.tensor(tok.encode(heldout_text(name))[: args.eval_tokens + 1]) for name in TEXTS}
    settings = {k: getattr(args, k) for k in ("steps", "finetune_steps", "block", "batch", "lr", "finetune_lr",
                                              "lora_rank", "window", "eval_tokens", "eval_window")}
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    if results.get("settings") != settings:
        results = {"settings": settings, "runs": {}}
    teacher = Llama.from_pretrained(source)
    if "softmax" not in results:
        start = time.process_time()
        results["softmax"] = {"ppl": perplexities(teacher, streams, args.eval_window),
                              "eval_cpu_seconds": time.process_time() - start,
                              "completions": complete(teacher, tok, args.new_tokens)}
        atomic_write_text(results_path, json.dumps(results, indent=2))
    print(f"softmax: {results['softmax']['ppl']}", flush=True)
    for seed in range(args.seeds):
        for variant in args.variants:
            key = f"{variant}/{seed}"
            if key in results["runs"]:
                continue
            attention, feature_map, windowed = VARIANTS[variant]
            window = args.window if windowed else None
            kernel, knobs = kernel_for(attention, feature_map, window)
            bare, _ = swap_attention(teacher, kernel, knobs, seed)
            entry: Dict[str, Any] = {"kernel": kernel, "knobs": knobs, "bare": perplexities(bare, streams, args.eval_window)}
            del bare
            out = args.out / f"{variant}-s{seed}"
            shutil.rmtree(out, ignore_errors=True)
            record = linearize(source, "shakespeare-char", str(out), attention=attention, feature_map=feature_map,
                               window=window, steps=args.steps, finetune_steps=args.finetune_steps,
                               lora_rank=args.lora_rank, lr=args.lr, finetune_lr=args.finetune_lr,
                               batch_size=args.batch, seed=seed,
                               overrides=_overrides(args, args.finetune_steps))
            entry["stages"] = {name: {k: stage.get(k) for k in ("steps", "tokens", "cpu_seconds", "trainable_parameters")}
                               for name, stage in record["stages"].items()}
            entry["transfer_mse"] = record["stages"]["transfer"]["metrics"].get("loss")  # the last logged update's
            entry["transfer"] = perplexities(runs.load(out / "transfer").model, streams, args.eval_window)
            final = runs.load(out).model
            entry["finetune"] = perplexities(final, streams, args.eval_window)
            if seed == 0:
                entry["completions"] = complete(final, tok, args.new_tokens)
            del final
            results = _merged(results_path, results)  # another process may run other variants beside this one
            results["runs"][key] = entry
            atomic_write_text(results_path, json.dumps(results, indent=2))
            print(f"{key}: bare {mean_ppl(entry['bare']):.2f} transfer {mean_ppl(entry['transfer']):.2f} "
                  f"finetune {mean_ppl(entry['finetune']):.2f}", flush=True)
    return results


def _merged(path: Path, results: Dict) -> Dict:
    """``results`` with the runs another process wrote to ``path`` meanwhile (same settings)."""
    if path.is_file():
        theirs = json.loads(path.read_text())
        if theirs.get("settings") == results["settings"]:
            results["runs"] = {**theirs.get("runs", {}), **results["runs"]}
            curve = {**theirs.get("curve", {})}
            for name, point in results.get("curve", {}).items():
                curve[name] = {**point, "runs": {**curve.get(name, {}).get("runs", {}), **point["runs"]}}
            if curve:
                results["curve"] = curve
    return results


def curve_name(steps: int, lr: float) -> str:
    return f"LoRA {steps} updates (lr {lr:g})"


def run_curve(args, results: Dict, results_path: Path) -> Dict:
    """The LoRA budget curve of ``--curve-variant``: for each ``--curve-finetune-steps`` and seed, the
    fine-tune again at that budget (``--curve-finetune-lr``) from the main run's transferred model —
    its directory copied with its finished transfer stage and its record set to the new fine-tune, then
    continued (``linearize(..., resume=True)``: the transfer stage is found done, only the fine-tune runs,
    as a run from scratch with those arguments would: it too fine-tunes the saved transferred model)."""
    source = str(data.smollm2_dir())
    tok = CheckpointTokenizer(source)
    streams = {name: torch.tensor(tok.encode(heldout_text(name))[: args.eval_tokens + 1]) for name in TEXTS}
    variant = args.curve_variant
    attention, feature_map, windowed = VARIANTS[variant]
    lr = args.curve_finetune_lr if args.curve_finetune_lr is not None else args.finetune_lr
    for steps in args.curve_finetune_steps:
        name = curve_name(steps, lr)
        for seed in range(args.seeds):
            point = results.setdefault("curve", {}).setdefault(
                name, {"variant": variant, "finetune_steps": steps, "finetune_lr": lr, "runs": {}})
            if str(seed) in point["runs"]:
                continue
            main_run = args.out / f"{variant}-s{seed}"
            if not (main_run / "transfer" / "model").is_dir():
                raise SystemExit(f"--curve-finetune-steps: {main_run} has no finished transfer stage; run the main "
                                 f"budget of {variant} first")
            out = args.out / f"{variant}-s{seed}-lora{steps}-lr{lr:g}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            shutil.copytree(main_run / "transfer", out / "transfer")
            record = json.loads((main_run / "linearize.json").read_text())
            record.update(finetune_steps=steps, finetune_lr=lr, final=None)
            record["stages"] = {"transfer": record["stages"]["transfer"]}
            atomic_write_text(out / "linearize.json", json.dumps(record, indent=2))
            done = linearize(source, "shakespeare-char", str(out), attention=attention, feature_map=feature_map,
                             window=args.window if windowed else None, steps=args.steps, finetune_steps=steps,
                             lora_rank=args.lora_rank, lr=args.lr, finetune_lr=lr, batch_size=args.batch, seed=seed,
                             overrides=_overrides(args, args.finetune_steps), resume=True)  # the main run's
            final = runs.load(out).model
            entry = {"finetune": perplexities(final, streams, args.eval_window),
                     "stage": {k: done["stages"]["finetune"].get(k) for k in ("steps", "tokens", "cpu_seconds")}}
            del final
            results = _merged(results_path, results)
            results["curve"].setdefault(name, point)["runs"][str(seed)] = entry
            atomic_write_text(results_path, json.dumps(results, indent=2))
            print(f"{variant}/{seed} at {name}: finetune {mean_ppl(entry['finetune']):.2f}", flush=True)
    return results


def _overrides(args, finetune_steps: int) -> Dict[str, Any]:
    return {"task.block_size": args.block, "train.eval_batches": 0, "train.eval_every": max(args.steps, finetune_steps),
            "train.eval_max_examples": 1, "train.progress": False, "train.tensorboard": False, "train.warmup": 0}


def curve_ratios(results: Dict, variant: str) -> List[Dict[str, Any]]:
    """The budget curve's points for ``variant`` with every seed's perplexity ratio to softmax."""
    soft = mean_ppl(results["softmax"]["ppl"])
    points = []
    for name, point in results.get("curve", {}).items():
        if point["variant"] == variant and point["runs"]:
            ratios = [mean_ppl(point["runs"][s]["finetune"]) / soft for s in sorted(point["runs"], key=int)]
            points.append({"budget": name, "ours": ratios, "baseline": [1.0], "steps": point["finetune_steps"]})
    return sorted(points, key=lambda p: p["steps"])


def per_seed(results: Dict, variant: str, stage: str) -> List[float]:
    runs_ = results["runs"]
    return [mean_ppl(runs_[k][stage]) for k in sorted(runs_) if k.split("/")[0] == variant]


def transfer_mse(results: Dict, variant: str) -> List[float]:
    """Per seed: the attention-transfer loss (mean per-layer MSE to softmax's outputs) of its last logged update."""
    runs_ = results["runs"]
    return [runs_[k]["transfer_mse"] for k in sorted(runs_)
            if k.split("/")[0] == variant and runs_[k].get("transfer_mse") is not None]


def recovered(results: Dict, variant: str) -> List[float]:
    """Per seed: the fraction of the bare swap's log-perplexity gap to softmax that the transfer closes."""
    soft = math.log(mean_ppl(results["softmax"]["ppl"]))
    return [(math.log(b) - math.log(t)) / (math.log(b) - soft)
            for b, t in zip(per_seed(results, variant, "bare"), per_seed(results, variant, "transfer"))]


def budget(args) -> str:
    return (f"SmolLM2-135M-Instruct; transfer {args.steps} updates x {args.batch} x {args.block} Shakespeare tokens "
            f"(lr {args.lr}), LoRA rank {args.lora_rank} {args.finetune_steps} updates (lr {args.finetune_lr}); "
            f"perplexity on {args.eval_tokens} held-out tokens each of Shakespeare and the Bible, windows of "
            f"{args.eval_window}; 1 CPU thread")


def command(args) -> str:
    return (f"PYTHONPATH=src python benchmarks/repro_linearize.py --seeds {args.seeds} --steps {args.steps} "
            f"--finetune-steps {args.finetune_steps} --block {args.block} --batch {args.batch} --window {args.window} "
            f"--variants {' '.join(args.variants)}")


def record(results: Dict, args) -> Dict[str, str]:
    verdicts = {}
    soft = mean_ppl(results["softmax"]["ppl"])
    for variant in args.variants:
        ours = recovered(results, variant)
        if len(ours) < claims.MIN_SEEDS or variant == "performer":  # performer: no parameters to transfer
            continue
        said = (f"share of the bare swap's log-perplexity gap to softmax closed by attention transfer, per seed "
                f"{[round(x, 3) for x in ours]} (bare {claims.fmt(per_seed(results, variant, 'bare'))}, transfer "
                f"{claims.fmt(per_seed(results, variant, 'transfer'))}, softmax {soft:.2f})")
        mse = transfer_mse(results, variant)
        if mse:
            said += f"; per-layer MSE to softmax's outputs at the transfer's end {claims.fmt(mse)}"
        kernel = results["runs"][f"{variant}/0"]["kernel"]
        entry = claims.record(
            id=f"linearize-transfer-{variant}", model=f"llama (SmolLM2-135M, attention={kernel})",
            paper=f"{LOLCATS}; {HEDGEHOG}",
            claim=f"Attention transfer into {variant} recovers most (over half) of the perplexity gap that swapping "
                  f"softmax for it without training opens.",
            better="higher", measured=True, command=command(args), ours=ours, baseline=0.5, budget=budget(args),
            why={"reproduced": said, "not reproduced": said + ": " + claims.gap(ours, [0.5], "higher", unit="of the gap")})
        verdicts[variant] = entry["verdict"]
    finals = {v: per_seed(results, v, "finetune") for v in args.variants}
    finals = {v: xs for v, xs in finals.items() if len(xs) >= claims.MIN_SEEDS}
    if finals:
        best = min(finals, key=lambda v: sum(finals[v]) / len(finals[v]))
        ratios = [x / soft for x in finals[best]]
        said = (f"perplexity ratio to softmax ({soft:.2f}) of the best variant, {best}, after transfer and fine-tune, "
                f"per seed {[round(x, 3) for x in ratios]}")
        curve = [{"budget": p["budget"], "ours": p["ours"], "baseline": p["baseline"]}
                 for p in curve_ratios(results, best) if len(p["ours"]) >= claims.MIN_SEEDS]
        if curve:
            said += "; with longer fine-tunes " + ", ".join(f"{p['budget']}: {claims.fmt(p['ours'])}" for p in curve)
        entry = claims.record(
            id="linearize-within-1.2x-softmax", model=f"llama (SmolLM2-135M, linearized: {best})",
            paper=LOLCATS, claim="The best linearized SmolLM2 is within 1.2x softmax's held-out perplexity.",
            better="lower", margin=0.2, measured=True, command=command(args), ours=ratios, baseline=1.0,
            budget=budget(args), curve=curve,
            why={"reproduced": said, "not reproduced": said + ": " + claims.gap(ratios, [1.2], "lower", unit="x")})
        verdicts["best"] = entry["verdict"]
    return verdicts


def write_page(doc: Path, results: Dict, args, verdicts: Dict[str, str]) -> None:
    soft = results["softmax"]
    head = " | ".join(f"{t} ppl" for t in TEXTS)
    cells = " | ".join(f"{soft['ppl'][t]:.2f}" for t in TEXTS)
    rows = [f"| softmax (pretrained) | — | {cells} | 1.00 | — | — | — |"]
    for variant in args.variants:
        keys = sorted(k for k in results["runs"] if k.split("/")[0] == variant)
        if not keys:
            continue
        for stage in ("bare", "transfer", "finetune"):
            per_text = {t: [results["runs"][k][stage][t] for k in keys] for t in TEXTS}
            ratio = [mean_ppl(results["runs"][k][stage]) / mean_ppl(soft["ppl"]) for k in keys]
            tokens = [results["runs"][k]["stages"].get(stage, {}).get("tokens") for k in keys] if stage != "bare" else []
            cpu = [results["runs"][k]["stages"].get(stage, {}).get("cpu_seconds") for k in keys] if stage != "bare" else []
            tok = f"{tokens[0]:,}" if tokens and tokens[0] else "—"
            mins = claims.fmt([c / 60 for c in cpu if c]) if any(cpu) else "—"
            mse = transfer_mse(results, variant) if stage == "transfer" else []
            rows.append(f"| {variant} ({results['runs'][keys[0]]['kernel']}), {stage} | {len(keys)} | "
                        f"{' | '.join(claims.fmt(per_text[t]) for t in TEXTS)} | {claims.fmt(ratio)} | {tok} | {mins} | "
                        f"{claims.fmt(mse) if mse else '—'} |")
    rec = [f"| {v} | {claims.fmt(recovered(results, v))} | {verdicts.get(v, '—')} |" for v in args.variants
           if v != "performer" and any(k.split("/")[0] == v for k in results["runs"])]
    comp = ["| prompt | softmax | " + " | ".join(args.variants) + " |", "|---|---|" + "---|" * len(args.variants)]
    for i, prompt in enumerate(PROMPTS):
        cells = [soft["completions"][i]] + [results["runs"].get(f"{v}/0", {}).get("completions", ["—"] * len(PROMPTS))[i]
                                            for v in args.variants]
        comp.append(f"| {prompt} | " + " | ".join(c.replace("|", "\\|").replace("\n", " ⏎ ") for c in cells) + " |")
    lines = [
        "# SmolLM2-135M made linear-time by attention transfer (LoLCATs, Hedgehog)", "",
        "Generated by `benchmarks/repro_linearize.py`; do not edit by hand. The claims and their verdicts are in "
        "[claims.json](claims.json) ([README](README.md)); the raw numbers in [linearize.json](linearize.json).", "",
        f"Command: `{command(args)}`", "", f"Budget: {budget(args)}.", "",
        "Each variant is what `qkv linearize smollm2 --attention ... --task shakespeare-char` runs: every layer's "
        "softmax attention swapped for the kernel with the pretrained q/k/v/o kept; *bare*: the new parameters at "
        "their initial values (no training); *transfer*: after attention transfer (only the new parameters trained, "
        "per-layer MSE to the softmax outputs); *finetune*: after LoRA on the attention projections (merged). "
        "Perplexity per token, mean (± sd over seeds); ratio: the texts' geometric-mean perplexity over softmax's. "
        "Tokens and CPU minutes: per stage, per seed.", "",
        f"| model, stage | seeds | {head} | ratio to softmax | tokens | CPU minutes | transfer MSE |",
        "|---|---|" + "---|" * len(TEXTS) + "---|---|---|---|", *rows, "",
        "Transfer MSE: the attention-transfer loss (mean over layers of the MSE between the kernel's and softmax's "
        "outputs on the same q, k, v) at the transfer's last logged update. `gla` and `gated-deltanet` read their state "
        "without a normaliser (`o = S q`), so their outputs cannot take softmax's scale by training the gates alone: "
        "their MSE stays high and the transfer does not close their gap; only the fine-tune moves them.", "",
        "## Attention transfer closes the bare swap's gap (LoLCATs §3.1)", "",
        "Share of the log-perplexity gap between the bare swap and softmax that the transfer closes (1: all of it); "
        "the claim is that it exceeds one half (one-sided Welch, 5 %).", "",
        "| variant | recovered share | verdict |", "|---|---|---|", *rec, "",
        f"The best variant after the fine-tune against 1.2x softmax's perplexity: {verdicts.get('best', '—')} "
        f"(claim `linearize-within-1.2x-softmax`).", "", *curve_table(results), 
        f"## Greedy completions ({args.new_tokens} tokens; seed 0's final models)", "", *comp, "",
    ]
    doc.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(doc, "\n".join(lines))


def curve_table(results: Dict) -> List[str]:
    """The page's section on the LoRA budget curve (none when nothing was measured)."""
    variants = sorted({p["variant"] for p in results.get("curve", {}).values()})
    if not variants:
        return []
    lines = ["## A longer fine-tune (the budget curve)", "",
             "The same transferred models (each seed's main-run transfer stage), fine-tuned again with LoRA at a "
             "larger budget (`--curve-finetune-steps`); the ratio is the texts' geometric-mean perplexity over "
             "softmax's, per seed, and the verdict is that of the 1.2x claim at that budget.", "",
             "| variant | fine-tune | seeds | ratio to softmax | per seed | verdict against 1.2x |", "|---|---|---|---|---|---|"]
    for variant in variants:
        main_ratio = [x / mean_ppl(results["softmax"]["ppl"]) for x in per_seed(results, variant, "finetune")]
        if main_ratio:
            lines.append(f"| {variant} | main budget ({results['settings']['finetune_steps']} updates, lr "
                         f"{results['settings']['finetune_lr']:g}) | {len(main_ratio)} | {claims.fmt(main_ratio)} | "
                         f"{', '.join(f'{x:.3f}' for x in main_ratio)} | "
                         f"{claims.verdict(main_ratio, [1.0], 'lower', 0.2) if len(main_ratio) >= claims.MIN_SEEDS else '—'} |")
        for p in curve_ratios(results, variant):
            verdict = claims.verdict(p["ours"], [1.0], "lower", 0.2) if len(p["ours"]) >= claims.MIN_SEEDS else "—"
            lines.append(f"| {variant} | {p['budget']} | {len(p['ours'])} | {claims.fmt(p['ours'])} | "
                         f"{', '.join(f'{x:.3f}' for x in p['ours'])} | {verdict} |")
    return lines + [""]


def main(argv: List[str] = None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--steps", type=int, default=40, help="attention-transfer updates")
    p.add_argument("--finetune-steps", type=int, default=20, help="LoRA updates")
    p.add_argument("--block", type=int, default=128, help="tokens per training window")
    p.add_argument("--batch", type=int, default=4, help="windows per update")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--finetune-lr", type=float, default=1e-3)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--window", type=int, default=64, help="hedgehog-window's sliding window (tokens)")
    p.add_argument("--eval-tokens", type=int, default=2048, help="held-out tokens per text")
    p.add_argument("--eval-window", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=16, help="greedy completion length")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--curve-finetune-steps", type=int, nargs="+", default=[],
                   help="also fine-tune --curve-variant's transferred models again at these LoRA budgets (the 1.2x "
                        "claim's budget curve); its main runs must be there")
    p.add_argument("--curve-finetune-lr", type=float, default=None, help="the curve's LoRA lr (default --finetune-lr)")
    p.add_argument("--curve-variant", default="hedgehog-window", choices=list(VARIANTS))
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.curve_finetune_steps):
        p.error(f"--curve-finetune-steps must be >= 1, got {args.curve_finetune_steps}")
    torch.set_num_threads(args.threads)
    doc = DOC
    if args.quick:
        doc = smoke_dir("linearize") / DOC.name
        args.seeds, args.steps, args.finetune_steps, args.block, args.batch = 1, 2, 1, 16, 2
        args.eval_tokens, args.eval_window, args.new_tokens = 64, 32, 4
    args.out = doc.parent / "runs" if args.quick else OUT
    results = run(args, doc.parent / "linearize.json")
    if args.curve_finetune_steps:
        results = run_curve(args, results, doc.parent / "linearize.json")
    verdicts = record(results, args) if not args.quick else {}
    write_page(doc, results, args, verdicts)
    print(f"linearize: {verdicts or 'no verdict'}; wrote {doc}", flush=True)
    return results


if __name__ == "__main__":
    main()
