"""Universal Transformer (Dehghani et al. 2019, "Universal Transformers", arXiv:1807.03819) on the
shared stack: one block, its weights shared across depth, applied ``T`` times or, per position,
under Adaptive Computation Time (Graves 2016).

    H^0 = E[ids]                                                (embeddings, no positions)
    A^t = LN(H^{t-1} + P^t + MHA(H^{t-1} + P^t))                t = 1 .. T
    H^t = LN(A^t + Transition(A^t))
    P^t_{i} = sinusoid(i) + sinusoid(t)                         (``positional="timestep"``)

Under ACT each position ``i`` computes a halting probability after every step and stops when
they sum to ``1 - eps`` (at most ``M = max_steps`` steps); its output is the halting-weighted mean
of its states and a halted position's state is copied forward (``qkv.blocks.AdaptiveComputationTime``).
The ponder cost ``tau * mean_i (N(i) + R(i))`` is added to the loss.

The depth loop is ``UniversalStack.run_layers`` (the stack's depth hook); the models are the
``Transformer`` encoder–decoder and the ``GPT`` decoder-only LM with that stack in place of theirs
(``stack_class``), plus the ponder cost. Incremental decoding keeps one ``BlockState`` per step
run so far and each position's halted state (``UniversalState``): a token runs the steps halting
asks for (and those already cached), never ``max_steps`` for its own sake.
Known failure (tensor2tensor #1723): with a positive halting bias every position halts after ~2
steps at initialisation and ACT never learns to use more; ``halting_bias_init`` defaults to -1.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from ... import _checks
from ...blocks import ACTOutput, AdaptiveComputationTime
from ...positional import TimestepEncoding
from ...registry import lookup, register
from ..base import ModelOutput
from ..losses import check_labels, lm_loss
from .gpt import GPT, GPTConfig
from .stack import BlockState, StackOutput, StackState, TransformerStack, _drop_if_full, token_scale
from .transformer import Transformer, TransformerConfig

__all__ = ["UniversalStack", "UniversalTransformer", "UniversalTransformerConfig", "UniversalTransformerLM",
           "UniversalTransformerLMConfig", "UniversalOptions", "UniversalState"]


#: the most steps a fixed-depth (``act=False``) Universal Transformer may take: with ACT halting bounds the
#: steps, without it nothing would (a 10^9-step depth is a hang, not a model)
MAX_FIXED_STEPS = 1024


@dataclass
class UniversalOptions:
    """The Universal Transformer's own fields, shared by its encoder–decoder and LM configs."""

    max_steps: int = 6  # T (fixed depth) or M (the most ACT steps)
    act: bool = True  # per-position Adaptive Computation Time; False: exactly max_steps steps everywhere
    act_eps: float = 0.01  # eps: halt once the halting probabilities sum to 1 - eps
    halting_bias_init: float = -1.0  # b_h at init (-1: h ~ 0.27, ~4 steps; t2t's +1 halts everything after 2)
    ponder_weight: float = 0.01  # tau: weight of the ponder cost mean_i (N(i) + R(i)) in the loss

    def _check_universal(self) -> None:
        _checks.positive_int("max_steps", self.max_steps)
        if not isinstance(self.act, bool):
            raise TypeError(f"act must be a bool, got {self.act!r}")
        if not self.act and self.max_steps > MAX_FIXED_STEPS:  # ACT's halting bounds the steps; nothing else would
            raise ValueError(f"max_steps must be 1 to {MAX_FIXED_STEPS} with act=False (every position runs every "
                             f"step: the depth), got {self.max_steps:,}; with act=True it is only a cap on halting")
        if isinstance(self.act_eps, bool) or not isinstance(self.act_eps, (int, float)) or not 0 <= self.act_eps < 1:
            raise ValueError(f"act_eps must be a float in [0, 1), got {self.act_eps!r}")
        if isinstance(self.halting_bias_init, bool) or not isinstance(self.halting_bias_init, (int, float)):
            raise TypeError(f"halting_bias_init must be a float, got {self.halting_bias_init!r}")
        if isinstance(self.ponder_weight, bool) or not isinstance(self.ponder_weight, (int, float)) or self.ponder_weight < 0:
            raise ValueError(f"ponder_weight must be a float >= 0, got {self.ponder_weight!r}")
        if self.n_layers != 1:  # type: ignore[attr-defined]
            raise ValueError(f"a Universal Transformer has one shared block (depth is max_steps): n_layers must be 1, "
                             f"got {self.n_layers}")  # type: ignore[attr-defined]


