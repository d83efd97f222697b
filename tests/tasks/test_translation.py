"""bible-en-es on a fake SWORD module pair (and on the real Bibles when cached)."""

import pytest
import torch

from qkv.tasks import build_task, data

from conftest import N_FAKE_VERSES


@pytest.fixture
def bible(fake_cache):
    return build_task("bible-en-es", cache_dir=fake_cache)


def test_pairs_and_splits(bible):
    splits = {s: bible.eval_pairs(s) for s in ("train", "valid", "test")}
    assert sum(map(len, splits.values())) == N_FAKE_VERSES
    assert all(splits.values())
    sources = [set(p[0] for p in pairs) for pairs in splits.values()]
    assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])
    en, es = splits["train"][0]
    assert en.endswith(" is here.") and es.endswith(" está aquí.")
    assert bible.vocab.decode(bible.vocab.encode(es)) == es


def test_max_chars_filters_both_sides(fake_cache):
    short = build_task("bible-en-es", max_chars=17, cache_dir=fake_cache)  # "Gen 100 está aquí." is 18
    pairs = [p for s in ("train", "valid", "test") for p in short.eval_pairs(s)]
    assert len(pairs) == 100 + 10 and all(len(en) <= 17 and len(es) <= 17 for en, es in pairs)
    with pytest.raises(ValueError, match="max_chars"):
        build_task("bible-en-es", max_chars=0, cache_dir=fake_cache)


def test_epoch_batches_disjoint_across_ranks(bible):
    n = len(bible.eval_pairs("train"))
    r0 = bible._train_pairs("train", 4, 2, 0, 0, 2)
    r1 = bible._train_pairs("train", 4, 2, 0, 1, 2)
    assert not set(r0) & set(r1)
    one_epoch = [p for step in range(n // 4) for p in bible._train_pairs("train", 4, step, 0, 0, 1)]
    assert len(set(one_epoch)) == len(one_epoch)  # no repeats within an epoch
    a = bible.get_batch("train", 4, 7, seed=1)
    assert all(torch.equal(a[k], bible.get_batch("train", 4, 7, seed=1)[k]) for k in a)


def test_evaluate_bleu_with_oracle_and_wrong_models(bible, models):
    answers = dict(bible.eval_pairs("test"))
    good = bible.evaluate(models.oracle(bible, answers, bible.vocab.size))
    assert good["bleu"] == pytest.approx(100.0) and good["exact_match"] == 1.0 and good["token_accuracy"] == 1.0
    bad = bible.evaluate(models.wrong(bible), split="valid", max_examples=3)
    assert bad["bleu"] == 0.0 and bad["exact_match"] == 0.0 and bad["examples"] == 3


@pytest.mark.skipif(not data.is_cached("bible"), reason="run `qkv data fetch bible`")
def test_real_bible_task():
    task = build_task("bible-en-es")
    sizes = {s: len(task.eval_pairs(s)) for s in ("train", "valid", "test")}
    assert 10_000 < sum(sizes.values()) <= 10_212 and min(sizes["valid"], sizes["test"]) > 400
    train = {en for en, _ in task.eval_pairs("train")}
    assert not any(en in train for en, _ in task.eval_pairs("test") + task.eval_pairs("valid"))
    assert task.vocab.size < 100


def test_max_target_len_is_the_longest_kept_target(fake_cache):
    short = build_task("bible-en-es", max_chars=17, cache_dir=fake_cache)
    longest = max(len(es) for s in ("train", "valid", "test") for _, es in short.eval_pairs(s))
    assert longest <= short.max_target_len == 17
