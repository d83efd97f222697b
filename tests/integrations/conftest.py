"""Fixtures for the Hugging Face integration tests: a tiny BERT WordPiece tokenizer built offline."""

from __future__ import annotations

from pathlib import Path

import pytest

WORDS = ["the", "bbc", "news", "market", "shares", "rose", "film", "star", "won", "award", "match", "goal",
         "minister", "vote", "phone", "net", "##s", "##ing", "."]


def write_wordpiece(directory: Path, words=WORDS) -> Path:
    """A BERT-style uncased WordPiece ``tokenizer.json`` (specials first, as in BERT's vocab.txt)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, normalizers, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.enable_padding(length=16)  # as a real tokenizer.json may carry: CheckpointTokenizer turns it off
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture
def wordpiece_dir(tmp_path) -> Path:
    return write_wordpiece(tmp_path / "tok")


@pytest.fixture
def bert_checkpoint(wordpiece_dir):
    """A tiny BertModel checkpoint beside its WordPiece tokenizer.json (as all-MiniLM-L6-v2's directory is)."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=24, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(wordpiece_dir)
    return wordpiece_dir
