"""The Transformer encoder-decoder: it learns to reverse, beam 1 equals greedy, and the shared
stack matches ``torch.nn.Transformer`` given the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.models.stack import TransformerStack
from qkv.models.transformer import Transformer, TransformerConfig

PAD, BOS, EOS, FIRST = 0, 1, 2, 3  # token ids of the reverse task: 3 .. 12 are symbols


def reverse_batch(batch_size: int, generator: torch.Generator, n_symbols: int = 10, lengths=(5, 8)):
    """Random symbol strings and their reversals as a seq2seq batch (docs/contracts.md)."""
    L = torch.randint(lengths[0], lengths[1] + 1, (batch_size,), generator=generator)
    S = int(L.max())
    src = torch.randint(FIRST, FIRST + n_symbols, (batch_size, S), generator=generator)
    src_mask = torch.arange(S)[None] < L[:, None]  # (B, S)
    src = src.masked_fill(~src_mask, PAD)
    tgt = torch.full((batch_size, S + 1), PAD)
    labels = torch.full((batch_size, S + 1), -100)
    for b in range(batch_size):
        rev = src[b, :L[b]].flip(0)
        tgt[b, 0] = BOS
        tgt[b, 1:L[b] + 1] = rev
        labels[b, :L[b]] = rev
        labels[b, L[b]] = EOS
    return dict(src_ids=src, src_mask=src_mask, tgt_ids=tgt, labels=labels)


def tiny_config(**overrides) -> TransformerConfig:
    values = dict(vocab_size=13, n_layers=2, d_model=64, n_heads=4, d_ff=128, dropout=0.0, max_len=32,
                  label_smoothing=0.0, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    values.update(overrides)
    return TransformerConfig(**values)


@pytest.mark.slow
def test_learns_reverse():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = Transformer(tiny_config())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    for step in range(300):
        out = model(**reverse_batch(64, g))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    model.eval()
    test = reverse_batch(500, torch.Generator().manual_seed(1))
    pred = model.generate(test["src_ids"], test["src_mask"], max_new_tokens=10)
    target = test["labels"].clamp_min(PAD)
    width = target.shape[1]
    pred = torch.nn.functional.pad(pred, (0, max(0, width - pred.shape[1])), value=PAD)[:, :width]
    exact = (pred == target).all(1).float().mean().item()
    print(f"loss {out.loss.item():.4f} exact {exact:.4f}")
    assert exact > 0.99
