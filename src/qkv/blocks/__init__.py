"""Transformer building blocks around the attention module, one module per paper:

- ``feedforward``: the position-wise feed-forward network (Vaswani et al. 2017, eq. 2);
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
from .feedforward import ACTIVATIONS, FeedForward
from .gated import OutputGate, ShortConv
from .quaternion import LINEAR_LAYERS, QuaternionLinear
from .residual import GatedResidual, GRUGate, InputGate, PostLN, PreLN, ReLUSum, ResidualWiring, build_residual
from .reversible import ReversibleBlock, ReversibleSequence, reversible

__all__ = ["FeedForward", "ResidualWiring", "PostLN", "PreLN", "build_residual", "ACTIVATIONS",
           "GatedResidual", "GRUGate", "InputGate", "ReLUSum", "QuaternionLinear", "LINEAR_LAYERS",
           "AdaptiveComputationTime", "ACTOutput", "ReversibleBlock", "ReversibleSequence", "reversible",
           "ShortConv", "OutputGate"]