@dataclass(frozen=True)
class UniversalState(StackState):
    """A Universal Transformer stack's decoding state: one ``BlockState`` per step run so far (the
    most any position needed, at most ``max_steps``) and, under ACT, ``hidden (B, position,
    d_model)``, each earlier position's state when it halted: a later position that needs more
    steps finds their caches for those steps computed from it (they are frozen, as in the full
    sequence), so decoding runs the steps halting asks for, not ``max_steps``."""

    hidden: Optional[Tensor] = None
    positions: Optional[Tensor] = None  # (B, position): the earlier positions' coordinates when given (None: 0 ..)


class UniversalStack(TransformerStack):
    """A ``TransformerStack`` with one block applied ``max_steps`` times, or under per-position ACT.

    Takes the ``TransformerStack`` arguments; ``config`` must also carry ``UniversalOptions``.
    ``config.positional`` is added before every step (``timestep``: position and step sinusoids)
    instead of once to the embeddings. ``run_steps`` returns the ``StackOutput`` and the
    ``ACTOutput`` (None without ACT); ``run_layers``, the stack's depth hook, returns the former.
    With ``need_weights`` the per-layer lists hold one entry per step taken; with ``return_state``
    the state (``UniversalState``) holds one ``BlockState`` per step run so far and the halted
    states of the positions seen, from which later positions' extra steps are served.
    """

    def __init__(self, config: Any, *, n_layers: Optional[int] = None, **kwargs: Any) -> None:
        if not isinstance(config, UniversalOptions):
            raise TypeError(f"config must carry UniversalOptions (a Universal Transformer config), got {type(config).__name__}")
        if n_layers not in (None, 1):
            raise ValueError(f"a Universal Transformer stack has one shared block; n_layers must be 1, got {n_layers}")
        # the coordinates are added here, not by the embeddings: the tokens are scaled for them all the same
        kwargs.setdefault("embedding_scale", token_scale(config.positional, config.d_model))
        if config.rotary():
            raise ValueError("positional='rotary' turns queries and keys inside attention; the Universal Transformer "
                             "adds its positions before every step (use 'timestep' or 'sinusoidal')")
        super().__init__(dataclasses.replace(config, positional="none"), n_layers=1, **kwargs)
        self.coordinates = lookup("positional", config.positional)(config.d_model, max_len=config.max_len, dropout=0.0)
        self.max_steps = config.max_steps
        self.act = (AdaptiveComputationTime(config.d_model, config.max_steps, config.act_eps, config.halting_bias_init)
                    if config.act else None)

    def add_coordinates(self, h: Tensor, offset: int, step: int, positions: Optional[Tensor] = None) -> Tensor:
        """``H + P^t``: the positional scheme of positions ``offset ..``, or ``positions (B, L)`` when given
        (a left-padded row's counted from its first token), and, ``timestep``, of step ``t``."""
        kw = {} if positions is None else {"positions": positions}
        if positions is not None and "positions" not in inspect.signature(self.coordinates.forward).parameters:
            raise ValueError(f"position_ids given, but the positional scheme {type(self.coordinates).__name__} takes "
                             f"none (timestep, learned and sinusoidal positions do)")
        if isinstance(self.coordinates, TimestepEncoding):
            return self.coordinates(h, offset, step=step, **kw)
        return self.coordinates(h, offset, **kw)

    def run_steps(self, x: Tensor, mask: Optional[Tensor] = None, memory: Optional[Tensor] = None,
                  memory_mask: Optional[Tensor] = None, state: Optional[StackState] = None,
                  need_weights: bool = False, return_state: bool = False,
                  return_hidden: bool = False, position_ids: Optional[Tensor] = None) -> Tuple[StackOutput, Optional[ACTOutput]]:
        """The shared block on embeddings ``x (B, L, d_model)``: ``T`` steps or ACT. ``position_ids (B, L)``:
        the coordinates' positions (default: following ``state.position``)."""
        _checks.tensor("x", x, ndim=3, floating=True)
        mask, memory_mask = _drop_if_full(mask), _drop_if_full(memory_mask)
        cached, earlier = self._check_state(state, x)
        offset = state.position if state is not None else 0
        block = self.layers[0]
        seen = self._earlier_positions(state, position_ids, x)  # (B, P) or None

        def step(h: Tensor, n: int):
            if state is not None and n > len(cached):  # every earlier position had halted before step n
                cached.append(self._frozen_step(earlier, n, mask, memory, memory_mask, cached, seen))
            out = block(self.add_coordinates(h, offset, n, position_ids), mask=mask, memory=memory, memory_mask=memory_mask,
                        state=None if state is None else cached[n - 1], need_weights=need_weights,
                        return_state=return_state)
            return out.hidden, out

        act = None
        if self.act is None:
            outs = []
            for n in range(1, self.max_steps + 1):
                x, out = step(x, n)
                outs.append(out)
        else:
            # incremental decoding runs at least the steps the earlier positions' caches hold, so that
            # each cached step holds every position; beyond them only as far as halting goes
            act = self.act(step, x, min_steps=len(cached) if return_state else 0)
            x, outs = act.output, act.states
        new_state = None
        if return_state:
            final = None
            if act is not None:  # what a later step sees of these positions: their state when they halted
                final = act.final_state if earlier is None else torch.cat([earlier, act.final_state], dim=1)
            positions = None if position_ids is None else (
                position_ids if seen is None else torch.cat([seen, position_ids], dim=1))  # (B, P + L)
            new_state = UniversalState(tuple(o.state for o in outs), offset + x.shape[1], final, positions)
        has_cross = block.cross_attn is not None
        output = StackOutput(self.final_norm(x), [o.self_weights for o in outs] if need_weights else None,
                             [o.cross_weights for o in outs] if need_weights and has_cross else None, new_state,
                             [o.hidden for o in outs] if return_hidden else None)
        return output, act

    def _check_state(self, state: Optional[StackState], x: Tensor) -> Tuple[list, Optional[Tensor]]:
        """``(per-step block states, the earlier positions' halted states (B, P, d) or None)`` of ``state``."""
        if state is None:
            return [], None
        if not isinstance(state, StackState):
            raise TypeError(f"state must be the StackState a previous call returned, got {type(state).__name__}")
        steps = len(state.layers)
        if self.act is None:
            if steps != self.max_steps:
                raise ValueError(f"state has {steps} steps, the stack runs max_steps={self.max_steps}")
            return list(state.layers), None
        earlier = state.hidden if isinstance(state, UniversalState) else None
        if steps > self.max_steps or steps == 0 or earlier is None:
            raise ValueError(f"state has {steps} steps{'' if earlier is not None else ' and no halted states'}: "
                             f"not one this stack returned (ACT, at most max_steps={self.max_steps} steps)")
        if earlier.shape != (x.shape[0], state.position, x.shape[2]):
            raise ValueError(f"state holds halted states of shape {tuple(earlier.shape)}, expected "
                             f"{(x.shape[0], state.position, x.shape[2])} (batch, positions seen, d_model)")
        return list(state.layers), earlier

    @staticmethod
    def _earlier_positions(state: Optional[StackState], position_ids: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
        """The earlier positions' coordinates ``(B, P)`` when this call gives ``position_ids`` (None: ``0 .. P - 1``,
        as the state's earlier calls counted them); a state that recorded them and a call without them, or the
        reverse, would mix two numberings and are refused."""
        P = state.position if state is not None else 0
        recorded = state.positions if isinstance(state, UniversalState) else None
        if position_ids is not None:
            _checks.tensor("position_ids", position_ids, ndim=2)
            _checks.same("position_ids", tuple(position_ids.shape), "input_ids", tuple(x.shape[:2]), "the shape")
        if P == 0 or (recorded is None and position_ids is None):
            return None
        if (recorded is None) != (position_ids is None):
            raise ValueError("position_ids must be given at every call of a decoding state or at none (the state's "
                             "earlier positions were counted the other way)")
        return recorded

    def _frozen_step(self, earlier: Tensor, n: int, mask: Optional[Tensor], memory: Optional[Tensor],
                     memory_mask: Optional[Tensor], cached: list, positions: Optional[Tensor] = None) -> Any:
        """The block's state at step ``n`` for the earlier positions, all halted before it: the block
        run on their frozen states (plus ``P^n`` at their ``positions``), as the full sequence's step ``n``
        sees them — with their columns of a key-padding ``mask (B, P + L)``."""
        P = earlier.shape[1]
        if mask is not None and mask.dim() != 2:
            raise ValueError("incremental ACT decoding past the earlier positions' steps takes a key-padding "
                             "self-attention mask (B, positions) only")
        seed = BlockState(cross_kv=cached[-1].cross_kv) if cached and cached[-1] is not None else None
        return self.layers[0](self.add_coordinates(earlier, 0, n, positions),
                              mask=None if mask is None else _drop_if_full(mask[:, :P]), memory=memory,
                              memory_mask=memory_mask, state=seed, return_state=True).state

    def run_layers(self, x: Tensor, mask: Optional[Tensor] = None, memory: Optional[Tensor] = None,
                   memory_mask: Optional[Tensor] = None, state: Optional[StackState] = None,
                   need_weights: bool = False, return_state: bool = False,
                   return_hidden: bool = False) -> StackOutput:
        """The depth hook: ``run_steps`` without its ACT statistics."""
        return self.run_steps(x, mask, memory, memory_mask, state, need_weights, return_state, return_hidden)[0]

    def embed_and_run(self, input_ids: Tensor, **kwargs: Any) -> Tuple[StackOutput, Optional[ACTOutput]]:
        """``forward`` (embeddings after ``state.position``) returning the ACT statistics too."""
        state = kwargs.get("state")
        offset = state.position if isinstance(state, StackState) else 0
        return self.run_steps(self.embed(input_ids, offset=offset), **kwargs)


def ponder_cost(act: Optional[ACTOutput], keep: Optional[Tensor]) -> Optional[Tensor]:
    """Mean ``N(i) + R(i)`` over the positions where ``keep (B, L)`` is True (all when None)."""
    if act is None:
        return None
    cost = act.ponder_cost  # (B, L)
    if keep is None:
        return cost.mean()
    return (cost * keep).sum() / keep.sum().clamp_min(1)


# ----------------------------------------------------------------------------- encoder–decoder


@dataclass
class UniversalTransformerConfig(TransformerConfig, UniversalOptions):
    """A small Universal Transformer for the generated seq2seq tasks (CPU minutes)."""

    n_layers: int = 1  # one shared block per stack (depth: max_steps)
    d_model: int = 128  # width
    n_heads: int = 4  # heads
    d_ff: int = 512  # transition (feed-forward) width
    dropout: float = 0.1  # residual and embedding dropout
    positional: str = "timestep"  # P^t: sinusoids of the position and of the step, added before every step
    max_len: int = 512  # sinusoid rows cached
    label_smoothing: float = 0.0  # the generated tasks need exact answers
    vocab_size: int = 64  # source (and shared target) vocabulary; the task's when trained from the CLI

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_universal()


@register("model", "universal-transformer", "ut")
class UniversalTransformer(Transformer):
    """Universal Transformer encoder–decoder (Dehghani et al. 2019): shared-weight depth with per-position ACT.

    ``forward`` as ``Transformer.forward``; ``aux`` adds ``ponder_cost`` (encoder + decoder, mean
    over real positions), ``encoder_steps`` and ``decoder_steps`` (mean ``N``), and with
    ``return_act=True`` the ``ACTOutput`` of each (``aux["encoder_act"]``, ``aux["decoder_act"]``).
    """

    config_class = UniversalTransformerConfig
    # the parent's presets without its depth: a Universal Transformer has one shared block (n_layers=1)
    presets = {name: {k: v for k, v in p.items() if k != "n_layers"} for name, p in Transformer.presets.items()}
    stack_class = UniversalStack
    train_defaults = {"lr": 1e-3, "steps": 1500, "batch_size": 64, "warmup": 100}

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, need_weights: bool = False, return_act: bool = False) -> ModelOutput:
        """Teacher-forced logits ``(B, T, V)``; with ``labels (B, T)``: cross-entropy + ``tau`` ponder cost."""
        _checks.token_ids("src_ids", src_ids, self.config.vocab_size)
        _checks.token_ids("tgt_ids", tgt_ids, self.tgt_vocab_size)
        src_mask = self._check_mask(src_mask, src_ids)
        enc, enc_act = self.encoder.embed_and_run(src_ids, mask=src_mask, need_weights=need_weights)
        dec, dec_act = self.decoder.embed_and_run(tgt_ids, memory=enc.hidden, memory_mask=src_mask,
                                                  need_weights=need_weights)
        logits = self.lm_head(dec.hidden)  # (B, T, V)
        aux: dict = {}
        ponder = None
        if enc_act is not None:
            tgt_keep = labels != -100 if labels is not None else None
            ponder = ponder_cost(enc_act, src_mask) + ponder_cost(dec_act, tgt_keep)
            aux.update(ponder_cost=ponder.detach(), encoder_steps=enc_act.n_steps.float().mean(),
                       decoder_steps=dec_act.n_steps.float().mean())
            if return_act:
                aux.update(encoder_act=enc_act, decoder_act=dec_act)
        loss = None
        if labels is not None:
            check_labels("labels", labels, self.tgt_vocab_size, tgt_ids.shape)
            loss = lm_loss(logits, labels, label_smoothing=self.config.label_smoothing)
            aux["lm_loss"] = loss.detach()
            if ponder is not None and self.training:
                loss = loss + self.config.ponder_weight * ponder
        weights = None
        if need_weights:
            weights = {"encoder": enc.weights, "decoder_self": dec.weights, "decoder_cross": dec.cross_weights}
        return ModelOutput(loss=loss, logits=logits, weights=weights, aux=aux, hidden=dec.hidden)


