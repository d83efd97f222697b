"""Reversible residual layers (Gomez et al. 2017, "The Reversible Residual Network",
arXiv:1707.04585), as the Reformer uses them (Kitaev et al. 2020, §3): activation memory that does
not grow with depth, each layer's inputs rebuilt from its outputs in backward.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .. import _checks

__all__ = ["ReversibleBlock", "ReversibleSequence", "reversible"]

class _Replay:
    """Saves torch's random generator state (CPU, and the CUDA device of ``device``) and replays it,
    so that dropout masks and LSH rotations drawn in forward are drawn again when a layer is
    recomputed in backward (as ``torch.utils.checkpoint`` does)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.cpu_state = torch.get_rng_state()
        self.cuda_state = torch.cuda.get_rng_state(device) if self.cuda else None
        self.device = device

    def __enter__(self) -> None:
        self._fork = torch.random.fork_rng(devices=[self.device] if self.cuda else [])
        self._fork.__enter__()  # the surrounding generator is restored on exit
        torch.set_rng_state(self.cpu_state)
        if self.cuda:
            torch.cuda.set_rng_state(self.cuda_state, self.device)

    def __exit__(self, *exc) -> None:
        self._fork.__exit__(*exc)


class _ReversibleFunction(torch.autograd.Function):
    """Forward without storing activations; backward rebuilds each layer's inputs from its outputs.

    Inputs after ``(x1, x2, layers, args)`` are the layers' trainable parameters, so that their
    gradients are returned through autograd (and reach them even when ``x`` needs no gradient).
    """

    @staticmethod
    def forward(ctx, x1: Tensor, x2: Tensor, layers, args, *params: Tensor):
        replays = []
        with torch.no_grad():
            for layer in layers:
                rf = _Replay(x1.device)
                y1 = x1 + layer.f(x2, *args)  # y1 = x1 + F(x2)
                rg = _Replay(x1.device)
                y2 = x2 + layer.g(y1)  # y2 = x2 + G(y1)
                replays.append((rf, rg))
                x1, x2 = y1, y2
        ctx.layers, ctx.args, ctx.replays = layers, args, replays
        ctx.save_for_backward(x1, x2)  # the last layer's outputs: all that is kept, whatever the depth
        return x1, x2

    @staticmethod
    def backward(ctx, dy1: Tensor, dy2: Tensor):
        y1, y2 = ctx.saved_tensors
        dy1 = torch.zeros_like(y1) if dy1 is None else dy1
        dy2 = torch.zeros_like(y2) if dy2 is None else dy2
        param_grads: List[Optional[Tensor]] = []
        for layer, (rf, rg) in zip(reversed(ctx.layers), reversed(ctx.replays)):
            params = [p for p in layer.parameters() if p.requires_grad]
            with torch.enable_grad():
                y1 = y1.detach().requires_grad_(True)
                with rg:
                    gy1 = layer.g(y1)
                g_grads = torch.autograd.grad(gy1, [y1] + params, dy2, allow_unused=True)
            with torch.no_grad():
                x2 = y2 - gy1  # x2 = y2 - G(y1)
                dy1 = dy1 + g_grads[0]  # dL/dy1 through y1 itself and through G(y1)
            with torch.enable_grad():
                x2 = x2.detach().requires_grad_(True)
                with rf:
                    fx2 = layer.f(x2, *ctx.args)
                f_grads = torch.autograd.grad(fx2, [x2] + params, dy1, allow_unused=True)
            with torch.no_grad():
                x1 = y1 - fx2  # x1 = y1 - F(x2)
                dy2 = dy2 + f_grads[0]  # dL/dx2 = dL/dy2 + F's path
            layer_grads = [a if b is None else b if a is None else a + b for a, b in zip(g_grads[1:], f_grads[1:])]
            param_grads = layer_grads + param_grads
            y1, y2 = x1.detach(), x2.detach()
        return (dy1, dy2, None, None, *param_grads)


