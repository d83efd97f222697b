"""Positional encodings against the paper's formula."""

import math

import pytest
import torch

from qkv.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, sinusoid_table


def test_sinusoid_formula():
    d = 6
    table = sinusoid_table(torch.arange(5), d)
    for pos in range(5):
        for i in range(d // 2):
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / d)), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / d)), abs=1e-6)


def test_sinusoidal_offset_and_beyond_table():
    pe = SinusoidalPositionalEncoding(8, max_len=16)
    x = torch.zeros(1, 20, 8)
    full = pe(x)
    torch.testing.assert_close(pe(x[:, 12:], offset=12), full[:, 12:])
    with pytest.raises(ValueError, match="feature size"):
        pe(torch.zeros(1, 3, 4))


def test_learned_embedding_bounds():
    pe = LearnedPositionalEmbedding(4, max_len=8)
    assert pe(torch.zeros(2, 8, 4)).shape == (2, 8, 4)
    with pytest.raises(ValueError, match="max_len"):
        pe(torch.zeros(1, 5, 4), offset=4)