# ----------------------------------------------------------------------------- encoder-only (LM)


@dataclass
class UniversalTransformerLMConfig(GPTConfig, UniversalOptions):
    """An encoder-only (causal, decoder-only in today's words) Universal Transformer LM, CPU-sized."""

    n_layers: int = 1  # one shared block (depth: max_steps)
    d_model: int = 128  # width
    n_heads: int = 4  # heads
    d_ff: int = 512  # transition width
    dropout: float = 0.1  # residual and embedding dropout
    activation: str = "relu"  # transition activation
    residual: str = "post-ln"  # the paper's A^t = LN(H + MHA(H)) wiring
    positional: str = "timestep"  # P^t before every step
    max_len: int = 256  # sinusoid rows cached (any length works)
    vocab_size: int = 256  # the task's when trained from the CLI

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_universal()


@register("model", "universal-transformer-lm", "ut-lm")
class UniversalTransformerLM(GPT):
    """Encoder-only Universal Transformer language model (Dehghani et al. 2019, LAMBADA setting), causal ACT.

    ``forward(input_ids (B, L), labels=None, need_weights=False, state=None, return_state=False,
    return_act=False, attention_mask=None, position_ids=None)`` -> ``ModelOutput``; ``aux``:
    ``ponder_cost``, ``steps`` (mean ``N``), ``act``. ``attention_mask``/``position_ids`` as GPT's (the
    positions go to the coordinates added before every step). ``generate`` is GPT's (one token at a
    time through the per-step caches; a left-padded batch with ``attention_mask``).
    """

    config_class = UniversalTransformerLMConfig
    context_parallel = ("its adaptive computation time halts each position on its own: the ranks would make "
                        "different numbers of attention calls and wait on each other for ever")
    task_kinds = frozenset({"lm"})  # its forward has no classification head
    # the parent's presets without its depth: a Universal Transformer has one shared block (n_layers=1)
    presets = {name: {k: v for k, v in p.items() if k != "n_layers"} for name, p in GPT.presets.items()}
    stack_class = UniversalStack
    train_defaults = {"lr": 1e-3, "steps": 1000, "batch_size": 32, "warmup": 100}

    def __init__(self, config: UniversalTransformerLMConfig) -> None:
        super().__init__(config)
        if self.stack.act is not None:  # GPT's init zeroed every bias: restore the halting bias
            torch.nn.init.constant_(self.stack.act.halting.bias, config.halting_bias_init)

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None, need_weights: bool = False,
                state: Optional[StackState] = None, return_state: bool = False, return_act: bool = False,
                attention_mask: Optional[Tensor] = None, position_ids: Optional[Tensor] = None) -> ModelOutput:
        c = self.config
        if labels is not None:
            check_labels("labels", labels, c.vocab_size, getattr(input_ids, "shape", ()))
        _checks.token_ids("input_ids", input_ids, c.vocab_size)
        attention_mask = self._checked_attention_mask(attention_mask, input_ids, state)  # as GPT's (B, seen + L)
        out, act = self.stack.embed_and_run(input_ids, mask=attention_mask, state=state, need_weights=need_weights,
                                            return_state=return_state, position_ids=position_ids)
        logits = self.lm_head(out.hidden)  # (B, L, V)
        aux: dict = {}
        ponder = ponder_cost(act, labels != -100 if labels is not None else None)
        if act is not None:
            aux.update(ponder_cost=ponder.detach(), steps=act.n_steps.float().mean())
            if return_act:
                aux["act"] = act
        loss = None
        if labels is not None:
            loss = lm_loss(logits, labels)
            aux["lm_loss"] = loss.detach()
            if ponder is not None and self.training:
                loss = loss + c.ponder_weight * ponder
        return ModelOutput(loss=loss, logits=logits, weights=out.weights, state=out.state, aux=aux, hidden=out.hidden)
