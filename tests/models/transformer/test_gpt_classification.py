"""GPT's classification head (Radford et al. 2018, §3.2): the last real token's final hidden state
through a new linear layer, its loss, the auxiliary LM loss, and ``qkv train gpt --task bbc-bytes
--init RUN`` from a byte-level LM run (fake Wikipedia and BBC data in a temporary ``QKV_DATA``:
the ``byte_data`` fixture)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from qkv import UserError, runs
from qkv.models.transformer.al_rfou import AlRfouConfig, AlRfouLM
from qkv.models.transformer.bert import BERT, BERTConfig
from qkv.models.transformer.gpt import GPT, GPTConfig
from qkv.models.losses import lm_loss

V, C = 37, 3
SIZE = dict(vocab_size=V, max_len=32, n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0)


def classifier(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**SIZE, "head": "classification", "num_labels": C, **overrides})).eval()


def batch():
    """``(4, 10)`` ids, a mask with right padding (rows 0, 1), left padding (row 2) and none (row 3),
    and each row's last real position."""
    ids = torch.randint(0, V, (4, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(4, 10, dtype=torch.bool)
    mask[0, 6:] = False
    mask[1, 3:] = False
    mask[2, :4] = False
    return ids, mask, LAST


LAST = torch.tensor([5, 2, 9, 9])  # the last real position of each row of batch()


def test_logits_come_from_the_last_real_token_under_left_and_right_padding():
    m = classifier()
    ids, mask, last = batch()
    logits = m(ids, attention_mask=mask).logits
    assert logits.shape == (4, C)
    padded = ids.clone()
    padded[~mask] = (ids[~mask] + 1) % V  # what sits in the padding, before or after the text, changes nothing
    torch.testing.assert_close(m(padded, attention_mask=mask).logits, logits, atol=1e-6, rtol=0)
    for row in range(4):
        changed = ids.clone()
        changed[row, last[row]] = (ids[row, last[row]] + 1) % V  # the last real token: that row changes, no other
        out = m(changed, attention_mask=mask).logits
        assert not torch.allclose(out[row], logits[row])
        others = [r for r in range(4) if r != row]
        torch.testing.assert_close(out[others], logits[others], atol=1e-6, rtol=0)
    torch.testing.assert_close(m(ids).logits[3], logits[3], atol=1e-6, rtol=0)  # no mask: the last column


def test_classification_equals_the_lm_hidden_state_at_the_last_real_position():
    """A causal model: the class logits are W_y applied to the LM forward's final hidden state at the
    last real token, and equal those of the text alone without its padding."""
    torch.manual_seed(0)
    lm = GPT(GPTConfig(**SIZE)).eval()
    m = classifier()
    assert m.init_from(lm) == ["classifier.weight", "classifier.bias"]
    ids, mask, last = batch()
    hidden = lm(ids, attention_mask=mask).hidden  # (B, L, d_model)
    expected = m.classifier(hidden[torch.arange(4), last])
    torch.testing.assert_close(m(ids, attention_mask=mask).logits, expected, atol=1e-6, rtol=0)
    alone = m(ids[1:2, :3]).logits  # row 1's three real tokens, unpadded
    torch.testing.assert_close(m(ids, attention_mask=mask).logits[1:2], alone, atol=1e-5, rtol=0)


def test_loss_is_the_cross_entropy_of_the_logits_and_gradients_flow():
    m = classifier().train()
    ids, mask, last = batch()
    labels = torch.tensor([0, 2, 1, -100])  # -100 ignored
    out = m(ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels, ignore_index=-100))
    out.loss.backward()
    assert m.classifier.weight.grad.abs().sum() > 0
    assert m.stack.embed.token.weight.grad.abs().sum() > 0
    assert m.stack.layers[0].self_attn.parameters().__next__().grad.abs().sum() > 0
    with pytest.raises(ValueError, match="labels"):
        m(ids, attention_mask=mask, labels=torch.tensor([0, 3, 1, 2]))  # class 3 of 3
    with pytest.raises(ValueError, match="labels"):
        m(ids, attention_mask=mask, labels=ids)  # next-token targets are the LM head's


def test_auxiliary_lm_loss_is_added_with_its_weight():
    """L_3 = L_2 + λ L_1 (§3.2): L_1 the LM loss of each real token predicting the next real one."""
    m = classifier(lm_aux_weight=0.5)
    ids, mask, last = batch()
    labels = torch.tensor([0, 2, 1, 1])
    out = m(ids, attention_mask=mask, labels=labels)
    targets = ids[:, 1:].clone()
    targets[~(mask[:, 1:] & mask[:, :-1])] = -100
    lm = lm_loss(m.lm_head(out.hidden[:, :-1]), targets)
    torch.testing.assert_close(out.aux["lm_loss"], lm.detach())
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels) + 0.5 * lm)
    assert "lm_loss" not in classifier()(ids, attention_mask=mask, labels=labels).aux  # λ = 0: none


