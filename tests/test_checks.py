"""qkv._checks: the one token-id check every model uses (the RNN and the Transformer models once
had two that disagreed on dtypes)."""

import pytest
import torch

from qkv import _checks
from qkv.models import GPT, GPTConfig, Seq2Seq, Seq2SeqConfig


def test_token_ids_accepts_what_an_embedding_takes():
    for dtype in (torch.long, torch.int32):
        ids = torch.tensor([[0, 4]], dtype=dtype)
        assert _checks.token_ids("ids", ids, 5) is ids
    assert _checks.token_ids("ids", torch.zeros(2, 0, dtype=torch.long), 5).shape == (2, 0)  # empty: nothing to range-check


@pytest.mark.parametrize("ids,error,match", [
    (torch.tensor([[0, 1]], dtype=torch.int16), TypeError, "int16"),  # nn.Embedding refuses it
    (torch.tensor([[0.0, 1.0]]), TypeError, "float"),
    (torch.tensor([[True]]), TypeError, "bool"),
    (torch.zeros(1, 2, 3, dtype=torch.long), ValueError, "2-D"),
    (torch.tensor([[0, 5]]), ValueError, r"\[0, 5\)"),
    (torch.tensor([[-1, 0]]), ValueError, "min -1"),
    ([[0, 1]], TypeError, "torch.Tensor"),
])
def test_token_ids_names_the_argument_and_what_is_wrong(ids, error, match):
    with pytest.raises(error, match=match) as raised:
        _checks.token_ids("src_ids", ids, 5)
    assert "src_ids" in str(raised.value)


def test_rnn_and_transformer_models_agree_on_dtypes():
    gpt = GPT(GPTConfig(vocab_size=7, max_len=8, n_layers=1, d_model=8, n_heads=2, d_ff=16))
    rnn = Seq2Seq(Seq2SeqConfig(src_vocab_size=7, d_embed=4, d_hidden=8, attn_dim=8, d_readout=8))
    short = torch.tensor([[1, 2]], dtype=torch.int16)
    with pytest.raises(TypeError, match="input_ids"):
        gpt(short)
    with pytest.raises(TypeError, match="src_ids"):
        rnn(short, torch.tensor([[1, 2]]))


class Reads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the reads of values back to Python (each a device sync on an accelerator)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten._local_scalar_dense, torch.ops.aten.aminmax):
            self.n += func.overloadpacket is torch.ops.aten._local_scalar_dense
        return func(*args, **(kwargs or {}))


def test_token_ids_reads_a_checked_tensor_once_and_again_after_a_write():
    """A model and its parts check the same ids: read once per model call; an in-place write (through
    a view too), another vocabulary or another tensor is read again."""
    gpt = GPT(GPTConfig(vocab_size=7, max_len=8, n_layers=2, d_model=8, n_heads=2, d_ff=16))
    ids = torch.tensor([[1, 2, 3]])
    with Reads() as reads:
        gpt(ids)
    assert reads.n <= 2, reads.n  # the range of the ids (min and max in one read); nothing per layer
    with Reads() as reads:
        _checks.token_ids("ids", ids, 7)
    assert reads.n == 0
    ids.view(-1)[0] = 9
    with pytest.raises(ValueError, match="max 9"):
        _checks.token_ids("ids", ids, 7)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        _checks.token_ids("ids", torch.tensor([[1, 2, 3]]), 3)
    with torch.inference_mode():
        frozen = torch.tensor([[1, 8]])
    with pytest.raises(ValueError, match="max 8"):
        _checks.token_ids("ids", frozen, 7)
    assert _checks.token_ids("ids", torch.tensor([[1, 2]]), 7) is not None


def test_greedy_decoding_reads_the_prompt_ids_once_not_every_drawn_token():
    """The drawn tokens come from vocab_size logits: ``generate`` marks them in range
    (``ids_in_range``), so a decoding step makes no read; writing into a marked tensor reads again."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=7, max_len=32, n_layers=2, d_model=8, n_heads=2, d_ff=16)).eval()
    prompt = torch.tensor([[1, 2, 3]])
    with Reads() as reads:
        out = gpt.generate(prompt, 12, temperature=0)
    assert out.shape == (1, 15)
    # the prompt's range (one read) and nothing for the 12 drawn tokens
    assert reads.n <= 2, reads.n
    # the same tokens as a decoding loop that checks every step
    state, ids = None, prompt
    for _ in range(12):
        step = gpt(ids if state is None else ids[:, -1:].clone(), state=state, return_state=True)
        state, ids = step.state, torch.cat([ids, step.logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ids)
    marked = _checks.ids_in_range(torch.tensor([[1, 2]]), 7)
    marked[0, 1] = 7  # a write after the mark: read again, and refused
    with pytest.raises(ValueError, match="max 7"):
        _checks.token_ids("ids", marked, 7)
