"""The Long Range Arena tasks (qkv.tasks.lra): ListOps labels against an evaluator written here
(recursive descent, its own operators), Pathfinder labels against a flood fill of the drawn image,
and every task's batches as a pure function of (seed, split, step, rank)."""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest
import torch

from qkv.tasks import build_task
from qkv.tasks.lra import ListOps, Pathfinder, listops_expression, listops_value, pathfinder_image

# ------------------------------------------------------------------------------------- ListOps


def evaluate(text: str):
    """Value, tree depth (a digit is depth 1) and widest operator of an expression, by recursive
    descent over its tokens — independent of the generator and of listops_value."""
    tokens = text.split()
    pos = 0

    def expr():
        nonlocal pos
        token = tokens[pos]
        pos += 1
        if len(token) == 1 and token in "0123456789":
            return int(token), 1, 0
        assert token in ("[MAX", "[MIN", "[MED", "[SM"), token
        args, depth, widest = [], 0, 0
        while tokens[pos] != "]":
            value, d, w = expr()
            args.append(value)
            depth, widest = max(depth, d), max(widest, w)
        pos += 1
        ordered = sorted(args)
        n = len(ordered)
        if token == "[MAX":
            value = ordered[-1]
        elif token == "[MIN":
            value = ordered[0]
        elif token == "[MED":  # integer part of the median
            value = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) // 2
        else:
            value = 0
            for a in args:
                value = (value + a) % 10
        return value, depth + 1, max(widest, n)

    result = expr()
    assert pos == len(tokens), "trailing tokens"
    return result


@pytest.mark.parametrize("text, value", [
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[MED 1 2 3 4 ]", 2),  # median 2.5 -> 2
    ("[MED 3 1 2 ]", 2),
    ("[SM 5 6 [MAX 9 1 ] ]", 0),  # 5 + 6 + 9 = 20
    ("[MIN 3 [MED 8 9 ] ]", 3),
    ("[SM [SM 9 9 ] [MIN 7 8 ] ]", 5),  # 8 + 7 = 15
])
def test_listops_value_of_written_expressions(text, value):
    assert listops_value(text) == value
    assert evaluate(text)[0] == value


@pytest.mark.parametrize("options", [dict(min_len=20, max_len=120, max_depth=5, max_args=4), {}])
def test_listops_labels_match_an_independent_evaluator(options):
    task = ListOps(eval_size=30, **options)
    examples = task.examples(30) + [{"input": t, "label": v} for t, v in task._held_out("test", 30)]
    for ex in examples:
        value, depth, widest = evaluate(ex["input"])
        assert value == ex["label"], ex["input"][:80]
        assert task.min_len <= len(ex["input"].split()) <= task.max_len
        assert depth <= task.max_depth and 2 <= widest <= task.max_args
    assert len({ex["label"] for ex in examples}) > 3  # not one constant value


def test_listops_expression_respects_max_len():
    rng = random.Random(0)
    lengths = [len(e[0]) for e in (listops_expression(rng, max_len=40) for _ in range(500)) if e is not None]
    assert lengths and max(lengths) <= 40


def test_listops_batches_pad_to_max_len_and_keep_or_drop_brackets():
    kept = ListOps(min_len=10, max_len=60, max_depth=4, eval_size=4)
    dropped = ListOps(min_len=10, max_len=60, max_depth=4, eval_size=4, brackets=False)
    text, _ = kept._held_out("test", 1)[0]
    assert dropped._held_out("test", 1)[0][0] == text  # the same expressions, tokenised two ways
    a, b = next(kept.eval_batches("test", 1)), next(dropped.eval_batches("test", 1))
    assert a["input_ids"].shape == b["input_ids"].shape == (1, 60)
    words_a = [kept.vocab.words[i] for i in a["input_ids"][0][a["attention_mask"][0]].tolist()]
    words_b = [dropped.vocab.words[i] for i in b["input_ids"][0][b["attention_mask"][0]].tolist()]
    assert words_a == text.split()
    assert words_b == [t.lstrip("[") for t in text.split() if t != "]"]  # LRA's release: MAX 2 9 MIN 4 7 0
    assert (a["input_ids"][0][~a["attention_mask"][0]] == kept.vocab.pad_id).all()


