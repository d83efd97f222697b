"""Gated linear-attention language models on the shared stack: GLA and DeltaNet.

- ``gla`` — Gated Linear Attention Transformer (Yang et al. 2023, "Gated Linear Attention
  Transformers with Hardware-Efficient Training", arXiv:2312.06635, §4.4): the ``gla`` kernel,
  ``S_t = S_{t-1} Diag(alpha_t) + v_t k_t^T`` with a data-dependent decay per key channel, and the
  output gate ``o'_t = SiLU(x_t W_r) ⊙ Norm(o_t)`` (eq. 6; the per-head norm is the kernel's).
- ``deltanet`` — DeltaNet (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule
  over Sequence Length", arXiv:2406.06484, §3.3): the ``deltanet`` kernel,
  ``S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T`` with L2-normalised queries and keys, a short
  causal convolution (4 positions, + SiLU) on q, k and v, and the same output norm and gate.

Both are GPT's decoder-only LM (pre-LN, tied embeddings) with these ``StackConfig`` knobs set —
``short_conv``, ``output_gate`` (``qkv.blocks.ShortConv``, ``qkv.blocks.OutputGate``, the stack's
``GatedSelfAttention``) — and no positional encoding (``positional="none"``): the recurrence and
the convolution see order, as in both papers. ``hybrid_every=k`` makes every k-th layer softmax
attention (Jamba, Qwen3-Next's 3 Gated DeltaNet layers to 1 of attention); ``attention=
"gated-deltanet"`` gives Gated DeltaNet (Yang et al. 2024, arXiv:2412.06464) on the same model.

Generation runs as an RNN: each layer keeps the kernel's ``RecurrentState(S)`` (fixed size
``(B, H, E, E)``) and the convolution's last 3 inputs, so every new token costs the same whatever
the context. The feed-forward network is the stack's (GELU), not the papers' SwiGLU.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...registry import register
from .gpt import GPT, GPTConfig

__all__ = ["GLA", "GLAConfig", "DeltaNet", "DeltaNetConfig"]

#: the CPU preset both share: trains on shakespeare-char in a couple of minutes on 2 cores
_CPU = {"n_layers": 2, "d_model": 128, "n_heads": 4, "d_ff": 512, "dropout": 0.0,
        "train": {"steps": 300, "batch_size": 32, "lr": 3e-3, "warmup": 30}}


@dataclass
class GLAConfig(GPTConfig):
    """A CPU-sized GLA Transformer LM."""

    vocab_size: int = 256  # token vocabulary (the task's when trained from the CLI)
    max_len: int = 256  # training context (generation is not limited by it: no positions)
    n_layers: int = 4  # blocks
    d_model: int = 256  # width
    n_heads: int = 4  # heads (the paper: 4)
    d_ff: int = 1024  # feed-forward width
    positional: str = "none"  # the recurrence sees order
    attention: str = "gla"  # S_t = S_{t-1} Diag(alpha_t) + v_t k_t^T
    output_gate: bool = True  # SiLU(x W_r) ⊙ Norm(o)


@register("model", "gla")
class GLA(GPT):
    """Gated Linear Attention Transformer LM: data-dependent channel decays and an output gate (Yang et al. 2023).

    ``forward``/``generate`` as ``GPT``; generation carries each layer's fixed-size ``RecurrentState``.
    """

    config_class = GLAConfig
    task_kinds = frozenset({"lm"})  # GPT's classification head is untried here
    suggested_tasks = ("shakespeare-char", "mqar")
    # "paper": the 340M model of Table 2 (24 layers, width 1024, 4 heads; GELU feed-forward here); "cpu": minutes on 2 cores
    presets = {"paper": {"n_layers": 24, "d_model": 1024, "n_heads": 4, "d_ff": 4096, "max_len": 2048}, "cpu": _CPU}
    default_preset = "cpu"


@dataclass
class DeltaNetConfig(GPTConfig):
    """A CPU-sized DeltaNet LM."""

    vocab_size: int = 256  # token vocabulary (the task's when trained from the CLI)
    max_len: int = 256  # training context (generation is not limited by it: no positions)
    n_layers: int = 4  # blocks
    d_model: int = 256  # width
    n_heads: int = 4  # heads
    d_ff: int = 1024  # feed-forward width
    positional: str = "none"  # the recurrence and the short convolution see order
    attention: str = "deltanet"  # S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T, L2-normalised q, k
    short_conv: int = 4  # causal depthwise convolution (+ SiLU) of 4 positions on q, k, v
    output_gate: bool = True  # SiLU(x W_r) ⊙ Norm(o)


@register("model", "deltanet")
class DeltaNet(GPT):
    """DeltaNet LM: the delta rule with a short convolution on q, k, v and an output gate (Yang et al. 2024).

    ``forward``/``generate`` as ``GPT``; generation carries each layer's ``RecurrentState`` and the
    convolution's last inputs (``GatedSelfAttentionState``).
    """

    config_class = DeltaNetConfig
    task_kinds = frozenset({"lm"})  # GPT's classification head is untried here
    suggested_tasks = ("shakespeare-char", "mqar")
    # "paper": the 340M model (24 layers, width 1024, 8 heads; GELU feed-forward here); "cpu": minutes on 2 cores
    presets = {"paper": {"n_layers": 24, "d_model": 1024, "n_heads": 8, "d_ff": 4096, "max_len": 2048}, "cpu": _CPU}
    default_preset = "cpu"
