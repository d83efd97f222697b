"""The LRA encoder-classifier and its two-tower form (qkv.models.transformer.lra)."""

from __future__ import annotations

import pytest
import torch

from qkv import masks
from qkv.models.transformer.lra import LRADualEncoder, LRADualEncoderConfig, LRAEncoder, LRAEncoderConfig, kernel_knobs

ONE_D = ["softmax", "local-1d", "window", "strided", "fixed", "linformer", "linear", "performer", "efficient",
         "adaptive-span"]


def small(attention: str, **kw) -> LRAEncoderConfig:
    base = dict(attention=attention, max_len=64, vocab_size=20, n_classes=3, d_model=16, n_heads=2, d_ff=32,
                mlp_dim=16, dropout=0.0)
    base.update(kw)
    return LRAEncoderConfig(**base)


def dual(attention: str, **kw) -> LRADualEncoderConfig:
    return LRADualEncoderConfig(**{**small(attention).__dict__, "attention_kwargs": {}, **kw})


@pytest.mark.parametrize("attention", ONE_D)
def test_padding_changes_nothing(attention):
    """Mean pooling over real tokens and masked keys: what sits in the padding never matters."""
    torch.manual_seed(0)
    model = LRAEncoder(small(attention)).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 20, (2, 64), generator=g)
    mask = torch.arange(64)[None] < torch.tensor([[40], [64]])
    other = torch.where(mask, ids, torch.randint(0, 20, (2, 64), generator=g))
    a, b = model(ids, attention_mask=mask).logits, model(other, attention_mask=mask).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_kernel_knobs_are_the_kernels_own_for_the_length():
    from qkv.registry import lookup

    for name in ("window", "linformer", "strided", "performer", "adaptive-span", "softmax"):
        cls = lookup("attention", name)
        own = cls.default_knobs(1024, 2, 32)
        knobs = kernel_knobs(name, 1024, 2, 32)
        assert knobs == {k: v for k, v in own.items() if k not in cls.head_kwargs(2, 32)}
    assert kernel_knobs("linformer", 1024, 2, 32)["seq_len"] == 1024
    assert kernel_knobs("window", 4096, 2, 32)["radius"] > kernel_knobs("window", 256, 2, 32)["radius"]
    assert kernel_knobs("softmax", 1024, 2, 32) == {}
    with pytest.raises(ValueError, match="image"):
        kernel_knobs("local-2d", 1024, 2, 32)
    filled = small("window").attention_kwargs  # filled in when the config leaves them empty
    assert filled and set(filled) <= {"radius"}
    assert small("window", attention_kwargs={"radius": 3}).attention_kwargs == {"radius": 3}


