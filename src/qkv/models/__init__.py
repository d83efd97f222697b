"""qkv's models: one module per system of the literature, built from the shared parts.

Each model module is imported here explicitly so that ``import qkv`` registers it.
"""

from __future__ import annotations

from .base import ModelOutput, QKVModel, load_pretrained
from .bert import BERT, BERTConfig
from .gpt import GPT, GPTConfig
from .graph_attention import GATConfig, GraphAttention
from .han import FlatGRU, FlatGRUConfig, HANConfig, HierarchicalAttentionNetwork
from .lstmn import LSTMN, LSTMNConfig
from .memnet import EndToEndMemoryNetwork, MemoryNetworkConfig
from .nadaraya_watson import NadarayaWatson, NadarayaWatsonConfig
from .ntm import LSTMBaseline, LSTMBaselineConfig, NeuralTuringMachine, NTMConfig
from .pointer import PointerNetwork, PointerNetworkConfig
from .pooling import AttentionMIL, AttentionMILConfig, DeepSets, DeepSetsConfig
from .seq2seq import Seq2Seq, Seq2SeqConfig
from .show_attend_tell import ShowAttendTell, ShowAttendTellConfig
from .squeeze_excitation import SECNN, SECNNConfig, SqueezeExcitation
from .stacked_attention import StackedAttention, StackedAttentionConfig
from .stack import StackConfig, TransformerStack
from .transformer import Transformer, TransformerConfig

__all__ = [
    "ModelOutput", "QKVModel", "load_pretrained", "StackConfig", "TransformerStack",
    "Transformer", "TransformerConfig", "GPT", "GPTConfig", "BERT", "BERTConfig", "Seq2Seq",
    "Seq2SeqConfig", "ShowAttendTell", "ShowAttendTellConfig", "PointerNetwork", "PointerNetworkConfig",
    "LSTMN", "LSTMNConfig", "NadarayaWatson", "NadarayaWatsonConfig", "DeepSets", "DeepSetsConfig",
    "AttentionMIL", "AttentionMILConfig", "HierarchicalAttentionNetwork", "HANConfig", "FlatGRU",
    "FlatGRUConfig", "EndToEndMemoryNetwork", "MemoryNetworkConfig", "StackedAttention",
    "StackedAttentionConfig", "NeuralTuringMachine", "NTMConfig", "LSTMBaseline", "LSTMBaselineConfig",
    "SqueezeExcitation", "SECNN", "SECNNConfig", "GraphAttention", "GATConfig",
]
