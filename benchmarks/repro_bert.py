"""Reproduce docs/reproductions/bert.md in one command: BERT pre-training (masked LM + next-sentence
prediction) on BBC News sentence pairs, then fine-tuning on BBC News topic classification
against the same model trained from scratch (Devlin et al. 2019, §3.1-3.2, §4).

    .venv/bin/python benchmarks/repro_bert.py            # ~10 min on one shared CPU core
    .venv/bin/python benchmarks/repro_bert.py --quick    # ~1 min smoke run (numbers meaningless)

Every run goes through ``qkv.runs``, what the command line calls, and is recorded as the command a
user would type:

1. ``qkv train bert --task bert-pretrain`` (MLM 15% 80/10/10 + NSP 50/50, ``[CLS] A [SEP] B [SEP]``);
2. ``qkv train bert --task bbc-news --init runs/repro_bert/pretrain`` (encoder from step 1, new head);
3. ``qkv train bert --task bbc-news`` with the same architecture and budget from random weights;

then ``qkv eval`` on the test splits. Writes ``runs/repro_bert/results.json``,
``docs/reproductions/bert.md`` and ``docs/reproductions/img/bert_*.png``.
"""

from __future__ import annotations

# What this script's claims depend on (benchmarks/claims.py: a claim is stale when one of these, or this
# script, changed since the commit it was measured at): claim id or "*" -> paths, "@group" = claims.GROUPS.
DEPENDS = {'*': ['@training',
       '@transformer',
       '@text',
       'src/qkv/models/transformer/bert.py',
       'src/qkv/tasks/bert_tasks.py',
       'src/qkv/tasks/bbc.py',
       'src/qkv/tasks/classify.py',
       'src/qkv/runs.py']}

import argparse
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from qkv.tasks import build_task  # noqa: E402