def test_local_2d_weights_come_back_in_raster_order():
    """The encoder attends in block-raster order but reports weights over raster positions: a
    query pixel's weights lie in its 2-D neighbourhood of the image."""
    torch.manual_seed(0)
    config = small("local-2d", max_len=256, image_size=(16, 16))  # 2x4 query blocks: not the raster order
    model = LRAEncoder(config).eval()
    ids = torch.randint(0, 20, (1, 256))
    weights = model(ids, need_weights=True).weights[0][0, 0]  # (256, 256) raster x raster
    kernel = model.stack.layers[0].self_attn.kernel
    order = kernel.order()
    assert not torch.equal(order, torch.arange(256))
    allowed = masks.materialize(kernel.pattern(256, 256), 256, 256)  # sequence x sequence
    back = torch.argsort(order)
    expected = allowed[back][:, back]  # raster x raster
    assert ((weights != 0) <= expected).all() and (weights.sum(-1) - 1).abs().max() < 1e-5
    keys = (weights[7 * 16 + 7] != 0).nonzero().squeeze(1)  # pixel (7, 7) looks near itself
    assert ((keys // 16 - 7).abs() <= 3).all() and ((keys % 16 - 7).abs() <= 5).all() and len(keys) > 8


def test_dual_encoder_reads_both_documents():
    torch.manual_seed(0)
    model = LRADualEncoder(small("softmax", n_classes=2)).eval()
    ids = torch.randint(0, 20, (3, 64))
    other = torch.randint(0, 20, (3, 64))
    labels = torch.tensor([0, 1, 1])
    out = model(ids, input_ids_2=other, labels=labels)
    assert out.logits.shape == (3, 2) and out.loss.ndim == 0
    assert not torch.allclose(out.logits, model(ids, input_ids_2=ids).logits)
    with pytest.raises(ValueError, match="input_ids_2"):
        model(ids)
    with pytest.raises(ValueError, match="attention_mask_2"):
        model(ids, attention_mask=torch.ones(3, 64, dtype=torch.bool), input_ids_2=other)


def test_abs_diff_pair_features_are_infersents_and_symmetric_in_the_pair():
    """``pair_features="abs-diff"``: the head reads [u, v, u*v, |u-v|] (checked against the pooled
    vectors by hand); the default stays LRA's [u, v, u*v, u-v]. Only the two-tower model takes it,
    and a saved config without the field (written before it existed) loads as LRA's."""
    torch.manual_seed(0)
    lra = LRADualEncoder(small("softmax", n_classes=2)).eval()
    absdiff = LRADualEncoder(dual("softmax", n_classes=2, pair_features="abs-diff")).eval()
    absdiff.load_state_dict(lra.state_dict())  # the same weights: only the features differ
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 20, (4, 64), generator=g), torch.randint(0, 20, (4, 64), generator=g)
    u, v = lra.encode(a)[0], lra.encode(b)[0]
    torch.testing.assert_close(lra(a, input_ids_2=b).logits, lra.head(torch.cat([u, v, u * v, u - v], -1)))
    torch.testing.assert_close(absdiff(a, input_ids_2=b).logits,
                               absdiff.head(torch.cat([u, v, u * v, (u - v).abs()], -1)))
    assert not torch.allclose(lra(a, input_ids_2=b).logits, absdiff(a, input_ids_2=b).logits)
    assert isinstance(lra.config, LRADualEncoderConfig) and lra.config.pair_features == "lra"  # from an encoder's config
    with pytest.raises(TypeError, match="pair_features"):  # the one-document encoder has no such field
        small("softmax", pair_features="abs-diff")
    import dataclasses

    old = {k: v for k, v in dataclasses.asdict(lra.config).items() if k != "pair_features"}
    assert LRADualEncoder.from_config(old).config.pair_features == "lra"
    for bad in ("ABS-DIFF", "abs_diff", "", None, ["lra"], 1):
        with pytest.raises(ValueError, match="pair_features must be one of"):
            dual("softmax", pair_features=bad)


def test_config_checks_image_size():
    with pytest.raises(ValueError, match="max_len"):
        small("softmax", image_size=(4, 4))


@pytest.mark.slow
def test_softmax_encoder_learns_shallow_listops():
    """A check that the pipeline learns: expressions of depth <= 3, 300 updates, well above the
    majority class (13.3% of these 300 test expressions)."""
    from qkv.runs.settings import fields_of, model_hints
    from qkv.tasks.lra import ListOps

    task = ListOps(min_len=8, max_len=40, max_depth=3, max_args=5, eval_size=300)
    labels = torch.cat([b["labels"] for b in task.eval_batches("test", 300)])
    majority = torch.bincount(labels).max().item() / len(labels)
    torch.manual_seed(0)
    model = LRAEncoder(LRAEncoderConfig(attention="softmax", **model_hints(task, fields_of(LRAEncoderConfig))))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(300):
        model(**task.get_batch("train", 32, step)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    accuracy = task.evaluate(model)["accuracy"]
    assert accuracy > majority + 0.06, (accuracy, majority)


def test_abs_diff_head_survives_save_and_reload(tmp_path):
    """A saved two-tower model with |u-v| reloads with |u-v| (not LRA's default), the same logits."""
    torch.manual_seed(0)
    model = LRADualEncoder(dual("softmax", n_classes=2, pair_features="abs-diff")).eval()
    model.save_pretrained(tmp_path / "m")
    again = LRADualEncoder.from_pretrained(tmp_path / "m").eval()
    assert again.config.pair_features == "abs-diff"
    a, b = torch.randint(0, 20, (3, 64)), torch.randint(0, 20, (3, 64))
    torch.testing.assert_close(again(a, input_ids_2=b).logits, model(a, input_ids_2=b).logits, rtol=0, atol=0)


@pytest.mark.parametrize("pair_features, attention", [("lra", "softmax"), ("abs-diff", "softmax"), ("lra", "lsh")])
def test_a_padded_pair_scores_as_the_same_pair_alone(pair_features, attention):
    """Both towers pool over real tokens only: a pair padded to 64 beside a longer pair gives the
    logits of the same pair alone, cut to its own length (lsh: 5e-4 apart before issue 52, its chunk 0
    looked back at chunks of padding)."""
    torch.manual_seed(0)
    model = LRADualEncoder(dual(attention, n_classes=2, pair_features=pair_features)).eval()
    g = torch.Generator().manual_seed(5)
    a, b = torch.randint(2, 20, (2, 64), generator=g), torch.randint(2, 20, (2, 64), generator=g)
    lengths = torch.tensor([[37], [64]])
    mask = torch.arange(64)[None] < lengths
    a, b = a.masked_fill(~mask, 0), b.masked_fill(~mask, 0)
    both = model(a, attention_mask=mask, input_ids_2=b, attention_mask_2=mask).logits
    alone = model(a[:1, :37], input_ids_2=b[:1, :37]).logits
    torch.testing.assert_close(both[:1], alone, atol=1e-5, rtol=1e-5)
