"""``UniversalTransformerLM.generate(attention_mask=...)`` (issue 52, item 8): a TypeError before (its
``forward`` took no mask). Now as GPT's: a left-padded batch gives each prompt what it gives alone, in
one pass (with ``position_ids`` from each row's first token, the coordinates added before every step)
and in ``generate``, cached and not, with ACT and with a fixed depth."""

import pytest
import torch

from qkv.models.transformer.universal_transformer import UniversalTransformerLM, UniversalTransformerLMConfig

LENGTHS, L = (7, 4, 1), 7


def _lm(spread=None, **kw):
    """``spread``: a seed that spreads the halting times (as test_universal_transformer's huge-max-steps
    test does), so that a later token needs steps no earlier position ran (``_frozen_step``, with the mask)."""
    torch.manual_seed(0)
    config = UniversalTransformerLMConfig(vocab_size=32, max_len=24, d_model=16, n_heads=2, d_ff=32, dropout=0.0,
                                          n_layers=1, **kw)
    model = UniversalTransformerLM(config).eval()
    if spread is not None:
        with torch.no_grad():
            model.stack.act.halting.weight.normal_(generator=torch.Generator().manual_seed(spread)).mul_(0.5)
            model.stack.act.halting.bias.fill_(0.5)
    return model


def _left_padded():
    g = torch.Generator().manual_seed(3)
    ids = torch.zeros(len(LENGTHS), L, dtype=torch.long)
    mask = torch.zeros(len(LENGTHS), L, dtype=torch.bool)
    for b, n in enumerate(LENGTHS):
        ids[b, L - n:] = torch.randint(1, 32, (n,), generator=g)
        mask[b, L - n:] = True
    return ids, mask


#: (what the user builds): each must generate for a left-padded batch what each row generates alone
MODELS = [
    {"act": True, "max_steps": 4},
    {"act": True, "max_steps": 30, "spread": 18},  # later tokens need steps the cache lacks (9 frozen steps)
    {"act": False, "max_steps": 3},
    {"act": True, "max_steps": 4, "positional": "learned"},
]


@pytest.mark.parametrize("kw", MODELS)
def test_left_padded_generate_gives_each_prompt_its_own_tokens(kw):
    model = _lm(**kw)
    ids, mask = _left_padded()
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=positions).logits
        for b, n in enumerate(LENGTHS):
            torch.testing.assert_close(logits[b:b + 1, L - n:], model(ids[b:b + 1, L - n:]).logits, atol=1e-5, rtol=0)
    for use_cache in (True, False):
        out = model.generate(ids, 6, attention_mask=mask, do_sample=False, use_cache=use_cache)
        for b, n in enumerate(LENGTHS):
            alone = model.generate(ids[b:b + 1, L - n:], 6, do_sample=False, use_cache=use_cache)
            assert torch.equal(out[b, L:], alone[0, n:]), (kw, use_cache, b)


def test_a_bad_mask_is_named():
    model = _lm()
    ids, mask = _left_padded()
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=mask[:, 1:])
    with pytest.raises(ValueError, match="position_ids"):
        model(ids, attention_mask=mask, position_ids=torch.zeros(3, 2, dtype=torch.long))