def test_empty_batch_as_bert():
    """No rows: (0, num_labels) logits and the mean cross-entropy of nothing (NaN), as BERT's head."""
    m = classifier()
    bert = BERT(BERTConfig(vocab_size=V, max_len=32, n_layers=1, d_model=32, n_heads=4, d_ff=64,
                           head="classification", num_labels=C))
    ids, mask, labels = torch.zeros(0, 6, dtype=torch.long), torch.zeros(0, 6, dtype=torch.bool), torch.zeros(0, dtype=torch.long)
    ours, theirs = m(ids, attention_mask=mask, labels=labels), bert(ids, attention_mask=mask, labels=labels)
    assert ours.logits.shape == theirs.logits.shape == (0, C)
    assert torch.isnan(ours.loss) and torch.isnan(theirs.loss)


def test_bad_inputs_and_settings_are_refused():
    m = classifier()
    ids, mask, last = batch()
    mask[1] = False
    with pytest.raises(ValueError, match="row 1 has no real token"):
        m(ids, attention_mask=mask)
    with pytest.raises(ValueError, match="state/return_state"):
        m(ids, return_state=True)
    with pytest.raises(ValueError, match=r"head must be one of \('lm', 'classification'\), got 'qa'"):
        GPTConfig(**SIZE, head="qa")
    for bad in (1, 0, 2.0):
        with pytest.raises(ValueError, match="num_labels must be an int >= 2"):
            GPTConfig(**SIZE, head="classification", num_labels=bad)
    with pytest.raises(ValueError, match="lm_aux_weight must be"):
        GPTConfig(**SIZE, head="classification", lm_aux_weight=-0.5)
    with pytest.raises(ValueError, match="lm_aux_weight is the auxiliary LM loss"):
        GPTConfig(**SIZE, lm_aux_weight=0.5)
    with pytest.raises(ValueError, match="language model only"):  # a subclass with its own forward
        AlRfouLM(AlRfouConfig(**SIZE, head="classification"))


def test_save_load_and_no_gpt2_checkpoint(tmp_path):
    """The classifier saves and loads with the model; transformers' GPT2LMHeadModel has no place for it."""
    m = classifier()
    m.save_pretrained(tmp_path / "qkv")
    again = GPT.from_pretrained(tmp_path / "qkv").eval()
    ids, mask, _ = batch()
    torch.testing.assert_close(again(ids, attention_mask=mask).logits, m(ids, attention_mask=mask).logits)
    with pytest.raises(ValueError, match="head='classification' has no place"):
        m.save_pretrained(tmp_path / "hf", format="huggingface")


def test_lm_head_unchanged():
    """head="lm" (the default) builds no classifier: an LM's parameters and draws are as before."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(**SIZE))
    assert not any(n.startswith("classifier") for n in m.state_dict())
    assert m(torch.randint(0, V, (2, 5))).logits.shape == (2, 5, V)


# ----------------------------------------------------------------------------- qkv train --init


SMALL = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32"]


def test_train_gpt_on_bbc_bytes_from_an_lm_run(byte_data, train_argv, capsys):
    from qkv.cli import main

    pre = byte_data / "pre"
    assert main(train_argv("gpt", "enwiki-bytes", pre, *SMALL, "--set", "task.block_size=32")) == 0
    fine = byte_data / "fine"
    assert main(train_argv("gpt", "bbc-bytes", fine, "--init", str(pre), "--set", "task.max_len=48")) == 0
    assert "fresh: classifier.weight, classifier.bias" in capsys.readouterr().out
    info = json.loads((fine / "run.json").read_text())["model_config"]
    assert (info["head"], info["num_labels"], info["d_model"], info["vocab_size"]) == ("classification", 5, 16, 259)
    assert main(["eval", str(fine), "--max-examples", "8"]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    # before any update: the body is the LM's, the classifier its own
    source = runs.load(pre).model
    settings = runs.resolve("gpt", "bbc-bytes", overrides={"task.max_len": 48, "train.progress": False}, init=str(pre))
    with runs.Run.create(byte_data / "again", settings) as run:
        mine = run.model.state_dict()
    for name, value in source.state_dict().items():
        torch.testing.assert_close(mine[name], value, rtol=0, atol=0, msg=name)
    assert {n for n in mine if n not in source.state_dict()} == {"classifier.weight", "classifier.bias"}

    # from scratch the task alone picks the head and its classes
    scratch = runs.resolve("gpt", "bbc-bytes", overrides={"task.max_len": 48})
    assert (scratch.model_config["head"], scratch.model_config["num_labels"]) == ("classification", 5)


def test_init_from_another_vocabulary_or_a_bad_head_is_one_line(byte_data, train_argv, capsys):
    from qkv.cli import main

    chars = byte_data / "chars"
    assert main(train_argv("gpt", "shakespeare-char", chars, *SMALL, "--set", "task.block_size=16")) == 0
    capsys.readouterr()
    assert main(train_argv("gpt", "bbc-bytes", byte_data / "fine", "--init", str(chars))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vocabulary (shakespeare-char" in err and "'bbc-bytes'" in err
    with pytest.raises(UserError, match="vocabulary"):
        runs.resolve("gpt", "bbc-bytes", init=str(chars))
    assert main(train_argv("gpt", "bbc-bytes", byte_data / "bad", *SMALL, "--set", "head=qa")) == 2
    assert "head must be one of ('lm', 'classification'), got 'qa'" in capsys.readouterr().err
    assert main(train_argv("gpt", "bbc-bytes", byte_data / "bad", *SMALL, "--set", "num_labels=1")) == 2
    assert "num_labels must be an int >= 2" in capsys.readouterr().err
