"""qkv.viz writes real PNGs from every shape of weights the models return."""

import pytest
import torch

from qkv import masks, viz


def test_panels_flatten_layers_heads_and_dicts():
    w = {"encoder": [torch.rand(2, 3, 4, 4), None], "cross": torch.rand(2, 5, 4)}
    panels = viz.attention_panels(w)
    assert [name for name, _ in panels] == ["encoder L0 H0", "encoder L0 H1", "encoder L0 H2", "cross"]
    assert [tuple(p.shape) for _, p in panels] == [(4, 4)] * 3 + [(5, 4)]
    with pytest.raises(ValueError, match="2-D to 4-D"):
        viz.attention_panels(torch.rand(2, 2, 2, 2, 2))


def test_pngs_are_written(tmp_path):
    p = viz.plot_attention_grid([torch.softmax(torch.randn(1, 2, 3, 3), -1)], tmp_path / "g.png", x_labels=list("abc"))
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    p = viz.plot_pattern(masks.materialize(masks.fixed(4, 1), 16, 16), tmp_path / "p.png")
    assert p.stat().st_size > 1000
    p = viz.plot_attention(torch.rand(3, 4), tmp_path / "a.png")
    assert p.exists()
    with pytest.raises(ValueError, match="no attention weights"):
        viz.plot_attention_grid(None, tmp_path / "x.png")
