"""Universal Transformer (Dehghani et al. 2019): fixed depth equals a weight-tied stack, the
timestep encoding against its formula, stepwise equals parallel under ACT, save/load, training."""

from __future__ import annotations

import pytest
import torch

from qkv.models.base import QKVModel
from qkv.models.transformer.stack import StackConfig, TransformerStack
from qkv.models.transformer.universal_transformer import (UniversalTransformer, UniversalTransformerConfig,
                                                          UniversalTransformerLM, UniversalTransformerLMConfig)
from qkv.positional import TimestepEncoding, sinusoid_table
from qkv.registry import lookup

V = 23
SMALL = dict(vocab_size=V, d_model=16, n_heads=2, d_ff=32, dropout=0.0, max_steps=3)


def lm(**overrides) -> UniversalTransformerLM:
    torch.manual_seed(0)
    return UniversalTransformerLM(UniversalTransformerLMConfig(**{**SMALL, **overrides})).eval()


def seq2seq(**overrides) -> UniversalTransformer:
    torch.manual_seed(0)
    return UniversalTransformer(UniversalTransformerConfig(**{**SMALL, **overrides})).eval()


def ids(B, L, seed=1):
    return torch.randint(3, V, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("causal", [False, True])
def test_fixed_depth_equals_weight_tied_stack(causal):
    """act=False, no coordinates: T steps of the shared block == a T-layer stack of that same block."""
    m = lm(act=False, positional="none", max_steps=4)
    ut = m.stack
    tied = TransformerStack(StackConfig(n_layers=4, d_model=16, n_heads=2, d_ff=32, dropout=0.0, positional="none",
                                        residual="post-ln", activation="relu"), vocab_size=V, causal=causal)
    tied.embed.token = ut.embed.token
    tied.layers = torch.nn.ModuleList([ut.layers[0]] * 4)  # weight-tied
    ut.causal = causal
    for layer in (ut.layers[0],):
        layer.self_attn.kernel.causal = causal
    x = ids(2, 9)
    torch.testing.assert_close(ut(x).hidden, tied.eval()(x).hidden)


def test_timestep_encoding_matches_the_formula():
    enc = TimestepEncoding(6, max_len=32)
    x = torch.randn(2, 5, 6)
    out = enc(x, offset=3, step=4)
    pos = sinusoid_table(torch.arange(3, 8), 6)  # sin(i / 10000^(2j/d)), cos(...)
    t = torch.tensor([[torch.sin(torch.tensor(4 / 10000 ** (2 * j / 6))), torch.cos(torch.tensor(4 / 10000 ** (2 * j / 6)))]
                      for j in range(3)]).flatten()
    torch.testing.assert_close(out, x + pos + t)
    assert lookup("positional", "timestep") is TimestepEncoding


def test_steps_add_position_and_timestep_before_the_shared_block():
    m = lm(act=False, max_steps=3)
    x = ids(2, 7)
    block, enc = m.stack.layers[0], TimestepEncoding(16)
    h = m.stack.embed(x)
    for t in range(1, 4):  # H^t = Block(H^{t-1} + P^t)
        h = block(enc(h, 0, step=t)).hidden
    torch.testing.assert_close(m.stack(x).hidden, h)


@pytest.mark.parametrize("act", [True, False])
def test_lm_stepwise_equals_parallel(act):
    m = lm(act=act, max_steps=4)
    with torch.no_grad():
        if act:  # spread the halting times over positions
            m.stack.act.halting.weight.normal_(generator=torch.Generator().manual_seed(5)).mul_(0.3)
            m.stack.act.halting.bias.fill_(0.5)
    x = ids(2, 11)
    full = m(x, return_act=True)
    if act:
        assert len(set(full.aux["act"].n_steps.flatten().tolist())) > 1  # positions halt at different steps
    state, parts = None, []
    for a, b in [(0, 1), (1, 5), (5, 6), (6, 11)]:
        out = m(x[:, a:b], state=state, return_state=True)
        state, parts = out.state, parts + [out.logits]
    assert len(state.layers) == (full.aux["act"].n_steps.max() if act else 4) and state.position == 11
    torch.testing.assert_close(torch.cat(parts, 1), full.logits, atol=1e-5, rtol=0)


def test_seq2seq_cached_decoding_equals_teacher_forcing():
    m = seq2seq(max_steps=4)
    with torch.no_grad():
        m.decoder.act.halting.weight.normal_(generator=torch.Generator().manual_seed(6)).mul_(0.3)
        m.decoder.act.halting.bias.fill_(0.5)
    src, tgt = ids(3, 8, seed=2), ids(3, 6, seed=3)
    full = m(src, tgt).logits
    memory = m.encode(src).hidden
    state, parts = None, []
    for t in range(6):
        out = m.decode(tgt[:, t:t + 1], memory, state=state, return_state=True)
        state, parts = out.state, parts + [m.lm_head(out.hidden)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)
    assert m.generate(src, max_new_tokens=5).shape[0] == 3


def test_ponder_cost_is_added_in_training_and_reported():
    m = seq2seq(ponder_weight=0.5).train()
    src, tgt = ids(2, 6), ids(2, 5, seed=4)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    out = m(src, tgt, src_mask=mask, labels=tgt, return_act=True)
    enc, dec = out.aux["encoder_act"], out.aux["decoder_act"]
    ponder = (enc.ponder_cost * mask).sum() / mask.sum() + dec.ponder_cost.mean()
    torch.testing.assert_close(out.aux["ponder_cost"], ponder.detach())
    torch.testing.assert_close(out.loss, out.aux["lm_loss"] + 0.5 * ponder)
    assert (enc.n_steps <= 3).all() and (dec.n_steps <= 3).all()
    out.loss.backward()
    assert m.encoder.act.halting.weight.grad.abs().sum() > 0


def test_default_halting_bias_starts_deeper_than_tensor2tensor():
    for bias, expected in ((1.0, 2), (-1.0, 4)):
        m = lm(max_steps=6, halting_bias_init=bias)
        torch.nn.init.zeros_(m.stack.act.halting.weight)
        assert m(ids(1, 5), return_act=True).aux["act"].n_steps.unique().tolist() == [expected]


def test_save_load_and_a_few_training_steps(tmp_path):
    m = seq2seq().train()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    src = ids(8, 5, seed=7)
    tgt = torch.cat([torch.ones(8, 1, dtype=torch.long), src], 1)
    labels = torch.cat([src, torch.full((8, 1), 2)], 1)
    first = None
    for _ in range(25):
        loss = m(src, tgt, labels=labels).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < first
    m.eval().save_pretrained(tmp_path)
    loaded = QKVModel.from_pretrained(tmp_path).eval()
    assert type(loaded) is UniversalTransformer
    assert torch.equal(loaded(src, tgt).logits, m(src, tgt).logits)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="n_layers must be 1"):
        UniversalTransformerConfig(n_layers=2)
    with pytest.raises(ValueError, match="max_steps"):
        UniversalTransformerLMConfig(max_steps=0)
    with pytest.raises(ValueError, match="act_eps"):
        UniversalTransformerConfig(act_eps=1.5)
    with pytest.raises(ValueError, match="max_steps must be 1 to 1024 with act=False"):
        UniversalTransformerConfig(act=False, max_steps=10 ** 9)  # a fixed depth of 10^9 steps: nothing halts it
    with pytest.raises(ValueError, match="state has 3 steps"):
        m = lm(max_steps=2)
        state = lm(max_steps=3)(ids(1, 2), return_state=True).state
        m(ids(1, 1), state=state)
    with pytest.raises(ValueError, match="state has 2 steps"):
        m = lm(max_steps=3, act=False)
        state = lm(max_steps=2, act=False)(ids(1, 2), return_state=True).state
        m(ids(1, 1), state=state)


