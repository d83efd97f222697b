"""``repro_sparse_image.py`` part 1 (issue 38): the `fixed` Sparse Transformer against dense GPT,
the data's unigram and bigram levels beside them, and a ``--quick`` run that publishes nothing."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "docs" / "reproductions" / "claims.json"


class _Stream:
    def __init__(self, train, valid):
        self.splits = {"train": torch.tensor(train), "valid": torch.tensor(valid)}

    def split_tokens(self, split):
        return self.splits[split]


def test_ngram_levels_are_the_add_one_cross_entropies(benchmark_script):
    script = benchmark_script("repro_sparse_image")
    n = 50
    task = _Stream([0, 1] * n, [0, 1] * 7)
    # unigram: counts 0 -> n + 1, 1 -> n + 1, the other 254 bytes 1, over 2n + 256
    assert script.ngram_bits(task, 1) == pytest.approx(-math.log2((n + 1) / (2 * n + 256)))
    # bigram: 0 -> 1 seen n times, 1 -> 0 n - 1 times (plus one each, over 256 more)
    p01, p10 = (n + 1) / (n + 256), n / (n - 1 + 256)
    expected = -(7 * math.log2(p01) + 6 * math.log2(p10)) / 13
    assert script.ngram_bits(task, 2) == pytest.approx(expected)
    assert script.ngram_bits(task, 2) < script.ngram_bits(task, 1)
    # n_bytes: only the first n labels of the split (here valid[1] = 1, after valid[0] = 0)
    assert script.ngram_bits(task, 1, 1) == pytest.approx(-math.log2((n + 1) / (2 * n + 256)))
    assert script.ngram_bits(task, 2, 1) == pytest.approx(-math.log2(p01))
    with pytest.raises(ValueError, match="order"):
        script.ngram_bits(task, 3)


def test_the_sparse_arm_is_fixed_with_a_quarter_of_the_stride_as_summaries(benchmark_script):
    script = benchmark_script("repro_sparse_image")
    models = script.lm_models(256, 16)
    (sparse_name, sparse), (dense_name, dense) = models.items()
    assert sparse_name == "sparse-transformer (fixed, interleaved)" and dense_name == "gpt (dense softmax)"
    assert sparse.config.attention == "fixed" and sparse.config.stride == 16 and sparse.config.c == 4
    assert sum(p.numel() for p in sparse.parameters()) == sum(p.numel() for p in dense.parameters())
    strided = next(iter(script.lm_models(256, 16, attention="strided").values()))
    assert strided.config.attention == "strided"


def test_lm_seeds_quick_prints_the_levels_and_publishes_nothing(benchmark_script, byte_data, capsys):
    script = benchmark_script("repro_sparse_image")
    page, claims_before = script.DOC.read_text(), CLAIMS.read_text()
    args = argparse.Namespace(quick=True, seeds=1, context=64, stride=8, lm_batch=1, lm_lr=2e-3, lm_warmup=2,
                              lm_seconds=0.3, eval_windows=1, lm_budgets=[0.4])
    script.lm_seeds(args)
    out = capsys.readouterr().out
    assert "bits/byte of the byte unigram" in out and "**unigram " in out and "on the 64 validation bytes" in out
    assert "| sparse-transformer (fixed, interleaved) | 0.3 | " in out and "| gpt (dense softmax) | 0.4 | " in out
    assert script.DOC.read_text() == page and CLAIMS.read_text() == claims_before
