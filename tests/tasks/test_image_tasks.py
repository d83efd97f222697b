"""Image-generation tasks: the IDX reader of Fashion-MNIST, quantisation, splits and bits/dim."""

import gzip
import struct

import pytest
import torch

from qkv.tasks import data
from qkv.tasks.images import FashionMnistImages


def test_idx_reader(tmp_path):
    images = torch.randint(0, 256, (3, 4, 5), dtype=torch.uint8)
    path = tmp_path / "x-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(struct.pack(">IIII", 0x0803, 3, 4, 5) + images.numpy().tobytes()))
    assert torch.equal(data._idx(path, 3), images)
    with pytest.raises(ValueError, match="IDX"):
        data._idx(path, 1)
    bad = tmp_path / "bad.gz"
    bad.write_bytes(gzip.compress(struct.pack(">IIII", 0x0803, 3, 4, 6) + images.numpy().tobytes()))
    with pytest.raises(ValueError, match="shape"):
        data._idx(bad, 3)


def test_fashion_mnist_is_registered_with_checksums():
    assert "fashion-mnist" in data.DATASETS and "Debian" in data.DATASETS["fashion-mnist"]["package"]
    assert len(data.CHECKSUMS["fashion-mnist"]) == 4
    with pytest.raises(ValueError, match="split"):
        data.load_fashion_mnist(split="valid")


@pytest.mark.skipif(not data.is_cached("fashion-mnist"), reason="run `qkv data fetch fashion-mnist`")
def test_fashion_mnist_task():
    task = FashionMnistImages(levels=4)
    assert (task.size("train"), task.size("valid"), task.size("test")) == (55000, 5000, 10000)
    batch = task.get_batch("train", 4, 0)
    assert batch["images"].shape == (4, 28, 28) and int(batch["images"].max()) < 4
    assert set(batch["classes"].tolist()) <= set(range(10))
