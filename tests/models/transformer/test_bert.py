"""BERT: heads and losses, every kernel as an encoder, bad input."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv.models.transformer.bert import BERT, BERTConfig
from qkv.registry import lookup
from qkv.tasks.bert_tasks import mask_tokens

V, PAD, CLS, SEP, MASK = 50, 0, 1, 2, 3
SPECIAL = (PAD, CLS, SEP)


def tiny(**overrides) -> BERTConfig:
    values = dict(vocab_size=V, max_len=32, n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0,
                  attention_dropout=0.0)
    values.update(overrides)
    return BERTConfig(**values)


def test_pretraining_heads_and_losses():
    torch.manual_seed(0)
    model = BERT(tiny())
    ids = torch.randint(4, V, (3, 10))
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    inputs, labels = mask_tokens(ids, V, MASK, SPECIAL, prob=0.3, generator=torch.Generator().manual_seed(0))
    nsp = torch.tensor([0, 1, 1])
    out = model(inputs, types, labels=labels, next_sentence_label=nsp, need_weights=True)
    assert out.logits.shape == (3, 10, V) and out.aux["nsp_logits"].shape == (3, 2)
    mlm = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(out.loss, mlm + F.cross_entropy(out.aux["nsp_logits"], nsp))
    assert len(out.weights) == 2 and out.weights[0].shape == (3, 4, 10, 10)
    assert model.mlm_decoder.weight is model.stack.embed.token.weight
    out.loss.backward()
    assert model.stack.embed.segment.weight.grad.abs().sum() > 0


def test_padding_is_never_attended():
    torch.manual_seed(0)
    model = BERT(tiny()).eval()
    ids = torch.randint(4, V, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 5:] = False
    out = model(ids, attention_mask=mask, need_weights=True)
    assert all((w[1, :, :, 5:] == 0).all() for w in out.weights)
    other = ids.clone()
    other[1, 5:] = 4  # what sits in the padding changes nothing elsewhere
    torch.testing.assert_close(model(other, attention_mask=mask).logits[1, :5], out.logits[1, :5])


def test_classification_head():
    torch.manual_seed(0)
    model = BERT(tiny(head="classification", num_labels=3))
    ids = torch.randint(4, V, (4, 6))
    labels = torch.tensor([0, 2, 1, 2])
    out = model(ids, labels=labels)
    assert out.logits.shape == (4, 3)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    with pytest.raises(ValueError, match="labels"):
        model(ids, labels=torch.tensor([0, 3, 1, 2]))
    with pytest.raises(ValueError, match="next_sentence_label"):
        model(ids, next_sentence_label=labels)


@pytest.mark.parametrize("name", sorted(qkv.list_attention()))
def test_every_kernel_trains_in_bert_by_name_alone(name):
    """Issue 20 item 7: ``qkv train bert --attention NAME`` with no knob and BERT's attention dropout
    0.1: knobs from the kernel's ``default_knobs``; a kernel that forms no weight matrix (performer,
    linear, efficient: dropout > 0 refused) gets none inside it, and a warning says so."""
    import warnings

    torch.manual_seed(0)
    values = dict(vocab_size=V, max_len=16, n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0, attention=name)
    if lookup("attention", name).causal_only:  # a decoder's mechanism: refused by name in an encoder
        with pytest.raises(ValueError, match=f"attention '{name}' is causal only"):
            BERT.from_config(values)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = BERT.from_config(values).train()
    said = [w for w in caught if "forms no attention-weight matrix" in str(w.message)]
    if lookup("attention", name).applies_dropout:
        assert not said and model.config.attention_dropout == 0.1
        assert all(block.self_attn.kernel.dropout == 0.1 for block in model.stack.layers)
    else:
        assert said and all(block.self_attn.kernel.dropout == 0.0 for block in model.stack.layers)
    ids = torch.randint(4, V, (2, 16))
    inputs, labels = mask_tokens(ids, V, MASK, SPECIAL, prob=0.3, generator=torch.Generator().manual_seed(0))
    out = model(inputs, labels=labels, next_sentence_label=torch.tensor([0, 1]))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bad_inputs():
    model = BERT(tiny())
    ids = torch.randint(4, V, (2, 6))
    with pytest.raises(ValueError, match="token_type_ids"):
        model(ids, token_type_ids=torch.full_like(ids, 2))
    with pytest.raises(TypeError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(2, 6))  # float: not a padding mask
    with pytest.raises(ValueError, match="attention_mask must hold 0 .* got 2"):
        model(ids, attention_mask=torch.full((2, 6), 2))
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.randint(4, V, (1, 33)))
    with pytest.raises(ValueError, match="labels"):
        model(ids, labels=ids[:, :3])
    with pytest.raises(ValueError, match="head"):
        tiny(head="qa")
    with pytest.raises(ValueError, match="num_labels"):
        tiny(num_labels=0)
    with pytest.raises(ValueError, match=r"input_ids has shape \(2, 0\): BERT pools its first position"):
        model(torch.zeros(2, 0, dtype=torch.long))  # no [CLS] to pool (an IndexError inside the pooler)


@pytest.mark.parametrize("head", ["encoder", "classification", "pretraining"])
def test_an_empty_batch_gives_an_empty_output(head):
    """Issue 52 item 15: a (0, 0) batch was an IndexError in the pooler; empty in, empty out, as (0, L)."""
    model = BERT(tiny(head=head, num_labels=3)).eval()
    for L in (0, 5):
        out = model(torch.zeros(0, L, dtype=torch.long))
        assert out.hidden.shape == (0, L, 32) and out.pooler_output.shape == (0, 32)
        if head == "classification":
            assert out.logits.shape == (0, 3)
        elif head == "pretraining":
            assert out.logits.shape == (0, L, V) and out.aux["nsp_logits"].shape == (0, 2)


def test_selected_mlm_logits_are_the_full_logits_at_the_labelled_positions():
    torch.manual_seed(0)
    full = BERT(tiny()).train()
    picked_model = BERT(tiny(mlm_logits="selected")).train()
    picked_model.load_state_dict(full.state_dict())
    ids = torch.randint(4, V, (3, 10))
    inputs, labels = mask_tokens(ids, V, MASK, SPECIAL, prob=0.3, generator=torch.Generator().manual_seed(0))
    a = full(inputs, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]))
    b = picked_model(inputs, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]))
    picked = labels != -100
    assert b.logits.shape == (int(picked.sum()), V)
    torch.testing.assert_close(b.logits, a.logits[picked])
    torch.testing.assert_close(b.loss, a.loss)
    assert picked_model(inputs).logits.shape == (3, 10, V)  # without labels: every position
    with pytest.raises(ValueError, match="mlm_logits"):
        tiny(mlm_logits="some")


def test_init_from_copies_the_encoder_and_leaves_the_new_head_fresh():
    torch.manual_seed(0)
    pre = BERT(tiny())
    torch.manual_seed(1)
    fine = BERT(tiny(head="classification", num_labels=5))
    head = fine.classifier.weight.clone()
    fresh = fine.init_from(pre)
    assert fresh == ["classifier.weight", "classifier.bias"]
    for name, value in fine.state_dict().items():
        if not name.startswith("classifier."):
            torch.testing.assert_close(value, pre.state_dict()[name], rtol=0, atol=0, msg=name)
    torch.testing.assert_close(fine.classifier.weight, head, rtol=0, atol=0)
    assert fine.mlm_decoder.weight is fine.stack.embed.token.weight  # the tie survives
    with pytest.raises(ValueError, match="stack.embed.token.weight"):
        BERT(tiny(vocab_size=V + 1, head="classification")).init_from(pre)
