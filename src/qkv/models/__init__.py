"""qkv's models: one module per system of the literature, built from the shared parts, grouped by
family: ``rnn/``, ``pooling/``, ``memory/`` and ``transformer/`` (the shared stack and its presets).

Each model module is imported here explicitly so that ``import qkv`` registers it.
"""

from __future__ import annotations

from .base import ModelOutput, QKVModel, load_pretrained
from .transformer.bert import BERT, BERTConfig
from .transformer.gpt import GPT, GPTConfig
from .transformer.al_rfou import AlRfouConfig, AlRfouLM
from .transformer.llama import Llama, LlamaConfig
from .pooling.graph_attention import GATConfig, GraphAttention
from .pooling.han import FlatGRU, FlatGRUConfig, HANConfig, HierarchicalAttentionNetwork
from .rnn.lstmn import LSTMN, LSTMNConfig
from .memory.memnet import EndToEndMemoryNetwork, MemoryNetworkConfig
from .pooling.nadaraya_watson import NadarayaWatson, NadarayaWatsonConfig
from .memory.ntm import LSTMBaseline, LSTMBaselineConfig, NeuralTuringMachine, NTMConfig
from .rnn.pointer import PointerNetwork, PointerNetworkConfig
from .pooling.sets import AttentionMIL, AttentionMILConfig, DeepSets, DeepSetsConfig
from .rnn.seq2seq import Seq2Seq, Seq2SeqConfig
from .rnn.show_attend_tell import ShowAttendTell, ShowAttendTellConfig
from .pooling.squeeze_excitation import SECNN, SECNNConfig, SqueezeExcitation
from .memory.stacked_attention import StackedAttention, StackedAttentionConfig
from .transformer.stack import StackConfig, TransformerStack
from .transformer.transformer import Transformer, TransformerConfig
from .transformer.linformer import Linformer, LinformerConfig
from .transformer.linear_transformer import LinearTransformer, LinearTransformerConfig
from .transformer.gated_linear import GLA, DeltaNet, DeltaNetConfig, GLAConfig
from .transformer.performer import Performer, PerformerConfig, PerformerEncoder, PerformerEncoderConfig
from .transformer.quaternion import (QuaternionEncoder, QuaternionEncoderConfig, QuaternionTransformer,
                                     QuaternionTransformerConfig)
from .transformer.transformer_xl import GTrXL, GTrXLConfig, TransformerXL, TransformerXLConfig, XLMemory
from .transformer.adaptive_span import AdaptiveSpanTransformer, AdaptiveSpanTransformerConfig
from .transformer.universal_transformer import (UniversalTransformer, UniversalTransformerConfig,
                                                UniversalTransformerLM, UniversalTransformerLMConfig)
from .transformer.image_transformer import ImageTransformer, ImageTransformerConfig
from .transformer.sparse_transformer import SparseTransformer, SparseTransformerConfig
from .transformer.reformer import Reformer, ReformerConfig
from .transformer.lra import LRADualEncoder, LRADualEncoderConfig, LRAEncoder, LRAEncoderConfig

__all__ = [
    "ModelOutput", "QKVModel", "load_pretrained", "StackConfig", "TransformerStack",
    "Transformer", "TransformerConfig", "GPT", "GPTConfig", "Llama", "LlamaConfig", "AlRfouLM", "AlRfouConfig", "BERT", "BERTConfig", "Seq2Seq",
    "Seq2SeqConfig", "ShowAttendTell", "ShowAttendTellConfig", "PointerNetwork", "PointerNetworkConfig",
    "LSTMN", "LSTMNConfig", "NadarayaWatson", "NadarayaWatsonConfig", "DeepSets", "DeepSetsConfig",
    "AttentionMIL", "AttentionMILConfig", "HierarchicalAttentionNetwork", "HANConfig", "FlatGRU",
    "FlatGRUConfig", "EndToEndMemoryNetwork", "MemoryNetworkConfig", "StackedAttention",
    "StackedAttentionConfig", "NeuralTuringMachine", "NTMConfig", "LSTMBaseline", "LSTMBaselineConfig",
    "SqueezeExcitation", "SECNN", "SECNNConfig", "GraphAttention", "GATConfig",
    "TransformerXL", "TransformerXLConfig", "XLMemory", "GTrXL", "GTrXLConfig",
    "AdaptiveSpanTransformer", "AdaptiveSpanTransformerConfig",
    "UniversalTransformer", "UniversalTransformerConfig", "UniversalTransformerLM", "UniversalTransformerLMConfig",
    "ImageTransformer", "ImageTransformerConfig", "SparseTransformer", "SparseTransformerConfig",
    "Linformer", "LinformerConfig", "LinearTransformer", "LinearTransformerConfig", "Performer", "PerformerConfig",
    "GLA", "GLAConfig", "DeltaNet", "DeltaNetConfig",
    "PerformerEncoder", "PerformerEncoderConfig", "QuaternionTransformer", "QuaternionTransformerConfig",
    "QuaternionEncoder", "QuaternionEncoderConfig",
    "Reformer", "ReformerConfig", "LRAEncoder", "LRAEncoderConfig", "LRADualEncoder", "LRADualEncoderConfig",
]
