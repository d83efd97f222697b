"""The position-wise feed-forward network (Vaswani et al. 2017, eq. 2), whole and in chunks."""

import pytest
import torch

from qkv.blocks import FeedForward


def test_feed_forward_is_the_paper_equation():
    torch.manual_seed(0)
    ff = FeedForward(6, 10)
    x = torch.randn(2, 5, 6)
    # FFN(x) = max(0, x W1 + b1) W2 + b2
    literal = torch.clamp(x @ ff.w1.weight.T + ff.w1.bias, min=0) @ ff.w2.weight.T + ff.w2.bias
    torch.testing.assert_close(ff(x), literal)
    chunked = FeedForward(6, 10, chunk_size=2)
    chunked.load_state_dict(ff.state_dict())
    torch.testing.assert_close(chunked(x), literal)
    with pytest.raises(ValueError, match="activation"):
        FeedForward(6, 10, "swish")
