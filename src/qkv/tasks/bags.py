"""MNIST-bags: multiple-instance learning on real MNIST digits (Ilse, Tomczak, Welling 2018,
arXiv:1802.04712, §5.2).

A bag is a set of ``K`` MNIST images, ``K`` drawn from a rounded Gaussian (mean 10, std 2 by
default, clipped to ``[1, max_bag]``); the bag is positive iff it contains the target digit (9 by
default). Labels are balanced: a negative bag draws from the non-target images, a positive bag
draws from all images and, when no target came up, has one random position replaced by a target
image. The 5,000 images of :func:`qkv.tasks.data.load_mnist` are split 80/10/10 before any bag is
made, so the test bags hold only images the model never saw.

Batches: ``bags (B, K_max, 1, 28, 28)`` float (pixels / 255, padding zeros), ``mask (B, K_max)``
bool (True = real instance), ``labels (B,)`` long. Metrics (``evaluate``): bag ``accuracy``,
bag ``auc`` (of the softmax probability of the positive class), and, when the model returns
attention weights ``(B, K_max)``, ``instance_auc`` — the AUC of the weights against the true
target instances within each positive bag that also holds other digits, averaged over such bags.
"""

from __future__ import annotations

import math
import random
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import SPLITS, stable_seed
from qkv.tasks.classify import TensorTask, binary_auc, split_indices
from qkv.tasks.data import load_mnist

__all__ = ["DigitBags", "make_bags"]


def make_bags(labels: Tensor, n_bags: int, *, target: int, mean: float, std: float, max_bag: int, seed: int) -> Dict[str, Tensor]:
    """Draw ``n_bags`` balanced bags over the images whose digit labels are ``labels (N,)``.

    Returns ``index (n_bags, max_bag)`` long (image indices, 0 in padding), ``mask (n_bags, max_bag)``
    bool, ``labels (n_bags,)`` long and ``instance_labels (n_bags, max_bag)`` bool.
    """
    rng = random.Random(seed)
    is_target = (labels == target).tolist()
    targets = [i for i, t in enumerate(is_target) if t]
    others = [i for i, t in enumerate(is_target) if not t]
    if not targets or not others:
        raise ValueError(f"labels must contain both the target digit {target} and other digits")
    index = torch.zeros(n_bags, max_bag, dtype=torch.long)
    mask = torch.zeros(n_bags, max_bag, dtype=torch.bool)
    bag_labels = torch.zeros(n_bags, dtype=torch.long)
    for b in range(n_bags):
        size = min(max(1, round(rng.gauss(mean, std))), max_bag)
        positive = rng.random() < 0.5
        if positive:
            members = [rng.randrange(len(labels)) for _ in range(size)]
            if not any(is_target[i] for i in members):
                members[rng.randrange(size)] = rng.choice(targets)
        else:
            members = [rng.choice(others) for _ in range(size)]
        index[b, :size] = torch.tensor(members)
        mask[b, :size] = True
        bag_labels[b] = int(positive)
    instance_labels = (labels[index] == target) & mask
    return {"index": index, "mask": mask, "labels": bag_labels, "instance_labels": instance_labels}


@register("task", "digit-bags")
class DigitBags(TensorTask):
    """MNIST-bags (Ilse et al. 2018): is the target digit in this bag of MNIST images?

    Args:
        target: the digit that makes a bag positive.
        bag_mean, bag_std: the Gaussian of the bag size; ``max_bag`` caps it (default mean + 3 std).
        n_train, n_valid, n_test: bags per split.
        cache_dir: MNIST cache directory (``qkv data fetch mnist``).
        images, digits: ``(N, 28, 28)`` uint8 images and ``(N,)`` labels to use instead of MNIST
            (tests use small fixtures).
    """

    meta_keys = ("instance_labels",)

    def __init__(self, *, target: int = 9, bag_mean: float = 10.0, bag_std: float = 2.0, max_bag: Optional[int] = None,
                 n_train: int = 5000, n_valid: int = 200, n_test: int = 1000, cache_dir: Optional[str] = None,
                 images: Optional[Tensor] = None, digits: Optional[Tensor] = None) -> None:
        if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target <= 9:
            raise ValueError(f"target must be a digit 0-9, got {target!r}")
        if not bag_mean >= 1 or not bag_std >= 0:
            raise ValueError(f"bag_mean must be >= 1 and bag_std >= 0, got {bag_mean!r}, {bag_std!r}")
        max_bag = max_bag if max_bag is not None else int(math.ceil(bag_mean + 3 * bag_std))
        if (images is None) != (digits is None):
            raise ValueError("images and digits must be given together (or neither, to load MNIST)")
        if images is None:
            images, digits = load_mnist(cache_dir)
        if images.dim() != 3 or images.shape[1:] != (28, 28) or digits.shape != images.shape[:1]:
            raise ValueError(f"images must be (N, 28, 28) with digits (N,), got {tuple(images.shape)} and {tuple(digits.shape)}")
        self.target, self.max_bag = target, max_bag
        parts = split_indices(len(digits), key="digit-bags")
        counts = {"train": n_train, "valid": n_valid, "test": n_test}
        self._images: Dict[str, Tensor] = {}
        self._digits: Dict[str, Tensor] = {}  # the digit of every image of a split (for pictures)
        self._splits = {}
        for split in SPLITS:
            idx = parts[split]
            self._images[split] = images[idx].float().div(255).unsqueeze(1)  # (N_split, 1, 28, 28)
            self._digits[split] = digits[idx]
            bags = make_bags(digits[idx], counts[split], target=target, mean=bag_mean, std=bag_std, max_bag=max_bag,
                             seed=stable_seed("digit-bags", split, target))
            self._splits[split] = bags
        self._check_splits()

    def _take(self, split: str, index: Tensor, meta: bool = False) -> Dict[str, Tensor]:
        part = self._splits[split]
        image_index, mask = part["index"][index], part["mask"][index]  # (B, K), (B, K)
        bags = self._images[split][image_index] * mask[..., None, None, None]  # (B, K, 1, 28, 28), zero padding
        batch = {"bags": bags, "mask": mask, "labels": part["labels"][index]}
        if meta:
            batch["instance_labels"] = part["instance_labels"][index]
        return batch

    def _metrics(self, outputs: List[Any], batches: List[Dict[str, Tensor]]) -> Dict[str, float]:
        metrics = super()._metrics(outputs, batches)
        logits = torch.cat([o.logits.float() for o in outputs])  # (N, 2)
        labels = torch.cat([b["labels"] for b in batches])
        metrics["auc"] = binary_auc(logits.softmax(-1)[:, 1], labels)
        if all(o.weights is not None for o in outputs):
            aucs = []
            for o, b in zip(outputs, batches):
                for w, inst, m, y in zip(o.weights, b["instance_labels"], b["mask"], b["labels"]):
                    if y == 1 and inst[m].any() and not inst[m].all():
                        aucs.append(binary_auc(w[m], inst[m]))
            metrics["instance_auc"] = sum(aucs) / len(aucs) if aucs else float("nan")
        return metrics

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """The weights of a held-out positive bag over its digits (``qkv viz``); ``text``: the bag's
        index in the test split."""
        from .views import bag_view, text_index

        part = self._splits["test"]
        first_positive = int(torch.nonzero(part["labels"] == 1)[0]) if text is None else 0
        pick = text_index(text, self.size("test"), "bag", default=first_positive)
        batch = self._take("test", torch.tensor([pick]), meta=True)
        digits = self._digits["test"][part["index"][pick]]
        return bag_view(model, batch, digits, self.target, self.meta_keys)
