"""BERT's tasks: the masked LM's 80/10/10 corruption, sentence pairs for MLM + NSP, BBC News as
token ids, the task variant for BERT, and `qkv train bert --task bbc-news --init RUN` (Devlin et
al. 2019, §3.1-3.2)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from qkv.models.pooling.han import HierarchicalAttentionNetwork
from qkv.models import LSTMN, Seq2Seq
from qkv.models.transformer.bert import BERT
from qkv.tasks import task_for_model
from qkv.tasks.bbc import is_bbc_cached, tokenize
from qkv.tasks.bert_tasks import BBCNewsTokens, BertPretrainTask, mask_tokens

CLASSES = ["business", "tech", "sport", "politics", "entertainment"]
ARTICLES = [(f"Headline {i} {c}\n\n" + " ".join(f"Sentence {j} of {c} story {i} says w{i}x{j} and more{j}." for j in range(6)), c)
            for i, c in enumerate(CLASSES * 8)]


V, MASK = 50, 3
SPECIAL = (0, 1, 2)  # pad, [CLS], [SEP]
PAD, CLS, SEP = SPECIAL


def test_masking_follows_80_10_10_and_skips_specials():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, V, (400, 500), generator=g)
    ids[:, 0], ids[:, -1], ids[:, 250] = CLS, SEP, PAD  # specials in every row
    inputs, labels = mask_tokens(ids, V, MASK, SPECIAL, prob=0.15, generator=g)
    special = torch.isin(ids, torch.tensor(SPECIAL))
    assert (labels[special] == -100).all() and torch.equal(inputs[special], ids[special])
    selected = labels != -100
    assert torch.equal(labels[selected], ids[selected]) and torch.equal(inputs[~selected], ids[~selected])

    def within_5_sigma(count, n, p):  # binomial count: |count - n p| <= 5 sqrt(n p (1 - p))
        return abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p))

    n_candidates = int((~special).sum())
    n = int(selected.sum())
    assert within_5_sigma(n, n_candidates, 0.15)
    replaced = inputs[selected]
    originals = ids[selected]
    n_mask = int((replaced == MASK).sum())
    n_changed = int(((replaced != MASK) & (replaced != originals)).sum())
    n_kept = int((replaced == originals).sum())
    n_drawable = V - len(SPECIAL) - 1  # random replacements avoid the specials and [MASK]
    assert within_5_sigma(n_mask, n, 0.8)
    assert within_5_sigma(n_changed, n, 0.1 * (1 - 1 / n_drawable))  # a random draw may hit the original
    assert within_5_sigma(n_kept, n, 0.1 + 0.1 / n_drawable)
    assert not torch.isin(replaced, torch.tensor(SPECIAL)).any()


def test_masking_is_seeded_and_validates():
    ids = torch.randint(4, V, (4, 20))
    a = mask_tokens(ids, V, MASK, SPECIAL, generator=torch.Generator().manual_seed(1))
    b = mask_tokens(ids, V, MASK, SPECIAL, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="mask_id"):
        mask_tokens(ids, V, V, SPECIAL)
    with pytest.raises(ValueError, match="prob"):
        mask_tokens(ids, V, MASK, SPECIAL, prob=1.5)
    with pytest.raises(ValueError, match="input_ids"):
        mask_tokens(ids + V, V, MASK, SPECIAL)


def _pretrain(**kw):
    return BertPretrainTask(articles=ARTICLES, min_count=1, eval_size=40, **kw)


def test_pairs_are_adjacent_or_from_another_article():
    task = _pretrain(max_len=24)
    streams = {}
    for doc in task._docs["train"]:
        streams[id(doc)] = [w for s in doc for w in s]
    g = torch.Generator().manual_seed(0)
    labels = []
    for _ in range(300):
        a, b, not_next = task._pair("train", g)
        assert 1 <= len(a) and 1 <= len(b) and len(a) + len(b) <= 24 - 3
        joined = a + b
        contiguous = any(joined == s[i : i + len(joined)] for s in streams.values() for i in range(len(s)))
        a_home = [d for d, s in streams.items() if any(a == s[i : i + len(a)] for i in range(len(s)))]
        b_home = [d for d, s in streams.items() if any(b == s[i : i + len(b)] for i in range(len(s)))]
        if not_next:
            assert set(a_home).isdisjoint(b_home)  # B from another article (its words name the article)
        else:
            assert contiguous  # B is the text right after A
        labels.append(not_next)
    assert 0.4 < sum(labels) / len(labels) < 0.6


def test_batch_layout_segments_and_masking():
    task = _pretrain(max_len=32)
    v = task.vocab
    batch = task.get_batch("train", 64, 3, seed=1)
    ids, types, mask, labels = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape == types.shape == mask.shape == labels.shape and ids.shape[1] <= 32
    original = torch.where(labels != -100, labels, ids)
    for n in range(64):
        row = original[n][mask[n]].tolist()
        seps = [i for i, t in enumerate(row) if t == v.sep_id]
        assert row[0] == v.cls_id and len(seps) == 2 and seps[1] == len(row) - 1
        # segment 0: [CLS] A [SEP]; segment 1: B [SEP]; padding: 0
        assert types[n, : seps[0] + 1].eq(0).all() and types[n, seps[0] + 1 : len(row)].eq(1).all()
        assert types[n, len(row):].eq(0).all() and not mask[n, len(row):].any()
    picked = labels != -100
    assert not torch.isin(labels[picked], torch.tensor(v.special_ids)).any()  # never [CLS]/[SEP]/[PAD]/[UNK]
    words = mask & ~torch.isin(original, torch.tensor(v.special_ids))
    share = float(picked.sum()) / float(words.sum())
    assert 0.10 < share < 0.20  # 15% of the word tokens
    assert float((ids[picked] == v.mask_id).float().mean()) > 0.6  # mostly [MASK] (80%)
    # a pure function of (seed, split, step, rank)
    again = task.get_batch("train", 64, 3, seed=1)
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    other = task.get_batch("train", 64, 3, seed=1, rank=1, world_size=2)
    assert not torch.equal(other["next_sentence_label"], batch["next_sentence_label"][: len(other["next_sentence_label"])]) \
        or not torch.equal(other["input_ids"], batch["input_ids"][:, : other["input_ids"].shape[1]])
    held = list(task.eval_batches("valid", 16))
    assert sum(len(b["next_sentence_label"]) for b in held) == 40
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(held, task.eval_batches("valid", 16)))
    with pytest.raises(ValueError, match="max_len"):
        _pretrain(max_len=4)


def test_evaluate_reports_mlm_and_nsp():
    task = _pretrain(max_len=24)
    torch.manual_seed(0)
    model = BERT.from_config({"vocab_size": task.vocab.size, "max_len": 24, "n_layers": 1, "d_model": 16, "n_heads": 2,
                              "d_ff": 32, "mlm_logits": "selected"})
    metrics = task.evaluate(model, "valid")
    assert set(metrics) >= {"mlm_accuracy", "nsp_accuracy", "mlm_loss", "nsp_loss", "loss"}
    assert 0 <= metrics["mlm_accuracy"] <= 1 and metrics["examples"] == 40
    full = BERT.from_config({**vars(model.config), "mlm_logits": "all"})
    full.load_state_dict(model.state_dict())
    for key, value in task.evaluate(full, "valid").items():
        assert value == pytest.approx(metrics[key], rel=1e-5, abs=1e-6), key


def test_bbc_tokens_share_the_vocabulary_and_split():
    task = BBCNewsTokens(articles=ARTICLES, min_count=1, max_len=10)
    pre = _pretrain()
    assert task.vocab.words == pre.vocab.words
    batch = task.get_batch("train", 4, 0)
    v = task.vocab
    assert batch["input_ids"].shape == (4, 10) and batch["labels"].shape == (4,) and task.num_labels == 5
    assert (batch["input_ids"][:, 0] == v.cls_id).all() and (batch["input_ids"][:, -1] == v.sep_id).all()
    assert v.decode(batch["input_ids"][0, 1:3]).startswith("headline")
    assert torch.equal(batch["attention_mask"], batch["input_ids"] != v.pad_id)
    assert task.model_hints()["head"] == "classification"


def test_bbc_news_is_token_ids_for_models_that_read_them():
    """The form of a task follows the model's declared ``input_key``."""
    assert task_for_model("bbc-news", BERT) == "bbc-news-tokens"
    assert task_for_model("bbc-news", LSTMN) == "bbc-news-tokens"
    assert task_for_model("bbc-news", HierarchicalAttentionNetwork) == "bbc-news"
    assert task_for_model("bbc-news", Seq2Seq) == "bbc-news"  # no declared key: the task as named
    assert task_for_model("bert-pretrain", BERT) == "bert-pretrain"


