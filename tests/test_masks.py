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


def test_local_2d():
    H, W, bh, bw, (top, left, right) = 4, 6, 2, 3, (1, 1, 2)

    def pred(i, j):
        qr, qc, kr, kc = i // W, i % W, j // W, j % W
        r0, c0 = (qr // bh) * bh, (qc // bw) * bw
        return r0 - top <= kr < r0 + bh and c0 - left <= kc < c0 + bw + right and j <= i

    got = masks.materialize(masks.local_2d((H, W), (bh, bw), (top, left, right)), H * W, H * W)
    assert torch.equal(got, brute(pred, H * W, H * W))


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
