"""qkv's GPT with the batch contract transformers users rely on (issue 36, item 3): a left-padded
batch with ``attention_mask`` and ``position_ids`` gives each row what its prompt alone gives —
in one pass and in ``generate`` (cached and not) — for every kernel whose pattern does not sit at
absolute positions; those (local-1d, fixed) refuse left padding and say why. ``do_sample``,
``eos_token_id`` and 0/1 masks as in transformers."""

import warnings

import pytest
import torch

from qkv.models import GPT
from qkv.models.transformer.gpt import GPTConfig
from qkv.registry import lookup, names

DECODERS = [n for n in names("attention") if lookup("attention", n).supports_causal and n != "linformer"]
LENGTHS, L = (7, 4, 1), 7


def _gpt(attention="softmax", **kw):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GPT(GPTConfig(vocab_size=32, max_len=24, n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0,
                             attention=attention, **kw)).eval()


def _left_padded():
    g = torch.Generator().manual_seed(3)
    ids = torch.zeros(len(LENGTHS), L, dtype=torch.long)
    mask = torch.zeros(len(LENGTHS), L, dtype=torch.bool)
    for b, n in enumerate(LENGTHS):
        ids[b, L - n:] = torch.randint(1, 32, (n,), generator=g)
        mask[b, L - n:] = True
    return ids, mask


@pytest.mark.parametrize("name", DECODERS)
def test_left_padded_batch_gives_each_prompt_its_own_tokens(name):
    model = _gpt(name)
    ids, mask = _left_padded()
    if lookup("attention", name).anchored:
        with pytest.raises(ValueError, match="left padding.*anchors its blocks"):
            model.generate(ids, 3, attention_mask=mask, do_sample=False)
        with pytest.raises(ValueError, match="left padding"):
            model(ids, attention_mask=mask)
        return
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=positions).logits
    for use_cache in (True, False):
        out = model.generate(ids, 6, attention_mask=mask, do_sample=False, use_cache=use_cache)
        for b, n in enumerate(LENGTHS):
            alone = ids[b:b + 1, L - n:]
            assert torch.equal(out[b, L:], model.generate(alone, 6, do_sample=False, use_cache=use_cache)[0, n:]), (name, b)
            if use_cache:
                with torch.no_grad():
                    torch.testing.assert_close(logits[b:b + 1, L - n:], model(alone).logits, atol=1e-5, rtol=0)


def test_without_positions_a_left_padded_row_is_not_itself():
    """The reason for ``position_ids``: positions counted from the first column put a padded row's
    tokens at other positions (issue 36: 0.33 apart)."""
    model = _gpt()
    ids, mask = _left_padded()
    with torch.no_grad():
        shifted = model(ids, attention_mask=mask).logits[1:2, L - 4:]
        alone = model(ids[1:2, L - 4:]).logits
    assert not torch.allclose(shifted, alone, atol=1e-3)


def test_eos_finishes_rows_and_generation_stops():
    model = _gpt()
    ids, mask = _left_padded()
    free = model.generate(ids, 8, attention_mask=mask.long(), do_sample=False)  # a 0/1 mask is taken too
    eos = int(free[0, L + 1])  # row 0 draws it at its second new token
    out = model.generate(ids, 8, attention_mask=mask, do_sample=False, eos_token_id=eos, pad_token_id=0)
    for b in range(len(LENGTHS)):
        row = out[b, L:].tolist()
        if eos in row:
            cut = row.index(eos)
            assert all(t == 0 for t in row[cut + 1:]) and row[:cut + 1] == free[b, L:L + cut + 1].tolist()
        else:
            assert row == free[b, L:L + len(row)].tolist()
    if all(eos in out[b, L:].tolist() for b in range(len(LENGTHS))):
        assert out.shape[1] < free.shape[1]  # every row finished: stopped early


def test_do_sample_and_greedy():
    model = _gpt()
    ids = torch.randint(1, 32, (2, 3), generator=torch.Generator().manual_seed(4))
    greedy = model.generate(ids, 5, temperature=0.0)
    assert torch.equal(model.generate(ids, 5, temperature=0.7, do_sample=False), greedy)
    sampled = model.generate(ids, 5, do_sample=True, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == greedy.shape
    with pytest.raises(ValueError, match="do_sample=True needs temperature > 0"):
        model.generate(ids, 2, temperature=0.0, do_sample=True)
    with pytest.raises(ValueError, match="eos_token_id must be a token id"):
        model.generate(ids, 2, eos_token_id=99)
    with pytest.raises(ValueError, match="every row needs at least one real token"):
        model.generate(ids, 2, attention_mask=torch.tensor([[0, 0, 0], [1, 1, 1]]))


def test_forward_takes_a_tokenizers_0_1_mask_as_generate_and_bert_do():
    """``model(**tokenizer(texts, padding=True, return_tensors="pt"))`` hands an int64 0/1 mask:
    ``generate`` and BERT took it, ``GPT.forward`` raised TypeError (found by the hqa audit); other
    values are still refused, naming the argument."""
    model = _gpt()
    ids, mask = _left_padded()
    ids, mask = ids.flip(-1), mask.flip(-1)  # right padding: no position_ids needed
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        torch.testing.assert_close(model(ids, attention_mask=mask.long()).logits, expected, atol=0, rtol=0)
        torch.testing.assert_close(model(ids, attention_mask=mask.int()).logits, expected, atol=0, rtol=0)
        state = model(ids[:, :3], attention_mask=mask[:, :3].long(), return_state=True).state
        step = model(ids[:, 3:], attention_mask=mask.long(), state=state).logits
    torch.testing.assert_close(step, expected[:, 3:], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="attention_mask must hold 0.*got 2"):
        model(ids, attention_mask=mask.long() * 2)
    with pytest.raises((TypeError, ValueError), match="attention_mask"):
        model(ids, attention_mask=mask.float())


def test_generate_refuses_right_padded_prompts():
    """A right-padded row would be continued from its padding (the last column): its tokens were
    another prompt's, silently (found by the hqa audit: [4, 8, pad, pad] continued as 15 15 15 15 15,
    alone 8 8 8 8 8; transformers only warns). Refused, naming the row and the fix."""
    model = _gpt()
    ids, mask = _left_padded()
    with pytest.raises(ValueError, match=r"attention_mask row 1 .*pad.* on the left"):
        model.generate(ids.flip(-1), 2, attention_mask=mask.flip(-1).long(), do_sample=False)
    model.generate(ids, 2, attention_mask=mask, do_sample=False)  # left padding: fine
