"""The Transformer encoder-decoder: it learns to reverse, beam 1 equals greedy, and the shared
stack matches ``torch.nn.Transformer`` given the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.models.transformer.transformer import Transformer, TransformerConfig

PAD, BOS, EOS, FIRST = 0, 1, 2, 3  # token ids of the reverse task: 3 .. 12 are symbols


def reverse_batch(batch_size: int, generator: torch.Generator, n_symbols: int = 10, lengths=(5, 8)):
    """Random symbol strings and their reversals as a seq2seq batch (docs/contracts.md)."""
    L = torch.randint(lengths[0], lengths[1] + 1, (batch_size,), generator=generator)
    S = int(L.max())
    src = torch.randint(FIRST, FIRST + n_symbols, (batch_size, S), generator=generator)
    src_mask = torch.arange(S)[None] < L[:, None]  # (B, S)
    src = src.masked_fill(~src_mask, PAD)
    tgt = torch.full((batch_size, S + 1), PAD)
    labels = torch.full((batch_size, S + 1), -100)
    for b in range(batch_size):
        rev = src[b, :L[b]].flip(0)
        tgt[b, 0] = BOS
        tgt[b, 1:L[b] + 1] = rev
        labels[b, :L[b]] = rev
        labels[b, L[b]] = EOS
    return dict(src_ids=src, src_mask=src_mask, tgt_ids=tgt, labels=labels)


def tiny_config(**overrides) -> TransformerConfig:
    values = dict(vocab_size=13, n_layers=2, d_model=64, n_heads=4, d_ff=128, dropout=0.0, max_len=32,
                  label_smoothing=0.0, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    values.update(overrides)
    return TransformerConfig(**values)


def exact_match(model: Transformer, batch, **generate_kwargs) -> float:
    pred = model.generate(batch["src_ids"], batch["src_mask"], max_new_tokens=10, **generate_kwargs)
    target = batch["labels"].clamp_min(PAD)  # reversal, EOS, then PAD
    width = target.shape[1]
    pred = nn.functional.pad(pred, (0, max(0, width - pred.shape[1])), value=PAD)[:, :width]
    return (pred == target).all(1).float().mean().item()


@pytest.fixture(scope="module")
def reverser() -> Transformer:
    """A tiny post-LN Transformer trained to reverse strings (300 steps, warm-up then linear decay)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = Transformer(tiny_config())
    steps, warmup = 300, 30
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, (steps - s) / (steps - warmup)))
    for _ in range(steps):
        loss = model(**reverse_batch(64, g)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


@pytest.mark.slow
def test_learns_reverse(reverser):
    test = reverse_batch(500, torch.Generator().manual_seed(1))
    assert exact_match(reverser, test) > 0.99
    assert exact_match(reverser, test, beam_size=3) > 0.99


def literal_greedy(model: Transformer, src_ids, src_mask, max_new_tokens: int):
    """Greedy decoding without a cache: re-read the whole target prefix every step (argmax; a
    sequence ends at EOS — or PAD, as in ``beam_search`` — and is PAD-filled after)."""
    B = src_ids.shape[0]
    tgt = torch.full((B, 1), BOS)
    done = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_new_tokens):
        next_id = model(src_ids, tgt, src_mask).logits[:, -1].argmax(-1).masked_fill(done, PAD)
        tgt = torch.cat([tgt, next_id[:, None]], 1)
        done |= (next_id == EOS) | (next_id == PAD)
        if done.all():
            break
    return tgt[:, 1:]


def test_beam_one_equals_greedy():
    torch.manual_seed(0)
    model = Transformer(tiny_config(n_layers=1)).eval()  # untrained: long, varied outputs
    batch = reverse_batch(16, torch.Generator().manual_seed(2))
    greedy = literal_greedy(model, batch["src_ids"], batch["src_mask"], 12)
    beam = model.generate(batch["src_ids"], batch["src_mask"], max_new_tokens=12, beam_size=1)
    assert torch.equal(greedy, beam)
    assert greedy.shape[1] > 3  # the comparison covers several cached steps
    wide = model.generate(batch["src_ids"], batch["src_mask"], max_new_tokens=12, beam_size=4, length_penalty=1.0)
    assert wide.shape[0] == 16 and wide.shape[1] <= 12


