"""The shared stack: equal to ``torch.nn.Transformer`` given the same weights, and its hooks
(the blocks themselves: tests/blocks/)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.models.transformer.stack import (BlockState, StackConfig, StackState, TransformerStack, copy_torch_layer,
                              reorder_state)
from qkv.types import KVCache


def copy_torch_transformer(torch_model: nn.Transformer, encoder: TransformerStack, decoder: TransformerStack) -> None:
    """Copy a ``torch.nn.Transformer``'s layers into qkv encoder/decoder stacks (``copy_torch_layer``)."""
    for ours, theirs in zip(encoder.layers, torch_model.encoder.layers):
        copy_torch_layer(ours, theirs)
    for ours, theirs in zip(decoder.layers, torch_model.decoder.layers):
        copy_torch_layer(ours, theirs)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("norm_first", [False, True])
def test_matches_torch_transformer(norm_first):
    torch.manual_seed(0)
    d, h, ff, n = 32, 4, 64, 2
    theirs = nn.Transformer(d, h, n, n, ff, dropout=0.0, batch_first=True, norm_first=norm_first).double()
    config = StackConfig(n_layers=n, d_model=d, n_heads=h, d_ff=ff, dropout=0.0,
                         residual="pre-ln" if norm_first else "post-ln")
    encoder = TransformerStack(config, vocab_size=5).double()
    decoder = TransformerStack(config, vocab_size=5, causal=True, cross_attention="softmax").double()
    # torch's closing encoder.norm / decoder.norm: our final LayerNorms with pre-LN; with post-LN the
    # paper has none, so torch's are removed
    if norm_first:
        encoder.final_norm.load_state_dict(theirs.encoder.norm.state_dict())
        decoder.final_norm.load_state_dict(theirs.decoder.norm.state_dict())
    else:
        theirs.encoder.norm = theirs.decoder.norm = None
    copy_torch_transformer(theirs, encoder, decoder)

    B, S, T = 3, 7, 5
    src, tgt = torch.randn(B, S, d, dtype=torch.double), torch.randn(B, T, d, dtype=torch.double)
    src_mask = torch.arange(S)[None] < torch.tensor([7, 4, 6])[:, None]  # (B, S) True = real token
    expected = theirs(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.double),
                      tgt_is_causal=True, src_key_padding_mask=~src_mask, memory_key_padding_mask=~src_mask)
    memory = encoder.run_layers(src, mask=src_mask).hidden
    got = decoder.run_layers(tgt, memory=memory, memory_mask=src_mask).hidden
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_decoder_stepwise_equals_parallel_with_cached_cross_kv():
    torch.manual_seed(0)
    config = StackConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    decoder = TransformerStack(config, vocab_size=11, causal=True, cross_attention="softmax").eval()
    memory = torch.randn(2, 6, 16)
    memory_mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    y = torch.randint(0, 11, (2, 5))
    full = decoder(y, memory=memory, memory_mask=memory_mask, need_weights=True)
    state, outs = None, []
    for t in range(5):
        out = decoder(y[:, t:t + 1], memory=memory, memory_mask=memory_mask, state=state, return_state=True)
        if state is not None:  # the memory's projections are reused, not recomputed
            assert out.state.layers[0].cross_kv[0] is state.layers[0].cross_kv[0]
        state, outs = out.state, outs + [out.hidden]
    torch.testing.assert_close(torch.cat(outs, 1), full.hidden, atol=1e-5, rtol=0)
    assert len(full.weights) == len(full.cross_weights) == 2
    assert full.cross_weights[0].shape == (2, 2, 5, 6)
    assert (full.cross_weights[1][1, :, :, 3:] == 0).all()  # padding never attended


def test_block_state_and_stack_state_are_typed():
    config = StackConfig(n_layers=3, d_model=8, n_heads=2, d_ff=16, dropout=0.0, positional="learned")
    stack = TransformerStack(config, vocab_size=7, causal=True).eval()
    out = stack(torch.randint(0, 7, (2, 4)), return_state=True, return_hidden=True)
    assert isinstance(out.state, StackState) and out.state.position == 4
    assert all(isinstance(s, BlockState) and isinstance(s.self_attn, KVCache) for s in out.state.layers)
    assert len(out.hidden_states) == 3
    with pytest.raises(ValueError, match="layers"):
        stack.run_layers(torch.randn(2, 1, 8), state=StackState(out.state.layers[:2], 4))


