"""1-D regression for Nadaraya–Watson kernel regression (d2l §11.2): ``y = 2 sin(x) + x^0.8 + eps``.

``n_train`` inputs ``x_i ~ U(0, 5)`` (sorted) with noise ``eps ~ N(0, noise^2)`` are the keys and
values; the test queries are an even grid on ``[0, 5)`` scored against the noise-free function.

Batches: ``x (B,)`` queries, ``keys (B, N)`` and ``values (B, N)`` (the whole training set),
``mask (B, N)`` bool, ``labels (B,)``. A training batch draws training points as queries and
masks each query's own key out (leave-one-out: a point cannot simply look itself up); held-out
batches attend over the whole training set. ``evaluate`` gives the ``mse``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import stable_seed
from qkv.tasks.classify import TensorTask

__all__ = ["NWRegression", "target_function"]


def target_function(x: Tensor) -> Tensor:
    """``f(x) = 2 sin(x) + x^0.8``."""
    return 2 * torch.sin(x) + x.pow(0.8)


@register("task", "nw-regression")
class NWRegression(TensorTask):
    """Nadaraya–Watson regression of ``2 sin(x) + x^0.8`` from noisy samples (d2l §11.2).

    Args:
        n_train: training points (keys/values); n_test: grid points of each held-out split (test: ``0,
            5/n_test, ...``; valid: the points halfway between them).
        noise: standard deviation of the training noise.
        seed: draws the training inputs and noise.
    """

    kind = "regression"

    def __init__(self, *, n_train: int = 50, n_test: int = 50, noise: float = 0.5, seed: int = 0) -> None:
        for name, value in (("n_train", n_train), ("n_test", n_test)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an int >= 2, got {value!r}")
        if not noise >= 0:
            raise ValueError(f"noise must be >= 0, got {noise!r}")
        g = torch.Generator().manual_seed(stable_seed("nw-regression", seed))
        self.x_train = torch.sort(torch.rand(n_train, generator=g) * 5).values  # (N,)
        self.y_train = target_function(self.x_train) + noise * torch.randn(n_train, generator=g)  # (N,)
        N = n_train

        def held_out(grid: Tensor) -> Dict[str, Tensor]:
            return {"x": grid, "keys": self.x_train.expand(n_test, N), "values": self.y_train.expand(n_test, N),
                    "mask": torch.ones(n_test, N, dtype=torch.bool), "labels": target_function(grid)}

        step = 5.0 / n_test
        train = {"x": self.x_train, "keys": self.x_train.expand(N, N), "values": self.y_train.expand(N, N),
                 "mask": ~torch.eye(N, dtype=torch.bool), "labels": self.y_train}  # leave one out
        # test: the grid 0, 5/n, ... (d2l's); valid: the points halfway between, so the two differ
        self._splits = {"train": train, "valid": held_out((torch.arange(n_test) + 0.5) * step),
                        "test": held_out(torch.arange(n_test) * step)}
        self._check_splits()

    def _metrics(self, outputs: List[Any], batches: List[Dict[str, Tensor]]) -> Dict[str, float]:
        pred = torch.cat([o.logits.float() for o in outputs])
        labels = torch.cat([b["labels"] for b in batches]).float()
        return {"mse": torch.mean((pred - labels) ** 2).item(), "examples": float(len(labels))}

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Kernel weights of the held-out grid points over the training points (``qkv viz``)."""
        from .views import nadaraya_watson_view

        n = min(max_len, self.size("test"))
        batch = self._take("test", torch.arange(n))
        return nadaraya_watson_view(model, batch["x"], self.x_train, batch)
