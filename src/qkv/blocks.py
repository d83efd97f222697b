"""Transformer building blocks around the attention module (Vaswani et al. 2017, "Attention Is
All You Need", arXiv:1706.03762): the position-wise feed-forward network and the residual
wirings that join a sub-layer to the residual stream.

A residual wiring is a small object with two hooks, so that every sub-layer of every block reads

    h = wiring.enter(x)          # what the sub-layer sees
    x = wiring.exit(x, F(h))     # how its output rejoins the stream

- post-LN (the paper, §3.1):  ``enter(x) = x``,     ``exit(x, y) = LayerNorm(x + Dropout(y))``
- pre-LN (GPT-2, Xiong 2020): ``enter(x) = LN(x)``, ``exit(x, y) = x + Dropout(y)``; the stack
  then ends with a final LayerNorm (``final_norm = True``).

A later wiring (GTrXL's GRU gate ``g(x, relu(y))``) is one more subclass registered as
``@register("residual", name)``; the stack builds wirings by name and never changes. Reversible
residuals (Reformer) couple two sub-layers and so replace the stack's layer loop instead.
"""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _checks
from .registry import lookup, register

__all__ = ["FeedForward", "ResidualWiring", "PostLN", "PreLN", "build_residual", "ACTIVATIONS",
           "GatedResidual", "GRUGate", "InputGate", "ReLUSum", "QuaternionLinear", "LINEAR_LAYERS",
           "AdaptiveComputationTime", "ACTOutput", "ReversibleBlock", "ReversibleSequence", "reversible"]

#: activations of the feed-forward network, by name. "gelu" is exact (erf, BERT's); "gelu-tanh" is
#: the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) of GPT-2 ("gelu_new").
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu-tanh": lambda x: F.gelu(x, approximate="tanh")}


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``FFN(x) = max(0, x W1 + b1) W2 + b2`` (Vaswani et al. 2017, eq. 2).

    Args:
        d_model: input and output width.
        d_ff: hidden width (the paper: ``4 d_model``).
        activation: ``"relu"`` (the paper) or ``"gelu"`` (BERT, GPT).
        chunk_size: compute over length chunks of this many positions (Kitaev et al. 2020, §3:
            the network is position-wise, so chunks are independent); bounds the ``(B, L, d_ff)``
            hidden activation to ``(B, chunk_size, d_ff)`` when nothing keeps it for backward
            (inference, or inside gradient checkpointing). None: one chunk.
        linear: the factory ``linear(in_features, out_features)`` of W1 and W2 (``nn.Linear``;
            ``LINEAR_LAYERS`` names the others, e.g. ``QuaternionLinear``).
    Shapes: ``x (B, L, d_model) -> (B, L, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", chunk_size: Optional[int] = None,
                 linear: Callable[..., nn.Module] = nn.Linear) -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        _checks.positive_int("d_ff", d_ff)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.chunk_size = None if chunk_size is None else _checks.positive_int("chunk_size", chunk_size)
        self.activation = activation
        self.w1 = linear(d_model, d_ff)  # x W1 + b1
        self.w2 = linear(d_ff, d_model)  # (.) W2 + b2

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, chunk_size={self.chunk_size}"

    def _ffn(self, x: Tensor) -> Tensor:
        return self.w2(ACTIVATIONS[self.activation](self.w1(x)))

    def forward(self, x: Tensor) -> Tensor:
        if self.chunk_size is None or x.shape[1] <= self.chunk_size:
            return self._ffn(x)
        return torch.cat([self._ffn(c) for c in x.split(self.chunk_size, dim=1)], dim=1)  # (B, L, d_model)


