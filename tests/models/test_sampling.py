"""qkv.models.sampling: greedy, top-k and nucleus (top-p) draws of the next token."""

import pytest
import torch

from qkv.models.sampling import sample_logits


def test_sampling_filters():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(2000, 1)
    g = torch.Generator().manual_seed(0)
    assert set(sample_logits(logits, top_k=2, generator=g).unique().tolist()) == {0, 1}
    p = logits[0].softmax(-1)  # 0.64, 0.23, 0.09, ...: top_p = 0.8 keeps the first two
    assert p[0] < 0.8 <= p[:2].sum()
    assert set(sample_logits(logits, top_p=0.8, generator=g).unique().tolist()) == {0, 1}
    assert torch.equal(sample_logits(logits, temperature=0), torch.zeros(2000, dtype=torch.long))
    with pytest.raises(ValueError, match="top_p"):
        sample_logits(logits, top_p=0.0)
