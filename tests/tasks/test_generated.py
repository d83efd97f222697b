"""Generated seq2seq tasks: correctness of pairs, determinism, disjoint splits, metrics."""

import datetime

import pytest
import torch

from qkv import registry
from qkv.tasks import build_task, list_tasks
from qkv.tasks.base import split_of
from qkv.tasks.generated import DATE_FORMATS, _parts

GENERATED = ["copy", "reverse", "sort", "addition", "dates"]


@pytest.mark.parametrize("name", GENERATED)
def test_batches_are_a_pure_function_of_the_step(name):
    task = build_task(name, eval_size=50)
    a = task.get_batch("train", 8, 3, seed=1)
    b = build_task(name, eval_size=50).get_batch("train", 8, 3, seed=1)
    assert all(torch.equal(a[k], b[k]) for k in a)

    def sources(batch):
        return [task.vocab.decode(ids[mask]) for ids, mask in zip(batch["src_ids"], batch["src_mask"])]

    for other in (task.get_batch("train", 8, 4, seed=1),  # another step
                  task.get_batch("train", 8, 3, seed=1, rank=1, world_size=2),  # another rank
                  task.get_batch("train", 8, 3, seed=2)):  # another seed
        assert sources(other) != sources(a)


@pytest.mark.parametrize("name", GENERATED)
def test_batch_layout(name):
    task = build_task(name, eval_size=50)
    batch = task.get_batch("train", 6, 0)
    v = task.vocab
    assert set(batch) == {"src_ids", "src_mask", "tgt_ids", "labels"}
    B, S = batch["src_ids"].shape
    assert B == 6 and batch["src_mask"].dtype == torch.bool and batch["src_mask"].shape == (B, S)
    assert (batch["src_ids"][~batch["src_mask"]] == v.pad_id).all()
    assert (batch["tgt_ids"][:, 0] == v.bos_id).all()
    keep = batch["labels"] != -100
    # labels are the decoder input shifted left, ending in EOS
    body = (keep & (batch["labels"] != v.eos_id))[:, :-1]
    assert torch.equal(batch["labels"][:, :-1][body], batch["tgt_ids"][:, 1:][body])
    assert (batch["labels"][keep].eq(v.eos_id).sum()) == B
    for row_src, row_mask, row_lab in zip(batch["src_ids"], batch["src_mask"], batch["labels"]):
        assert split_of(v.decode(row_src[row_mask])) == "train"


@pytest.mark.parametrize("name", GENERATED)
def test_splits_never_overlap(name):
    task = build_task(name, eval_size=200)
    sources = {s: {p[0] for p in task.eval_pairs(s)} for s in ("train", "valid", "test")}
    assert sources["valid"] and sources["test"]
    assert not sources["train"] & sources["valid"] and not sources["train"] & sources["test"]
    assert not sources["valid"] & sources["test"]
    train = {task.vocab.decode(r[m]) for step in range(5) for r, m in zip(*[task.get_batch("train", 32, step)[k] for k in ("src_ids", "src_mask")])}
    assert not train & (sources["valid"] | sources["test"])


def test_pairs_are_right():
    rev = build_task("reverse", min_len=3, max_len=5, alphabet="letters", eval_size=50)
    for s, t in rev.eval_pairs("valid"):
        assert t == s[::-1] and 3 <= len(s) <= 5 and set(s) <= set("abcdefghijklmnopqrstuvwxyz")
    for s, t in build_task("sort", eval_size=50).eval_pairs("test"):
        assert t == "".join(sorted(s))
    for s, t in build_task("copy", alphabet="xyz", eval_size=20).eval_pairs("train"):
        assert s == t and set(s) <= set("xyz")
    for s, t in build_task("addition", min_len=2, max_len=3, eval_size=50).eval_pairs("test"):
        a, b = s.split("+")
        assert int(t) == int(a) + int(b) and 2 <= len(a) <= 3 and not a.startswith("0")
    for s, t in build_task("dates", min_year=1950, max_year=1960, eval_size=50).eval_pairs("test"):
        d = datetime.date.fromisoformat(t)
        assert 1950 <= d.year <= 1960 and str(d.year) in s


