"""qkv's models: one module per system of the literature, built from the shared parts.

Each model module is imported here explicitly so that ``import qkv`` registers it.
"""

from __future__ import annotations

from .base import ModelOutput, QKVModel, load_pretrained
from .bert import BERT, BERTConfig
from .gpt import GPT, GPTConfig
from .lstmn import LSTMN, LSTMNConfig
from .pointer import PointerNetwork, PointerNetworkConfig
from .seq2seq import Seq2Seq, Seq2SeqConfig
from .show_attend_tell import ShowAttendTell, ShowAttendTellConfig
from .stack import StackConfig, TransformerStack
from .transformer import Transformer, TransformerConfig

__all__ = [
    "ModelOutput", "QKVModel", "load_pretrained", "StackConfig", "TransformerStack",
    "Transformer", "TransformerConfig", "GPT", "GPTConfig", "BERT", "BERTConfig", "Seq2Seq",
    "Seq2SeqConfig", "ShowAttendTell", "ShowAttendTellConfig", "PointerNetwork", "PointerNetworkConfig",
    "LSTMN", "LSTMNConfig",
]