def test_reorder_state_selects_batch_rows():
    cache = KVCache(torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 4, 5), torch.zeros(3, 2, 4, 5), offset=2)
    state = StackState((BlockState(cache, (torch.arange(3.0), torch.arange(3.0))),), position=4)
    new = reorder_state(state, torch.tensor([2, 2, 0]))
    assert new.position == 4 and new.layers[0].self_attn.offset == 2
    assert new.layers[0].self_attn.key[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert new.layers[0].cross_kv[1].tolist() == [2.0, 2.0, 0.0]


def test_sinusoidal_positions_follow_the_offset():
    config = StackConfig(n_layers=1, d_model=8, n_heads=2, d_ff=16, dropout=0.0)
    stack = TransformerStack(config, vocab_size=7, causal=True).eval()
    ids = torch.randint(0, 7, (1, 6))
    full = stack.embed(ids)
    torch.testing.assert_close(stack.embed(ids[:, 4:], offset=4), full[:, 4:])


def test_full_padding_mask_is_dropped_for_fast_path():
    config = StackConfig(n_layers=1, d_model=8, n_heads=2, d_ff=16, dropout=0.0)
    stack = TransformerStack(config, vocab_size=7).eval()
    ids = torch.randint(0, 7, (2, 5))
    torch.testing.assert_close(stack(ids, mask=torch.ones(2, 5, dtype=torch.bool)).hidden, stack(ids).hidden)


# ----------------------------------------------------------------------------- inputs and plug-ins


def test_stack_rejects_bad_inputs():
    config = StackConfig(n_layers=1, d_model=8, n_heads=2, d_ff=16)
    with pytest.raises(TypeError, match="config"):
        TransformerStack({"n_layers": 1}, vocab_size=3)
    stack = TransformerStack(config, vocab_size=7, cross_attention="softmax")
    with pytest.raises(ValueError, match="memory"):
        stack(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="x must be 3-D"):
        stack.run_layers(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="token_type_ids"):
        stack(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long), memory=torch.zeros(1, 2, 8))


def test_new_wiring_and_positional_scheme_plug_in_by_name():
    """A later variant registers its parts; the stack builds them by name, unchanged."""
    from qkv.blocks import ResidualWiring
    from qkv.registry import register

    @register("residual", "test-rezero")
    class ReZero(ResidualWiring):  # x + alpha F(x), alpha = 0 at start (Bachlechner et al. 2020)
        def __init__(self, d_model, dropout=0.0, eps=1e-5):
            super().__init__(d_model, dropout, eps)
            self.alpha = nn.Parameter(torch.zeros(()))

        def enter(self, x):
            return x

        def exit(self, x, y):
            return x + self.alpha * self.dropout(y)

    @register("positional", "test-zero")
    class Zero(nn.Module):
        def __init__(self, d_model, max_len=0, dropout=0.0):
            super().__init__()

        def forward(self, x, offset=0):
            return x

    config = StackConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, dropout=0.0, residual="test-rezero",
                         positional="test-zero")
    stack = TransformerStack(config, vocab_size=7)
    ids = torch.randint(0, 7, (2, 5))
    torch.testing.assert_close(stack(ids).hidden, stack.embed.token(ids))  # alpha = 0: the identity


# ----------------------------------------------------------------------------- fixed positions vs tokens


def _position_token_rms(name):
    """RMS of the positions a model adds over RMS of its (scaled) token embeddings, at init."""
    from qkv.models.transformer.bert import BERT, BERTConfig
    from qkv.models.transformer.gpt import GPT, GPTConfig
    from qkv.models.transformer.universal_transformer import UniversalTransformerLM, UniversalTransformerLMConfig

    def measure(cls, config_cls, positional, d):
        torch.manual_seed(0)
        m = cls(config_cls(vocab_size=200, n_layers=1, d_model=d, n_heads=4, d_ff=32, positional=positional, max_len=200))
        stack = m.stack
        tokens = stack.embed.token(torch.arange(200).view(1, 200)) * stack.embed.scale
        zeros = torch.zeros(1, 200, d)
        positions = stack.coordinates(zeros, 0, step=1) if positional == "timestep" else stack.embed.positional(zeros)
        return float(positions.pow(2).mean().sqrt() / tokens.pow(2).mean().sqrt())

    models = {"gpt": (GPT, GPTConfig, "sinusoidal"), "bert": (BERT, BERTConfig, "sinusoidal"),
              "ut-lm": (UniversalTransformerLM, UniversalTransformerLMConfig, "timestep")}
    return [measure(*models[name], d) for d in (32, 256)]


@pytest.mark.parametrize("name", ["gpt", "bert", "ut-lm"])
@torch.no_grad()
def test_fixed_positions_do_not_drown_the_tokens(name):
    """Issue 20 item 2: unit-amplitude sinusoids (and the Universal Transformer's timestep signal)
    added to N(0, 0.02) token embeddings were ~35 (UT: ~60) times their RMS at every width, and the
    models stayed at the unigram loss. The stack scales the tokens by sqrt(d_model) from unit-RMS
    tables (Vaswani et al. 2017, §3.4): positions and tokens start on one scale at every width."""
    for ratio in _position_token_rms(name):
        assert 0.5 < ratio < 2.0, ratio


def test_token_scale_follows_the_positional_scheme():
    from qkv.models.transformer.stack import Embeddings, token_scale

    assert token_scale("sinusoidal", 64) == 8.0 and token_scale("timestep", 16) == 4.0
    assert token_scale("learned", 64) == 1.0 and token_scale("none", 64) == 1.0
    assert Embeddings(10, 64, positional="sinusoidal").scale == 8.0
    assert Embeddings(10, 64, positional="sinusoidal", scale=1.0).scale == 1.0  # an explicit scale wins
