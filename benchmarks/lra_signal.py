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

Each accuracy is against the majority class of the same test set; a one-sided binomial z-test at
5 % (standard error ``sqrt(p0 (1 - p0) / n)`` under the majority rate ``p0``) says whether the
model is above it. Deterministic (no seeds: fixed splits, no training randomness). Writes
``docs/reproductions/lra-signal.json`` and ``lra-signal.md``. Pathfinder and ListOps are not
covered (their cheap non-Transformer checks need training runs).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _repro import smoke_dir  # noqa: E402

from qkv.tasks.lra import BBCBytes, BBCMatch  # noqa: E402

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


def articles_for_quick() -> List[tuple]:
    import random

    rng = random.Random(0)
    words = {c: [f"{c}{i}" for i in range(30)] for c in ("business", "entertainment", "politics", "sport", "tech")}
    return [(" ".join(rng.choice(words[c]) for _ in range(200)), c) for c in words for _ in range(20)]


def main(argv: Sequence[str] = None) -> Dict[str, Dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="made-up articles, a temporary folder")
    parser.add_argument("--text-len", type=int, default=1024, help="bytes per article for Text (qkv bench lra's max_len)")
    parser.add_argument("--retrieval-len", type=int, default=512,
                        help="bytes per article for Retrieval (qkv bench lra's max_len)")
    parser.add_argument("--train-pairs", type=int, default=2000)
    args = parser.parse_args(argv)
    articles = articles_for_quick() if args.quick else None
    doc = smoke_dir("lra-signal") / DOC.name if args.quick else DOC
    results = {"text": text_signal(BBCBytes(max_len=args.text_len, articles=articles)),
               "retrieval": retrieval_signal(BBCMatch(max_len=args.retrieval_len, eval_size=200 if args.quick else 1000,
                                                      articles=articles), 200 if args.quick else args.train_pairs)}
    doc.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    rows = [f"| {name} | {r['accuracy']:.3f} | {r['majority']:.3f} | {r['n']} | {r['z']:.1f} | {r['p']:.2g} | "
            f"{'yes' if r['signal'] else 'no'} |" for name, r in results.items()]
    doc.write_text("\n".join([
        "# Long Range Arena stand-ins: signal without a Transformer", "",
        f"`PYTHONPATH=src .venv/bin/python benchmarks/lra_signal.py` (deterministic; raw numbers in "
        f"[lra-signal.json](lra-signal.json)). Text (`bbc-bytes`): hashed byte 1-3-gram TF-IDF of each article's "
        f"first {args.text_len} bytes, nearest class centroid. Retrieval (`bbc-match`): TF-IDF cosine of the two "
        f"articles' first {args.retrieval_len} bytes, the threshold that best separates {args.train_pairs} training pairs. Accuracy on the tasks' test "
        "sets against their majority class; signal = one-sided binomial z-test at 5 %. The lengths are those "
        "`qkv bench lra` gives its encoders ([lra.md](lra.md)).", "",
        "| task | accuracy | majority class | test examples | z | p | signal |",
        "| --- | --- | --- | --- | --- | --- | --- |", *rows, "",
        "Pathfinder and ListOps have no cheap check here yet (a small CNN on Pathfinder needs a training run).", ""]))
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
