"""Transformer building blocks around the attention module, one module per paper:

- ``feedforward``: the position-wise feed-forward network (Vaswani et al. 2017, eq. 2) and its
  gated variants SwiGLU, GeGLU (Shazeer 2020);
- ``norms``: LayerNorm and RMSNorm (Zhang & Sennrich 2019) by name;
- ``residual``: residual wirings — post-LN, pre-LN (Vaswani et al. 2017; Xiong et al. 2020) and
  GTrXL's gates (Parisotto et al. 2019), registered by name;
- ``quaternion``: the quaternion linear layer (Parcollet et al. 2019; Tay et al. 2019);
- ``act``: Adaptive Computation Time (Graves 2016), the Universal Transformer's depth;
- ``reversible``: reversible residual layers (Gomez et al. 2017), the Reformer's;
- ``gated``: the short causal convolution and the output gate of gated linear-attention layers
  (GLA, DeltaNet; Yang et al. 2023, 2024).

Everything is importable from ``qkv.blocks`` itself (``qkv.blocks.GRUGate``).
"""

from .act import ACTOutput, AdaptiveComputationTime
from .feedforward import ACTIVATIONS, FeedForward, GatedFeedForward, build_feedforward
from .norms import NORMS, RMSNorm, build_norm
from .gated import OutputGate, ShortConv
from .quaternion import LINEAR_LAYERS, QuaternionLinear
from .residual import GatedResidual, GRUGate, InputGate, PostLN, PreLN, ReLUSum, ResidualWiring, build_residual
from .reversible import ReversibleBlock, ReversibleSequence, reversible

__all__ = ["FeedForward", "GatedFeedForward", "build_feedforward", "RMSNorm", "NORMS", "build_norm", "ResidualWiring", "PostLN", "PreLN", "build_residual", "ACTIVATIONS",
           "GatedResidual", "GRUGate", "InputGate", "ReLUSum", "QuaternionLinear", "LINEAR_LAYERS",
           "AdaptiveComputationTime", "ACTOutput", "ReversibleBlock", "ReversibleSequence", "reversible",
           "ShortConv", "OutputGate"]
