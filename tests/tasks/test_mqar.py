"""mqar (Zoology's multi-query associative recall): the sequences, the answers, determinism,
disjoint splits, the recall metric and bad options."""

import re

import pytest
import torch

from qkv.tasks import build_task
from qkv.tasks.base import IGNORE_INDEX, split_of


def _task(**kw):
    return build_task("mqar", **{"vocab_size": 16, "n_pairs": 4, "eval_size": 40, **kw})


def _pairs(task, row):
    """The listed pairs ``{key: value}``, the asked keys and the gap, read back from the text."""
    words = task.vocab.decode(row).split()
    listed = dict(zip(words[0:2 * task.n_pairs:2], words[1:2 * task.n_pairs:2]))
    queries = words[task.seq_len - 2 * task.n_queries:]
    gap = words[2 * task.n_pairs:task.seq_len - 2 * task.n_queries]
    return listed, queries, gap


@pytest.mark.parametrize("options", [{}, {"n_queries": 2, "seq_len": 20}])
def test_every_asked_key_is_answered_by_its_value_and_only_there(options):
    task = _task(**options)
    batch = task.get_batch("train", 8, 0)
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == labels.shape == (8, task.seq_len)
    for row, lab in zip(ids, labels):
        listed, queries, gap = _pairs(task, row)
        assert len(listed) == task.n_pairs and all(k.startswith("k") for k in listed)  # distinct keys
        assert all(v.startswith("v") for v in listed.values())
        assert gap == ["_"] * (task.seq_len - 2 * (task.n_pairs + task.n_queries))
        asked = queries[0::2]
        assert len(set(asked)) == task.n_queries and queries[1::2] == [listed[k] for k in asked]
        answered = (lab != IGNORE_INDEX).nonzero().flatten().tolist()
        assert answered == list(range(task.seq_len - 2 * task.n_queries, task.seq_len, 2))  # the asked keys
        for t in answered:  # the label is the next token: the value of the key at t
            assert task.vocab.decode([int(lab[t])]) == listed[task.vocab.decode([int(row[t])])]


def test_batches_are_a_pure_function_of_the_step():
    a = _task().get_batch("train", 8, 3, seed=1)
    assert all(torch.equal(a[k], v) for k, v in _task().get_batch("train", 8, 3, seed=1).items())
    for other in (_task().get_batch("train", 8, 4, seed=1), _task().get_batch("train", 8, 3, seed=2),
                  _task().get_batch("train", 8, 3, seed=1, rank=1, world_size=2)):
        assert not torch.equal(other["input_ids"], a["input_ids"])


def test_splits_never_share_a_sequence():
    task = _task()
    held = {s: {tuple(r) for r in task.eval_rows(s)} for s in ("valid", "test")}
    assert len(task.eval_rows("test")) == 40 and not held["valid"] & held["test"]
    train = {tuple(r.tolist()) for step in range(5) for r in task.get_batch("train", 32, step)["input_ids"]}
    assert not train & (held["valid"] | held["test"])
    assert all(split_of(" ".join(map(str, r))) == "test" for r in held["test"])


class _Oracle(torch.nn.Module):
    """Puts its logit on the value listed for the key at each position; ``wrong``: on ``<pad>``."""

    def __init__(self, task, wrong=False):
        super().__init__()
        self.task, self.wrong = task, wrong
        self.p = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, **kw):
        B, L = input_ids.shape
        logits = torch.zeros(B, L, self.task.vocab.size)
        for b in range(B):
            listed = dict(zip(input_ids[b, 0:2 * self.task.n_pairs:2].tolist(), input_ids[b, 1:2 * self.task.n_pairs:2].tolist()))
            for t in range(L):
                value = listed.get(int(input_ids[b, t]))
                if value is not None:
                    logits[b, t, self.task.vocab.pad_id if self.wrong else value] = 10.0
        return type("Out", (), {"logits": logits})()


def test_recall_is_the_fraction_of_answers_right():
    task = _task()
    right = task.evaluate(_Oracle(task), "test")
    assert right["accuracy"] == 1.0 and right["exact"] == 1.0 and right["answers"] == 40 * task.n_queries
    assert right["loss"] < 1e-3
    wrong = task.evaluate(_Oracle(task, wrong=True), "test")
    assert wrong["accuracy"] == 0.0 and wrong["exact"] == 0.0 and wrong["loss"] > 5


def test_model_hints_and_examples():
    task = _task(seq_len=70)
    hints = task.model_hints()
    assert hints["vocab_size"] == task.vocab.size == 2 + 16 + 1 and hints["max_len"] == 70 and hints["head"] == "lm"
    assert len(task.examples(2)[0]["text"].split()) == 70


@pytest.mark.parametrize("options, message", [
    ({"n_pairs": 9}, "n_pairs must be <= vocab_size // 2 = 8"),
    ({"n_queries": 5}, "n_queries must be <= n_pairs = 4"),
    ({"seq_len": 15}, "seq_len must be >= 2 (n_pairs + n_queries) = 16"),
    ({"vocab_size": 1}, "vocab_size must be >= 2"),
    ({"eval_size": 0}, "eval_size must be >= 1"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _task(**options)


def test_bad_types_and_batch_arguments_are_refused():
    with pytest.raises(TypeError, match="n_pairs must be an int"):
        _task(n_pairs=2.0)
    with pytest.raises(ValueError, match="split must be one of"):
        _task().get_batch("dev", 2, 0)
