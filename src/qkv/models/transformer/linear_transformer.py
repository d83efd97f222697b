"""The Linear Transformer (Katharopoulos et al. 2020, "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention", arXiv:2006.16236): GPT's decoder-only LM with the
``linear`` kernel, ``phi(x) = elu(x) + 1``.

    V'_i = phi(Q_i)^T S_i / (phi(Q_i)^T Z_i),   S_i = sum_{j<=i} phi(K_j) V_j^T,   Z_i = sum_{j<=i} phi(K_j)

Training runs the causal form in parallel (chunks, O(N)); generation runs it as an RNN (§3.4,
eq. 16–20): each layer keeps ``LinearState(S, Z)`` of fixed size ``(B, H, E, E)`` and
``(B, H, E)``, updated ``s_i = s_{i-1} + phi(k_i) v_i^T``, ``z_i = z_{i-1} + phi(k_i)`` — O(1) time
and memory per token whatever the context. GPT's ``generate`` with the stack's state is exactly
this recurrence.

Positions: the sinusoids of Vaswani et al. (``positional="sinusoidal"``), as the authors' own
experiments use (their image-generation code concatenates the sinusoids to the pixel embeddings;
here they are added, with the tokens scaled by ``sqrt(d_model)`` as the shared stack does for every
fixed signal). A fixed function of the position, they set no context limit: generation as an RNN
runs past ``max_len`` and never re-reads the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...registry import register
from .gpt import GPT, GPTConfig

__all__ = ["LinearTransformer", "LinearTransformerConfig"]


@dataclass
class LinearTransformerConfig(GPTConfig):
    """A CPU-sized Linear Transformer LM."""

    vocab_size: int = 256  # token vocabulary (the task's when trained from the CLI)
    max_len: int = 256  # training context (sinusoids cached; generation is not limited by it)
    n_layers: int = 4  # blocks
    d_model: int = 256  # width
    n_heads: int = 4  # heads
    d_ff: int = 1024  # feed-forward width
    positional: str = "sinusoidal"  # the authors' fixed sinusoids: no length limit, generation never re-reads the context
    attention: str = "linear"  # causal linear attention, phi = elu + 1


@register("model", "linear-transformer")
class LinearTransformer(GPT):
    """Linear Transformer LM with elu+1 linear attention that generates as an RNN (Katharopoulos et al. 2020).

    ``forward`` as ``GPT``; ``generate`` feeds one token at a time with one ``LinearState`` per layer
    (fixed size), so each new token costs the same time and memory whatever the context length.
    """

    config_class = LinearTransformerConfig
    task_kinds = frozenset({"lm"})  # GPT's classification head is untried with linear attention
    train_defaults = {"steps": 500, "batch_size": 16, "lr": 1e-3, "warmup": 50}