class ResidualWiring(nn.Module):
    """How a sub-layer ``F`` joins the residual stream: ``x' = exit(x, F(enter(x)))``.

    ``dropout`` is the paper's residual dropout (§5.4), applied to the sub-layer output before
    it is added. ``final_norm`` says whether a stack of such blocks needs a closing LayerNorm.
    """

    final_norm: ClassVar[bool] = False
    registry_name: ClassVar[str] = ""

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5) -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))

    def enter(self, x: Tensor) -> Tensor:
        raise NotImplementedError  # abstract: each wiring defines it

    def exit(self, x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError  # abstract: each wiring defines it


@register("residual", "post-ln", "post_ln")
class PostLN(ResidualWiring):
    """Post-LN residual LayerNorm(x + Sublayer(x)) (Vaswani et al. 2017, §3.1)."""

    def enter(self, x: Tensor) -> Tensor:
        return x

    def exit(self, x: Tensor, y: Tensor) -> Tensor:
        return self.norm(x + self.dropout(y))


@register("residual", "pre-ln", "pre_ln")
class PreLN(ResidualWiring):
    """Pre-LN residual x + Sublayer(LayerNorm(x)) (Radford et al. 2019; Xiong et al. 2020); needs a final LayerNorm."""

    final_norm = True

    def enter(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def exit(self, x: Tensor, y: Tensor) -> Tensor:
        return x + self.dropout(y)


class GatedResidual(ResidualWiring):
    """GTrXL's wirings (Parisotto et al. 2019, "Stabilizing Transformers for Reinforcement Learning",
    arXiv:1910.06764, §3): layer norm on the sub-layer *input* only, and a gating layer
    ``g(x, relu(y))`` in place of the residual sum::

        enter(x) = LN(x)            exit(x, y) = g(x, relu(Dropout(y)))

    ``x`` is the residual stream, ``y`` the sub-layer output. Subclasses define the gate ``g``;
    ``gate_bias`` is ``b_g`` where the gate has one. The stream is never normalised, so a stack
    of these ends with a final LayerNorm, as pre-LN.
    """

    final_norm = True

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5, gate_bias: float = 2.0) -> None:
        super().__init__(d_model, dropout, eps)
        if isinstance(gate_bias, bool) or not isinstance(gate_bias, (int, float)):
            raise TypeError(f"gate_bias must be a float, got {gate_bias!r}")
        self.gate_bias = float(gate_bias)

    def enter(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def exit(self, x: Tensor, y: Tensor) -> Tensor:
        return self.gate(x, F.relu(self.dropout(y)))

    def gate(self, x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError  # abstract: each gate defines it


@register("residual", "relu-sum", "identity-map")
class ReLUSum(GatedResidual):
    """Identity map reordering of TrXL-I (Parisotto et al. 2019): x + relu(Sublayer(LayerNorm(x))) — GTrXL's plain-sum gate."""

    def gate(self, x: Tensor, y: Tensor) -> Tensor:
        return x + y


@register("residual", "input-gate")
class InputGate(GatedResidual):
    """GTrXL input gating (Parisotto et al. 2019): g = sigmoid(W_g x) * x + y, y = relu(Sublayer(LayerNorm(x)))."""

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5, gate_bias: float = 2.0) -> None:
        super().__init__(d_model, dropout, eps, gate_bias)
        self.w_g = nn.Linear(d_model, d_model)  # W_g (with a bias)

    def gate(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.sigmoid(self.w_g(x)) * x + y


@register("residual", "gru-gate", "gtrxl")
class GRUGate(GatedResidual):
    """GTrXL GRU-type gate (Parisotto et al. 2019): g = (1 - z) * x + z * tanh(W_g y + U_g (r * x)), z = sigmoid(W_z y + U_z x - b_g).

    ::

        r = sigmoid(W_r y + U_r x)
        z = sigmoid(W_z y + U_z x - b_g)
        h^ = tanh(W_g y + U_g (r * x))
        g = (1 - z) * x + z * h^

    with ``x`` the stream and ``y = relu(Sublayer(LN(x)))``. ``b_g = 2`` makes ``z ~ sigmoid(-2)
    = 0.12`` at initialisation, so each sub-layer starts close to the identity on ``x`` — the
    paper's explanation of GTrXL's stability. The six matrices are initialised ``N(0, 0.02)``
    (GPT's scale), which keeps the other terms small at initialisation too.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5, gate_bias: float = 2.0) -> None:
        super().__init__(d_model, dropout, eps, gate_bias)
        self.w = nn.Linear(d_model, 3 * d_model, bias=False)  # [W_r; W_z; W_g] y
        self.u_rz = nn.Linear(d_model, 2 * d_model, bias=False)  # [U_r; U_z] x
        self.u_g = nn.Linear(d_model, d_model, bias=False)  # U_g (r * x)
        for linear in (self.w, self.u_rz, self.u_g):
            nn.init.normal_(linear.weight, std=0.02)

    def update_gate(self, x: Tensor, y: Tensor) -> Tensor:
        """``z = sigmoid(W_z y + U_z x - b_g)``, the share of the new value in ``g``."""
        return torch.sigmoid(self.w(y).chunk(3, -1)[1] + self.u_rz(x).chunk(2, -1)[1] - self.gate_bias)

    def gate(self, x: Tensor, y: Tensor) -> Tensor:
        wr, wz, wg = self.w(y).chunk(3, dim=-1)  # (..., d) each
        ur, uz = self.u_rz(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.gate_bias)
        h = torch.tanh(wg + self.u_g(r * x))
        return (1 - z) * x + z * h


def build_residual(name: str, d_model: int, dropout: float = 0.0, eps: float = 1e-5) -> ResidualWiring:
    """The residual wiring registered as ``name`` (``"post-ln"``, ``"pre-ln"``, ...)."""
    return lookup("residual", name)(d_model, dropout=dropout, eps=eps)


class QuaternionLinear(nn.Module):
    """Quaternion linear layer: the Hamilton product with a quaternion weight (Parcollet et al. 2019,
    "Quaternion Recurrent Neural Networks", arXiv:1806.04418; Tay et al. 2019, "Lightweight and
    Efficient Neural Natural Language Processing with Quaternion Networks", arXiv:1906.04393).

    Input and output are read as ``in/4`` and ``out/4`` quaternions ``[r; x; y; z]`` (the four
    quarters of the feature vector). The weight ``W = W_r + W_x i + W_y j + W_z k`` has four real
    components of shape ``(in/4, out/4)``; ``W (x) Q`` is the real block matrix (formulas.md)

        [[W_r, -W_x, -W_y, -W_z],
         [W_x,  W_r, -W_z,  W_y],
         [W_y,  W_z,  W_r, -W_x],
         [W_z, -W_y,  W_x,  W_r]]  applied to [r; x; y; z]

    so the layer has a quarter of the weights of ``nn.Linear(in, out)`` (the bias, ``out``, is
    kept whole). Initialisation (Parcollet et al. 2019, §3.4, polar form): each weight is
    ``phi (cos theta + u sin theta)`` with modulus ``phi ~ chi_4`` scaled by
    ``sigma = 1 / sqrt(2 (in/4 + out/4))`` (Glorot), phase ``theta ~ U(-pi, pi)`` and ``u`` a random
    unit pure quaternion; the bias starts at 0.

    Shapes: ``x (..., in_features) -> (..., out_features)``; both must be multiples of 4.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            _checks.positive_int(name, n)
            if n % 4:
                raise ValueError(f"{name} must be a multiple of 4 (four quaternion components), got {n}")
        self.in_features, self.out_features = in_features, out_features
        shape = (in_features // 4, out_features // 4)
        self.weight_r, self.weight_x, self.weight_y, self.weight_z = (nn.Parameter(torch.empty(shape)) for _ in range(4))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Parcollet et al.'s polar-form quaternion initialisation (see the class docstring)."""
        n_in, n_out = self.weight_r.shape
        sigma = 1.0 / math.sqrt(2.0 * (n_in + n_out))
        phi = torch.randn(4, n_in, n_out, generator=generator).norm(dim=0) * sigma  # chi with 4 dof, scaled
        theta = (torch.rand(n_in, n_out, generator=generator) * 2 - 1) * math.pi  # U(-pi, pi)
        u = torch.randn(3, n_in, n_out, generator=generator)
        u = u / u.norm(dim=0).clamp_min(1e-12)  # unit pure quaternion (x, y, z)
        self.weight_r.copy_(phi * torch.cos(theta))
        for w, ui in zip((self.weight_x, self.weight_y, self.weight_z), u):
            w.copy_(phi * ui * torch.sin(theta))
        if self.bias is not None:
            self.bias.zero_()

    @property
    def weight(self) -> Tensor:
        """The real ``(out_features, in_features)`` matrix of the Hamilton product (``nn.Linear`` layout)."""
        r, x, y, z = (w.T for w in (self.weight_r, self.weight_x, self.weight_y, self.weight_z))  # (out/4, in/4)
        return torch.cat([torch.cat([r, -x, -y, -z], dim=1),
                          torch.cat([x, r, -z, y], dim=1),
                          torch.cat([y, z, r, -x], dim=1),
                          torch.cat([z, -y, x, r], dim=1)], dim=0)  # (out, in)

    def forward(self, x: Tensor) -> Tensor:
        _checks.tensor("x", x, floating=True)
        _checks.same("x", x.shape[-1], "in_features", self.in_features, "the feature size")
        _checks.same_dtype("x", x, "QuaternionLinear", self.weight_r)
        return F.linear(x, self.weight, self.bias)


#: linear layers a Transformer stack can be built with (``StackConfig.linear``), by name.
LINEAR_LAYERS = {"dense": nn.Linear, "quaternion": QuaternionLinear}


# ----------------------------------------------------------------------------- adaptive computation time


class ACTOutput(NamedTuple):
    """What ``AdaptiveComputationTime`` returns (``P`` positions: any leading shape, e.g. ``(B, L)``).

    output:        ``(*P, d)`` mean-field state ``sum_n p^n s^n``.
    ponder_cost:   ``(*P,)`` ``N(t) + R(t)`` (differentiable through ``R``); sum it times ``tau``.
    n_steps:       ``(*P,)`` long, ``N(t)``.
    remainder:     ``(*P,)`` ``R(t) = 1 - sum_{n < N(t)} h^n``.
    probabilities: ``(*P, T)`` ``p^n`` for the ``T <= M`` steps run (0 after ``N(t)``; the steps
                   never run, all 0, are not stored); each row sums to 1.
    states:        the step function's last auxiliary results, one per step (see ``forward``).
    """

    output: Tensor
    ponder_cost: Tensor
    n_steps: Tensor
    remainder: Tensor
    probabilities: Tensor
    states: list


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

    def forward(self, step, s: Tensor, run_all_steps: bool = False) -> ACTOutput:
        """Run ``step`` under ACT from the state ``s (*P, d)``.

        ``step(s, n) -> s_new`` or ``(s_new, aux)`` (``n`` = 1 .. M; ``aux``, e.g. a cache or
        attention weights, is collected into ``ACTOutput.states``). The loop stops once every
        position has halted, unless ``run_all_steps`` (incremental decoding needs every step's
        state for the positions that follow). Time and memory follow the steps run, ``max N(t)``,
        not ``M``.
        """
        _checks.tensor("s", s, floating=True)
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
            if not run_all_steps and not bool(running.any()):
                break
        # memory follows the steps run, not M: p^n = 0 for every step never run, and none is stored
        ponder = n_steps.to(remainder.dtype) + remainder  # N(t) + R(t)
        return ACTOutput(output, ponder, n_steps, remainder, torch.stack(probabilities, dim=-1), states)


# ----------------------------------------------------------------------------- reversible residuals


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
