"""Adaptive Computation Time (Graves 2016, "Adaptive Computation Time for Recurrent Neural
Networks", arXiv:1603.08983), per position, around any step function — the depth of the
Universal Transformer (Dehghani et al. 2019, §2.2).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .. import _checks

__all__ = ["AdaptiveComputationTime", "ACTOutput"]

class ACTOutput(NamedTuple):
    """What ``AdaptiveComputationTime`` returns (``P`` positions: any leading shape, e.g. ``(B, L)``).

    output:        ``(*P, d)`` mean-field state ``sum_n p^n s^n``.
    ponder_cost:   ``(*P,)`` ``N(t) + R(t)`` (differentiable through ``R``); sum it times ``tau``.
    n_steps:       ``(*P,)`` long, ``N(t)``.
    remainder:     ``(*P,)`` ``R(t) = 1 - sum_{n < N(t)} h^n``.
    probabilities: ``(*P, T)`` ``p^n`` for the ``T <= M`` steps run (0 after ``N(t)``; the steps
                   never run, all 0, are not stored); each row sums to 1.
    states:        the step function's last auxiliary results, one per step (see ``forward``).
    final_state:   ``(*P, d)`` each position's state when it halted, ``s^{N(t)}`` (what a later
                   step would see of it: a halted position is frozen).
    """

    output: Tensor
    ponder_cost: Tensor
    n_steps: Tensor
    remainder: Tensor
    probabilities: Tensor
    states: list
    final_state: Tensor


class AdaptiveComputationTime(nn.Module):
    """Adaptive Computation Time (Graves 2016, "Adaptive Computation Time for Recurrent Neural
    Networks", arXiv:1603.08983), per position, around any step function.

    At step ``n = 1 .. M`` the step function updates the state ``s^n = step(s^{n-1}, n)``; the
    halting unit gives ``h^n = sigmoid(W_h s^n + b_h)``. A position halts after

        N(t) = min{n : sum_{n' <= n} h^{n'} >= 1 - eps}     (at most M steps)

    with remainder ``R(t) = 1 - sum_{n < N(t)} h^n``; its halting weights are ``p^n = h^n`` for
    ``n < N(t)`` and ``p^{N(t)} = R(t)`` (they sum to 1), its output is the mean field
    ``sum_n p^n s^n`` and its ponder cost ``N(t) + R(t)``. A halted position stops changing: the
    step function still sees it (attention over all positions), frozen at its last state, so that
    the computation of the others does not depend on when it halted.

    Args:
        d_model: state width.
        max_steps: ``M``.
        eps: ``eps`` (Graves: 0.01).
        halting_bias_init: initial ``b_h``. Graves starts it positive to favour few steps early in
            training; in Universal Transformers a positive bias (tensor2tensor: 1.0) lets every
            position halt after ~2 steps and stay there (tensor2tensor #1723): a negative bias
            (the default -1: ``h ~ 0.27``, about 4 steps at first) leaves room to learn depth.
    """

    def __init__(self, d_model: int, max_steps: int, eps: float = 0.01, halting_bias_init: float = -1.0) -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        self.max_steps = _checks.positive_int("max_steps", max_steps)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1:
            raise ValueError(f"eps must be a float in [0, 1), got {eps!r}")
        self.eps = float(eps)
        if isinstance(halting_bias_init, bool) or not isinstance(halting_bias_init, (int, float)):
            raise TypeError(f"halting_bias_init must be a float, got {halting_bias_init!r}")
        self.halting = nn.Linear(d_model, 1)  # W_h, b_h
        nn.init.constant_(self.halting.bias, float(halting_bias_init))

    def extra_repr(self) -> str:
        return f"max_steps={self.max_steps}, eps={self.eps}"

    def halting_probability(self, s: Tensor) -> Tensor:
        """``h = sigmoid(W_h s + b_h)``: ``(*P, d)`` -> ``(*P,)``."""
        return torch.sigmoid(self.halting(s)).squeeze(-1)

    def forward(self, step, s: Tensor, run_all_steps: bool = False, min_steps: int = 0) -> ACTOutput:
        """Run ``step`` under ACT from the state ``s (*P, d)``.

        ``step(s, n) -> s_new`` or ``(s_new, aux)`` (``n`` = 1 .. M; ``aux``, e.g. a cache or
        attention weights, is collected into ``ACTOutput.states``). The loop stops once every
        position has halted and at least ``min_steps`` steps ran (incremental decoding: the steps
        the earlier positions' caches already hold, so that every cached step holds every
        position; the halted ones frozen); ``run_all_steps`` runs all ``M``. Time and memory
        follow the steps run, ``max(max N(t), min_steps)``, not ``M``.
        """
        _checks.tensor("s", s, floating=True)
        min_steps = self.max_steps if run_all_steps else min(_checks.positive_int("min_steps", min_steps, allow_zero=True),
                                                              self.max_steps)
        P = s.shape[:-1]
        cum = s.new_zeros(P)  # sum_{n' < n} h^{n'} of the running positions
        running = torch.ones(P, dtype=torch.bool, device=s.device)
        output = torch.zeros_like(s)
        n_steps = torch.zeros(P, dtype=torch.long, device=s.device)
        remainder = s.new_zeros(P)
        probabilities, states = [], []
        for n in range(1, self.max_steps + 1):
            result = step(s, n)
            new, aux = result if isinstance(result, tuple) else (result, None)
            s = torch.where(running.unsqueeze(-1), new, s)  # halted positions keep their state
            states.append(aux)
            h = self.halting_probability(s)
            # halt now when the sum reaches 1 - eps (or at step M): p^N = R = 1 - sum_{n < N} h^n
            halts = running & ((cum + h >= 1 - self.eps) | (n == self.max_steps))
            p = torch.where(halts, 1 - cum, torch.where(running, h, torch.zeros_like(h)))
            output = output + p.unsqueeze(-1) * s
            remainder = torch.where(halts, 1 - cum, remainder)
            n_steps = torch.where(halts, torch.full_like(n_steps, n), n_steps)
            cum = cum + torch.where(running & ~halts, h, torch.zeros_like(h))
            running = running & ~halts
            probabilities.append(p)
            if n >= min_steps and not bool(running.any()):
                break
        # memory follows the steps run, not M: p^n = 0 for every step never run, and none is stored
        ponder = n_steps.to(remainder.dtype) + remainder  # N(t) + R(t)
        return ACTOutput(output, ponder, n_steps, remainder, torch.stack(probabilities, dim=-1), states, s)