def test_wide_beam_is_exhaustive_search():
    """With a beam wider than every prefix, beam search returns argmax_Y log P(Y | X) / lp(Y) over
    all hypotheses of at most 3 tokens (enumerated literally): those ending at EOS or PAD, and the
    unfinished ones of exactly 3 tokens; ``|Y|`` counts the tokens other than PAD."""
    import itertools

    torch.manual_seed(0)
    model = Transformer(tiny_config(n_layers=1, tgt_vocab_size=5)).eval()  # target ids 0 .. 4
    batch = reverse_batch(3, torch.Generator().manual_seed(3))
    alpha = 0.8
    beam = model.generate(batch["src_ids"], batch["src_mask"], max_new_tokens=3, beam_size=100, length_penalty=alpha)
    ends, others = (EOS, PAD), [t for t in range(5) if t not in (EOS, PAD)]
    hyps = [list(p) + [e] for n in range(3) for p in itertools.product(others, repeat=n) for e in ends]
    hyps += [list(p) for p in itertools.product(others, repeat=3)]
    for b in range(3):
        best, best_score = None, float("-inf")
        for y in hyps:
            tgt = torch.tensor([[BOS] + y[:-1]])
            logp = model(batch["src_ids"][b:b + 1], tgt, batch["src_mask"][b:b + 1]).logits.log_softmax(-1)
            length = max(1, sum(t != PAD for t in y))  # beam_search counts at least 1
            score = logp[0, torch.arange(len(y)), y].sum().item() / ((5 + length) / 6) ** alpha
            if score > best_score:
                best, best_score = y, score
        got = beam[b].tolist()
        assert got[:len(best)] == best and all(t == PAD for t in got[len(best):])


def test_forward_shapes_weights_and_loss():
    torch.manual_seed(0)
    model = Transformer(tiny_config(n_decoder_layers=3, label_smoothing=0.1))
    batch = reverse_batch(4, torch.Generator().manual_seed(0))
    out = model(**batch, need_weights=True)
    B, S = batch["src_ids"].shape
    T = batch["tgt_ids"].shape[1]
    assert out.logits.shape == (B, T, 13) and out.loss.dim() == 0
    assert len(out.weights["encoder"]) == 2 and len(out.weights["decoder_self"]) == 3
    assert out.weights["decoder_cross"][0].shape == (B, 4, T, S)
    literal = nn.functional.cross_entropy(out.logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                                          label_smoothing=0.1)
    torch.testing.assert_close(out.loss, literal)
    assert model.lm_head.weight is model.encoder.embed.token.weight is model.decoder.embed.token.weight


def test_separate_target_vocabulary():
    model = Transformer(tiny_config(tgt_vocab_size=20))
    assert model.lm_head.weight.shape == (20, 64)
    assert model.encoder.embed.token is not model.decoder.embed.token
    out = model(torch.randint(0, 13, (2, 5)), torch.randint(0, 20, (2, 4)))
    assert out.logits.shape == (2, 4, 20)


def test_bad_inputs():
    model = Transformer(tiny_config())
    src = torch.randint(3, 13, (2, 5))
    with pytest.raises(ValueError, match="src_ids"):
        model(src + 20, src)
    with pytest.raises(TypeError, match="src_mask"):
        model(src, src, src_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="src_mask"):
        model(src, src, src_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="tgt_ids"):
        model(src, src[0])
    with pytest.raises(ValueError, match="labels"):
        model(src, src, labels=src[:, :3])
    with pytest.raises(ValueError, match="beam_size"):
        model.generate(src, beam_size=0)
    with pytest.raises(ValueError, match="eos_id"):
        model.generate(src, eos_id=99)
    with pytest.raises(ValueError, match="bos_id"):
        tiny_config(bos_id=13)
    with pytest.raises(ValueError, match="cross_attention"):
        tiny_config(cross_attention="nope")
