"""Reproduce docs/reproductions/gpt.md in one command: GPT generative pre-training on Wikipedia bytes,
then discriminative fine-tuning on BBC News topic classification, against the same network trained
from scratch (Radford et al. 2018, "Improving Language Understanding by Generative Pre-Training", §3).

    .venv/bin/python benchmarks/repro_gpt.py --seeds 3    # ~12 min on one CPU thread (3 x ~4 min)
    .venv/bin/python benchmarks/repro_gpt.py --quick      # seconds; writes to a temporary folder

Every run goes through ``qkv.runs``, what the command line calls, and is recorded as the command a
user would type. Per seed:

1. ``qkv train gpt --task enwiki-bytes`` (byte-level LM on real Wikipedia, §3.1);
2. ``qkv train gpt --task bbc-bytes --init runs/repro_gpt/seedS/pretrain`` (the LM's weights, a new
   linear head on the last token's hidden state, §3.2);
3. ``qkv train gpt --task bbc-bytes`` with the same architecture and budget from random weights;

then ``qkv eval`` on the test split. Writes ``runs/repro_gpt/results.json``, ``docs/reproductions/gpt.md``
and ``docs/reproductions/img/gpt_pretrain_finetune.png``; with 3 seeds or more, the claim
``gpt-pretrain-finetune`` in claims.json.
"""

from __future__ import annotations

# What this script's claims depend on (benchmarks/claims.py: a claim is stale when one of these, or this
# script, changed since the commit it was measured at): claim id or "*" -> paths, "@group" = claims.GROUPS.
DEPENDS = {'*': ['@training',
       '@transformer',
       '@text',
       'src/qkv/models/transformer/gpt.py',
       'src/qkv/tasks/bbc.py',
       'src/qkv/tasks/classify.py',
       'src/qkv/runs.py']}

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import qkv.runs  # noqa: E402
from qkv.tasks import build_task  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loaded from a file by the tests, too
import claims  # noqa: E402  (benchmarks/claims.py: the claims table and its verdicts)
from _repro import evals, evaluate_test, shown, smoke_dir, train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reproductions" / "gpt.md"
RUNS = ROOT / "runs" / "repro_gpt"
PLOT = "gpt_pretrain_finetune.png"
PAPER = "Radford et al. 2018, Improving Language Understanding by Generative Pre-Training"
COMMON = {"train.progress": False, "train.tensorboard": False}
#: pre-training has learnt something only when its validation bits per byte are below the unigram
#: level (the bytes' own training frequencies) by at least this much
LEARNT_MARGIN = 0.1
DEFAULTS = {"seeds": 1, "pretrain_steps": 1000, "finetune_steps": 200, "context": 256, "n_layers": 2, "d_model": 128,
            "batch_size": 16, "pretrain_lr": 2e-3, "finetune_lr": 5e-4, "lm_aux_weight": 0.5}