def test_date_formats_are_unambiguous_and_in_vocab():
    task = build_task("dates", eval_size=10)
    day = datetime.date(1987, 3, 14)
    rendered = {example: render(_parts(day)) for example, render in DATE_FORMATS}
    assert all(example == text for example, text in rendered.items())
    seen = {}
    for ordinal in range(day.toordinal(), day.toordinal() + 800):
        d = datetime.date.fromordinal(ordinal)
        for _, render in DATE_FORMATS:
            text = render(_parts(d))
            assert task.vocab.unk_id not in task.vocab.encode(text)
            assert seen.setdefault(text, d) == d


def test_options_are_checked():
    with pytest.raises(TypeError, match="unknown argument"):
        build_task("reverse", length=3)
    with pytest.raises(ValueError, match="max_len"):
        build_task("copy", min_len=5, max_len=2)
    with pytest.raises(ValueError, match="alphabet"):
        build_task("sort", alphabet="a")
    with pytest.raises(ValueError, match="min_year"):
        build_task("dates", min_year=2000, max_year=1999)
    task = build_task("copy", eval_size=10)
    with pytest.raises(ValueError, match="split"):
        task.get_batch("dev", 2, 0)
    with pytest.raises(ValueError, match="rank"):
        task.get_batch("train", 2, 0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        task.get_batch("train", 0, 0)


def test_tiny_source_space_still_splits():
    task = build_task("copy", min_len=1, max_len=2, eval_size=1000)
    sizes = [len(task.eval_pairs(s)) for s in ("train", "valid", "test")]
    assert sum(sizes) == 110  # every string of 1-2 digits, each in exactly one split


@pytest.mark.parametrize("name", GENERATED)
def test_evaluate_oracle_and_wrong_models(name, models):
    task = build_task(name, eval_size=40)
    answers = dict(task.eval_pairs("test"))
    good = task.evaluate(models.oracle(task, answers, task.vocab.size), split="test")
    assert good["exact_match"] == 1.0 and good["token_accuracy"] == 1.0 and good["examples"] == 40
    bad = task.evaluate(models.wrong(task), split="test", max_examples=10)
    assert bad["exact_match"] == 0.0 and bad["examples"] == 10
    assert bad["loss"] == pytest.approx(torch.log(torch.tensor(float(task.vocab.size))).item())


def test_registry_and_listing():
    names = dict(list_tasks())
    for name in GENERATED + ["shakespeare-char", "enwiki-bytes", "bible-en-es"]:
        assert name in names and names[name]
        assert registry.lookup("task", name).kind in {"lm", "seq2seq"}
    examples = build_task("addition", eval_size=5).examples(3)
    assert len(examples) == 3 and all("+" in e["source"] for e in examples)


@pytest.mark.parametrize("name,options,bound", [
    ("dates", {}, 10), ("dates", {"min_year": 1, "max_year": 30}, 10), ("reverse", {"max_len": 6}, 6),
    ("copy", {"max_len": 3}, 3), ("sort", {"max_len": 4}, 4), ("addition", {"max_len": 2}, 3),
])
def test_max_target_len_bounds_every_target(name, options, bound):
    """``qkv translate`` and ``qkv viz`` stop generating at ``max_target_len`` (+ ``<eos>``): the
    bound holds for every target and is reached."""
    task = build_task(name, eval_size=300, **options)
    assert task.max_target_len == bound
    lengths = [len(task.vocab.encode(t)) for split in ("train", "valid", "test") for _, t in task.eval_pairs(split)]
    lengths += [len(task.vocab.encode(t)) for _, t in task._train_pairs("train", 200, 0, 0, 0, 1)]
    assert max(lengths) == bound
