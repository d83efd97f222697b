"""The training speed is said in the unit the task trains on: examples/s for a classifier (one
label per example, BERT on bbc-news), tokens/s for a language model."""

import torch

from qkv.train.trainer import _count_tokens, _postfix


def test_a_classifier_counts_examples_and_a_language_model_tokens():
    assert _count_tokens({"input_ids": torch.zeros(4, 64, dtype=torch.long), "labels": torch.arange(4)}) == (4, "examples")
    lm = torch.tensor([[1, 2, -100], [3, -100, -100]])
    assert _count_tokens({"input_ids": lm, "labels": lm}) == (3, "tokens")
    assert _count_tokens({"images": torch.zeros(2, 3)}) == (6, "tokens")


def test_the_bar_names_the_unit():
    assert "ex/s" in _postfix({"loss": 1.0, "examples_per_s": 12.0}, {}) and "tok/s" not in _postfix(
        {"loss": 1.0, "examples_per_s": 12.0}, {})
    assert _postfix({"loss": 1.0, "tokens_per_s": 12.0}, {})["tok/s"] == "12"
