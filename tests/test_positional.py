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


def literal_sinusoids(positions, d):
    return torch.tensor([[(math.sin if f % 2 == 0 else math.cos)(p / 10000 ** ((f - f % 2) / d)) for f in range(d)]
                         for p in positions], dtype=torch.float64)


def test_float64_inputs_get_float64_tables():
    """Issue 20 item 1: a float64 input gets a float64 table (was float32: errors ~1e-7 that
    depend on the CPU's float32 sin), everything else a table at least as precise as float32."""
    positions, d = range(0, 600, 7), 16
    ref = literal_sinusoids(positions, d)
    table = sinusoid_table(torch.tensor(list(positions), dtype=torch.float64), d)
    assert table.dtype == torch.float64
    torch.testing.assert_close(table, ref, rtol=0, atol=1e-12)
    assert sinusoid_table(torch.tensor(list(positions)), d).dtype == torch.float32
    pe = SinusoidalPositionalEncoding(d, max_len=64).double()
    x = torch.zeros(1, len(positions) * 7, d, dtype=torch.float64)
    torch.testing.assert_close(pe(x)[0, ::7], ref, rtol=0, atol=1e-12)  # cached rows and rows beyond them
    half = SinusoidalPositionalEncoding(d, max_len=64)(torch.zeros(1, 100, d, dtype=torch.bfloat16))
    torch.testing.assert_close(half[0].double(), literal_sinusoids(range(100), d).bfloat16().double(), rtol=0, atol=0)
