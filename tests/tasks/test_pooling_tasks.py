"""Tasks of the pooling/memory models on small fixtures (no network): MNIST-bags, bAbI-style
stories, NTM copy, NW regression, BBC News, digits, karate club; real data only when cached."""

from __future__ import annotations

import re

import pytest
import torch

from qkv.models.base import ModelOutput
from qkv.tasks.babi import PLACES, BabiCounting, BabiSingle, BabiTwo
from qkv.tasks.bags import DigitBags, make_bags
from qkv.tasks.bbc import BBCNews, is_bbc_cached, tokenize
from qkv.tasks.classify import binary_auc
from qkv.tasks.data import is_cached
from qkv.tasks.digits import Digits
from qkv.tasks.ntm_copy import NTMCopy, copy_batch
from qkv.tasks.regression import NWRegression


def _fake_mnist(n=200):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 28, 28), generator=g, dtype=torch.uint8), torch.arange(n) % 10


# --------------------------------------------------------------------------- helpers


def test_binary_auc_matches_pair_count():
    scores = torch.tensor([0.1, 0.4, 0.35, 0.8, 0.4])
    targets = torch.tensor([0, 0, 1, 1, 1])
    pairs = [(p, n) for p in (2, 3, 4) for n in (0, 1)]
    ref = sum(1.0 if scores[p] > scores[n] else 0.5 if scores[p] == scores[n] else 0.0 for p, n in pairs) / len(pairs)
    assert binary_auc(scores, targets) == pytest.approx(ref)
    assert binary_auc(scores, torch.ones(5)) != binary_auc(scores, torch.ones(5))  # NaN with one class


# --------------------------------------------------------------------------- MNIST-bags


def test_make_bags_labels_and_masks():
    digits = torch.arange(100) % 10
    bags = make_bags(digits, 200, target=9, mean=6, std=2, max_bag=12, seed=1)
    sizes = bags["mask"].sum(-1)
    assert sizes.min() >= 1 and sizes.max() <= 12
    # masks are a prefix; a bag is positive iff one of its real instances is a 9
    assert torch.equal(bags["mask"], torch.arange(12) < sizes[:, None])
    has_target = ((digits[bags["index"]] == 9) & bags["mask"]).any(-1)
    assert torch.equal(has_target.long(), bags["labels"])
    assert torch.equal(bags["instance_labels"], (digits[bags["index"]] == 9) & bags["mask"])
    assert 0.35 < bags["labels"].float().mean() < 0.65


def test_digit_bags_batches_are_pure_and_padded():
    images, digits = _fake_mnist()
    task = DigitBags(images=images, digits=digits, n_train=50, n_valid=10, n_test=20, bag_mean=5, bag_std=1)
    a = task.get_batch("train", 8, 3, seed=1)
    b = task.get_batch("train", 8, 3, seed=1)
    assert set(a) == {"bags", "mask", "labels"}
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["bags"].shape == (8, task.max_bag, 1, 28, 28)
    assert torch.all(a["bags"][~a["mask"]] == 0)
    r0 = task.get_batch("train", 4, 0, rank=0, world_size=2)["labels"]
    assert len(r0) == 4
    with pytest.raises(ValueError, match="split"):
        task.get_batch("dev", 4, 0)
    with pytest.raises(ValueError, match="target"):
        DigitBags(images=images, digits=digits, target=10)
    with pytest.raises(ValueError, match="together"):
        DigitBags(images=images)


def test_digit_bags_evaluate_with_oracle_weights():
    images, digits = _fake_mnist()
    task = DigitBags(images=images, digits=digits, n_train=20, n_valid=10, n_test=40, bag_mean=6, bag_std=1)

    class Oracle(torch.nn.Module):
        """Attends to the 9s (recognised by their exact pixels) and says 'positive' iff it sees one."""

        def __init__(self):
            super().__init__()
            self.nines = images[digits == 9].float().div(255)

        def forward(self, bags, mask=None, labels=None, need_weights=False):
            is9 = (bags[:, :, 0, None] == self.nines[None, None]).flatten(3).all(-1).any(-1) & mask  # (B, K)
            w = is9.float() / is9.float().sum(-1, keepdim=True).clamp(min=1)
            logits = torch.stack([-is9.any(-1).float(), is9.any(-1).float()], -1)
            return ModelOutput(logits=logits, weights=w)

    metrics = task.evaluate(Oracle(), "test")
    assert metrics["accuracy"] == 1.0 and metrics["auc"] == 1.0 and metrics["instance_auc"] == 1.0