def reversible(layers: Sequence[Any], x1: Tensor, x2: Tensor, *args: Any) -> Tuple[Tensor, Tensor]:
    """Run reversible residual layers (Gomez et al. 2017, eq. 1–2) on the pair ``(x1, x2)``.

    ``layers``: objects with ``f(x, *args)``, ``g(x)`` and ``parameters()`` (``ReversibleBlock``,
    or an adapter over existing sub-layers). ``args`` (masks; nothing that needs a gradient) go to
    every ``f``. With gradients enabled the layers run inside one autograd function that keeps
    only the last outputs and recomputes each layer in backward from them; otherwise it is a plain
    loop. Returns ``(y1, y2)``.
    """
    for a in args:
        if isinstance(a, Tensor) and a.requires_grad:
            raise ValueError("reversible: the extra arguments of f must not need gradients (only masks and constants)")
    if not layers:
        return x1, x2
    if not torch.is_grad_enabled():
        for layer in layers:
            x1 = x1 + layer.f(x2, *args)
            x2 = x2 + layer.g(x1)
        return x1, x2
    params = [p for layer in layers for p in layer.parameters() if p.requires_grad]
    return _ReversibleFunction.apply(x1, x2, tuple(layers), args, *params)


class ReversibleBlock(nn.Module):
    """One reversible layer (Gomez et al. 2017): ``y1 = x1 + F(x2)``, ``y2 = x2 + G(y1)``, inverted by
    ``x2 = y2 - G(y1)``, ``x1 = y1 - F(x2)``. In the Reformer (Kitaev et al. 2020, §3) F is attention
    and G the (chunked) feed-forward network, each behind a LayerNorm.

    Args:
        F: module called as ``F(x, *args)`` (args: e.g. an attention mask), ``(B, L, D) -> (B, L, D)``.
        G: module called as ``G(x)``.
    """

    def __init__(self, F: nn.Module, G: nn.Module) -> None:
        super().__init__()
        self.F, self.G = F, G

    def f(self, x: Tensor, *args: Any) -> Tensor:
        return self.F(x, *args)

    def g(self, x: Tensor) -> Tensor:
        return self.G(x)

    def forward(self, x1: Tensor, x2: Tensor, *args: Any) -> Tuple[Tensor, Tensor]:
        """One layer with ordinary autograd (stores its activations)."""
        y1 = x1 + self.f(x2, *args)
        return y1, x2 + self.g(y1)


class ReversibleSequence(nn.Module):
    """A stack of reversible layers whose activation memory does not grow with depth (Gomez et al.
    2017, "The Reversible Residual Network", arXiv:1707.04585; Kitaev et al. 2020, §3).

        y1 = x1 + F(x2),   y2 = x2 + G(y1)          (each layer)
        x2 = y2 - G(y1),   x1 = y1 - F(x2)          (backward rebuilds the inputs)

    Training keeps only the last layer's outputs: backward walks the layers from the top,
    recomputing ``G(y1)`` and ``F(x2)`` with the random generator state saved in forward (dropout
    masks and random LSH rotations are replayed exactly), so the gradients are those of the
    ordinary residual computation. Costs one extra forward per layer in backward.

    Args:
        blocks: ``ReversibleBlock``s (or modules with ``f(x, *args)`` and ``g(x)``).
    Shapes: ``forward(x1, x2, *args)``: ``x1, x2 (B, L, D)`` -> ``(y1, y2)``.
    """

    def __init__(self, blocks: Sequence[nn.Module]) -> None:
        super().__init__()
        for i, b in enumerate(blocks):
            if not (callable(getattr(b, "f", None)) and callable(getattr(b, "g", None))):
                raise TypeError(f"blocks[{i}] must have f(x, *args) and g(x) methods (a ReversibleBlock), "
                                f"got {type(b).__name__}")
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x1: Tensor, x2: Tensor, *args: Any) -> Tuple[Tensor, Tensor]:
        _checks.tensor("x1", x1, floating=True)
        _checks.tensor("x2", x2, floating=True)
        _checks.same("x1", tuple(x1.shape), "x2", tuple(x2.shape), "the shape")
        return reversible(list(self.blocks), x1, x2, *args)
