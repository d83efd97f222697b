"""GPT: a decoder-only Transformer language model (Radford et al. 2018, "Improving Language
Understanding by Generative Pre-Training"; Radford et al. 2019, GPT-2), on the shared stack.

    h_0 = W_e[U] + W_p            (token + learned position embeddings)
    h_l = block(h_{l-1})          l = 1 .. n   (causal self-attention, pre-LN as in GPT-2)
    P(u) = softmax(LN(h_n) W_e^T) (output tied to the input embedding)

Fine-tuning on classification (2018, §3.2; ``head="classification"``): the final hidden state of
the last real token ``h^m`` goes through a new linear layer, ``P(y | x^1..x^m) = softmax(h^m W_y)``;
``L_3 = L_2 + λ L_1`` adds the LM loss on the same text (``lm_aux_weight`` = λ; the paper: 0.5).
A fine-tuning run starts from a pre-trained LM run with ``qkv train gpt --task bbc-bytes --init RUN``.

Al-Rfou et al. 2018's auxiliary losses are their own model on this one: ``al_rfou.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...registry import register
from ..base import ModelOutput, QKVModel
from ..losses import IGNORE_INDEX, check_labels, float32_at_least, lm_loss
from ..sampling import sample_logits
from .stack import bool_token_mask, init_normal, StackConfig, StackState, TransformerStack

__all__ = ["GPT", "GPTConfig", "HEADS"]

HEADS = ("lm", "classification")


@dataclass
class GPTConfig(StackConfig):
    """GPT-2 small by default (Radford et al. 2019)."""

    vocab_size: int = 50257  # token vocabulary (the task's vocab size when trained from the CLI)
    max_len: int = 1024  # context length (learned positions)
    n_layers: int = 12  # blocks
    d_model: int = 768  # width
    n_heads: int = 12  # heads
    d_ff: int = 3072  # feed-forward width (4 d_model)
    dropout: float = 0.1  # embedding and residual dropout
    activation: str = "gelu"  # feed-forward activation
    residual: str = "pre-ln"  # GPT-2 wiring: x + F(LN(x)), final LayerNorm
    positional: str = "learned"  # learned absolute positions
    tie_embeddings: bool = True  # output projection = token embedding matrix transposed
    head: str = "lm"  # "lm": next-token logits (B, L, V) | "classification": logits (B, num_labels) from the last real token
    num_labels: int = 2  # classes of the classification head
    lm_aux_weight: float = 0.0  # λ of the auxiliary LM loss while fine-tuning a classifier (the paper: 0.5); 0: none

    def __post_init__(self) -> None:
        super().__post_init__()
        _checks.positive_int("vocab_size", self.vocab_size)
        if not isinstance(self.tie_embeddings, bool):
            raise TypeError(f"tie_embeddings must be a bool, got {self.tie_embeddings!r}")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        if isinstance(self.num_labels, bool) or not isinstance(self.num_labels, int) or self.num_labels < 2:
            raise ValueError(f"num_labels must be an int >= 2 (the classes of the classification head), got {self.num_labels!r}")
        weight = self.lm_aux_weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
            raise ValueError(f"lm_aux_weight must be a finite number >= 0, got {weight!r}")
        if weight and self.head != "classification":
            raise ValueError(f"lm_aux_weight is the auxiliary LM loss of head='classification'; head={self.head!r} "
                             "trains the LM loss alone (set lm_aux_weight=0)")


@register("model", "gpt")
class GPT(QKVModel):
    """GPT decoder-only language model (Radford et al. 2018/2019) on the shared Transformer stack.

    ``head="lm"``: ``forward(input_ids (B, L), labels=None (B, L), need_weights=False, state=None,
    return_state=False)`` -> ``ModelOutput(loss, logits (B, L, V), weights [per layer (B, H, L, N)], state)``.
    ``head="classification"``: ``forward(input_ids (B, L), attention_mask=None (B, L) bool, labels=None (B,))``
    -> ``logits (B, num_labels)`` from the last real token's final hidden state (2018, §3.2).
    """

    config_class = GPTConfig
    suggested_tasks = ('shakespeare-char', 'enwiki-bytes')  # `qkv list model`
    task_kinds = frozenset({"lm", "classification"})  # a subclass whose forward is its own names its kinds
    init_task_fields = ("head", "num_labels")  # a fine-tuning task chooses the head (qkv train --init)
    init_fresh = ("classifier.",)  # ...which starts fresh; the stack and the LM head are copied
    input_key = "input_ids"  # token ids
    context_parallel = True  # the LM head: a loss over positions (a classification head refuses: below)
    stack_class = TransformerStack  # the decoder stack (Universal Transformer: a shared-depth stack)
    # "paper": GPT-2 small (the config's defaults); "cpu": trains on shakespeare-char in minutes on 2 cores
    presets = {"paper": {},
               "cpu": {"n_layers": 4, "d_model": 128, "n_heads": 4, "d_ff": 512, "dropout": 0.0,
                       "train": {"steps": 600, "batch_size": 32, "lr": 3e-3, "warmup": 50}}}
    default_preset = "cpu"
    #: fields that ``gpt`` configs held (at these values when unused) before a model built on GPT had
    #: its own class; that model declares them (Al-Rfou et al.'s losses: ``al_rfou.py``)
    legacy_fields: ClassVar[Dict[str, Any]] = {}

    def context_parallel_refusal(self) -> Optional[str]:
        if self.config.head == "classification":
            return ("with head='classification' it reads one position of each sequence (the last real token), "
                    "which one rank alone holds")
        return super().context_parallel_refusal()

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        c = config
        if c.head == "classification" and "classification" not in self.task_kinds:
            raise ValueError(f"head='classification': {type(self).__name__} is a language model only (head='lm')")
        self.stack = self.stack_class(c, vocab_size=c.vocab_size, causal=True, token_segments=True)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(init_normal)  # N(0, 0.02) weights, zero biases (GPT-2)
        if c.tie_embeddings:
            self.lm_head.weight = self.stack.embed.token.weight
        if c.head == "classification":  # built after the stack's initialisation: the LM's draws are unchanged
            self.classifier_dropout = nn.Dropout(c.dropout)  # the paper's dropout on the classifier (§4.1)
            self.classifier = nn.Linear(c.d_model, c.num_labels)  # W_y, new at fine-tuning
            init_normal(self.classifier)

    @classmethod
    def from_config(cls, config: Union[GPTConfig, Dict[str, Any]]) -> "GPT":
        """``QKVModel.from_config``; a config dict written before a model built on GPT had its own
        class (its ``legacy_fields``: Al-Rfou et al.'s losses) still loads: unused, the fields are
        dropped; used, a ``gpt`` config builds that model (the subclass that declares them)."""
        if isinstance(config, dict):
            fields = {f.name for f in dataclasses.fields(cls.config_class)}
            for owner in GPT.__subclasses__():
                legacy = {k: config[k] for k in owner.legacy_fields if k in config and k not in fields}
                if not legacy:
                    continue
                config = {k: v for k, v in config.items() if k not in legacy}
                if any(legacy[k] != owner.legacy_fields[k] for k in legacy):
                    if cls is not GPT:
                        raise ValueError(f"the fields {sorted(legacy)} are the {owner.registry_name!r} model's, not "
                                         f"{cls.registry_name!r}'s")
                    return owner.from_config({**config, **owner.legacy_fields, **legacy})
        return super().from_config(config)

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None, need_weights: bool = False,
                state: Optional[StackState] = None, return_state: bool = False,
                attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None,
                position_ids: Optional[Tensor] = None, logits_to_keep: int = 0) -> ModelOutput:
        """Next-token logits for every position of ``input_ids (B, L)``; ``labels (B, L)``: next-token
        targets (``-100`` ignored), ``loss`` their cross-entropy. ``state``/``return_state``:
        continue a sequence (KV caches of the kernels). ``logits_to_keep = k > 0``: the logits of
        the last ``k`` positions only, ``(B, k, V)`` (transformers' name; ``generate`` reads a
        prompt with 1, so that it does not multiply every position by the output matrix); not with
        ``labels``.

        ``attention_mask (B, L)`` bool, True = real token: padded keys are masked out (with
        ``state``, ``(B, positions so far + L)``); positions still count from 0 at the first
        column, as in transformers' GPT-2, unless ``position_ids (B, L)`` say otherwise — for a
        left-padded batch ``(attention_mask.cumsum(-1) - 1).clamp(min=0)`` gives each row the
        positions of its tokens alone (what ``generate`` passes). Without ``attention_mask``,
        ``position_ids`` that restart at 0 inside a row mark packed documents (transformers'
        ``DataCollatorWithFlattening``): each document gets what it gets alone. A kernel whose blocks sit at
        absolute positions (``anchored``: local-1d, local-2d, fixed) refuses a mask padded in front.
        ``token_type_ids (B, L)``: ids in the token vocabulary whose token embeddings are added
        (GPT-2's token types). ``hidden``: the final hidden states.

        ``head="classification"``: ``labels (B,)`` class ids (``-100`` ignored), ``logits (B, num_labels)``
        from the last position whose ``attention_mask`` is True (the last column without a mask),
        left or right padding alike; ``loss`` their cross-entropy (``+ lm_aux_weight`` x the LM
        loss on the real tokens, ``aux["lm_loss"]``).
        """
        c = self.config
        classify = c.head == "classification"
        if classify and (state is not None or return_state):
            raise ValueError("state/return_state continue a sequence with head='lm'; head='classification' reads "
                             "whole sequences")
        if labels is not None and not classify:
            check_labels("labels", labels, c.vocab_size, getattr(input_ids, "shape", ()))
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be an int >= 0 (0: every position), got {logits_to_keep!r}")
        if logits_to_keep and labels is not None:
            raise ValueError("logits_to_keep > 0 keeps some positions' logits; labels need every position's (give 0)")
        attention_mask = self._checked_attention_mask(attention_mask, input_ids, state)
        last = None
        if classify:
            _checks.tensor("input_ids", input_ids, ndim=2)
            last = last_real_position(attention_mask, input_ids)
            if labels is not None:
                check_labels("labels", labels, c.num_labels, (input_ids.shape[0],))
        extra = {} if position_ids is None else {"position_ids": position_ids}  # (a stack without them: Universal Transformer)
        out = self.stack(input_ids, token_type_ids, mask=attention_mask, state=state, need_weights=need_weights,
                         return_state=return_state, **extra)
        if classify:
            return self._classify(out, input_ids, attention_mask, last, labels)
        logits = self.lm_head(out.hidden[:, -logits_to_keep:] if logits_to_keep else out.hidden)  # (B, L or k, V)
        loss, aux = None, {}
        if labels is not None:
            loss = lm_loss(logits, labels)
            aux["lm_loss"] = loss.detach()
        return ModelOutput(loss=loss, logits=logits, weights=out.weights, state=out.state, aux=aux, hidden=out.hidden)

    def _classify(self, out: Any, input_ids: Tensor, attention_mask: Optional[Tensor], last: Tensor,
                  labels: Optional[Tensor]) -> ModelOutput:
        """The classification head on the stack's output (2018, §3.2, eq. 3-5)."""
        c = self.config
        h = out.hidden  # (B, L, d_model)
        h_m = h[torch.arange(h.shape[0], device=h.device), last]  # (B, d_model): the last real token's h_l^m
        # P(y | x^1..x^m) = softmax(h_l^m W_y)
        logits = self.classifier(self.classifier_dropout(h_m))  # (B, num_labels)
        loss, aux = None, {}
        if labels is not None:
            # L_2 = -log P(y | x^1..x^m), averaged over the batch
            loss = F.cross_entropy(float32_at_least(logits), labels, ignore_index=IGNORE_INDEX)
            aux["classification_loss"] = loss.detach()
            if c.lm_aux_weight:
                # L_3 = L_2 + λ L_1: the LM loss on the same text, each real token predicting the next real one
                real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask
                targets = input_ids[:, 1:].masked_fill(~(real[:, 1:] & real[:, :-1]), IGNORE_INDEX)  # (B, L - 1)
                l_1 = lm_loss(self.lm_head(h[:, :-1]), targets)
                loss = loss + c.lm_aux_weight * l_1
                aux["lm_loss"] = l_1.detach()
        return ModelOutput(loss=loss, logits=logits, weights=out.weights, aux=aux, hidden=h)

    def _checked_attention_mask(self, attention_mask: Optional[Tensor], input_ids: Tensor,
                                state: Optional[StackState]) -> Optional[Tensor]:
        """``forward``'s ``attention_mask`` as a bool ``(B, positions so far + L)`` tensor (0/1 as a
        tokenizer gives it accepted), checked against ``input_ids`` and ``state``; None stays None."""
        attention_mask = bool_token_mask("attention_mask", attention_mask)
        if attention_mask is not None:
            _checks.token_ids("input_ids", input_ids, self.config.vocab_size)
            seen = state.position if isinstance(state, StackState) else 0
            _checks.tensor("attention_mask", attention_mask, ndim=2)
            if attention_mask.dtype != torch.bool:
                raise TypeError(f"attention_mask must be a bool tensor (True = real token) or hold 0/1, got dtype "
                                f"{attention_mask.dtype}")
            _checks.same("attention_mask", tuple(attention_mask.shape), "(batch, positions so far + input length)",
                         (input_ids.shape[0], seen + input_ids.shape[1]), "the shape")
            self._check_left_padding(attention_mask)
        return attention_mask

    def _check_left_padding(self, attention_mask: Tensor) -> None:
        """Refuse a mask padded in front (some row's first column False) when a kernel's blocks sit at
        absolute positions (``AttentionKernel.anchored``): that row would see other blocks than its
        tokens alone (not read while a graph is traced)."""
        if torch.compiler.is_compiling() or not attention_mask.numel() or bool(attention_mask[:, 0].all()):
            return
        anchored = sorted({m.registry_name for m in self.modules() if getattr(m, "anchored", False) is True
                           and isinstance(getattr(m, "registry_name", None), str)})
        if anchored:
            raise ValueError(f"attention_mask pads some rows in front (left padding), but attention {anchored[0]!r} "
                             f"anchors its blocks at absolute positions (multiples of its block length), so a padded "
                             f"row would see other blocks than its tokens alone; pad on the right, or run such rows "
                             f"one at a time")

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, use_cache: bool = True,
                 generator: Optional[torch.Generator] = None, attention_mask: Optional[Tensor] = None,
                 do_sample: Optional[bool] = None, eos_token_id: Optional[int] = None,
                 pad_token_id: Optional[int] = None) -> Tensor:
        """Extend ``input_ids (B, L)`` by ``max_new_tokens`` sampled tokens -> ``(B, L + max_new_tokens)``.

        ``temperature = 0`` decodes greedily; ``top_k``/``top_p`` restrict sampling (``sample_logits``).
        ``do_sample=False`` decodes greedily whatever the temperature, ``True`` samples (temperature
        > 0), None: as the temperature says. ``use_cache=True`` feeds one token at a time with the
        kernels' state (KV cache); ``use_cache=False`` re-reads the whole sequence each step — same
        tokens, slower. With learned positions a sequence longer than ``max_len`` is continued from
        its last ``max_len`` tokens, re-read each step (a sliding context, as in nanoGPT). Runs in
        the module's current mode: call ``model.eval()`` first to turn dropout off.

        A batch of prompts of different lengths: pad them on the left and give ``attention_mask (B,
        L)`` (bool or 0/1, True = real token); positions then count from each row's first real
        token, so that every row continues as its prompt alone would (a kernel with ``anchored``
        blocks refuses left padding). ``eos_token_id``: a row that drew it is finished — later
        columns hold ``pad_token_id`` (default ``eos_token_id``) — and generation stops early, with
        fewer columns, once every row is.
        """
        c = self.config
        temperature, pad = self._check_generate(input_ids, max_new_tokens, temperature, do_sample, eos_token_id,
                                                pad_token_id)
        window = c.max_len if c.positional == "learned" else None
        B, L = input_ids.shape
        mask = positions = None
        if attention_mask is not None:
            mask, positions = self._generation_mask(attention_mask, B, L, max_new_tokens)
        ids = input_ids.new_empty(B, L + max_new_tokens)  # filled in place: no per-token copy of the sequence
        ids[:, :L] = input_ids
        finished = torch.zeros(B, dtype=torch.bool, device=ids.device)
        state = None
        for n in range(L, L + max_new_tokens):
            logits, state = self._next_logits(ids[:, :n], state, mask, positions, window, use_cache)
            token = sample_logits(logits, temperature, top_k, top_p, generator).to(ids.dtype)  # (B,)
            if eos_token_id is not None:
                token = token.masked_fill(finished, pad)
                finished |= token == eos_token_id
            ids[:, n] = token
            if eos_token_id is not None and bool(finished.all()):
                return ids[:, :n + 1]
        return ids

    def _check_generate(self, input_ids: Tensor, max_new_tokens: int, temperature: float, do_sample: Optional[bool],
                        eos_token_id: Optional[int], pad_token_id: Optional[int]) -> Tuple[float, Optional[int]]:
        """``generate``'s checks of its arguments (the mask apart); returns the temperature (0 when
        ``do_sample=False``) and the token that fills finished rows."""
        c = self.config
        _checks.token_ids("input_ids", input_ids, c.vocab_size)
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids must hold at least one token (the prompt), got length 0")
        _checks.positive_int("max_new_tokens", max_new_tokens, allow_zero=True)
        if do_sample is not None and not isinstance(do_sample, bool):
            raise TypeError(f"do_sample must be a bool or None, got {do_sample!r}")
        if do_sample is False:
            temperature = 0.0
        elif do_sample and (isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature == 0):
            raise ValueError("do_sample=True needs temperature > 0 (temperature=0 is greedy decoding)")
        for name, token in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
            if token is not None and (isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < c.vocab_size):
                raise ValueError(f"{name} must be a token id in [0, {c.vocab_size}), got {token!r}")
        return temperature, eos_token_id if pad_token_id is None else pad_token_id

    def _generation_mask(self, attention_mask: Tensor, B: int, L: int, max_new_tokens: int) -> Tuple[Tensor, Tensor]:
        """The checked, left-padded prompt mask ``(B, L)`` extended over the new tokens ``(B, L + new)``,
        and each row's positions, counted from its first real token."""
        _checks.tensor("attention_mask", attention_mask, ndim=2)
        _checks.same("attention_mask", tuple(attention_mask.shape), "input_ids", (B, L), "the shape")
        attention_mask = bool_token_mask("attention_mask", attention_mask)
        if attention_mask.dtype != torch.bool:
            raise ValueError("attention_mask must be bool or hold 0/1 (1 = real token)")
        mask = attention_mask.new_ones(B, L + max_new_tokens, dtype=torch.bool)
        mask[:, :L] = attention_mask
        if not bool(mask[:, :L].any(-1).all()):
            raise ValueError("attention_mask: every row needs at least one real token (its prompt)")
        if not bool(mask[:, L - 1].all()):  # that row would be continued from its padding
            row = int((~mask[:, L - 1]).nonzero()[0])
            raise ValueError(f"attention_mask row {row} ends in padding (right padding): generate continues every "
                             f"row from its last column; pad prompts on the left (a tokenizer's padding_side='left')")
        self._check_left_padding(mask[:, :L])
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L + new): each row's own positions
        return mask, positions

    def _next_logits(self, seq: Tensor, state, mask: Optional[Tensor], positions: Optional[Tensor],
                     window: Optional[int], use_cache: bool) -> Tuple[Tensor, Any]:
        """The logits ``(B, vocab)`` after ``seq (B, n)``, the sequence so far, and the kernels' state
        to carry to the next token (None when the whole context is read again)."""
        n = seq.shape[1]
        # the last position's logits only, where forward can say so (a subclass's own forward may not)
        last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(self.forward).parameters else {}
        if window is not None and n > window:
            # past the learned positions: the context slides, its positions restart at 0, so re-read it
            kw = {} if mask is None else _window_inputs(mask[:, n - window:n])
            out, state = self(seq[:, -window:], **kw, **last), None
        elif use_cache:
            # after the prompt, one token drawn from vocab_size logits: in range, not read again
            step = seq if state is None else _checks.ids_in_range(seq[:, -1:], self.config.vocab_size)
            kw = {} if mask is None else {"attention_mask": mask[:, :n],
                                          "position_ids": positions[:, n - step.shape[1]:n]}
            out = self(step, state=state, return_state=True, **kw, **last)
            state = out.state
        else:
            kw = {} if mask is None else {"attention_mask": mask[:, :n], "position_ids": positions[:, :n]}
            out = self(seq, **kw, **last)
        return out.logits[:, -1], state

def _window_inputs(mask: Tensor) -> Dict[str, Tensor]:
    """The mask and positions of a sliding context's ``(B, window)`` columns: positions from each
    row's first real token in the window."""
    return {"attention_mask": mask, "position_ids": (mask.long().cumsum(-1) - 1).clamp(min=0)}


def last_real_position(attention_mask: Optional[Tensor], input_ids: Tensor) -> Tensor:
    """``(B,)`` the index of the last position whose ``attention_mask (B, L)`` is True (the last
    column without a mask): the token whose hidden state GPT classifies, under left or right
    padding alike. A row with no real token, or no position at all, is refused."""
    B, L = input_ids.shape
    if L == 0:
        raise ValueError("input_ids must hold at least one token to classify, got length 0")
    positions = torch.arange(L, device=input_ids.device).expand(B, L)  # (B, L)
    if attention_mask is None:
        return positions[:, -1]
    last = positions.masked_fill(~attention_mask, -1).amax(1)  # (B,)
    empty = last < 0
    if bool(empty.any()):
        raise ValueError(f"attention_mask row {int(empty.nonzero()[0])} has no real token (all False): nothing to classify")
    return last