def test_listops_rejects_bad_options():
    with pytest.raises(ValueError, match="min_len"):
        ListOps(min_len=100, max_len=50)
    with pytest.raises(ValueError, match="max_args"):
        ListOps(max_args=1)
    with pytest.raises(TypeError, match="brackets"):
        ListOps(brackets="yes")


# ------------------------------------------------------------------------------------- Pathfinder


def connected(image: np.ndarray, a, b, radius: int) -> bool:
    """Flood fill over the lit pixels from ``a``: two lit pixels are neighbours when their
    Chebyshev distance is at most ``radius`` (a dash's gap); does it reach ``b``?"""
    lit = image > 0
    H, W = lit.shape
    seen = np.zeros_like(lit)
    seen[a] = True
    queue = deque([a])
    while queue:
        y, x = queue.popleft()
        for dy in range(-radius, radius + 1):
            for dx in range(-radius, radius + 1):
                v, u = y + dy, x + dx
                if 0 <= v < H and 0 <= u < W and lit[v, u] and not seen[v, u]:
                    seen[v, u] = True
                    queue.append((v, u))
    return bool(seen[b])


@pytest.mark.parametrize("size, contour_length, n_distractors", [(32, 14, 3), (32, 6, 3), (24, 6, 2)])
def test_pathfinder_labels_match_a_flood_fill_of_the_image(size, contour_length, n_distractors):
    rng = np.random.default_rng(size + contour_length)
    labels = []
    for _ in range(24):
        drawn = pathfinder_image(rng, size=size, contour_length=contour_length, n_distractors=n_distractors)
        a, b = drawn.dots
        for y, x in drawn.dots:  # each dot is a lit 3x3 square
            assert (drawn.image[y - 1:y + 2, x - 1:x + 2] == 255).all()
        assert connected(drawn.image, a, b, drawn.link_radius) == (drawn.label == 1)
        labels.append(drawn.label)
    assert 0 < sum(labels) < len(labels)


