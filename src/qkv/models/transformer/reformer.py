"""The Reformer (Kitaev, Kaiser, Levskaya 2020, "Reformer: The Efficient Transformer",
arXiv:2001.04451): a Transformer whose cost grows as O(L log L) in time and whose activation
memory does not grow with depth, built from three parts that exist elsewhere in qkv:

* LSH attention (``attention/lsh.py``): shared-QK attention within the sorted chunks of a
  random-rotation hash, several rounds;
* reversible residual layers (``blocks.ReversibleSequence``, Gomez et al. 2017, §3 of the paper):

      Y1 = X1 + Attention(LN(X2)),   Y2 = X2 + FeedForward(LN(Y1))

  the input embedding is copied to ``(X1, X2)`` and the output is ``LN((Y1 + Y2) / 2)``; backward
  rebuilds each layer's inputs from its outputs, so training stores one layer's activations;
* chunked feed-forward (``FeedForward(chunk_size=)``): the ``d_ff`` hidden activation is computed
  over ``ff_chunk_size`` positions at a time.

Two forms: a causal language model (``head="lm"``, trained on ``enwiki-bytes`` /
``shakespeare-char``, ``generate`` with an ``LSHState`` per layer) and a bidirectional encoder
with a mean-pooled classification head (``head="classification"``, e.g. ``bbc-news``).

The depth loop is ``ReformerStack.run_layers`` (the stack's depth hook). ``reversible=False``
runs the same layers as ordinary pre-LN residual blocks (the baseline of the memory benchmark).

Scores follow the authors' code: shared-QK scores are ``q_i . k_j`` on unit keys
(``score_scale=1.0``, as trax and Hugging Face's port compute them), not the ``q_i . k_j / sqrt(d)``
that eq. 1 with ``k_j = q_j / ||q_j||`` reads as; ``score_scale=None`` gives eq. 1's. On enwiki-bytes
at 2,000 steps (5 seeds) shared-QK with eq. 1's scores is 0.60 bits per byte behind separate Q and K,
with the authors' 0.08 ahead (``reformer-shared-qk`` in docs/reproductions/claims.json). A ``config.json`` saved before this field existed (its LSH knobs
in ``attention_kwargs`` without ``score_scale``) loads with the scores it was trained with (None).

Deviations: learned absolute positions (the paper's axial positions are for 64K-token inputs);
the number of buckets is fixed from ``max_len`` (``n_buckets=None``: ``2 max_len / bucket_size``
rounded up to a power of two) so that the hashing of a sequence does not change while it is
decoded token by token; causal LSH windows are the exact variant documented in ``attention/lsh.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import _checks
from ...attention.lsh import derived_n_buckets
from ...blocks import reversible
from ...registry import register
from ..base import ModelOutput
from ..losses import IGNORE_INDEX, check_labels, float32_at_least
from .gpt import GPT, GPTConfig
from .stack import (BlockState, StackOutput, StackState, TransformerBlock, TransformerStack,
                    check_token_mask)

__all__ = ["Reformer", "ReformerConfig", "ReformerStack"]

HEADS = ("lm", "classification")


@dataclass
class ReformerConfig(GPTConfig):
    """A CPU-sized Reformer: byte-level LM on contexts of a few thousand positions."""

    vocab_size: int = 256  # bytes (the task's vocabulary when trained from the CLI)
    max_len: int = 1024  # context length (learned positions)
    n_layers: int = 6  # reversible layers
    d_model: int = 128  # width
    n_heads: int = 4  # heads
    d_ff: int = 512  # feed-forward width
    dropout: float = 0.0  # embedding and residual dropout
    activation: str = "gelu"  # feed-forward activation
    residual: str = "pre-ln"  # LN inside F and G (the reversible wiring needs pre-LN sub-layers)
    positional: str = "learned"  # learned absolute positions
    attention: str = "lsh"  # LSH attention; "softmax" etc. give a reversible Transformer with that kernel
    attention_kwargs: Dict[str, Any] = field(default_factory=dict)  # extra knobs for the kernel
    bucket_size: int = 32  # LSH chunk length m (the paper: 64)
    n_rounds: int = 2  # LSH hash rounds (the paper: 1 to 8)
    n_buckets: Union[int, Tuple[int, ...], None] = None  # None: derived from max_len (fixed per model)
    dedup: bool = False  # count a key met in several rounds once
    score_scale: Optional[float] = 1.0  # LSH scores s q.k on unit keys: 1.0 the authors' code; None: 1/sqrt(d) (eq. 1)
    hash_seed: Optional[int] = None  # None: new random rotations every call (the paper); int: fixed
    reversible: bool = True  # reversible residual layers (False: ordinary pre-LN residual blocks)
    ff_chunk_size: Optional[int] = 128  # feed-forward over length chunks of this size
    head: str = "lm"  # "lm": causal LM | "classification": bidirectional encoder, pooled classifier
    num_labels: int = 2  # classes of the classification head

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        if self.residual != "pre-ln":
            raise ValueError(f"residual must be 'pre-ln' (F and G are LN + sub-layer), got {self.residual!r}")
        for name in ("bucket_size", "n_rounds", "num_labels"):
            _checks.positive_int(name, getattr(self, name))
        if not isinstance(self.reversible, bool) or not isinstance(self.dedup, bool):
            raise TypeError(f"reversible and dedup must be bools, got {self.reversible!r}, {self.dedup!r}")
        if isinstance(self.n_buckets, list):
            self.n_buckets = tuple(self.n_buckets)  # from config.json
        if self.attention == "lsh":
            n_buckets = self.n_buckets if self.n_buckets is not None else derived_n_buckets(self.max_len, self.bucket_size)
            own = {"bucket_size": self.bucket_size, "n_rounds": self.n_rounds, "n_buckets": n_buckets,
                   "dedup": self.dedup, "score_scale": self.score_scale, "seed": self.hash_seed}
            field_of = {"seed": "hash_seed"}  # the kernel's knob -> this config's field
            for knob, value in own.items():  # one source of truth: the fields; attention_kwargs may only agree
                given = self.attention_kwargs.get(knob, value)
                given = tuple(given) if isinstance(given, list) else given  # from config.json
                if given != value:
                    name = field_of.get(knob, knob)
                    raise ValueError(f"attention_kwargs.{knob}={given!r} conflicts with {name}={value!r}: the Reformer's "
                                     f"LSH knobs are its own fields — set {name} (--set {name}=...) instead")
            self.attention_kwargs = {**self.attention_kwargs, **own}
            _check_hashing_size(self, n_buckets)
        super().__post_init__()


def _saved_before_score_scale(values: Dict[str, Any]) -> bool:
    """Whether ``values`` is an LSH Reformer's ``config.json`` written before the ``score_scale``
    field: ``__post_init__`` had merged its LSH knobs into ``attention_kwargs`` (so
    ``bucket_size`` is there), and no ``score_scale`` is given anywhere."""
    kwargs = values.get("attention_kwargs")
    return (values.get("attention", "lsh") == "lsh" and "score_scale" not in values
            and isinstance(kwargs, dict) and "bucket_size" in kwargs and "score_scale" not in kwargs)


def _check_hashing_size(config: "ReformerConfig", n_buckets: Any) -> None:
    """Refuse ``n_rounds`` / ``n_buckets`` whose hashing would not fit in memory for one sequence
    of ``max_len``, from the arithmetic alone: the rotations ``(d_model, n_rounds, sum(f) / 2)``,
    the projections ``(H, L, n_rounds, sum(f) / 2)`` and the chunked scores ``(H, n_rounds, L, 2m)``
    (float32; attention/lsh.py's cost), before any of it is drawn."""
    from ..base import _human_bytes, available_memory

    factors = tuple(n_buckets) if isinstance(n_buckets, (tuple, list)) else (n_buckets,)
    if not all(isinstance(f, int) and f > 0 for f in factors):
        return  # the kernel names the bad value
    half = sum(factors) // 2
    need = 4 * config.n_rounds * (config.d_model * half + config.n_heads * config.max_len * (half + 2 * config.bucket_size))
    have = available_memory()
    if have is not None and need > have:
        raise ValueError(f"ReformerConfig: LSH hashing with n_rounds={config.n_rounds}, n_buckets={n_buckets} needs "
                         f"{_human_bytes(need)} for one sequence of max_len={config.max_len}, more than the "
                         f"{_human_bytes(have)} of memory available; the paper uses 1 to 8 rounds and 2 max_len / "
                         f"bucket_size buckets")


class _Halves:
    """The two sub-layers of a pre-LN ``TransformerBlock`` as the reversible pair (not a module:
    the block owns the parameters)::

        F(x) = Dropout(Attention(LN(x)))      G(x) = Dropout(FeedForward(LN(x)))
    """

    def __init__(self, block: TransformerBlock) -> None:
        self.block = block

    def f(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        b = self.block
        return b.res_self.dropout(b.self_attn(b.res_self.norm(x), mask=mask).output)

    def g(self, x: Tensor) -> Tensor:
        b = self.block
        return b.res_ff.dropout(b.ff(b.res_ff.norm(x)))

    def parameters(self):
        return self.block.parameters()


class ReformerStack(TransformerStack):
    """The shared stack with reversible depth: ``run_layers`` runs the pairs ``(X1, X2)`` through
    ``blocks.reversible`` (training) or the same equations in a plain loop (decoding with state,
    attention weights, per-layer hidden states). ``causal`` comes from the config's head."""

    def __init__(self, config: ReformerConfig, *, vocab_size: int, causal: bool = True, **kwargs: Any) -> None:
        super().__init__(config, vocab_size=vocab_size, causal=config.head == "lm", **kwargs)

    def run_layers(self, x: Tensor, mask: Optional[Tensor] = None, memory: Optional[Tensor] = None,
                   memory_mask: Optional[Tensor] = None, state: Optional[StackState] = None,
                   need_weights: bool = False, return_state: bool = False,
                   return_hidden: bool = False) -> StackOutput:
        if not self.config.reversible:
            return super().run_layers(x, mask, memory, memory_mask, state, need_weights, return_state, return_hidden)
        _checks.tensor("x", x, ndim=3, floating=True)
        if memory is not None:
            raise ValueError("the Reformer stack has no cross-attention: memory must be None")
        if isinstance(mask, Tensor) and mask.dim() == 2 and bool(mask.all()):
            mask = None  # no padding: keep the kernels' fast paths
        halves = [_Halves(block) for block in self.layers]
        if state is None and not (return_state or need_weights or return_hidden):
            y1, y2 = reversible(halves, x, x, mask)  # X1 = X2 = embeddings
            return StackOutput(self.final_norm((y1 + y2) / 2), None, None, None, None)
        layer_states = state.layers if state is not None else (None,) * len(self.layers)
        if len(layer_states) != len(self.layers):
            raise ValueError(f"state has {len(layer_states)} layers, the stack has {len(self.layers)}")
        x1 = x2 = x
        weights, new_states, hidden = [], [], []
        for half, s in zip(halves, layer_states):
            b = half.block
            a = b.self_attn(b.res_self.norm(x2), mask=mask, state=s.self_attn if s is not None else None,
                            need_weights=need_weights, return_state=return_state)
            x1 = x1 + b.res_self.dropout(a.output)  # Y1 = X1 + F(X2)
            x2 = x2 + half.g(x1)  # Y2 = X2 + G(Y1)
            weights.append(a.weights)
            new_states.append(BlockState(a.state))
            hidden.append((x1 + x2) / 2)
        new_state = None
        if return_state:
            new_state = StackState(tuple(new_states), (state.position if state is not None else 0) + x.shape[1])
        return StackOutput(self.final_norm((x1 + x2) / 2), weights if need_weights else None, None, new_state,
                           hidden if return_hidden else None)


@register("model", "reformer")
class Reformer(GPT):
    """Reformer (Kitaev et al. 2020): LSH attention, reversible residual layers and chunked feed-forward; causal LM or encoder classifier.

    ``head="lm"``: ``forward(input_ids (B, L), labels=None (B, L), ...)`` and ``generate(...)`` as
    ``GPT``. ``head="classification"``: ``forward(input_ids (B, L), attention_mask=None (B, L) bool,
    labels=None (B,))`` -> ``logits (B, num_labels)`` from the mean of the unpadded positions.
    """

    config_class = ReformerConfig
    task_kinds = frozenset({"lm", "classification"})
    stack_class = ReformerStack
    train_defaults = {"lr": 1e-3, "steps": 500, "batch_size": 8, "warmup": 50, "eval_max_examples": 64}

    @classmethod
    def from_config(cls, config: Union[ReformerConfig, Dict[str, Any]]) -> "Reformer":
        """Build from a ``ReformerConfig`` or a dict of its fields. A dict saved before
        ``score_scale`` existed (LSH knobs merged into ``attention_kwargs``, no ``score_scale``
        anywhere) gets ``score_scale=None``: the scores its weights were trained with."""
        if isinstance(config, dict) and _saved_before_score_scale(config):
            config = {**config, "score_scale": None}
        return super().from_config(config)

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                need_weights: bool = False, state: Optional[StackState] = None,
                return_state: bool = False) -> ModelOutput:
        """Next-token logits (``head="lm"``) or class logits (``head="classification"``)."""
        c = self.config
        if c.head == "lm":
            if attention_mask is not None:
                raise ValueError("attention_mask is for the encoder form (head='classification'); the LM reads whole windows")
            return super().forward(input_ids, labels=labels, need_weights=need_weights, state=state,
                                   return_state=return_state)
        if state is not None or return_state:
            raise ValueError("state/return_state are for the causal LM form (head='lm')")
        _checks.token_ids("input_ids", input_ids, c.vocab_size)
        check_token_mask("attention_mask", attention_mask, input_ids)
        out = self.stack(input_ids, mask=attention_mask, need_weights=need_weights)
        keep = (torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask)[..., None]
        pooled = (out.hidden * keep).sum(1) / keep.sum(1).clamp_min(1)  # (B, d_model): mean of real positions
        logits = self.classifier(pooled)  # (B, num_labels)
        loss = None
        if labels is not None:
            check_labels("labels", labels, c.num_labels, (input_ids.shape[0],))
            loss = F.cross_entropy(float32_at_least(logits), labels, ignore_index=IGNORE_INDEX)
        return ModelOutput(loss=loss, logits=logits, weights=out.weights, aux={}, hidden=out.hidden)
