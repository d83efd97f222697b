"""Bahdanau et al. 2014, Fig. 2 on real translation: quality against source length, with seeds.

    PYTHONPATH=src .venv/bin/python benchmarks/repro_bahdanau_length.py --seeds 5 --steps 1000   # ~30 min, one core
    PYTHONPATH=src .venv/bin/python benchmarks/repro_bahdanau_length.py --quick                   # a smoke run

bible-en-es (KJV English -> Reina-Valera 1909 Spanish, character level, verses of at most 100
characters), the GRU encoder-decoder of ``repro_rnn_attention.py --parts bible`` (d_embed 32,
d_hidden 64, AdamW lr 3e-3, batch 32, cosine) with no attention (RNNencdec) and with Bahdanau's
(RNNsearch), ``--seeds`` seeds each (the seed draws the initialisation and the batch order);
greedy translations of the 483 test verses, sacrebleu corpus BLEU and chrF per source-length
bucket. The claim ``bahdanau-length-bible``: with attention, chrF on the longest sources (85-100
characters, where Fig. 2 separates the two) is higher. Writes the seeded section of
docs/reproductions/rnn-attention.md (§4) and its plot.

Its own script (not a part of ``repro_rnn_attention.py``) so that adding it left that script's
claims measured on unchanged code; it reuses that script's scoring and seeding.
"""

from __future__ import annotations

# What this script's claims depend on (benchmarks/claims.py: a claim is stale when one of these, or this
# script, changed since the commit it was measured at): claim id or "*" -> paths, "@group" = claims.GROUPS.
DEPENDS = {'*': ['@training', '@rnn', 'benchmarks/repro_rnn_attention.py', 'src/qkv/tasks/translation.py',
                 'src/qkv/tasks/vocab.py']}

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
from _repro import replace_section, smoke_dir, train_fresh  # noqa: E402
from repro_rnn_attention import BAHDANAU, BIBLE_BUCKETS, seeded_arms, translate_and_score  # noqa: E402

from qkv._io import atomic_path, atomic_write_text  # noqa: E402
from qkv._plot import pyplot, save_figure  # noqa: E402
from qkv.models.rnn.seq2seq import Seq2Seq, Seq2SeqConfig  # noqa: E402

DOC = ROOT / "docs" / "reproductions" / "rnn-attention.md"
IMG = DOC.parent / "img"
OUT = ROOT / "runs" / "repro_bahdanau_length"
ARMS = {"no attention": None, "Bahdanau": "bahdanau"}
LONG = "85-100"  # the longest source bucket
SECTION = ("<!-- bible-length -->", "<!-- /bible-length -->")


def run(args) -> Dict[str, List[Dict]]:
    """Every arm once per seed: per-bucket BLEU, chrF and character accuracy of its greedy test translations."""
    from qkv.tasks.translation import BibleEnEs

    task = BibleEnEs()
    pairs = task.eval_pairs("test", args.eval_verses)

    def fit(label, model, seed):
        return train_fresh(model, task, args.out / f"{ARMS[label] or 'none'}-s{seed}", args.steps, 32, 3e-3,
                           warmup=50, weight_decay=0.0, eval_max_examples=32, seed=seed)

    def measure(label, model, seed):
        hyps, buckets = translate_and_score(model, task, pairs)
        return {"buckets": buckets, "samples": [{"source": s, "reference": r, "hypothesis": h}
                                                for (s, r), h in zip(pairs[:2], hyps[:2])]}

    return seeded_arms(args.seeds, {label: (lambda a=a: Seq2Seq(Seq2SeqConfig(
        src_vocab_size=task.vocab.size, attention=a, d_embed=32, d_hidden=64, attn_dim=64, d_readout=64)))
        for label, a in ARMS.items()}, fit=fit, measure=measure, label="bible")


def names() -> List[str]:
    return [f"{lo}-{hi}" for lo, hi in BIBLE_BUCKETS]


def per_arm(per_seed: Dict[str, List[Dict]], bucket: str, key: str) -> Dict[str, List[float]]:
    """Each arm's per-seed ``key`` (bleu, chrf) on source-length ``bucket``."""
    return {label: [r["buckets"][bucket][key] for r in runs] for label, runs in per_seed.items()}