def test_pathfinder_negatives_are_not_touching_paths():
    """A negative's dots stay apart even when neighbours reach one pixel further than the gaps."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        drawn = pathfinder_image(rng, label=0)
        assert not connected(drawn.image, *drawn.dots, drawn.link_radius)


def test_pathfinder_task_batches_are_the_drawn_images():
    task = Pathfinder(contour_length=6, eval_size=4)
    batch = next(task.eval_batches("test", 4))
    assert batch["input_ids"].shape == (4, 1024) and batch["input_ids"].dtype == torch.long
    assert set(batch["input_ids"].unique().tolist()) <= {0, 255}
    image, label = task._held_out("test", 1)[0]
    assert torch.equal(batch["input_ids"][0], torch.from_numpy(image.reshape(-1).astype(np.int64)))
    assert int(batch["labels"][0]) == label
    assert task.model_hints() == {"vocab_size": 256, "n_classes": 2, "num_labels": 2, "max_len": 1024, "image_size": (32, 32),
                                  "head": "classification"}
    with pytest.raises(ValueError, match="contour_length"):
        Pathfinder(contour_length=1)


# ------------------------------------------------------------------------------------- determinism

CLASSES = ("business", "entertainment", "politics", "sport", "tech")


def fake_articles(n: int = 60):
    rng = random.Random(0)
    words = ["market", "film", "vote", "match", "phone", "the", "a", "of", "and", "growth"]
    return [(" ".join(rng.choice(words) for _ in range(rng.randint(20, 80))), CLASSES[i % 5]) for i in range(n)]


def fake_images(n: int = 60):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 28, 28), generator=g, dtype=torch.uint8), torch.arange(n) % 10


BUILDERS = {
    "listops": lambda: build_task("listops", min_len=20, max_len=80, max_depth=5, eval_size=8),
    "pathfinder": lambda: build_task("pathfinder", contour_length=6, eval_size=8),
    "bbc-bytes": lambda: build_task("bbc-bytes", max_len=96, articles=fake_articles()),
    "bbc-match": lambda: build_task("bbc-match", max_len=96, eval_size=8, articles=fake_articles()),
    "bbc-match (words)": lambda: build_task("bbc-match", max_len=24, eval_size=8, unit="words", articles=fake_articles()),
    "fashion-mnist-seq": lambda: build_task("fashion-mnist-seq", size=30, images=fake_images()[0],
                                            labels=fake_images()[1]),
}


def _equal(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_task_is_a_pure_function_of_seed_split_step_rank(name):
    first, second = BUILDERS[name](), BUILDERS[name]()
    batch = first.get_batch("train", 4, 3, seed=1, rank=1, world_size=2)
    assert _equal(batch, second.get_batch("train", 4, 3, seed=1, rank=1, world_size=2))
    assert _equal(batch, first.get_batch("train", 4, 3, seed=1, rank=1, world_size=2))  # no hidden state
    for other in (dict(step=4, seed=1, rank=1), dict(step=3, seed=2, rank=1), dict(step=3, seed=1, rank=0)):
        kw = dict(other)
        assert not _equal(batch, first.get_batch("train", 4, kw.pop("step"), world_size=2, **kw))
    held = list(first.eval_batches("test", 3, max_examples=5))
    again = list(second.eval_batches("test", 2, max_examples=5))
    assert torch.equal(torch.cat([b["labels"] for b in held]), torch.cat([b["labels"] for b in again]))
    assert torch.equal(torch.cat([b["input_ids"] for b in held]), torch.cat([b["input_ids"] for b in again]))
    assert sum(len(b["labels"]) for b in held) == 5
    assert batch["input_ids"].shape == (4, first.max_len) and batch["labels"].max() < first.n_classes
    assert first.examples(2) and list(first.examples(2)[0]) [:1] == ["input"]


def test_bbc_match_pairs_are_labelled_by_category():
    task = BUILDERS["bbc-match"]()
    by_text = {text.encode()[:96]: klass for text, klass in fake_articles()}
    batch = task.get_batch("train", 32, 0)
    for a, b, y, ma, mb in zip(batch["input_ids"], batch["input_ids_2"], batch["labels"], batch["attention_mask"],
                               batch["attention_mask_2"]):
        first, second = bytes(a[ma].tolist()), bytes(b[mb].tolist())
        assert first != second and (by_text[first] == by_text[second]) == bool(y)
    assert 0 < int(batch["labels"].sum()) < 32


def test_bbc_match_in_words_reads_the_same_pairs_as_words_of_the_training_vocabulary():
    articles = fake_articles()
    by_bytes = build_task("bbc-match", max_len=4096, eval_size=8, articles=articles)
    by_words = build_task("bbc-match", max_len=4096, eval_size=8, unit="words", articles=articles)
    assert by_words.vocab_size == by_words.vocab.size == by_words.model_hints()["vocab_size"] < 20
    first, again = by_bytes.get_batch("train", 16, 2, seed=3), by_words.get_batch("train", 16, 2, seed=3)
    assert torch.equal(first["labels"], again["labels"])  # the same pairs, read another way
    for ids, mask, row, row_mask in zip(again["input_ids"], again["attention_mask"], first["input_ids"],
                                        first["attention_mask"]):
        text = bytes(row[row_mask].tolist()).decode()
        assert by_words.vocab.decode(ids[mask].tolist()) == text  # every word of the article, in order
    assert int(again["attention_mask"].sum(1).max()) < 100  # a word per id, not a byte
    assert by_words.examples(1)[0]["input"].split()[0] in by_words.vocab.words
    # The vocabulary is the training split's words seen MIN_COUNT (3) times; the rest read as <unk>.
    rare = build_task("bbc-match", eval_size=8, unit="words", articles=articles + [("zebra zebra market", CLASSES[0])])
    assert "zebra" not in rare.vocab.words and rare.vocab.encode("zebra market") == [rare.vocab.unk_id,
                                                                                     rare.vocab.words.index("market")]
    held = by_words._parts["test"][0]  # a word only a held-out article has is not in the vocabulary
    text, klass = articles[held]
    leaky = build_task("bbc-match", eval_size=8, unit="words",
                       articles=articles[:held] + [("quokka " * 5 + text, klass)] + articles[held + 1:])
    assert "quokka" not in leaky.vocab.words


@pytest.mark.parametrize("unit", ["chars", "", "WORDS", " words", None, 1, True, ["words"], b"words"])
def test_bbc_match_refuses_a_hostile_unit_in_one_line_naming_it(unit):
    with pytest.raises(ValueError) as info:
        build_task("bbc-match", unit=unit, articles=fake_articles())
    message = str(info.value)
    assert message == f"unit must be one of ('bytes', 'words'), got {unit!r}" and "\n" not in message


def test_data_tasks_keep_the_splits_apart():
    task = BUILDERS["bbc-bytes"]()
    seen = {split: {bytes(row[m].tolist()) for b in task.eval_batches(split, 16) for row, m in
                    zip(b["input_ids"], b["attention_mask"])} for split in ("train", "valid", "test")}
    assert not (seen["train"] & seen["test"]) and not (seen["valid"] & seen["test"])


def test_pathfinder_cache_keeps_batches_the_same_and_bounded():
    cached, uncached = Pathfinder(contour_length=6, cache_images=8), Pathfinder(contour_length=6, cache_images=0)
    for step in (0, 1, 2, 0):
        assert _equal(cached.get_batch("train", 4, step), uncached.get_batch("train", 4, step))
    assert cached._cached <= 8 and uncached._cached == 0


def test_pathfinder_fixed_training_set_cycles_through_its_images():
    """train_size=N: the training batches read a fixed set of N images, each image once per epoch in a
    seeded order (another seed: another order, the same images); the held-out sets do not change."""
    task = Pathfinder(size=16, contour_length=3, n_distractors=1, distractor_length=2, eval_size=4, train_size=12)
    stream = Pathfinder(size=16, contour_length=3, n_distractors=1, distractor_length=2, eval_size=4)

    def rows(batch):
        return [tuple(r.tolist()) for r in batch["input_ids"]]

    epoch = [rows(task.get_batch("train", 4, step, seed=1)) for step in range(3)]
    flat = [r for b in epoch for r in b]
    assert len(set(flat)) == 12  # every image of the set once in the first epoch
    second = [r for step in range(3, 6) for r in rows(task.get_batch("train", 4, step, seed=1))]
    assert set(second) == set(flat) and second != flat  # the same images, a new order
    other = [r for step in range(3) for r in rows(task.get_batch("train", 4, step, seed=2))]
    assert set(other) == set(flat) and other != flat
    assert _equal(task.get_batch("train", 4, 1, seed=1), Pathfinder(
        size=16, contour_length=3, n_distractors=1, distractor_length=2, train_size=12).get_batch("train", 4, 1, seed=1))
    held = next(task.eval_batches("test", 4))
    assert _equal(held, next(stream.eval_batches("test", 4)))
    assert not set(rows(held)) & set(flat)  # the test images are not in the training set
    with pytest.raises(ValueError, match="train_size"):
        Pathfinder(train_size=0)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "100", True])
def test_pathfinder_train_size_refuses_what_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match=r"train_size must be an int >= 1, got"):
        Pathfinder(train_size=bad)


def test_pathfinder_fixed_set_split_over_ranks_is_the_single_process_batch():
    """Under DDP (world_size 2) the two ranks' batches at a step are together the one batch a single
    process reads at that step: the same images of the fixed set, none read twice, none skipped."""
    task = Pathfinder(size=16, contour_length=3, n_distractors=1, distractor_length=2, train_size=10)
    rows = lambda b: sorted(tuple(r.tolist()) for r in b["input_ids"])  # noqa: E731
    for step in (0, 1, 2):  # step 2 crosses into the second epoch of 10 images
        whole = rows(task.get_batch("train", 4, step, seed=3))
        split = rows(task.get_batch("train", 2, step, seed=3, rank=0, world_size=2)) + \
            rows(task.get_batch("train", 2, step, seed=3, rank=1, world_size=2))
        assert sorted(split) == whole
