"""Do the Long Range Arena stand-ins carry signal? Cheap models that are not Transformers, on the
same splits the LRA runs use (issue 38, item 6: first show each task can be learned at all).

    PYTHONPATH=src .venv/bin/python benchmarks/lra_signal.py           # seconds; needs `qkv data fetch bbc`
    PYTHONPATH=src .venv/bin/python benchmarks/lra_signal.py --quick   # a few articles, a temporary folder

- **Text** (``bbc-bytes``): each article's first ``--text-len`` bytes as hashed byte 1-3-gram counts,
  TF-IDF weighted (document frequencies from the training split) and L2-normalised; a
  nearest-centroid classifier (cosine to each class's mean training vector). No gradient training.
- **Retrieval** (``bbc-match``): the cosine of the two articles' TF-IDF vectors; the threshold that
  best separates the task's training pairs (``--train-pairs`` drawn as training draws them) labels
  the held-out test pairs.

- **Pathfinder** (``pathfinder``, at ``qkv bench lra``'s options and at each ``--pathfinder-sizes``):
  a small CNN (``--pathfinder-layers`` 3x3 convolutions of 32 channels, ReLU, 2x2 max pooling
  after every second, global max pooling, a linear layer) trained ``--pathfinder-steps`` updates
  of 64 on a fixed training set of ``--pathfinder-train`` images, ``--seeds`` seeds
  (initialisation and batch order).

Each accuracy is against the majority class of the same test set; a one-sided binomial z-test at
5 % (standard error ``sqrt(p0 (1 - p0) / n)`` under the majority rate ``p0``) says whether the
model is above it (for Pathfinder, every seed's). Text and Retrieval are deterministic (no seeds:
fixed splits, no training randomness). Writes ``docs/reproductions/lra-signal.json`` and
``lra-signal.md``. ListOps is not covered (its labels are computed from the tokens; the encoders
learn it already).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _repro import smoke_dir  # noqa: E402

from qkv._io import atomic_write_text  # noqa: E402
from qkv.tasks.lra import BBCBytes, BBCMatch, Pathfinder  # noqa: E402

DOC = ROOT / "docs" / "reproductions" / "lra-signal.md"
DIM = 2 ** 14  # hashed n-gram buckets


def ngram_counts(data: bytes, max_len: int, dim: int = DIM) -> np.ndarray:
    """Hashed counts of the byte 1-, 2- and 3-grams of ``data[:max_len]`` (float32, ``(dim,)``)."""
    a = np.frombuffer(data[:max_len], dtype=np.uint8).astype(np.int64)
    grams = [a, 256 + a[:-1] * 256 + a[1:], 65792 + (a[:-2] * 256 + a[1:-1]) * 256 + a[2:]]
    codes = np.concatenate(grams) * 2654435761 % dim  # multiplicative hash into the buckets
    return np.bincount(codes, minlength=dim).astype(np.float32)


class Tfidf:
    """TF-IDF over hashed byte n-grams, document frequencies from ``docs``."""

    def __init__(self, docs: Sequence[bytes], max_len: int) -> None:
        self.max_len = max_len
        counts = np.stack([ngram_counts(d, max_len) for d in docs])
        self.idf = np.log((1 + len(docs)) / (1 + (counts > 0).sum(0))) + 1.0

    def __call__(self, doc: bytes) -> np.ndarray:
        v = np.log1p(ngram_counts(doc, self.max_len)) * self.idf
        return v / max(float(np.linalg.norm(v)), 1e-12)


def above_majority(accuracy: float, majority: float, n: int) -> Dict[str, float]:
    """The one-sided binomial z-test of ``accuracy`` against the ``majority`` rate on ``n`` examples."""
    se = math.sqrt(majority * (1 - majority) / n)
    z = (accuracy - majority) / se
    return {"accuracy": accuracy, "majority": majority, "n": n, "z": z,
            "p": 0.5 * math.erfc(z / math.sqrt(2)), "signal": bool(0.5 * math.erfc(z / math.sqrt(2)) < 0.05)}


def text_signal(task: BBCBytes) -> Dict[str, float]:
    train = [task._data[i] for i in task._parts["train"]]
    test = [task._data[i] for i in task._parts["test"]]
    vec = Tfidf([d for d, _ in train], task.max_len)
    X = np.stack([vec(d) for d, _ in train])
    y = np.array([c for _, c in train])
    centroids = np.stack([X[y == k].mean(0) for k in range(task.n_classes)])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    pred = np.argmax(np.stack([vec(d) for d, _ in test]) @ centroids.T, axis=1)
    truth = np.array([c for _, c in test])
    majority = max(np.mean(truth == k) for k in range(task.n_classes))
    return above_majority(float(np.mean(pred == truth)), float(majority), len(test))


def retrieval_signal(task: BBCMatch, train_pairs: int) -> Dict[str, float]:
    vec = Tfidf([task._data[i][0] for i in task._parts["train"]], task.max_len)
    cache: Dict[int, np.ndarray] = {}

    def cosine(a: bytes, b: bytes) -> float:
        va = cache.setdefault(id(a), vec(a))
        vb = cache.setdefault(id(b), vec(b))
        return float(va @ vb)

    train = task._draw("train", train_pairs, 0, 0, 0, 1)
    scores = np.array([cosine(a, b) for a, b, _ in train])
    labels = np.array([y for _, _, y in train])
    cuts = np.unique(scores)
    best = max(cuts, key=lambda c: np.mean((scores >= c) == labels))
    test = task._held_out("test", task.eval_size)
    pred = np.array([cosine(a, b) >= best for a, b, _ in test])
    truth = np.array([y for _, _, y in test])
    majority = max(float(np.mean(truth)), 1 - float(np.mean(truth)))
    return {**above_majority(float(np.mean(pred == truth)), majority, len(test)), "threshold": float(best)}


def path_cnn(layers: int, side: int, width: int = 32) -> nn.Module:
    """``layers`` 3x3 convolutions (padding 1, ReLU), a 2x2 max pooling after every second one while
    the map is larger than 4x4 (so the receptive field covers the image), global max pooling, a
    linear layer to the two classes."""
    convs: List[nn.Module] = []
    for i in range(layers):
        convs += [nn.Conv2d(1 if i == 0 else width, width, 3, padding=1), nn.ReLU()]
        if i % 2 == 1 and side > 4 and i < layers - 1:
            convs.append(nn.MaxPool2d(2))
            side //= 2
    return nn.Sequential(*convs, nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(width, 2))


def pathfinder_signal(task: Pathfinder, steps: int, seeds: int, layers: int, batch_size: int = 64,
                      lr: float = 2e-3) -> Dict[str, object]:
    """The small CNN on ``task``, one run per seed: AdamW at ``lr`` with cosine decay, test accuracy
    on the task's held-out test images against their majority class."""
    side = task.size

    def images(batch):
        return batch["input_ids"].float().div(255.0).view(-1, 1, side, side)

    test = list(task.eval_batches("test", 250))
    truth = torch.cat([b["labels"] for b in test])
    majority = max(float((truth == k).float().mean()) for k in (0, 1))
    runs = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = path_cnn(layers, side)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5 * (1 + math.cos(math.pi * min(t, steps) / steps)))
        model.train()
        for step in range(steps):
            batch = task.get_batch("train", batch_size, step, seed=seed)
            loss = nn.functional.cross_entropy(model(images(batch)), batch["labels"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(images(b)).argmax(-1) for b in test])
        runs.append(above_majority(float((pred == truth).float().mean()), majority, len(truth)))
        print(f"pathfinder {side}x{side} cnn seed {seed}: {runs[-1]['accuracy']:.3f} (majority {majority:.3f})", flush=True)
    accs = [r["accuracy"] for r in runs]
    return {"accuracy": float(np.mean(accs)), "per_seed": accs, "majority": majority, "n": len(truth),
            "z": float(np.mean([r["z"] for r in runs])), "p": max(r["p"] for r in runs),
            "signal": all(r["signal"] for r in runs), "size": side, "contour_length": task.contour_length,
            "steps": steps, "batch_size": batch_size, "layers": layers, "seeds": seeds, "train_size": task.train_size,
            "options": {k: getattr(task, k) for k in ("size", "contour_length", "n_distractors", "distractor_length")}}