@pytest.mark.skipif(not is_cached("mnist"), reason="MNIST is not cached (qkv data fetch mnist)")
def test_digit_bags_real_mnist_splits_do_not_share_images():
    task = DigitBags(n_train=100, n_valid=20, n_test=20)
    assert task._images["train"].shape[1:] == (1, 28, 28)
    flat = {s: {tuple(x.flatten().tolist()[::7]) for x in task._images[s][:200]} for s in ("train", "test")}
    assert len(flat["train"] & flat["test"]) <= 2  # MNIST has a few near-duplicates; none shared by design
    assert Digits().size("train") == 4000


# --------------------------------------------------------------------------- bAbI-style stories


def _where_from_text(sentences, person):
    place = None
    for s in sentences:
        words = s.split()
        if words[0] == person and words[-1] in PLACES:
            place = words[-1]
    return place


def test_babi_single_answers_follow_the_story():
    task = BabiSingle(n_train=200, n_valid=20, n_test=50)
    for sentences, question, answer, support in task.stories["test"]:
        person = question.split()[-1]
        assert answer == _where_from_text(sentences, person)
        assert support == [max(i for i, s in enumerate(sentences) if s.startswith(person + " "))]
    train_texts = {" | ".join(s) + q for s, q, _, _ in task.stories["train"]}
    assert not any(" | ".join(s) + q in train_texts for s, q, _, _ in task.stories["test"])  # held out


def test_babi_batches_and_masks():
    task = BabiTwo(n_train=100, n_valid=10, n_test=20)
    batch = task.get_batch("train", 5, 2)
    assert set(batch) == {"story", "story_mask", "query", "labels"}
    S = task.max_sentences
    assert batch["story"].shape == (5, S, task.sentence_len) and batch["story_mask"].shape == (5, S)
    real = (batch["story"] != 0).any(-1)
    assert torch.equal(real, batch["story_mask"])
    assert all(task.vocab.words[i] in PLACES for i in batch["labels"].tolist())
    for sentences, question, answer, support in task.stories["train"][:30]:
        obj = question.split()[-1]
        assert any(obj in sentences[i] for i in support)
    counting = BabiCounting(n_train=100, n_valid=10, n_test=20)
    assert {s[2] for s in counting.stories["train"]} <= {"none", "one", "two", "three"}
    with pytest.raises(ValueError, match="max_sentences"):
        BabiSingle(min_sentences=5, max_sentences=3)


# --------------------------------------------------------------------------- NTM copy


def test_copy_batch_layout():
    bits = torch.randint(0, 2, (2, 3, 4)).float()
    b = copy_batch(bits)
    assert b["inputs"].shape == (2, 7, 5) and b["labels"].shape == (2, 7, 4)
    assert torch.equal(b["inputs"][:, :3, :4], bits) and torch.all(b["inputs"][:, 3, 4] == 1)
    assert torch.all(b["inputs"][:, 4:] == 0)  # nothing to read in the output phase
    assert torch.equal(b["labels"][:, 4:], bits)
    assert b["label_mask"].tolist()[0] == [False] * 4 + [True] * 3


