"""Why does Long Range Arena's Image stand-in favour `linformer` (69.1 %) over `softmax` (33.9 %)?
(docs/reproductions/lra.md's default run, one seed; issue 38, item 6.)

    PYTHONPATH=src .venv/bin/python benchmarks/lra_image.py --seeds 3    # ~60 min on one CPU thread
    PYTHONPATH=src .venv/bin/python benchmarks/lra_image.py --quick      # seconds; a temporary folder

``fashion-mnist-seq`` is a 28 x 28 image read as 784 pixel tokens. Linformer's kernel owns two
matrices E, F of (k, n) = (196, 784) per layer that mix the 784 positions into 196 projected keys
and values: a dense linear map over the whole image, learned, in every layer. Softmax attention has
no such map; it has to build spatial features from position embeddings through attention weights.
The arms, each trained as ``qkv bench lra`` trains an Image cell (its encoder, its plan: 250 updates
of 32, AdamW lr 1e-3, warm-up then cosine; ``--steps`` to change), ``--seeds`` seeds each
(initialisation and batch order):

- ``softmax`` and ``linformer``, as in the default run;
- ``linformer-frozen``: the same, with E and F kept at their random initialisation (not trained):
  does learning the position maps matter, or only having them?
- ``softmax`` at ``--long`` x the updates: does softmax catch up with a budget (the curve)?
- ``pixels``: logistic regression on the 784 grey levels (scaled to [0, 1]), same updates, batch,
  optimiser and schedule: what one dense map over the image reaches on its own.

Writes docs/reproductions/lra-image.json and lra-image.md (test accuracy on the 1,000 test images
``qkv bench lra`` scores).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _repro import smoke_dir, train_fresh  # noqa: E402

from qkv._io import atomic_write_text  # noqa: E402
from qkv.bench import common  # noqa: E402
from qkv.bench import lra  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASK = "fashion-mnist-seq"


def encoder(kernel: str, task: Any, seed: int, frozen: bool = False) -> nn.Module:
    """``qkv bench lra``'s Image encoder with ``kernel`` (its initialisation for ``seed``); with
    ``frozen``, every linformer projection (E, F) is left out of training."""
    model = lra.model_for(TASK, task, kernel, seed)
    if frozen:
        names = [n for n, p in model.named_parameters() if n.endswith((".E", ".F"))]
        if not names:
            raise ValueError(f"{kernel}: no E / F projections to freeze")
        for n, p in model.named_parameters():
            if n in names:
                p.requires_grad_(False)
    return model


def train_encoder(arm: str, kernel: str, task: Any, seed: int, steps: int, batch: int, lr: float, warmup: int,
                  out: Path, test_examples: int, frozen: bool = False) -> Dict[str, Any]:
    model = encoder(kernel, task, seed, frozen)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    seconds = train_fresh(model, task, out / f"{arm}-{steps}-{seed}", steps, batch, lr, warmup=warmup,
                          schedule="cosine", seed=seed, eval_max_examples=256)
    model.eval()
    test = task.evaluate(model, "test", max_examples=test_examples)
    print(f"{arm} ({steps} updates) seed {seed}: {test['accuracy']:.3f} ({seconds:.0f} s)", flush=True)
    return {"accuracy": float(test["accuracy"]), "seconds": seconds, "trained_parameters": trained,
            "parameters": sum(p.numel() for p in model.parameters())}


def train_pixels(task: Any, seed: int, steps: int, batch: int, lr: float, warmup: int,
                 test_examples: int) -> Dict[str, Any]:
    """Logistic regression on the grey levels: AdamW, linear warm-up then cosine decay, as the encoders."""
    torch.manual_seed(seed)
    model = nn.Linear(task.max_len, task.n_classes)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    warm = max(1, min(warmup, steps // 4))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: (t + 1) / warm if t < warm else 0.5 * (1 + math.cos(math.pi * (t - warm) / max(1, steps - warm))))
    start = time.time()
    for step in range(steps):
        b = task.get_batch("train", batch, step, seed=seed)
        loss = nn.functional.cross_entropy(model(b["input_ids"].float() / 255.0), b["labels"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        right = total = 0
        for b in task.eval_batches("test", 250, test_examples):
            right += int((model(b["input_ids"].float() / 255.0).argmax(-1) == b["labels"]).sum())
            total += len(b["labels"])
    print(f"pixels seed {seed}: {right / total:.3f}", flush=True)
    return {"accuracy": right / total, "seconds": time.time() - start,
            "trained_parameters": sum(p.numel() for p in model.parameters())}


def summary(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    accs = [r["accuracy"] for r in runs]
    return {"per_seed": accs, "mean": statistics.mean(accs), "sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "trained_parameters": runs[0]["trained_parameters"], "seconds": [r["seconds"] for r in runs]}


def page(res: Dict[str, Any]) -> List[str]:
    steps, long = res["steps"], res["steps"] * res["long"]
    arms = [("softmax", f"`softmax`, {steps} updates"), ("linformer", f"`linformer`, {steps} updates"),
            ("linformer-frozen", f"`linformer`, E and F frozen at initialisation, {steps} updates"),
            ("softmax-long", f"`softmax`, {long} updates"),
            ("pixels", f"logistic regression on the 784 grey levels, {steps} updates")]
    rows = [f"| {label} | {', '.join(f'{100 * a:.1f}' for a in res['arms'][k]['per_seed'])} | "
            f"{100 * res['arms'][k]['mean']:.1f} ± {100 * res['arms'][k]['sd']:.1f} | "
            f"{res['arms'][k]['trained_parameters']:,} |" for k, label in arms if k in res["arms"]]
    a = {k: v["mean"] for k, v in res["arms"].items()}
    lin_params = res["arms"]["linformer"]["trained_parameters"] - res["arms"]["linformer-frozen"]["trained_parameters"]
    reading = [
        f"- Linformer's E and F, the (k, n) = ({res['k']}, {res['n']}) position maps of its two layers, are "
        f"{lin_params:,} of its {res['arms']['linformer']['trained_parameters']:,} trained parameters; softmax "
        f"trains {res['arms']['softmax']['trained_parameters']:,} in all.",
        f"- Frozen at their random initialisation they give {100 * a['linformer-frozen']:.1f} % against "
        f"{100 * a['linformer']:.1f} % trained ({100 * (a['linformer'] - a['linformer-frozen']):+.1f} points) and "
        f"softmax's {100 * a['softmax']:.1f} %.",
        f"- Softmax with {res['long']} x the updates: {100 * a['softmax-long']:.1f} % "
        f"({100 * (a['softmax-long'] - a['softmax']):+.1f} points over {steps} updates).",
        f"- One dense map over the pixels and nothing else (logistic regression) reaches {100 * a['pixels']:.1f} % "
        f"in the same {steps} updates.",
    ]
    return [
        f"`{TASK}` (Fashion-MNIST read as {res['n']} pixel tokens), the encoder and plan of `qkv bench lra` "
        f"({steps} updates of {res['batch']}, AdamW lr {res['lr']}, warm-up then cosine), {len(res['seeds'])} seeds "
        f"(initialisation and batch order); test accuracy on {res['test_examples']:,} test images (%):\n\n" +
        "\n".join(["| arm | per seed | mean ± sd | trained parameters |", "| --- | --- | --- | --- |", *rows]),
        "\n".join(reading),
        f"Time: {res['minutes']:.1f} min on one CPU thread."]


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="updates per arm (default: the LRA plan's for Image, 250)")
    p.add_argument("--long", type=int, default=4, help="softmax's longer run: this many times --steps")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a few updates on a few test images (numbers meaningless)")
    args = p.parse_args(argv)
    for name in ("seeds", "long", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    torch.set_num_threads(args.threads)
    plan = lra.PLAN[TASK]
    steps = args.steps or (4 if args.quick else plan.steps)
    test_examples = 50 if args.quick else plan.eval_examples
    out_dir = smoke_dir("lra-image") if args.quick else ROOT / "docs" / "reproductions"
    runs = Path("/tmp" if args.quick else ROOT / "runs") / "lra_image"
    task = lra.build_lra_task(TASK, plan.options)
    seeds = list(range(args.seeds))
    start = time.time()
    arms: Dict[str, List[Dict[str, Any]]] = {k: [] for k in
                                             ("pixels", "softmax", "linformer", "linformer-frozen", "softmax-long")}
    common_args = dict(batch=plan.batch_size, lr=plan.lr, warmup=plan.warmup, out=runs, test_examples=test_examples)
    for seed in seeds:
        arms["pixels"].append(train_pixels(task, seed, steps, plan.batch_size, plan.lr, plan.warmup, test_examples))
        arms["softmax"].append(train_encoder("softmax", "softmax", task, seed, steps, **common_args))
        arms["linformer"].append(train_encoder("linformer", "linformer", task, seed, steps, **common_args))
        arms["linformer-frozen"].append(train_encoder("linformer-frozen", "linformer", task, seed, steps,
                                                      frozen=True, **common_args))
    for seed in seeds:
        arms["softmax-long"].append(train_encoder("softmax-long", "softmax", task, seed, steps * args.long,
                                                  **common_args))
    knobs = lra.model_for(TASK, task, "linformer", 0).config.attention_kwargs
    res = {"task": TASK, "steps": steps, "long": args.long, "batch": plan.batch_size, "lr": plan.lr,
           "seeds": seeds, "test_examples": test_examples, "n": task.max_len, "k": knobs.get("k"),
           "arms": {k: summary(v) for k, v in arms.items()}, "machine": common.describe_machine(torch.device("cpu")),
           "command": "python benchmarks/lra_image.py " + " ".join(sys.argv[1:]), "date": common.now_iso(),
           "minutes": (time.time() - start) / 60}
    atomic_write_text(out_dir / "lra-image.json", json.dumps(res, indent=1) + "\n")
    common.write_markdown(out_dir / "lra-image.md", "Why the Image stand-in favours linformer over softmax "
                          "(Long Range Arena, issue 38)", res["machine"], res["command"], res["date"], page(res))
    print(f"wrote {out_dir / 'lra-image.md'}")


if __name__ == "__main__":
    main()
