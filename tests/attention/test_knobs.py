"""``AttentionKernel.knobs``: the one place a kernel's knobs are filled — its ``default_knobs``
for the length, then the given ones (given win); head arguments only ``with_heads``; local-2d's
image rule lives in local-2d."""

import pytest

from qkv.registry import lookup, names
from qkv.models.transformer.lra import kernel_knobs


def test_given_knobs_win_over_the_defaults():
    window = lookup("attention", "window")
    assert window.knobs(1024, 4, 64) == {"radius": 64}
    assert window.default_knobs(1024, 4, 64) == {"radius": 64, "n_heads": 4}  # with its head argument (the sinks')
    assert window.knobs(1024, 4, 64, {"radius": 3}) == {"radius": 3}
    assert window.knobs(1024, 4, 64, {"radius": 3}, image_size=(32, 32)) == {"radius": 3}  # a 1-D kernel ignores it


def test_head_arguments_only_with_heads_or_given():
    relative = lookup("attention", "relative")
    heads = relative.head_kwargs(4, 16)
    assert heads and set(heads) <= set(relative.knobs(256, 4, 16, with_heads=True))
    assert not set(heads) & set(relative.knobs(256, 4, 16))
    assert relative.knobs(256, 4, 16, {"n_heads": 4})["n_heads"] == 4  # given ones are kept


@pytest.mark.parametrize("name", names("attention"))
def test_every_kernel_fills_its_defaults(name):
    cls = lookup("attention", name)
    own = cls.default_knobs(256, 2, 16)
    assert cls.knobs(256, 2, 16, with_heads=True) == own
    assert cls.knobs(256, 2, 16) == {k: v for k, v in own.items() if k not in cls.head_kwargs(2, 16)}


def test_local_2d_reads_the_image():
    local2d = lookup("attention", "local-2d")
    assert local2d.knobs(1024, 2, 32) == local2d.default_knobs(1024, 2, 32)  # no image: the square of the length
    on_image = {"image_size": (16, 64), "block": (2, 16), "memory": (2, 8, 8)}  # H/8 x W/4 blocks, H/8 and W/8 margins
    assert local2d.knobs(1024, 2, 32, image_size=(16, 64)) == on_image
    assert local2d.knobs(1024, 2, 32, {"block": (1, 1)}, image_size=(16, 64)) == {**on_image, "block": (1, 1)}
    assert kernel_knobs("local-2d", 1024, 2, 32, image_size=(16, 64)) == on_image  # the LRA encoder's
    with pytest.raises(ValueError, match="needs an image task"):
        kernel_knobs("local-2d", 1024, 2, 32)
