"""``Task.evaluate`` is one template: a task gives ``score_batch`` and ``summarize``; the template
adds the scores up over the held-out batches (numbers add, lists concatenate), moves tensors to the
model's device, runs in eval mode without gradients (the mode given back) and, on a ``stream``
task, hands a ``carries_state`` model's state from one batch to the next."""

from types import SimpleNamespace

import torch

from qkv.tasks.base import Task


class Counting(Task):
    kind = "toy"
    eval_batch_size = 2

    def __init__(self, stream=False):
        self.stream = stream

    def eval_batches(self, split, batch_size, max_examples=None):
        n = 5 if max_examples is None else max_examples
        for first in range(0, n, batch_size):
            yield {"x": torch.arange(first, min(first + batch_size, n), dtype=torch.float32)}

    def eval_inputs(self, split, batch_size, max_examples=None):
        for batch in self.eval_batches(split, batch_size, max_examples):
            yield {**batch, "names": [f"{split}{int(v)}" for v in batch["x"]]}

    def score_batch(self, model, batch):
        names = batch.pop("names")
        out = model(**batch)
        return {"sum": out.y.sum().item(), "n": len(names), "batches": 1, "names": names, "state": getattr(out, "state", None)}

    def summarize(self, totals):
        return {"mean": totals["sum"] / totals["n"], "names": totals["names"], "batches": totals["batches"]}


calls = []


class Doubler(torch.nn.Module):
    carries_state = False

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x, state=None, return_state=False):
        assert not self.training and not torch.is_grad_enabled()
        calls.append(state)
        y = self.w * x
        return SimpleNamespace(y=y, state=(len(calls) if return_state else None))


def test_the_template_adds_the_scores_of_every_batch():
    calls.clear()
    model = Doubler().train()
    metrics = Counting().evaluate(model, "valid")
    assert metrics == {"mean": 4.0, "names": ["valid0", "valid1", "valid2", "valid3", "valid4"], "batches": 3}
    assert model.training  # given back
    assert calls == [None, None, None]  # not a stream task: no state passed


def test_batch_size_and_max_examples_reach_the_batches():
    calls.clear()
    metrics = Counting().evaluate(Doubler(), "test", max_examples=4, batch_size=4)
    assert metrics["batches"] == 1 and metrics["names"] == ["test0", "test1", "test2", "test3"]


def test_a_stream_task_passes_a_carrying_model_its_state():
    calls.clear()
    model = Doubler().eval()
    model.carries_state = True
    Counting(stream=True).evaluate(model, "test")
    assert calls == [None, 1, 2]  # each batch gets the state the previous one left
    assert not model.training