import claims  # noqa: E402  (benchmarks/claims.py: the claims table and its verdicts)
from _repro import evals, evaluate_test, shown, smoke_dir, train  # noqa: E402,F401  (shown: tests/test_runs.py reads it here)

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "reproductions" / "img"
DOC = ROOT / "docs" / "reproductions" / "bert.md"
OUT = ROOT / "runs" / "repro_bert"
ARCH = {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256, "attention_dropout": 0.0}
COMMON = {"train.progress": False, "train.tensorboard": False}
PAPER = "Devlin et al. 2019, BERT: Pre-training of Deep Bidirectional Transformers (arXiv:1810.04805)"
# pre-training has learnt something only when the masked LM beats the unigram model (the target
# words' own frequencies) and next-sentence prediction beats ln 2, each by at least this much (nats)
LEARNT_MARGIN = 0.1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny budgets: checks the pipeline, not the numbers")
    p.add_argument("--pretrain-steps", type=int, default=1200)
    p.add_argument("--finetune-steps", type=int, default=300)
    p.add_argument("--pretrain-lr", type=float, default=1e-3)
    p.add_argument("--max-vocab", type=int, default=5000, help="words in the vocabulary (both tasks)")
    p.add_argument("--pretrain-warmup", type=int, default=100, help="linear warm-up steps of pre-training")
    p.add_argument("--residual", choices=["post-ln", "pre-ln"], default="post-ln",
                   help="the encoder's wiring (BERT: post-ln; pre-ln trains more easily at a high learning rate)")
    p.add_argument("--seeds", type=int, default=1,
                   help="pre-train + fine-tune + scratch once per seed; the claim is recorded with >= 3 seeds, and "
                        "only when pre-training has left the unigram level")
    p.add_argument("--pretrain-only", action="store_true",
                   help="pre-train (every seed) and report the masked-LM and next-sentence losses against the unigram "
                        "level and ln 2; no fine-tuning (for tuning pre-training)")
    p.add_argument("--doc-only", action="store_true", help="rewrite the page from runs/repro_bert (no training)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.quick:  # a smoke run writes (and clears) its own folder, never the published runs and pictures
        global OUT, IMG
        OUT = smoke_dir("bert") / "runs"
        IMG = OUT.parent / "img"
    if args.doc_only:
        results = json.loads((OUT / "results.json").read_text())
        if (OUT / "pretrain" / "model").is_dir():
            results["cls"] = cls_spread(OUT / "pretrain", results["settings"]["max_vocab"])
        (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        write_doc(results, plot(results, False), results["settings"]["command"])
        return
    pre_steps = 20 if args.quick else args.pretrain_steps
    fine_steps = 10 if args.quick else args.finetune_steps
    if OUT.exists():
        shutil.rmtree(OUT)
    chance = chance_levels(args.max_vocab)
    arch = {**ARCH, "residual": args.residual}
    seeds_results = []
    for seed in range(args.seeds):
        seed_out = OUT if seed == 0 else OUT / f"seed{seed}"
        results = train_seed(args, seed, seed_out, arch, pre_steps, fine_steps)
        results["chance"] = chance
        results["learnt"] = learnt(results["pretrain"]["test"], chance)
        seeds_results.append(results)
        print(f"seed {seed}: pre-training {'left' if results['learnt']['ok'] else 'did NOT leave'} the unigram level "
              f"({results['learnt']['text']})", flush=True)
    results = seeds_results[0]
    results["per_seed"] = [{"seed": i, "learnt": r["learnt"], "pretrain": r["pretrain"]["test"],
                            "finetune": r.get("finetune", {}).get("test"), "scratch": r.get("scratch", {}).get("test")}
                           for i, r in enumerate(seeds_results)]
    OUT.mkdir(parents=True, exist_ok=True)
    results["settings"] = {"pretrain_steps": pre_steps, "finetune_steps": fine_steps, "pretrain_lr": args.pretrain_lr,
                           "pretrain_warmup": args.pretrain_warmup, "residual": args.residual,
                           "max_vocab": args.max_vocab, "seeds": args.seeds,
                           "command": " ".join(["python benchmarks/repro_bert.py", *_flags(args)])}
    (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if not args.quick:  # the per-seed raw results, committed beside the page (runs/ is not)
        DOC.with_suffix(".json").write_text(json.dumps({k: results[k] for k in ("settings", "per_seed", "chance")},
                                                       indent=2) + "\n")
    if args.pretrain_only:
        return
    results["cls"] = cls_spread(OUT / "pretrain", args.max_vocab)
    plots = plot(results, args.quick)
    if not args.quick:
        write_doc(results, plots, results["settings"]["command"])
        record_claim(results, args)


def train_seed(args, seed: int, out: Path, arch: Dict[str, Any], pre_steps: int, fine_steps: int) -> Dict:
    """Pre-train, fine-tune and train from scratch with one seed (through ``qkv.runs``)."""
    pre, fine, scratch = out / "pretrain", out / "finetune", out / "scratch"
    every = max(pre_steps // 6, 1)
    vocab = {"task.max_vocab": args.max_vocab}
    common = {**COMMON, "train.seed": seed}
    fine_tune = {"train.steps": fine_steps, "train.batch_size": 32, "train.lr": 5e-4, "train.warmup": 30,
                 "train.eval_every": max(fine_steps // 6, 1), "train.eval_batches": 0, "train.eval_max_examples": 256}
    phases = {  # name: (model, task, out, overrides, init)
        "pretrain": ("bert", "bert-pretrain", pre, {**arch, **vocab, "train.steps": pre_steps, "train.batch_size": 32,
                                                    "train.lr": args.pretrain_lr, "train.warmup": args.pretrain_warmup,
                                                    "train.eval_every": every, "train.eval_batches": 4,
                                                    "train.eval_max_examples": 512, **common}, None),
        "finetune": ("bert", "bbc-news", fine, {**vocab, **fine_tune, **common}, pre),
        "scratch": ("bert", "bbc-news", scratch, {**arch, **vocab, **fine_tune, **common}, None),
    }
    if args.pretrain_only:
        phases = {"pretrain": phases["pretrain"]}
    results: Dict[str, Dict] = {}
    for name, phase in phases.items():
        t0 = time.time()
        train(*phase)
        seconds = time.time() - t0
        test = evaluate_test(out / name)
        results[name] = {"command": shown(*phase), "train_seconds": round(seconds, 1), "test": test,
                         "valid_curve": evals(out / name)}
        print(name, f"seed {seed}", results[name]["test"], f"{seconds:.0f} s", flush=True)
    return results


def chance_levels(max_vocab: int) -> Dict:
    """What pre-training must beat on the same held-out pairs: the most frequent word and the
    unigram model (cross-entropy of the targets under the training targets' frequencies) for the masked LM,
    the majority class and ln 2 for next-sentence prediction."""
    task = build_task("bert-pretrain", max_vocab=max_vocab)
    most_frequent = len(task.vocab.special_ids)  # words are sorted by count after the 5 specials
    targets = torch.cat([b["labels"][b["labels"] != -100] for b in task.eval_batches("test", 64)])
    nsp = torch.cat([b["next_sentence_label"] for b in task.eval_batches("test", 64)])
    # the unigram model: the masked-LM targets' frequencies in 400 training batches (add-one smoothed),
    # scored on the held-out targets (their own empirical entropy would be biased low: ~4k targets, 5k words)
    counts = torch.ones(task.vocab.size)
    for step in range(400):
        labels = task.get_batch("train", 64, step)["labels"]
        counts += torch.bincount(labels[labels != -100], minlength=task.vocab.size).float()
    unigram = float(-(counts / counts.sum()).log()[targets].mean())
    chance = {"mlm_most_frequent_word": (targets == most_frequent).float().mean().item(),
              "most_frequent_word": task.vocab.words[most_frequent],
              "mlm_unigram_loss": unigram,
              "nsp_majority": max(nsp.float().mean().item(), 1 - nsp.float().mean().item()),
              "nsp_chance_loss": math.log(2), "mlm_targets": len(targets), "pairs": len(nsp)}
    fine_task = build_task("bbc-news-tokens", max_vocab=max_vocab)
    counts = torch.bincount(fine_task._splits["test"]["labels"], minlength=5)
    chance["bbc_majority"] = (counts.max() / counts.sum()).item()
    return chance


def learnt(test: Dict, chance: Dict) -> Dict:
    """Has pre-training left the unigram level? Masked-LM loss below the unigram loss and
    next-sentence loss below ln 2, each by ``LEARNT_MARGIN`` nats."""
    mlm_gain = chance["mlm_unigram_loss"] - test["mlm_loss"]
    nsp_gain = chance["nsp_chance_loss"] - test["nsp_loss"]
    ok = mlm_gain >= LEARNT_MARGIN and nsp_gain >= LEARNT_MARGIN
    return {"ok": ok, "mlm_gain": mlm_gain, "nsp_gain": nsp_gain,
            "text": f"masked LM {test['mlm_loss']:.3f} nats against the unigram {chance['mlm_unigram_loss']:.3f}, "
                    f"next sentence {test['nsp_loss']:.3f} against ln 2 = {chance['nsp_chance_loss']:.3f}"}


def record_claim(results: Dict, args) -> None:
    """The fine-tuning claim, one value per seed — refused while any seed's pre-training sits at
    the unigram level (then the claim stays pending, with that reason)."""
    per_seed = results["per_seed"]
    if len(per_seed) < claims.MIN_SEEDS:
        return
    stuck = [p["seed"] for p in per_seed if not p["learnt"]["ok"]]
    if stuck:
        print(f"no verdict: pre-training did not leave the unigram level for seeds {stuck} "
              f"({per_seed[stuck[0]]['learnt']['text']}); the claim stays pending", flush=True)
        return
    ours = [p["finetune"]["accuracy"] for p in per_seed]
    base = [p["scratch"]["accuracy"] for p in per_seed]
    s = results["settings"]
    claims.record(
        id="bert-finetune", model="bert", paper=PAPER, command=s["command"], better="higher", ours=ours, baseline=base,
        measured=True,
        claim="Pre-training with the masked LM and next-sentence prediction gives an encoder that fine-tunes to a "
              "better accuracy than the same network trained from scratch (here: bbc-news topics).",
        budget=f"pre-training {s['pretrain_steps']} steps of 32 pairs, fine-tuning {s['finetune_steps']} steps of 32; "
               f"2 layers d_model 64, {s['residual']}; CPU, one thread",
        why={"reproduced": f"test accuracy fine-tuned {claims.fmt(ours)}, from scratch {claims.fmt(base)}",
             "not reproduced": f"test accuracy fine-tuned {claims.fmt(ours)}, from scratch {claims.fmt(base)}, with "
                               f"pre-training past the unigram level ({per_seed[0]['learnt']['text']})"})


def plot(results: Dict, quick: bool) -> List[str]:
    IMG.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if quick else ""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    curve = results["pretrain"]["valid_curve"]
    steps = [r["step"] for r in curve]
    a.plot(steps, [r["mlm_accuracy"] for r in curve], "o-", label="masked LM accuracy")
    a.plot(steps, [r["nsp_accuracy"] for r in curve], "s-", label="next-sentence accuracy")
    a.axhline(results["chance"]["mlm_most_frequent_word"], color="C0", ls=":", label="MLM: most frequent word")
    a.axhline(0.5, color="C1", ls=":", label="NSP: chance")
    a.set_xlabel("pre-training step")
    a.set_ylabel("validation accuracy")
    a.set_title("pre-training (bert-pretrain)", fontsize=9)
    a.legend(fontsize=7)
    for name, style in (("finetune", "o-"), ("scratch", "s--")):
        curve = results[name]["valid_curve"]
        b.plot([r["step"] for r in curve], [r["accuracy"] for r in curve], style,
               label="pre-trained (--init)" if name == "finetune" else "from scratch")
    b.axhline(results["chance"]["bbc_majority"], color="gray", ls=":", label="majority class")
    b.set_xlabel("fine-tuning step")
    b.set_ylabel("validation accuracy")
    b.set_title("BBC News topic classification (bbc-news)", fontsize=9)
    b.legend(fontsize=7)
    fig.tight_layout()
    name = f"bert_pretrain_finetune{suffix}.png"
    fig.savefig(IMG / name, dpi=110)
    plt.close(fig)
    return [name]


@torch.no_grad()
def cls_spread(run_dir: Path, max_vocab: int) -> Dict[str, float]:
    """How much the pre-trained encoder's top-layer [CLS] vector varies across held-out pairs, next
    to the other positions' (per-dimension standard deviation over examples, averaged)."""
    from qkv.models import QKVModel

    model = QKVModel.from_pretrained(run_dir / "model").eval()
    task = build_task("bert-pretrain", max_vocab=max_vocab)
    batch = next(task.eval_batches("test", 256))
    h = model.stack(batch["input_ids"], batch["token_type_ids"], mask=batch["attention_mask"]).hidden  # (B, L, d)
    tokens = h[:, 1:][batch["attention_mask"][:, 1:]]  # (M, d) every real non-[CLS] position
    return {"cls_std": h[:, 0].std(0).mean().item(), "token_std": tokens.std(0).mean().item()}


def _flags(args) -> List[str]:
    defaults = {"pretrain_steps": 1200, "finetune_steps": 300, "pretrain_lr": 1e-3, "max_vocab": 5000,
                "pretrain_warmup": 100, "residual": "post-ln", "seeds": 1}
    return [f"--{k.replace('_', '-')} {getattr(args, k)}" for k, v in defaults.items() if getattr(args, k) != v]


TUNING = ("<!-- pretraining-tuning -->", "<!-- /pretraining-tuning -->")


def kept_section(marks) -> List[str]:
    """The page's marked section (measured by earlier runs with other settings), kept as it is when
    the page is rewritten; none when the page has no such section."""
    text = DOC.read_text() if DOC.exists() else ""
    if marks[0] not in text:
        return []
    return [text[text.index(marks[0]):text.index(marks[1]) + len(marks[1])], ""]


def write_doc(results: Dict, plots: List[str], command: str) -> None:
    pre, fine, scratch, chance = results["pretrain"], results["finetune"], results["scratch"], results["chance"]
    pt, ft, st = pre["test"], fine["test"], scratch["test"]
    lines = [
        "# BERT: pre-training (masked LM + next sentence) and fine-tuning",
        "",
        "Devlin et al. 2019, \"BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding\"",
        "(arXiv:1810.04805). Claim: pre-training a bidirectional encoder on unlabelled text with the masked",
        "LM (15% of tokens, 80/10/10 `[MASK]`/random/unchanged) and next-sentence prediction (50% IsNext,",
        "50% NotNext pairs `[CLS] A [SEP] B [SEP]` with segment ids) learns representations that a new",
        "classification head fine-tunes better than the same network trained from scratch.",
        "",
        "Reproduced at small scale on CPU with real text: the 2,225 BBC News articles. Pre-training pairs come",
        "from the 1,780 *training* articles of `bbc-news` (`bert-pretrain`); fine-tuning is `bbc-news` topic",
        "classification (5 classes) on `[CLS]` + the first 62 words of an article (`bbc-news-tokens`, the form",
        "`qkv train bert --task bbc-news` takes); the vocabulary is the "
        f"{results['settings']['max_vocab']:,} most frequent training words.",
        f"Model: 2 layers, d_model 64, 4 heads, d_ff 256 ({results['settings'].get('residual', 'post-ln')}, GELU, "
        "learned positions, max_len 64).",
        "",
        f"Command ({results['settings'].get('seeds', 1)} seed(s), single-threaded; the tables show seed 0): `{command}` "
        f"({pre['train_seconds'] + fine['train_seconds'] + scratch['train_seconds']:.0f} s of training on a shared 2-core machine).",
        "It runs:",
        "",
        "```",
        *(run["command"].replace(f"{ROOT}/", "") for run in (pre, fine, scratch)),
        "```",
        "",
        "## Pre-training",
        "",
        "| held-out test pairs | masked LM accuracy | next-sentence accuracy | MLM loss | NSP loss |",
        "|---|---|---|---|---|",
        f"| after {pre['valid_curve'][-1]['step']} steps | {pt['mlm_accuracy']:.3f} | {pt['nsp_accuracy']:.3f} | "
        f"{pt['mlm_loss']:.3f} | {pt['nsp_loss']:.3f} |",
        f"| chance | {chance['mlm_most_frequent_word']:.3f} (always \"{chance['most_frequent_word']}\") | "
        f"{chance['nsp_majority']:.3f} (majority) | {chance['mlm_unigram_loss']:.3f} (unigram) | 0.693 |",
        "",
        f"({chance['mlm_targets']} masked-LM targets in {chance['pairs']} test pairs; `[UNK]` is never a target.)",
        "",
        "## Fine-tuning on BBC News",
        "",
        "| test articles (223) | accuracy | loss | training |",
        "|---|---|---|---|",
        f"| pre-trained, `--init` | {ft['accuracy']:.3f} | {ft['loss']:.3f} | {fine['train_seconds']:.0f} s |",
        f"| from scratch, same budget | {st['accuracy']:.3f} | {st['loss']:.3f} | {scratch['train_seconds']:.0f} s |",
        f"| majority class | {chance['bbc_majority']:.3f} | | |",
        "",
        *[f"![pre-training and fine-tuning curves](img/{name})" for name in plots],
        "",
        "Validation curves: left, the masked LM and next-sentence accuracy during pre-training; right, the",
        "topic accuracy while fine-tuning the pre-trained encoder and while training the same network from",
        "random weights with the same steps, batch and learning rate.",
        "",
        "## Reading",
        "",
        _reading(pt, ft, st, chance, results.get("cls"), results.get("per_seed", [])),
        "",
        *kept_section(TUNING),
        "Deviations from the paper: words instead of WordPiece; a 0.2 M-parameter encoder pre-trained for",
        "minutes on ~1.8 k articles instead of BERT-base on 3.3 G words; sequences of 64 tokens; the masked-LM",
        "decoder evaluated at the selected positions only (`mlm_logits=\"selected\"`, as the original",
        "implementation's `masked_lm_positions`).",
        "",
    ]
    DOC.write_text("\n".join(lines))


def _reading(pt: Dict, ft: Dict, st: Dict, chance: Dict, cls: Dict = None, per_seed: List[Dict] = ()) -> str:
    state = learnt(pt, chance)
    if not state["ok"]:
        text = (f"**Pre-training did not leave the unigram level** ({state['text']}; it must beat both by "
                f"{LEARNT_MARGIN} nats), so there is no pre-trained representation to test: **no verdict** on the "
                "fine-tuning claim (claims-pending.json keeps it pending). Masked-LM accuracy "
                f"{pt['mlm_accuracy']:.3f} against {chance['mlm_most_frequent_word']:.3f} for always "
                f"\"{chance['most_frequent_word']}\"; next-sentence accuracy {pt['nsp_accuracy']:.3f} against the "
                f"majority class's {chance['nsp_majority']:.3f}.")
    else:
        seeds = [p for p in per_seed if p.get("finetune")]
        text = (f"Pre-training left the unigram level ({state['text']}). Fine-tuned test accuracy "
                f"{ft['accuracy']:.3f} against {st['accuracy']:.3f} from scratch (seed 0)")
        if len(seeds) >= claims.MIN_SEEDS:
            ours, base = [p["finetune"]["accuracy"] for p in seeds], [p["scratch"]["accuracy"] for p in seeds]
            text += (f"; over {len(seeds)} seeds {claims.fmt(ours)} against {claims.fmt(base)}: "
                     f"**{claims.verdict(ours, base, 'higher')}** (claims.json)")
        else:
            text += f"; one seed, so no verdict (claims need {claims.MIN_SEEDS})"
        text += "."
    if cls:
        text += (f" The pre-trained encoder's top-layer `[CLS]` vector varies between pairs with a standard "
                 f"deviation of {cls['cls_std']:.3f} per dimension (256 test pairs), against {cls['token_std']:.3f} at "
                 "the other positions; the classifier reads `[CLS]` through the pooler.")
    return text


if __name__ == "__main__":
    main()