def test_qkv_train_and_translate(tmp_path, capsys, train_argv):
    from qkv.cli import main

    run = tmp_path / "run"
    argv = train_argv("universal-transformer", "addition", run, "--set", "d_model=16", "--set", "n_heads=2",
                      "--set", "d_ff=32", "--set", "max_steps=2", "--set", "task.max_len=2", "--set", "task.eval_size=8",
                      batch_size=4)
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["translate", str(run), "12+3", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("12+3\t")


def test_a_huge_max_steps_costs_only_the_steps_run():
    """Issue 20 item 5: ``qkv train universal-transformer-lm --set max_steps=1000000000`` was killed
    for memory (a per-step tuple and list of max_steps entries). With every position halting at
    step 1, a forward and backward pass runs one step."""
    from qkv.models.transformer.universal_transformer import UniversalTransformerLM, UniversalTransformerLMConfig

    torch.manual_seed(0)
    m = UniversalTransformerLM(UniversalTransformerLMConfig(vocab_size=11, d_model=16, n_heads=2, d_ff=32,
                                                            max_len=16, max_steps=10 ** 9, halting_bias_init=20.0))
    x = torch.randint(11, (2, 8))
    out = m(x, labels=x, return_act=True)
    out.loss.backward()
    assert out.aux["act"].probabilities.shape == (2, 8, 1) and float(out.aux["steps"]) == 1.0


def _count_block_calls(model, limit):
    """Count the shared block's calls; fail (instead of hanging) past ``limit``."""
    calls = []

    def hook(module, args, kwargs):
        calls.append(1)
        if len(calls) > limit:
            raise AssertionError(f"the shared block ran more than {limit} times")

    blocks = [s.layers[0] for s in (getattr(model, "decoder", None), getattr(model, "encoder", None),
                                    getattr(model, "stack", None)) if s is not None]
    for block in blocks:
        block.register_forward_pre_hook(hook, with_kwargs=True)
    return calls


def test_huge_max_steps_decodes_as_far_as_halting_goes():
    """Issue 37 item 8: `qkv train universal-transformer --task reverse --set max_steps=1000000000
    --steps 1` hung in generation: incremental decoding ran every one of max_steps steps per token.
    Decoding now runs the steps halting asks for; the cache of a step the earlier positions never
    reached is computed from their halted states, so stepwise still equals parallel."""
    m = lm(max_steps=10 ** 9)
    with torch.no_grad():  # spread the halting times: 2 to 13 steps
        m.stack.act.halting.weight.normal_(generator=torch.Generator().manual_seed(5)).mul_(0.5)
        m.stack.act.halting.bias.fill_(0.5)
    x = ids(2, 12)
    full = m(x, return_act=True)
    n = full.aux["act"].n_steps
    assert n.max() <= 20 and len(set(n.flatten().tolist())) > 1
    calls = _count_block_calls(m, limit=500)
    state, parts = None, []
    for a in range(12):  # one token at a time, as generation does
        out = m(x[:, a:a + 1], state=state, return_state=True)
        state, parts = out.state, parts + [out.logits]
    torch.testing.assert_close(torch.cat(parts, 1), full.logits, atol=1e-5, rtol=0)
    assert len(state.layers) == n.max() and len(calls) <= 12 * 2 * int(n.max())
    assert m.generate(x[:, :3], max_new_tokens=6).shape == (2, 9)


def test_huge_max_steps_beam_search_finishes():
    m = seq2seq(max_steps=10 ** 9)
    _count_block_calls(m, limit=2000)
    out = m.generate(ids(2, 5, seed=2), max_new_tokens=8, beam_size=3)
    assert out.shape[0] == 2 and out.shape[1] <= 8
