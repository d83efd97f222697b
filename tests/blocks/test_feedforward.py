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


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu-tanh"])
def test_inference_path_equals_the_module_calls(activation):
    """Without gradients a plain FFN takes ``qkv._linear.linear`` with the activation fused (oneDNN
    on the CPU where available, >= MIN_ROWS rows); it equals the modules' own calls, a forward hook
    on W1 is still honoured (the module call is kept), and gradients still reach W1 and W2."""
    from qkv.blocks.feedforward import ACTIVATIONS

    torch.manual_seed(0)
    ff = FeedForward(16, 48, activation)
    x = torch.randn(3, 20, 16)  # 60 rows
    literal = ff.w2(ACTIVATIONS[activation](ff.w1(x)))
    with torch.no_grad():
        torch.testing.assert_close(ff(x), literal, rtol=1e-5, atol=1e-5)
    seen = []
    handle = ff.w1.register_forward_hook(lambda m, a, out: seen.append(out.shape))
    with torch.no_grad():
        ff(x)
    handle.remove()
    assert seen == [torch.Size([3, 20, 48])]
    ff(x).sum().backward()
    assert ff.w1.weight.grad is not None and ff.w2.weight.grad.abs().sum() > 0
