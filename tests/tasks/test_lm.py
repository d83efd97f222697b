"""Language-modelling tasks on the fixture cache (and on the real data when cached)."""

import math

import pytest
import torch

from qkv.tasks import build_task, data


@pytest.fixture
def shakespeare(fake_cache):
    return build_task("shakespeare-char", block_size=16, cache_dir=fake_cache)


def test_windows_are_next_token_pairs(shakespeare):
    batch = shakespeare.get_batch("train", 4, 0)
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 16)
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    train = shakespeare.vocab.decode(shakespeare.split_tokens("train"))
    for row in batch["input_ids"]:
        assert shakespeare.vocab.decode(row) in train


def test_determinism_and_ranks(shakespeare):
    a = shakespeare.get_batch("train", 8, 5, seed=3)
    assert torch.equal(a["input_ids"], shakespeare.get_batch("train", 8, 5, seed=3)["input_ids"])
    r0 = shakespeare.get_batch("train", 8, 5, seed=3, rank=0, world_size=2)["input_ids"]
    r1 = shakespeare.get_batch("train", 8, 5, seed=3, rank=1, world_size=2)["input_ids"]
    assert not torch.equal(r0, r1)
    assert not torch.equal(a["input_ids"], shakespeare.get_batch("train", 8, 6, seed=3)["input_ids"])


def test_contiguous_splits_and_eval_batches(shakespeare, fake_cache):
    parts = [shakespeare.split_tokens(s) for s in ("train", "valid", "test")]
    stream = torch.tensor(shakespeare.vocab.encode(data.load_shakespeare(fake_cache)))
    assert torch.equal(torch.cat(parts), stream)
    batches = list(shakespeare.eval_batches("test", 3))
    n_blocks = (parts[2].numel() - 1) // 16
    assert sum(b["input_ids"].shape[0] for b in batches) == n_blocks
    flat = torch.cat([b["input_ids"] for b in batches]).flatten()
    assert torch.equal(flat, parts[2][: flat.numel()])  # consecutive, non-overlapping windows
    assert sum(b["input_ids"].shape[0] for b in shakespeare.eval_batches("test", 3, max_examples=4)) == 4


def test_vocab_round_trip(fake_cache, shakespeare):
    text = "To be, or not to be"
    assert shakespeare.vocab.decode(shakespeare.vocab.encode(text)) == text
    enwiki = build_task("enwiki-bytes", block_size=32, cache_dir=fake_cache)
    assert enwiki.vocab.size == 259
    batch = enwiki.get_batch("valid", 2, 0)
    assert batch["input_ids"].max() < 256 and batch["input_ids"].shape == (2, 32)


def test_evaluate_uniform_model_gives_log_vocab(shakespeare, models):
    V = shakespeare.vocab.size
    metrics = shakespeare.evaluate(models.uniform_lm(V), split="valid", max_examples=5)
    assert metrics["loss"] == pytest.approx(math.log(V))
    assert metrics["bpc"] == pytest.approx(math.log2(V))
    assert metrics["perplexity"] == pytest.approx(V)
    assert metrics["tokens"] == 5 * 16


def test_bad_options(fake_cache):
    with pytest.raises(ValueError, match="block_size"):
        build_task("shakespeare-char", block_size=10_000, cache_dir=fake_cache)
    with pytest.raises(TypeError, match="unknown argument"):
        build_task("shakespeare-char", seq_len=8, cache_dir=fake_cache)
    with pytest.raises(FileNotFoundError, match="qkv data fetch enwiki"):
        build_task("enwiki-bytes", cache_dir=fake_cache / "nowhere")


@pytest.mark.skipif(not data.is_cached("shakespeare"), reason="run `qkv data fetch shakespeare`")
def test_real_shakespeare_task():
    task = build_task("shakespeare-char")
    sizes = [task.split_tokens(s).numel() for s in ("train", "valid", "test")]
    assert sum(sizes) == len(data.load_shakespeare()) and sizes[1] > 200_000
    assert task.get_batch("train", 2, 0)["input_ids"].shape == (2, 128)


@pytest.mark.parametrize("name,block", [("shakespeare-char", 64), ("enwiki-bytes", 256)])
def test_packed_batches_mark_each_document(fake_cache, name, block):
    """pack=True: position_ids restart at 0 at each document's start (a play, a <page>) and at each
    window's; labels are -100 at a document's last token; packing() counts the pieces."""
    task = build_task(name, block_size=block, cache_dir=fake_cache, pack=True)
    plain = build_task(name, block_size=block, cache_dir=fake_cache)
    batch = task.get_batch("train", 16, 0)
    same = plain.get_batch("train", 16, 0)
    assert torch.equal(batch["input_ids"], same["input_ids"])  # the same windows, with their documents marked
    text = task.vocab.decode(task.split_tokens("train"))

    def opens(row, i):  # a play's title after the blank line that joins the texts; every <page>
        if name == "enwiki-bytes":  # bytes (pages hold characters of several); each line is a <page>
            return int(row[i - 1]) == ord("\n")
        return row[i - 2:i] == "\n\n" and row[i:].startswith(("HAMLET", "THE TEMPEST"))

    crossed = 0
    for ids, positions, labels, plain_labels in zip(batch["input_ids"], batch["position_ids"], batch["labels"],
                                                    same["labels"]):
        row = task.vocab.decode(ids) if name == "shakespeare-char" else ids
        starts = [0] + [i for i in range(1, block) if opens(row, i)]
        assert (positions == 0).nonzero().flatten().tolist() == starts
        for a, b in zip(starts, starts[1:] + [block]):
            assert torch.equal(positions[a:b], torch.arange(b - a))
        ends = [s - 1 for s in starts[1:]]
        assert (labels == -100).nonzero().flatten().tolist() == ends
        assert torch.equal(labels[labels != -100], plain_labels[labels != -100])
        crossed += len(ends)
        assert name != "shakespeare-char" or row in text
    assert crossed > 0, "no window crossed a document: the test would not see a boundary"
    counts = task.packing()
    assert counts["rows"] == 16 and counts["real"] == 16 * block
    assert counts["pieces"] == 16 + crossed and counts["padded"] == counts["pieces"] * block
    assert counts["gain"] == pytest.approx((16 + crossed) / 16)
    task.get_batch("valid", 4, 0)  # held-out batches are not counted
    assert task.packing()["rows"] == 16
    eval_batch = next(iter(task.eval_batches("valid", 2)))
    assert set(eval_batch) == {"input_ids", "labels", "position_ids"}


def test_pack_refuses_streams(fake_cache):
    with pytest.raises(ValueError, match="pack=True with stream=True"):
        build_task("shakespeare-char", block_size=16, cache_dir=fake_cache, pack=True, stream=True)
    with pytest.raises(TypeError, match="pack must be a bool"):
        build_task("shakespeare-char", block_size=16, cache_dir=fake_cache, pack=1)
