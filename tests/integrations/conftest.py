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


def _ids(B: int, T: int, seed: int = 0):
    import torch

    return torch.randint(3, 50, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def patch_keeps_the_model():
    """``check(model, patch, atol)``: a transformers causal LM whose linear-attention layers qkv's
    functions serve (``patch()`` puts them in place) gives the logits it gave before — unpadded and
    left-padded over two chunks of 64 — and, through ``generate`` with its cache, the same greedy
    tokens and per-step logits (one-token steps: the recurrent function with the cached state). The
    model must have a vocabulary of at least 50 and id 0 as its padding."""
    import torch

    def logits(model, ids, mask=None):
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).logits

    def check(model, patch, atol: float) -> None:
        ids, mask = _ids(2, 70), torch.ones(2, 70, dtype=torch.long)  # two chunks of 64: the scan over chunks runs
        mask[1, :9] = 0  # left padding
        expected, expected_padded = logits(model, ids), logits(model, ids, mask)
        short, short_mask = _ids(2, 12, seed=1), torch.ones(2, 12, dtype=torch.long)
        short_mask[0, :3] = 0
        kw = dict(attention_mask=short_mask, max_new_tokens=8, do_sample=False, pad_token_id=0, output_logits=True,
                  return_dict_in_generate=True)
        with torch.no_grad():
            generated = model.generate(short, **kw)
        patch()
        torch.testing.assert_close(logits(model, ids), expected, atol=atol, rtol=0)
        real = mask.bool()
        torch.testing.assert_close(logits(model, ids, mask)[real], expected_padded[real], atol=atol, rtol=0)
        with torch.no_grad():
            got = model.generate(short, **kw)
        assert torch.equal(got.sequences, generated.sequences) and got.sequences.shape[1] == 20
        torch.testing.assert_close(torch.stack(got.logits), torch.stack(generated.logits), atol=atol, rtol=0)

    return check