def plot(per_seed: Dict[str, List[Dict]], path: Path, steps: int) -> None:
    """BLEU and chrF per source-length bucket, mean ± standard error over seeds, one line per arm."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, runs in per_seed.items():
        for ax, key in zip(axes, ("bleu", "chrf")):
            xs = [per_arm({label: runs}, k, key)[label] for k in names()]
            ax.errorbar(names(), [claims.mean(x) for x in xs],
                        yerr=[claims.standard_error(x) if len(x) > 1 else 0.0 for x in xs], marker="o", capsize=3,
                        label=label)
    seeds = len(next(iter(per_seed.values())))
    for ax, what in zip(axes, ("BLEU (sacrebleu, greedy)", "chrF (greedy)")):
        ax.set_xlabel("source length (characters)")
        ax.set_ylabel(f"{what}, mean ± s.e. of {seeds} seed{'s' if seeds != 1 else ''}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"bible-en-es test verses, character level, {steps} steps x 32 pairs (cf. Bahdanau 2014 Fig. 2)")
    save_figure(fig, path, dpi=110)


def write_section(doc: Path, per_seed: Dict[str, List[Dict]], args, verdict: str, picture: str) -> None:
    """The seeded length curve in §4 of ``doc``: BLEU and chrF per bucket (mean ± standard error), the verdict."""
    cols = names() + ["1-100"]
    first = per_seed["Bahdanau"][0]["buckets"]
    rows = [f"| {what} {label} | " + " | ".join(claims.fmt([r["buckets"][k][key] for r in runs]) for k in cols) + " |"
            for key, what in (("bleu", "BLEU"), ("chrf", "chrF")) for label, runs in per_seed.items()]
    chrf = per_arm(per_seed, LONG, "chrf")
    seconds = "; ".join(f"{label} {claims.fmt([r['train_seconds'] for r in runs])}" for label, runs in per_seed.items())
    lines = [SECTION[0], "",
             f"**{args.steps:,} steps, {args.seeds} seeds** (initialisation and batch order), "
             f"`python benchmarks/repro_bahdanau_length.py --seeds {args.seeds} --steps {args.steps}` "
             f"({time.strftime('%Y-%m-%d')}, one thread); mean ± standard error over seeds:", "",
             "| source length (chars) | " + " | ".join(names()) + " | all |", "| --- " * (len(cols) + 1) + "|",
             "| test verses | " + " | ".join(str(first[k]["n"]) for k in cols) + " |", *rows, "",
             f"Training seconds: {seconds}. The claim (`bahdanau-length-bible`, [claims.json](claims.json)) compares "
             f"chrF on the longest sources ({LONG} characters), per seed "
             f"{', '.join(f'{x:.1f}' for x in chrf['Bahdanau'])} against {', '.join(f'{x:.1f}' for x in chrf['no attention'])}: "
             f"**{verdict}** (one-sided Welch t-test at 5 %).", "",
             f"![bible-en-es, {args.steps} steps, {args.seeds} seeds]({picture})", "", SECTION[1]]
    with atomic_path(doc) as tmp:  # the page is replaced whole: a kill leaves the old page or the new one
        tmp.write_text(doc.read_text() if doc.exists() else "")
        replace_section(tmp, "\n".join(lines), SECTION, "## 5. Pointer network")


def record(per_seed: Dict[str, List[Dict]], args, n_test: int) -> None:
    chrf, bleu, every = per_arm(per_seed, LONG, "chrf"), per_arm(per_seed, LONG, "bleu"), per_arm(per_seed, "1-100", "chrf")
    n_long = per_seed["Bahdanau"][0]["buckets"][LONG]["n"]
    said = (f"chrF on the {n_long} test verses of {LONG} source characters: Bahdanau {claims.fmt(chrf['Bahdanau'])}, "
            f"no attention {claims.fmt(chrf['no attention'])} (per seed {[round(x, 1) for x in chrf['Bahdanau']]} vs "
            f"{[round(x, 1) for x in chrf['no attention']]}); BLEU there {claims.fmt(bleu['Bahdanau'])} vs "
            f"{claims.fmt(bleu['no attention'])}; chrF on all test verses {claims.fmt(every['Bahdanau'])} vs "
            f"{claims.fmt(every['no attention'])}")
    claims.record(
        id="bahdanau-length-bible", model="seq2seq (attention=bahdanau)", paper=BAHDANAU, better="higher", measured=True,
        claim="With attention, an encoder-decoder translates long sentences better than the fixed-vector encoder-decoder "
              f"of the same size (Fig. 2: quality against sentence length; here bible-en-es, chrF on the longest sources, "
              f"{LONG} characters).",
        command=f"python benchmarks/repro_bahdanau_length.py --seeds {args.seeds} --steps {args.steps}",
        ours=chrf["Bahdanau"], baseline=chrf["no attention"],
        budget=f"bible-en-es, character level, {args.steps} updates of 32 pairs, GRU d_embed 32, d_hidden 64 in both "
               f"arms, AdamW lr 3e-3 (cosine, 50 warm-up); greedy translations of the {n_test} test verses; CPU, one thread",
        why={"reproduced": said,
             "not reproduced": said + ": " + claims.gap(chrf["Bahdanau"], chrf["no attention"], "higher", unit="chrF")})


def main(argv: List[str] = None) -> Dict[str, List[Dict]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5, help="seeds per arm (a claim needs 3)")
    p.add_argument("--steps", type=int, default=1000, help="training updates of 32 pairs per model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="20 updates, 2 seeds, 50 verses, a temporary folder")
    args = p.parse_args(argv)
    for name in ("seeds", "steps", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    doc, img = DOC, IMG
    if args.quick:
        doc = smoke_dir("bahdanau-length") / DOC.name
        img = doc.parent / "img"
        args.steps, args.seeds = 20, min(args.seeds, 2)
    args.out = doc.parent / "runs" if args.quick else OUT
    args.eval_verses = 50 if args.quick else None
    per_seed = run(args)
    n_test = per_seed["Bahdanau"][0]["buckets"]["1-100"]["n"]
    picture = f"rnn-bible-length-{args.steps}-seeds.png"
    plot(per_seed, img / picture, args.steps)
    chrf = per_arm(per_seed, LONG, "chrf")
    verdict = (claims.verdict(chrf["Bahdanau"], chrf["no attention"], "higher") if args.seeds >= claims.MIN_SEEDS
               else f"no verdict from {args.seeds} seed{'s' if args.seeds != 1 else ''}")
    write_section(doc, per_seed, args, verdict, f"img/{picture}")
    results = {"steps": args.steps, "seeds": args.seeds, "test_verses": n_test, "per_seed": per_seed}
    atomic_write_text(doc.parent / ("bahdanau-length.json" if not args.quick else "bahdanau-length-quick.json"),
                      json.dumps(results, indent=1) + "\n")
    if not args.quick and args.seeds >= claims.MIN_SEEDS:
        record(per_seed, args, n_test)
    print(f"bahdanau-length: {verdict}; wrote {doc}", flush=True)
    return per_seed


if __name__ == "__main__":
    main()
