"""pointer-sort, convex-hull (exact monotone chain, metrics) and digit-captions."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import torch

from qkv.models.base import ModelOutput
from qkv.tasks.pointer_tasks import ConvexHullTask, PointerSortTask, convex_hull, is_simple_polygon, polygon_area


def brute_force_hull(points):
    """Vertices j with some edge (i, j) having every other point strictly to its left."""
    n = len(points)
    vertices = set()
    for i, j in itertools.permutations(range(n), 2):
        (x1, y1), (x2, y2) = points[i], points[j]
        if all((x2 - x1) * (y - y1) - (y2 - y1) * (x - x1) > 0 for k, (x, y) in enumerate(points) if k not in (i, j)):
            vertices.update((i, j))
    return vertices


def test_convex_hull_is_exact_and_counter_clockwise():
    rng = random.Random(0)
    for _ in range(50):
        pts = [(rng.random(), rng.random()) for _ in range(rng.randint(3, 12))]
        hull = convex_hull(pts)
        assert set(hull) == brute_force_hull(pts)
        assert hull[0] == min(hull)
        ring = [pts[i] for i in hull]
        signed = sum(ring[i][0] * ring[(i + 1) % len(ring)][1] - ring[(i + 1) % len(ring)][0] * ring[i][1] for i in range(len(ring)))
        assert signed > 0  # counter-clockwise
    square = [(0, 0), (1, 0), (0.5, 0), (1, 1), (0, 1), (0.5, 0.5)]
    assert convex_hull(square) == [0, 1, 3, 4]  # collinear (0.5, 0) and the interior point dropped


def test_polygon_helpers():
    assert polygon_area([(0, 0), (1, 0), (1, 1), (0, 1)]) == 1.0
    assert is_simple_polygon([(0, 0), (1, 0), (1, 1), (0, 1)])
    assert not is_simple_polygon([(0, 0), (1, 1), (1, 0), (0, 1)])  # bow tie
    assert not is_simple_polygon([(0, 0), (1, 1)])


class Oracle(torch.nn.Module):
    """Points at the right answer (for the metric tests)."""

    def __init__(self, task, corrupt=False):
        super().__init__()
        self.task, self.corrupt = task, corrupt
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, inputs, labels=None, input_mask=None):
        return ModelOutput(loss=self.w * 0)

    def generate(self, inputs, input_mask=None):
        n = inputs.shape[1]
        rows = []
        for b in range(inputs.shape[0]):
            m = int(input_mask[b].sum())
            pts = inputs[b, :m].tolist()
            target = convex_hull(pts) if isinstance(self.task, ConvexHullTask) else sorted(range(m), key=lambda i: pts[i][0])
            if self.corrupt:
                target = target[:-1]
            rows.append(target + [n] + [-1] * (n + 1 - len(target)))
        return torch.tensor([r[: n + 1] for r in rows])


def test_pointer_tasks_batches_and_metrics():
    for task in (PointerSortTask(eval_size=40), ConvexHullTask(eval_size=40)):
        b1 = task.get_batch("train", 8, 3, seed=1)
        b2 = task.get_batch("train", 8, 3, seed=1)
        for k in b1:
            torch.testing.assert_close(b1[k], b2[k])
        assert not torch.equal(b1["inputs"], task.get_batch("train", 8, 4, seed=1)["inputs"])
        n = b1["inputs"].shape[1]
        assert b1["inputs"].shape[-1] == task.d_input
        for row, mask in zip(b1["labels"], b1["input_mask"]):
            real = row[row != -100].tolist()
            assert real[-1] == n and all(0 <= i < int(mask.sum()) for i in real[:-1])
        if isinstance(task, PointerSortTask):
            for x, row in zip(b1["inputs"], b1["labels"]):
                idx = [i for i in row.tolist() if 0 <= i < n]
                assert x[idx, 0].tolist() == sorted(x[idx, 0].tolist())
        perfect = task.evaluate(Oracle(task), "test")
        assert perfect["exact_match"] == 1.0
        if isinstance(task, ConvexHullTask):
            assert perfect["area_coverage"] == pytest.approx(1.0) and perfect["valid"] == 1.0
            broken = task.evaluate(Oracle(task, corrupt=True), "test")
            assert broken["exact_match"] == 0.0 and 0 < broken["area_coverage"] < 1
    with pytest.raises(ValueError, match="min_len"):
        ConvexHullTask(min_len=2)
    with pytest.raises(ValueError, match="max_len"):
        PointerSortTask(min_len=5, max_len=4)
    with pytest.raises(ValueError, match="split"):
        PointerSortTask().get_batch("dev", 2, 0)


def _mnist_or_skip():
    from qkv.tasks.captions import DigitCaptionsTask

    task = DigitCaptionsTask(eval_size=20)
    try:
        task._data
    except (FileNotFoundError, RuntimeError, OSError) as err:
        pytest.skip(f"MNIST not cached ({err}); run `qkv data fetch mnist`")
    return task


def test_digit_captions_batches():
    task = _mnist_or_skip()
    images, labels, splits = task._data
    assert not set(splits["train"].tolist()) & set(splits["test"].tolist())
    b = task.get_batch("train", 6, 0)
    torch.testing.assert_close(b["images"], task.get_batch("train", 6, 0)["images"])
    assert b["images"].shape == (6, 1, 28, 112) and 0 <= float(b["images"].min()) and float(b["images"].max()) <= 1
    strips = [task._strip("train", torch.Generator().manual_seed(0)) for _ in range(3)]
    batch = task.collate(strips)
    for k, (idx, offset) in enumerate(strips):
        caption = task.vocab.decode([i for i in batch["labels"][k].tolist() if i >= 0])
        assert caption == "".join(str(int(labels[i])) for i in idx)
        assert 2 <= len(caption) <= 4
        # the first digit's pixels are where the offset says
        torch.testing.assert_close(batch["images"][k, 0, :, offset : offset + 28], images[idx[0]])
    assert batch["tgt_ids"][:, 0].eq(task.vocab.bos_id).all()


def _is_png(path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("task_cls", [PointerSortTask, ConvexHullTask])
def test_pointer_visualize_writes_png(tmp_path, task_cls):
    from qkv.models.rnn.pointer import PointerNetwork, PointerNetworkConfig

    task = task_cls(eval_size=3)
    torch.manual_seed(0)
    model = PointerNetwork(PointerNetworkConfig(d_input=task.d_input, d_embed=4, d_hidden=6, attn_dim=4))
    assert _is_png(task.visualize(model, tmp_path / "p.png"))
    text = "0.3 0.9 0.1" if task.d_input == 1 else "0.1,0.2 0.8,0.3 0.5,0.9 0.4,0.4"
    assert _is_png(task.visualize(model, tmp_path / "sub" / "q.png", text=text))
    assert model.training  # visualize restores the mode
    with pytest.raises(ValueError, match="inputs"):
        task.parse_inputs("0.1,0.2,0.3" if task.d_input == 2 else "a b")
    if task.d_input == 2:
        torch.testing.assert_close(task.parse_inputs("0,1 2,3"), torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
        assert task.solve(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.5, 0.2], [0.0, 1.0]])) == [0, 1, 3]
    else:
        assert task.solve(task.parse_inputs("0.3, 0.9, 0.1")) == [2, 0, 1]


def test_digit_captions_visualize_writes_png(tmp_path):
    from qkv.models.rnn.show_attend_tell import ShowAttendTell, ShowAttendTellConfig

    task = _mnist_or_skip()
    torch.manual_seed(0)
    model = ShowAttendTell(ShowAttendTellConfig(vocab_size=task.vocab.size, channels=(4, 6), d_embed=5, d_hidden=7, attn_dim=4))
    assert _is_png(task.visualize(model, tmp_path / "c.png", n=2))
    assert _is_png(task.visualize(model, tmp_path / "d.png", text="471"))
    idx, offset = task.strip_of("47")
    _, labels, _ = task._data
    assert offset == 0 and [int(labels[i]) for i in idx] == [4, 7]
    with pytest.raises(ValueError, match="digits"):
        task.strip_of("4a")


def test_digit_captions_visualize_draws_a_panel_per_generated_word_only(tmp_path, monkeypatch):
    """CLI audit: the columns after the caption's end were bare copies of the image."""
    from qkv.models.rnn.show_attend_tell import ShowAttendTell, ShowAttendTellConfig
    from qkv.tasks import captions

    task = _mnist_or_skip()
    torch.manual_seed(0)
    model = ShowAttendTell(ShowAttendTellConfig(vocab_size=task.vocab.size, channels=(4, 6), d_embed=5, d_hidden=7, attn_dim=4))
    figures = []
    monkeypatch.setattr(captions, "save_figure", lambda fig, path, dpi: figures.append(fig) or Path(path))
    task.visualize(model, tmp_path / "c.png", n=2)
    (fig,) = figures
    _, ids, _, _ = task._caption(model, task.eval_strips("test", 2))
    for b, axes_row in enumerate(fig.axes[i * len(fig.axes) // 2:(i + 1) * len(fig.axes) // 2] for i in range(2)):
        words = sum(1 for i in ids[b].tolist() if i != task.vocab.pad_id)
        shown = [ax for ax in axes_row[1:] if ax.get_visible()]
        assert len(shown) == words and all(len(ax.images) == 2 for ax in shown)  # the image and its attention
    longest = max(sum(1 for i in ids[b].tolist() if i != task.vocab.pad_id) for b in range(2))
    assert len(fig.axes) == 2 * (1 + max(1, longest))  # columns for the longest caption, not for max_digits always
