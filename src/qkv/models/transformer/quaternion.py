"""The Quaternion Transformer (Tay et al. 2019, "Lightweight and Efficient Neural Natural
Language Processing with Quaternion Networks", arXiv:1906.04393): every attention projection
(``W^Q, W^K, W^V, W^O``) and both feed-forward layers are quaternion linear layers
(``qkv.blocks.QuaternionLinear``, Parcollet et al. 2019):

    W (x) Q = [[W_r, -W_x, -W_y, -W_z], [W_x, W_r, -W_z, W_y], [W_y, W_z, W_r, -W_x], [W_z, -W_y, W_x, W_r]] [r; x; y; z]

— a quarter of the weights of those layers ("75% fewer parameters"). Embeddings, LayerNorms and
the output heads stay real-valued, as in the paper. Two presets of the shared stack with
``linear="quaternion"``: ``QuaternionTransformer`` (encoder–decoder, the Transformer's) and
``QuaternionEncoder`` (encoder classifier, BERT's heads). ``d_model`` and ``d_ff`` must be
multiples of 4.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ...blocks import QuaternionLinear
from ...registry import register
from .bert import BERT, BERTConfig
from .transformer import Transformer, TransformerConfig

__all__ = ["QuaternionTransformer", "QuaternionTransformerConfig", "QuaternionEncoder", "QuaternionEncoderConfig"]


def reset_quaternion_layers(model: nn.Module) -> None:
    """Parcollet et al.'s quaternion initialisation for every ``QuaternionLinear`` of ``model``
    (after a model-wide initialisation, e.g. the Transformer's Xavier, has overwritten it)."""
    for m in model.modules():
        if isinstance(m, QuaternionLinear):
            m.reset_parameters()


@dataclass
class QuaternionTransformerConfig(TransformerConfig):
    """A CPU-sized Quaternion Transformer encoder–decoder."""

    vocab_size: int = 8000  # source (and shared target) vocabulary (the task's when trained from the CLI)
    n_layers: int = 3  # encoder (and decoder) blocks
    d_model: int = 256  # width (a multiple of 4)
    n_heads: int = 4  # heads
    d_ff: int = 1024  # feed-forward width (a multiple of 4)
    linear: str = "quaternion"  # attention projections and feed-forward: QuaternionLinear


@register("model", "quaternion-transformer")
class QuaternionTransformer(Transformer):
    """Quaternion Transformer encoder-decoder: Hamilton-product projections and FFN, 1/4 of their weights (Tay et al. 2019)."""

    config_class = QuaternionTransformerConfig

    def __init__(self, config: QuaternionTransformerConfig) -> None:
        super().__init__(config)
        reset_quaternion_layers(self)


@dataclass
class QuaternionEncoderConfig(BERTConfig):
    """A CPU-sized Quaternion Transformer encoder classifier."""

    vocab_size: int = 30522  # token vocabulary (the task's when trained from the CLI)
    n_layers: int = 4  # blocks
    d_model: int = 256  # width (a multiple of 4)
    n_heads: int = 4  # heads
    d_ff: int = 1024  # feed-forward width (a multiple of 4)
    linear: str = "quaternion"  # attention projections and feed-forward: QuaternionLinear
    head: str = "classification"  # "classification" | "pretraining" (MLM + NSP)


@register("model", "quaternion-encoder")
class QuaternionEncoder(BERT):
    """Quaternion Transformer encoder classifier: BERT's heads on Hamilton-product layers (Tay et al. 2019)."""

    config_class = QuaternionEncoderConfig
    train_defaults = {"steps": 300, "batch_size": 16, "lr": 5e-4, "warmup": 30}
