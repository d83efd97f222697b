"""qkv: the attention family on PyTorch — correct against its papers, interchangeable by name,
fast, and usable from the ``qkv`` command line."""

from __future__ import annotations

# every registry filled on `import qkv`: models, tasks and the parts they name are buildable by name at once
from . import functional, masks, models, positional, registry, scores, tasks
from . import hf  # noqa: F401  (registers the Hugging Face checkpoint format for QKVModel.from_pretrained)
from ._errors import UserError
from .attention import (
    AttentionKernel,
    HardAttention,
    LocalAttention,
    SoftAttention,
    MultiHeadAttention,
    build_attention,
    list_attention,
)
from .models import Llama, LlamaConfig
from .types import AttentionOutput, KVCache

__version__ = "0.1.0"

__all__ = [
    "AttentionOutput", "KVCache", "AttentionKernel", "MultiHeadAttention", "build_attention",
    "list_attention", "functional", "masks", "positional", "registry", "scores", "tasks", "SoftAttention",
    "HardAttention", "LocalAttention", "UserError", "Llama", "LlamaConfig",
]
