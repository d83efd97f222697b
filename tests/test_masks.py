"""qkv.masks: predicates against the set definitions of the papers."""

import pytest
import torch

from qkv import masks


def brute(pred, m, n):
    return torch.tensor([[bool(pred(i, j)) for j in range(n)] for i in range(m)])


def test_padding_and_causal():
    pm = masks.padding_mask(torch.tensor([2, 0, 4]), 4)
    assert pm.tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert torch.equal(masks.causal_mask(3, 5, offset=2), brute(lambda i, j: j <= i + 2, 3, 5))
    assert torch.equal(masks.causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("causal", [False, True])
def test_window(causal):
    r = 2
    ref = brute(lambda i, j: abs(i - j) <= r and (not causal or j <= i), 9, 9)
    assert torch.equal(masks.materialize(masks.window(r, causal=causal), 9, 9), ref)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("subsets", [(1,), (2,), (1, 2)])
def test_strided(causal, subsets):
    l = 3

    def pred(i, j):
        a1 = (i - l <= j <= i) if causal else abs(i - j) <= l
        a2 = (i - j) % l == 0
        ok = (1 in subsets and a1) or (2 in subsets and a2)
        return ok and (not causal or j <= i)

    assert torch.equal(masks.materialize(masks.strided(l, subsets, causal=causal), 12, 12), brute(pred, 12, 12))


@pytest.mark.parametrize("causal", [False, True])
def test_fixed(causal):
    l, c = 4, 2

    def pred(i, j):
        ok = (j // l == i // l) or (j % l in range(l - c, l))
        return ok and (not causal or j <= i)

    assert torch.equal(masks.materialize(masks.fixed(l, c, causal=causal), 13, 13), brute(pred, 13, 13))


def test_local_1d():
    b, mem = 3, 2
    ref = brute(lambda i, j: j <= i and j >= (i // b) * b - mem, 10, 10)
    assert torch.equal(masks.materialize(masks.local_1d(b, mem), 10, 10), ref)
    both = brute(lambda i, j: (i // b) * b - mem <= j < (i // b) * b + b, 10, 10)  # bidirectional: the whole block
    assert torch.equal(masks.materialize(masks.local_1d(b, mem, causal=False), 10, 10), both)


def paper_block_raster_order(H, W, bh, bw):
    """Parmar et al. 2018's generation order, written plainly: query blocks in raster order, raster
    order inside a block (border blocks clipped); the list of (row, column) pixels."""
    order = []
    for R in range(0, H, bh):
        for C in range(0, W, bw):
            for r in range(R, min(R + bh, H)):
                for c in range(C, min(C + bw, W)):
                    order.append((r, c))
    return order


@pytest.mark.parametrize("H,W,bh,bw", [(4, 6, 2, 3), (5, 7, 2, 3), (3, 3, 1, 1), (4, 5, 4, 5)])
def test_block_raster_order(H, W, bh, bw):
    order = [(r, c) for r, c in paper_block_raster_order(H, W, bh, bw)]
    assert masks.block_raster_order((H, W), (bh, bw)).tolist() == [r * W + c for r, c in order]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H,W,bh,bw,memory", [(4, 6, 2, 3, (1, 1, 2)), (5, 7, 2, 3, (2, 1, 1)), (4, 4, 1, 2, (0, 0, 0))])
def test_local_2d(H, W, bh, bw, memory, causal):
    """Sequence position t is the t-th pixel of the block-raster scan; a query sees its block's
    rectangle extended (top, left, right), and, causal, only pixels generated before it."""
    top, left, right = memory
    order = paper_block_raster_order(H, W, bh, bw)

    def pred(i, j):
        (qr, qc), (kr, kc) = order[i], order[j]
        r0, c0 = (qr // bh) * bh, (qc // bw) * bw
        inside = r0 - top <= kr < r0 + bh and c0 - left <= kc < c0 + bw + right
        return inside and (j <= i or not causal)

    got = masks.materialize(masks.local_2d((H, W), (bh, bw), memory, causal=causal), H * W, H * W)
    assert torch.equal(got, brute(pred, H * W, H * W))


def test_local_2d_left_block_is_entirely_visible():
    """Block-raster, not image-raster: the first pixel of a block sees every pixel of the block to
    its left (rows below its own included) and nothing of the block to its right."""
    H, W, bh, bw = 4, 4, 2, 2
    allowed = masks.materialize(masks.local_2d((H, W), (bh, bw), (0, 2, 2)), H * W, H * W)
    order = masks.block_raster_order((H, W), (bh, bw)).tolist()
    first_of_right_block = order.index(0 * W + 2)  # pixel (0, 2)
    left_block = [order.index(r * W + c) for r in range(2) for c in range(2)]
    assert allowed[first_of_right_block, left_block].all()  # (1, 0), (1, 1) are below it, yet generated
    assert first_of_right_block == 4


def test_combinators():
    a, b = masks.window(1), masks.causal()
    both = masks.materialize(masks.and_masks(a, b), 5, 5)
    either = masks.materialize(masks.or_masks(a, b), 5, 5)
    assert torch.equal(both, brute(lambda i, j: abs(i - j) <= 1 and j <= i, 5, 5))
    assert torch.equal(either, brute(lambda i, j: abs(i - j) <= 1 or j <= i, 5, 5))


def test_mask_mods_work_with_flex_attention_block_mask():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    bm = flex.create_block_mask(masks.window(2, causal=True), None, None, 256, 256, device="cpu", BLOCK_SIZE=128)
    assert bm is not None


def test_bad_arguments():
    with pytest.raises(ValueError, match="radius"):
        masks.window(-1)
    with pytest.raises(ValueError, match="lengths"):
        masks.padding_mask(torch.tensor([5]), 3)
    with pytest.raises(TypeError, match="lengths"):
        masks.padding_mask(torch.tensor([1.0]), 3)
    with pytest.raises(ValueError, match="subsets"):
        masks.strided(2, subsets=(3,))
    with pytest.raises(ValueError, match="c must"):
        masks.fixed(2, c=3)
    with pytest.raises(ValueError, match="image_size"):
        masks.local_2d((4,), (2, 2))
    with pytest.raises(TypeError, match="stride"):
        masks.strided(2.5)