def articles_for_quick() -> List[tuple]:
    import random

    rng = random.Random(0)
    words = {c: [f"{c}{i}" for i in range(30)] for c in ("business", "entertainment", "politics", "sport", "tech")}
    return [(" ".join(rng.choice(words[c]) for _ in range(200)), c) for c in words for _ in range(20)]


PATHFINDER_OPTIONS = {32: {"size": 32, "contour_length": 14},  # qkv bench lra's (LRA's 32x32, 14 dashes)
                      16: {"size": 16, "contour_length": 3, "n_distractors": 1, "distractor_length": 2}}


def pathfinder_options(side: int) -> Dict[str, int]:
    """Pathfinder's options at image side ``side`` (a key of ``PATHFINDER_OPTIONS``, which ``main``
    checks: LRA's at 32; at 16 the longest paths and the most distractors the generator can place)."""
    return dict(PATHFINDER_OPTIONS[side])


def main(argv: Sequence[str] = None) -> Dict[str, Dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="made-up articles, a temporary folder")
    parser.add_argument("--text-len", type=int, default=1024, help="bytes per article for Text (qkv bench lra's max_len)")
    parser.add_argument("--retrieval-len", type=int, default=512,
                        help="bytes per article for Retrieval (qkv bench lra's max_len)")
    parser.add_argument("--train-pairs", type=int, default=2000)
    parser.add_argument("--pathfinder-steps", type=int, default=2000, help="updates of 64 for each Pathfinder CNN")
    parser.add_argument("--pathfinder-sizes", type=int, nargs="*", default=[32, 16],
                        help="Pathfinder image sides (32: qkv bench lra's; a smaller side scales the path lengths with it)")
    parser.add_argument("--pathfinder-layers", type=int, default=8, help="3x3 convolutions of the Pathfinder CNN")
    parser.add_argument("--pathfinder-train", type=int, default=20000, help="images in Pathfinder's fixed training set")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of each Pathfinder CNN")
    args = parser.parse_args(argv)
    for name in ("text_len", "retrieval_len", "train_pairs", "pathfinder_steps", "pathfinder_layers", "pathfinder_train",
                 "seeds"):  # every option checked before any work
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for side in args.pathfinder_sizes:
        if side not in PATHFINDER_OPTIONS:
            parser.error(f"--pathfinder-sizes: expected sides among {sorted(PATHFINDER_OPTIONS)}, got {side}")
    command = " " + " ".join(argv if argv is not None else sys.argv[1:]) if (argv or sys.argv[1:]) else ""
    articles = articles_for_quick() if args.quick else None
    doc = smoke_dir("lra-signal") / DOC.name if args.quick else DOC
    results = {"text": text_signal(BBCBytes(max_len=args.text_len, articles=articles)),
               "retrieval": retrieval_signal(BBCMatch(max_len=args.retrieval_len, eval_size=200 if args.quick else 1000,
                                                      articles=articles), 200 if args.quick else args.train_pairs)}
    for side in args.pathfinder_sizes:
        options = pathfinder_options(side)
        results[f"pathfinder {side}x{side}"] = pathfinder_signal(
            Pathfinder(**options, eval_size=200 if args.quick else 1000, train_size=64 if args.quick else args.pathfinder_train),
            5 if args.quick else args.pathfinder_steps,
            1 if args.quick else args.seeds, args.pathfinder_layers)
    atomic_write_text(doc.with_suffix(".json"), json.dumps(results, indent=1) + "\n")  # old or new, never half
    rows = [f"| {name} | {r['accuracy']:.3f}" + (f" (per seed {', '.join(f'{x:.3f}' for x in r['per_seed'])})" if "per_seed" in r else "")
            + f" | {r['majority']:.3f} | {r['n']} | {r['z']:.1f} | {r['p']:.2g} | "
            f"{'yes' if r['signal'] else 'no'} |" for name, r in results.items()]
    paths = [r for name, r in results.items() if name.startswith("pathfinder")]
    atomic_write_text(doc, "\n".join([
        "# Long Range Arena stand-ins: signal without a Transformer", "",
        f"`PYTHONPATH=src .venv/bin/python benchmarks/lra_signal.py{command}` (Text and Retrieval deterministic, "
        f"Pathfinder per seed; raw numbers in "
        f"[lra-signal.json](lra-signal.json)). Text (`bbc-bytes`): hashed byte 1-3-gram TF-IDF of each article's "
        f"first {args.text_len} bytes, nearest class centroid. Retrieval (`bbc-match`): TF-IDF cosine of the two "
        f"articles' first {args.retrieval_len} bytes, the threshold that best separates {args.train_pairs} training pairs. Accuracy on the tasks' test "
        "sets against their majority class; signal = one-sided binomial z-test at 5 %. The lengths are those "
        "`qkv bench lra` gives its encoders ([lra.md](lra.md)).", "",
        *([f"Pathfinder (`pathfinder`): a CNN of {paths[0]['layers']} 3x3 convolutions (32 channels, ReLU, 2x2 max "
           f"pooling after every second), global max pooling and a linear layer, {paths[0]['steps']} updates of "
           f"{paths[0]['batch_size']} images from a fixed training set of {paths[0]['train_size']}, AdamW "
           f"lr 2e-3 with cosine decay, {paths[0]['seeds']} seed{'s' if paths[0]['seeds'] != 1 else ''}; at " + "; ".join(
               f"{r['size']}x{r['size']} ({r['options']['contour_length']} dashes per path, {r['options']['n_distractors']} "
               f"distractor{'s' if r['options']['n_distractors'] != 1 else ''} of {r['options']['distractor_length']})"
               for r in paths)
           + ". For Pathfinder z is the seeds' mean, p the largest of the seeds' and signal means every seed's test "
             "is below 5 %.", ""]
          if paths else []),
        "| task | accuracy | majority class | test examples | z | p | signal |",
        "| --- | --- | --- | --- | --- | --- | --- |", *rows, "",
        "ListOps has no cheap check here (its labels are computed from the tokens; the encoders learn it).", ""]))
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