def test_ntm_copy_task_and_evaluate():
    task = NTMCopy(width=4, min_len=2, max_len=5, eval_lengths=(5, 8), eval_size=6)
    a, b = task.get_batch("train", 3, 7), task.get_batch("train", 3, 7)
    assert torch.equal(a["inputs"], b["inputs"])
    assert 5 <= a["inputs"].shape[1] <= 11
    assert not torch.equal(next(task.eval_batches("test", 6))["labels"], next(task.eval_batches("valid", 6))["labels"])

    class Echo(torch.nn.Module):
        """Perfect copier: looks the answer up from the inputs."""

        def forward(self, inputs, labels=None, label_mask=None, need_weights=False):
            B, T, _ = inputs.shape
            L = (T - 1) // 2
            out = torch.full((B, T, 4), -5.0)
            out[:, L + 1 :] = inputs[:, :L, :4] * 10 - 5
            return ModelOutput(logits=out)

    metrics = task.evaluate(Echo())
    assert metrics == {"bit_errors@5": 0.0, "exact@5": 1.0, "bit_errors@8": 0.0, "exact@8": 1.0}
    with pytest.raises(ValueError, match="max_len"):
        NTMCopy(min_len=5, max_len=2)


# --------------------------------------------------------------------------- regression, digits


def test_nw_regression_leave_one_out():
    task = NWRegression(n_train=20, n_test=10)
    batch = task.get_batch("train", 20, 0)
    for b in range(20):
        own = (batch["keys"][b] == batch["x"][b]) & (batch["values"][b] == batch["labels"][b])
        assert not batch["mask"][b][own].any()  # a training query never sees itself
        assert batch["mask"][b].sum() == 19
    test = next(task.eval_batches("test", 100))
    assert test["mask"].all() and test["x"].shape == (10,)
    torch.testing.assert_close(test["x"], torch.arange(10) * 0.5)  # d2l's grid
    valid = next(task.eval_batches("valid", 100))
    torch.testing.assert_close(valid["x"], torch.arange(10) * 0.5 + 0.25)  # halfway: not the test points


def test_digits_fixture():
    images, digits = _fake_mnist(100)
    task = Digits(images=images, digits=digits)
    batch = task.get_batch("train", 4, 0)
    assert batch["images"].shape == (4, 1, 28, 28) and batch["images"].max() <= 1
    assert task.size("train") + task.size("valid") + task.size("test") == 100


# --------------------------------------------------------------------------- BBC News


ARTICLES = [(f"Headline {i}\n\nThe {c} story number {i} is here. Another sentence! And a third? " + "words " * i, c)
            for i, c in enumerate(["business", "tech", "sport", "politics", "entertainment"] * 6)]


def test_tokenize_sentences_and_words():
    assert tokenize("Ad sales boost\n\nProfits rose 76%. Shares fell! Why?") == [
        ["ad", "sales", "boost"], ["profits", "rose", "76"], ["shares", "fell"], ["why"]]


def test_bbc_task_on_fixture():
    task = BBCNews(articles=ARTICLES, max_sentences=3, max_words=5, min_count=1)
    batch = task.get_batch("train", 4, 0)
    assert batch["doc"].shape == (4, 3, 5) and batch["labels"].shape == (4,)
    assert task.vocab.words[:2] == ["<pad>", "<unk>"]
    first = task._splits["train"]["doc"][0]
    assert re.match(r"headline \d+", task.vocab.decode(first[0]))
    with pytest.raises(ValueError, match="classes"):
        BBCNews(articles=[("x", "weather")] * 10)


@pytest.mark.skipif(not is_bbc_cached(), reason="BBC News is not cached (qkv.tasks.bbc.fetch_bbc())")
def test_bbc_real_data():
    task = BBCNews(max_sentences=5, max_words=10)
    assert task.size("train") + task.size("valid") + task.size("test") == 2225


def test_karate_club():
    pytest.importorskip("networkx")
    from qkv.tasks.graphs import KarateClub
    task = KarateClub(labelled_per_class=3)
    batch = task.get_batch("train", 1, 0)
    assert batch["x"].shape == (34, 34) and batch["edge_index"].shape == (2, 156)
    assert int((batch["labels"] != -100).sum()) == 6
    assert {0, 33} <= set(task.nodes["train"].tolist())
    parts = [set(task.nodes[s].tolist()) for s in ("train", "valid", "test")]
    assert sum(map(len, parts)) == 34 and not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