@pytest.mark.skipif(not is_bbc_cached(), reason="BBC News is not cached (qkv.tasks.bbc.fetch_bbc())")
def test_pretrain_then_fine_tune_from_the_cli(tmp_path, capsys):
    from qkv.cli import main

    small = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
             "--batch-size", "4", "--eval-batches", "1", "--eval-max-examples", "8", "--progress", "false",
             "--tensorboard", "false"]
    pre = tmp_path / "pre"
    assert main(["train", "bert", "--task", "bert-pretrain", "--out", str(pre), "--steps", "2", *small]) == 0
    assert {"mlm_accuracy", "nsp_accuracy"} <= set(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    fine = tmp_path / "fine"
    argv = ["train", "bert", "--task", "bbc-news", "--init", str(pre), "--out", str(fine), "--steps", "2",
            "--batch-size", "4", "--eval-batches", "1", "--eval-max-examples", "8", "--progress", "false",
            "--tensorboard", "false"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fresh: classifier.weight, classifier.bias" in out
    info = json.loads((fine / "run.json").read_text())
    assert info["task"] == "bbc-news-tokens" and info["model_config"]["head"] == "classification"
    assert info["model_config"]["d_model"] == 16 and info["model_config"]["num_labels"] == 5
    assert main(["eval", str(fine), "--max-examples", "8"]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*argv[:6], "--out", str(tmp_path / "again"), "--resume"]) == 2  # --init starts a new run only
    assert "--resume" in capsys.readouterr().err