QUICK = {"pretrain_steps": 20, "finetune_steps": 8, "context": 64, "n_layers": 1, "d_model": 32, "batch_size": 4}
PRETRAIN_EVAL = 128  # validation windows of the pre-training curve and of the reported bits per byte


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny model and budget (seconds): checks the pipeline, "
                   "not the numbers; writes to a temporary folder, never to docs/ nor claims.json")
    p.add_argument("--seeds", type=int, default=DEFAULTS["seeds"],
                   help="pre-train + fine-tune + scratch once per seed; the claim is recorded with >= 3")
    p.add_argument("--pretrain-steps", type=int, default=DEFAULTS["pretrain_steps"])
    p.add_argument("--finetune-steps", type=int, default=DEFAULTS["finetune_steps"],
                   help="updates of the fine-tuned and of the from-scratch classifier (the same budget)")
    p.add_argument("--context", type=int, default=DEFAULTS["context"],
                   help="bytes per pre-training window and per article (learned positions: one length for both)")
    p.add_argument("--n-layers", type=int, default=DEFAULTS["n_layers"])
    p.add_argument("--d-model", type=int, default=DEFAULTS["d_model"], help="width (4 heads of d_model/4; d_ff 4 d_model)")
    p.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], help="windows or articles per update")
    p.add_argument("--pretrain-lr", type=float, default=DEFAULTS["pretrain_lr"])
    p.add_argument("--finetune-lr", type=float, default=DEFAULTS["finetune_lr"], help="fine-tuning and scratch alike")
    p.add_argument("--lm-aux-weight", type=float, default=DEFAULTS["lm_aux_weight"],
                   help="λ of the auxiliary LM loss while training the classifiers (the paper: 0.5)")
    p.add_argument("--out", default=None, help="folder for the page, its plot and results (default docs/reproductions; "
                   "--quick: a temporary folder)")
    p.add_argument("--doc-only", action="store_true", help="rewrite the page and plot from the results already in "
                   "OUT/gpt.json (no training, no claim)")
    p.add_argument("--budgets", type=int, nargs="*", default=[],
                   help="larger fine-tuning budgets (steps), each fine-tuning the saved pre-trained runs again and "
                        "training from scratch with every seed: the claim's budget curve (needs the main run's "
                        "OUT/gpt.json and runs, made with the same settings)")
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if any(b <= args.finetune_steps for b in args.budgets):
        p.error(f"--budgets must be larger than --finetune-steps ({args.finetune_steps}), got {args.budgets}")
    return args


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(1)
    out = Path(args.out) if args.out else (smoke_dir("gpt") if args.quick else DOC.parent)
    runs_dir = out / "runs" if args.quick or args.out else RUNS
    publish = not args.quick and out.resolve() == DOC.parent.resolve()  # the claim only from the published page's runs
    if args.doc_only:
        results = json.loads((out / "gpt.json").read_text())
        plot(results, out / "img" / PLOT)
        (out / DOC.name).write_text(page(results))
        return results
    if args.budgets:
        return budget_curve(args, out, runs_dir, publish)
    shutil.rmtree(runs_dir, ignore_errors=True)
    start = time.time()
    levels = chance_levels(args.context)
    per_seed = []
    for seed in range(args.seeds):
        result = train_seed(args, seed, runs_dir / f"seed{seed}")
        result["learnt"] = learnt(result["pretrain"]["valid"]["bpc"], levels["unigram_bpc"])
        per_seed.append(result)
        print(f"seed {seed}: pre-training {'left' if result['learnt']['ok'] else 'did NOT leave'} the unigram level "
              f"({result['learnt']['text']}); test accuracy fine-tuned {result['finetune']['test']['accuracy']:.3f}, "
              f"from scratch {result['scratch']['test']['accuracy']:.3f}", flush=True)
    results = {"settings": {**{k: getattr(args, k) for k in DEFAULTS}, "quick": args.quick,
                            "command": command(args), "machine": "CPU, one thread"},
               "levels": levels, "per_seed": per_seed, "seconds": round(time.time() - start, 1)}
    (out / "img").mkdir(parents=True, exist_ok=True)
    (out / "gpt.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / "img" / PLOT)
    (out / DOC.name).write_text(page(results))
    if publish:
        record_claim(results)
    print(f"wrote {out / DOC.name} ({results['seconds']:.0f} s)", flush=True)
    return results


def budget_curve(args: argparse.Namespace, out: Path, runs_dir: Path, publish: bool) -> Dict[str, Any]:
    """``--budgets``: for each larger fine-tuning budget, fine-tune every seed's saved pre-trained
    run again and train from scratch with that budget; the test accuracies go into ``gpt.json``
    (``budgets``), the page and the claim's budget curve."""
    results = json.loads((out / "gpt.json").read_text())
    saved = {k: v for k, v in results["settings"].items() if k in DEFAULTS and k != "finetune_steps"}
    mine = {k: getattr(args, k) for k in saved}
    if saved != mine:
        raise SystemExit(f"--budgets: {out / 'gpt.json'} was made with {saved}, not {mine}")
    start = time.time()
    for steps in args.budgets:
        args.finetune_steps = steps
        accuracy = {"finetune": [], "scratch": []}
        for p in results["per_seed"]:
            seed_dir = runs_dir / f"seed{p['seed']}"
            if not (seed_dir / "pretrain").is_dir():
                raise SystemExit(f"--budgets: no pre-trained run {seed_dir / 'pretrain'}; run the main budget first")
            for name, acc in budget_seed(args, p["seed"], seed_dir, steps).items():
                accuracy[name].append(acc)
        results.setdefault("budgets", {})[str(steps)] = accuracy
        print(f"{steps} fine-tuning steps: fine-tuned {accuracy['finetune']}, from scratch {accuracy['scratch']}",
              flush=True)
        if publish and len(accuracy["finetune"]) >= claims.MIN_SEEDS:
            claims.add_point("gpt-pretrain-finetune", f"{steps} fine-tuning steps", accuracy["finetune"],
                             accuracy["scratch"])
    results["budget_seconds"] = round(results.get("budget_seconds", 0.0) + time.time() - start, 1)
    (out / "gpt.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / DOC.name).write_text(page(results))
    return results


def budget_seed(args: argparse.Namespace, seed: int, out: Path, steps: int) -> Dict[str, float]:
    """One seed at a larger fine-tuning budget: test accuracy fine-tuned from ``out/pretrain`` and
    from scratch (run directories ``finetune-STEPS``, ``scratch-STEPS``)."""
    common = {**COMMON, "train.seed": seed}
    articles = {"task.max_len": args.context}
    aux = {"lm_aux_weight": args.lm_aux_weight} if args.lm_aux_weight else {}
    classify = {"train.steps": steps, "train.batch_size": args.batch_size, "train.lr": args.finetune_lr,
                "train.warmup": max(steps // 10, 1), "train.eval_every": 0, "train.eval_batches": 0}
    accuracy = {}
    for name, extra, init in (("finetune", {}, out / "pretrain"), ("scratch", arch(args), None)):
        run = out / f"{name}-{steps}"
        train("gpt", "bbc-bytes", run, {**extra, **articles, **aux, **classify, **common}, init)
        accuracy[name] = evaluate_test(run)["accuracy"]
    return accuracy


def command(args: argparse.Namespace) -> str:
    """The command that reruns these results (flags that differ from the defaults)."""
    if args.quick:
        return "python benchmarks/repro_gpt.py --quick"
    flags = [f"--{k.replace('_', '-')} {getattr(args, k)}" for k, v in DEFAULTS.items() if getattr(args, k) != v]
    return " ".join(["python benchmarks/repro_gpt.py", *flags])


def arch(args: argparse.Namespace) -> Dict[str, Any]:
    """The network of all three runs of a seed (learned positions over ``context`` bytes)."""
    return {"n_layers": args.n_layers, "d_model": args.d_model, "n_heads": 4, "d_ff": 4 * args.d_model,
            "dropout": 0.0, "max_len": args.context}


def train_seed(args: argparse.Namespace, seed: int, out: Path) -> Dict[str, Any]:
    """Pre-train, fine-tune and train from scratch with one seed (through ``qkv.runs``)."""
    pre, fine, scratch = out / "pretrain", out / "finetune", out / "scratch"
    common = {**COMMON, "train.seed": seed}
    articles = {"task.max_len": args.context}
    aux = {"lm_aux_weight": args.lm_aux_weight} if args.lm_aux_weight else {}
    classify = {"train.steps": args.finetune_steps, "train.batch_size": args.batch_size, "train.lr": args.finetune_lr,
                "train.warmup": max(args.finetune_steps // 10, 1), "train.eval_every": max(args.finetune_steps // 8, 1),
                "train.eval_batches": 0, "train.eval_max_examples": 256}
    phases = {  # name: (model, task, out, overrides, init)
        "pretrain": ("gpt", "enwiki-bytes", pre,
                     {**arch(args), "task.block_size": args.context, "train.steps": args.pretrain_steps,
                      "train.batch_size": args.batch_size, "train.lr": args.pretrain_lr,
                      "train.warmup": max(args.pretrain_steps // 20, 1),
                      "train.eval_every": max(args.pretrain_steps // 8, 1), "train.eval_batches": 0,
                      "train.eval_max_examples": PRETRAIN_EVAL, **common}, None),
        "finetune": ("gpt", "bbc-bytes", fine, {**articles, **aux, **classify, **common}, pre),
        "scratch": ("gpt", "bbc-bytes", scratch, {**arch(args), **articles, **aux, **classify, **common}, None),
    }
    result: Dict[str, Any] = {"seed": seed}
    for name, phase in phases.items():
        t0 = time.time()
        train(*phase)
        seconds = time.time() - t0
        line = shown(*phase).replace(f"{ROOT}/", "")  # run directories relative to the repository
        entry = {"command": line, "train_seconds": round(seconds, 1), "valid_curve": evals(out / name)}
        if name == "pretrain":  # bits per byte on the first PRETRAIN_EVAL validation windows (the unigram's bytes)
            valid = qkv.runs.load(pre).evaluate("valid", max_examples=PRETRAIN_EVAL)
            entry["valid"] = {k: round(float(v), 4) for k, v in valid.items()}
        else:
            entry["test"] = evaluate_test(out / name)
        result[name] = entry
        print(name, f"seed {seed}", entry.get("valid", entry.get("test")), f"{seconds:.0f} s", flush=True)
    return result


def chance_levels(context: int) -> Dict[str, float]:
    """What the runs must beat: the unigram model's bits per byte (the bytes' add-one smoothed
    training frequencies) on the validation bytes the pre-trained LM is scored on, and the
    majority class of the BBC test (and validation) articles."""
    lm = build_task("enwiki-bytes", block_size=context)
    counts = torch.bincount(lm.split_tokens("train"), minlength=lm.vocab.size).double() + 1
    log_p = (counts / counts.sum()).log2()
    targets = torch.cat([b["labels"].flatten() for b in lm.eval_batches("valid", 64, PRETRAIN_EVAL)])
    bbc = build_task("bbc-bytes", max_len=context)
    labels = {split: torch.cat([b["labels"] for b in bbc.eval_batches(split, 256)]) for split in ("valid", "test")}
    majority = {split: float(torch.bincount(y, minlength=5).max() / y.numel()) for split, y in labels.items()}
    return {"unigram_bpc": float(-log_p[targets].mean()), "valid_bytes": int(targets.numel()),
            "majority": majority["test"], "valid_majority": majority["valid"], "test_articles": int(labels["test"].numel())}


def learnt(bpc: float, unigram: float) -> Dict[str, Any]:
    """Has pre-training left the unigram level (by ``LEARNT_MARGIN`` bits per byte)?"""
    return {"ok": unigram - bpc >= LEARNT_MARGIN, "gain": unigram - bpc,
            "text": f"validation {bpc:.3f} bits/byte against the unigram {unigram:.3f}"}


def record_claim(results: Dict[str, Any]) -> None:
    """The claim, one value per seed (recorded with ``claims.MIN_SEEDS`` seeds or more)."""
    per_seed, s = results["per_seed"], results["settings"]
    if len(per_seed) < claims.MIN_SEEDS:
        print(f"{len(per_seed)} seed(s): no claim recorded (claims need {claims.MIN_SEEDS})", flush=True)
        return
    ours = [p["finetune"]["test"]["accuracy"] for p in per_seed]
    base = [p["scratch"]["test"]["accuracy"] for p in per_seed]
    bpc = [p["pretrain"]["valid"]["bpc"] for p in per_seed]
    unigram = results["levels"]["unigram_bpc"]
    below = sum(p["learnt"]["ok"] for p in per_seed)
    numbers = f"test accuracy fine-tuned {claims.fmt(ours)}, from scratch {claims.fmt(base)}"
    pretraining = (f"pre-training reached {claims.fmt(bpc)} validation bits/byte against the unigram "
                   f"{unigram:.3f} ({below} of {len(per_seed)} seeds below it by {LEARNT_MARGIN})")
    claims.record(
        id="gpt-pretrain-finetune", model="gpt", paper=PAPER, command=s["command"], better="higher", ours=ours,
        measured=True,
        baseline=base,
        claim="Generative pre-training on unlabelled text, then discriminative fine-tuning, classifies better than "
              "the same network trained from scratch (here: Wikipedia bytes, then bbc-bytes topics).",
        budget=f"pre-training {s['pretrain_steps']} steps of {s['batch_size']} x {s['context']} bytes, fine-tuning "
               f"{s['finetune_steps']} steps of {s['batch_size']} articles; {s['n_layers']} layers d_model "
               f"{s['d_model']}; {s['machine']}",
        why={"reproduced": f"{numbers}; {pretraining}",
             "not reproduced": f"{numbers}; {pretraining}"})


def plot(results: Dict[str, Any], path: Path) -> None:
    """Left: the pre-training validation bits per byte against the unigram level; right: the
    validation accuracy of the fine-tuned and the from-scratch classifier, per seed."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for p in results["per_seed"]:
        alpha = 1.0 if p["seed"] == 0 else 0.4
        curve = [r for r in p["pretrain"]["valid_curve"] if "bpc" in r]
        a.plot([r["step"] for r in curve], [r["bpc"] for r in curve], "o-", color="C0", alpha=alpha,
               label="GPT (valid)" if p["seed"] == 0 else None)
        for name, style, color in (("finetune", "o-", "C2"), ("scratch", "s--", "C3")):
            curve = [r for r in p[name]["valid_curve"] if "accuracy" in r]
            b.plot([r["step"] for r in curve], [r["accuracy"] for r in curve], style, color=color, alpha=alpha,
                   label=("pre-trained (--init)" if name == "finetune" else "from scratch") if p["seed"] == 0 else None)
    a.axhline(results["levels"]["unigram_bpc"], color="gray", ls=":", label="unigram")
    a.set_xlabel("pre-training step")
    a.set_ylabel("validation bits per byte")
    a.set_title("pre-training (enwiki-bytes)", fontsize=9)
    a.legend(fontsize=7)
    b.axhline(results["levels"]["valid_majority"], color="gray", ls=":", label="majority class")
    b.set_xlabel("fine-tuning step")
    b.set_ylabel("validation accuracy")
    b.set_title(f"BBC News topics from bytes (bbc-bytes); {len(results['per_seed'])} seed(s), seed 0 solid", fontsize=9)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def page(results: Dict[str, Any]) -> str:
    s, levels, per_seed = results["settings"], results["levels"], results["per_seed"]
    first = per_seed[0]
    ours = [p["finetune"]["test"]["accuracy"] for p in per_seed]
    base = [p["scratch"]["test"]["accuracy"] for p in per_seed]
    lines = [
        "# GPT: generative pre-training, then discriminative fine-tuning",
        "",
        *(["**Smoke run (`--quick`): a tiny model and budget; the numbers mean nothing.**", ""] if s["quick"] else []),
        f"{PAPER}. Claim: a Transformer language model pre-trained on unlabelled text",
        "(§3.1), then fine-tuned with a new linear layer on the final hidden state of the last token",
        "(§3.2), classifies better than the same network trained on the labelled task alone",
        "(the ablation \"Transformer w/o pre-training\", Table 5).",
        "",
        "Measured at small scale with real text, on bytes (vocabulary 259): pre-training reads",
        "`enwiki-bytes` (6.09 M bytes of Wikipedia XML, 90% for training); fine-tuning is `bbc-bytes`",
        "(the 2,225 BBC News articles, 5 topics, split 80/10/10; each article's first "
        f"{s['context']} bytes). Model: GPT, {_count(s['n_layers'], 'layer')}, d_model {s['d_model']}, 4 heads, "
        f"d_ff {4 * s['d_model']}, pre-LN, learned positions over {s['context']} bytes, no dropout.",
        "",
        f"Command: `{s['command']}` ({_count(len(per_seed), 'seed')}; {s['machine']}; {results['seconds']:.0f} s "
        "in all). Budget per seed: pre-training "
        f"{s['pretrain_steps']} steps of {s['batch_size']} windows of {s['context']} bytes (lr {s['pretrain_lr']}); "
        f"fine-tuning and the from-scratch run {s['finetune_steps']} steps of {s['batch_size']} articles each "
        f"(lr {s['finetune_lr']}, auxiliary LM weight λ = {s['lm_aux_weight']}). Seed 0 runs:",
        "",
        "```",
        first["pretrain"]["command"],
        first["finetune"]["command"],
        first["scratch"]["command"],
        "```",
        "",
        "## Pre-training",
        "",
        f"Bits per byte on the first {levels['valid_bytes']:,} validation bytes; the unigram level scores the same "
        "bytes with the training bytes' frequencies (add-one smoothed).",
        "",
        "| seed | validation bits/byte | unigram | below the unigram by | training |",
        "|---|---|---|---|---|",
        *[f"| {p['seed']} | {p['pretrain']['valid']['bpc']:.3f} | {levels['unigram_bpc']:.3f} | "
          f"{p['learnt']['gain']:.3f} | {p['pretrain']['train_seconds']:.0f} s |" for p in per_seed],
        "",
        "## Fine-tuning on BBC News topics",
        "",
        f"Test accuracy on the {levels['test_articles']} test articles; the majority class has "
        f"{levels['majority']:.3f} there ({levels['valid_majority']:.3f} on the validation articles).",
        "",
        "| seed | pre-trained, `--init` | from scratch, same budget | training (fine-tuned / scratch) |",
        "|---|---|---|---|",
        *[f"| {p['seed']} | {p['finetune']['test']['accuracy']:.3f} | {p['scratch']['test']['accuracy']:.3f} | "
          f"{p['finetune']['train_seconds']:.0f} s / {p['scratch']['train_seconds']:.0f} s |" for p in per_seed],
        *([f"| mean ± se | {claims.fmt(ours)} | {claims.fmt(base)} | |"] if len(per_seed) > 1 else []),
        "",
        *budget_lines(results),
        f"![pre-training and fine-tuning curves](img/{PLOT})",
        "",
        "Left, the pre-training validation bits per byte; right, the validation accuracy while fine-tuning the",
        "pre-trained network and while training the same network from random weights with the same steps,",
        "batch and learning rate.",
        "",
        "## Reading",
        "",
        reading(results),
        "",
        "Deviations from the paper: bytes instead of a 40k BPE vocabulary; "
        f"{_count(s['n_layers'], 'layer')} of width {s['d_model']} pre-trained on "
        f"{s['pretrain_steps'] * s['batch_size'] * s['context'] / 1e6:.2f} M bytes drawn from the 5.48 M training bytes "
        "of Wikipedia instead of 12 layers of width 768 trained for 100 epochs on BooksCorpus; contexts of "
        f"{s['context']} bytes instead of 512 tokens; pre-LN blocks (GPT-2's wiring); no dropout"
        + ("." if s["lm_aux_weight"] == 0.5 else f"; the auxiliary LM loss at λ = {s['lm_aux_weight']} (the paper: 0.5).")
        + " The fine-tuning learning rate and λ were picked from one-seed trials (lr 5e-4 against 2e-3, λ 0.5 "
          "against 0) that were scored on the test articles — λ = 0.5 is also the paper's.",
        "",
    ]
    return "\n".join(lines)


def budget_lines(results: Dict[str, Any]) -> List[str]:
    """The larger fine-tuning budgets (``--budgets``), if any: each seed's test accuracy."""
    budgets = results.get("budgets", {})
    if not budgets:
        return []
    rows = [f"| {steps} | {', '.join(f'{x:.3f}' for x in b['finetune'])} ({claims.fmt(b['finetune'])}) | "
            f"{', '.join(f'{x:.3f}' for x in b['scratch'])} ({claims.fmt(b['scratch'])}) |"
            for steps, b in sorted(budgets.items(), key=lambda kv: int(kv[0]))]
    return [f"Larger fine-tuning budgets (`--budgets {' '.join(sorted(budgets, key=int))}`, "
            f"{results.get('budget_seconds', 0):.0f} s): the same pre-trained runs fine-tuned again, and the same "
            "network from scratch, with more steps (warm-up 10% of them); test accuracy per seed (mean ± se):", "",
            "| fine-tuning steps | pre-trained, `--init` | from scratch |", "|---|---|---|", *rows, ""]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def reading(results: Dict[str, Any]) -> str:
    """What the numbers say, and no more."""
    per_seed, unigram = results["per_seed"], results["levels"]["unigram_bpc"]
    ours = [p["finetune"]["test"]["accuracy"] for p in per_seed]
    base = [p["scratch"]["test"]["accuracy"] for p in per_seed]
    below = [p["seed"] for p in per_seed if p["learnt"]["ok"]]
    bpc = [p["pretrain"]["valid"]["bpc"] for p in per_seed]
    text = (f"Pre-training reached {claims.fmt(bpc)} validation bits per byte against the unigram level's "
            f"{unigram:.3f}: {len(below)} of {len(per_seed)} seed(s) below it by at least {LEARNT_MARGIN}. "
            f"Fine-tuned test accuracy {claims.fmt(ours)} against {claims.fmt(base)} from scratch")
    if len(per_seed) >= claims.MIN_SEEDS:
        text += f" over {len(per_seed)} seeds: **{claims.verdict(ours, base, 'higher')}** (claims.json)."
    else:
        wins = sum(o > b for o, b in zip(ours, base))
        text += (f"; fine-tuning ahead in {wins} of {len(per_seed)} seed(s), and with fewer than "
                 f"{claims.MIN_SEEDS} seeds no verdict.")
    return text


if __name__ == "__main__":
    main()
