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


# ----------------------------------------------------------------------------- issue 20 item 7: pictures


def _saved_figures(monkeypatch):
    """The figures ``qkv.viz`` lays out and saves (drawn again after saving, for their boxes)."""
    figures = []
    save = viz.save_figure

    def keep(fig, path, dpi=120):
        figures.append(fig)
        return save(fig, path, dpi)

    monkeypatch.setattr(viz, "save_figure", keep)
    return figures


def _boxes(fig):
    """The figure's box, its heading's box, its panels' boxes (titles and tick labels included),
    its colour bars and their boxes, in display units."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # saving closed the figure: draw it on a canvas of its own
    canvas.draw()
    renderer = canvas.get_renderer()
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    panels = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible() and ax.axison and ax not in bars]
    heading = fig._suptitle.get_window_extent(renderer) if fig._suptitle is not None else None
    return fig.bbox, heading, panels, bars, [bar.get_tightbbox(renderer) for bar in bars]


def _lm_like_view(n_panels, n_tokens, caption):
    tokens = [viz.show_token(c) for c in caption[:n_tokens]]
    causal = torch.softmax(torch.randn(n_tokens, n_tokens).masked_fill(torch.ones(n_tokens, n_tokens).triu(1).bool(), -1e9), -1)
    return viz.AttentionView([(f"attention L{i // 2} H{i % 2}", causal) for i in range(n_panels)], x_labels=tokens,
                             y_labels=tokens, title="GPT", caption=caption)


@pytest.mark.parametrize("n_panels,n_tokens", [(8, 48), (4, 12), (1, 6)])
def test_heading_clears_the_panels_and_stays_in_the_figure(n_panels, n_tokens, tmp_path, monkeypatch):
    """The main job's picture (a row or two of panels under a two-line heading) and a narrow
    sequence-to-sequence one (one panel under a long caption): the heading overlaps no panel (nor
    its title) and lies inside the figure; one colour bar reads weights from 0 to 1."""
    figures = _saved_figures(monkeypatch)
    caption = "ROMEO.\nBut, soft! what light through yonder window breaks? It is the east, and Juliet is the sun."
    _lm_like_view(n_panels, n_tokens, caption).plot(tmp_path / "a.png")
    figure, heading, panels, bars, bar_boxes = _boxes(figures[-1])
    assert len(panels) == n_panels and heading is not None
    for box in panels:
        assert not heading.overlaps(box), "the heading lies over a panel"
    assert figure.x0 <= heading.x0 and heading.x1 <= figure.x1 and figure.y0 <= heading.y0 and heading.y1 <= figure.y1
    for box in panels + bar_boxes:
        assert figure.x0 <= box.x0 and box.x1 <= figure.x1 + 1, "a panel or the colour bar is cut at the edge"
        assert figure.y0 <= box.y0 + 1 and box.y1 <= figure.y1 + 1, "a panel or the colour bar is cut at the edge"
    (bar,) = bars
    assert bar.get_ylim() == (0.0, 1.0)
    assert "weight" in bar.get_ylabel()


def test_long_labels_and_heading_fit_a_small_panel(tmp_path, monkeypatch):
    """A memory network's picture: 3 hops over 8 sentences, each a long key label, under a
    three-line heading. Everything stays inside the figure and off the panel."""
    figures = _saved_figures(monkeypatch)
    sentences = [f"sandra journeyed back to the kitchen {i}" for i in range(8)]
    view = viz.AttentionView([("hops", torch.softmax(torch.randn(3, 8), -1))], x_labels=sentences,
                             y_labels=["hop 1", "hop 2", "hop 3"],
                             title="EndToEndMemoryNetwork: attention of each hop over the story (* = supporting fact)",
                             caption="where is john? answer office, predicted office")
    view.plot(tmp_path / "m.png")
    figure, heading, (panel,), _, (bar,) = _boxes(figures[-1])
    assert not heading.overlaps(panel)
    for box in (heading, panel, bar):
        assert figure.x0 <= box.x0 and box.x1 <= figure.x1 + 1 and figure.y0 <= box.y0 + 1 and box.y1 <= figure.y1 + 1


def test_grid_of_raw_weights_has_a_colour_bar(tmp_path, monkeypatch):
    figures = _saved_figures(monkeypatch)
    viz.plot_attention_grid([torch.softmax(torch.randn(1, 2, 3, 3), -1)], tmp_path / "g.png", x_labels=list("abc"))
    _, _, panels, bars, _ = _boxes(figures[-1])
    assert len(panels) == 2 and len(bars) == 1


def test_weights_outside_0_1_get_their_own_range():
    assert viz._weight_range([torch.tensor([0.0, 0.4])]) == (0.0, 1.0)
    assert viz._weight_range([torch.tensor([-2.0, 3.0])]) == (-2.0, 3.0)


class _TinyLM:
    """A language-model task over a made-up play: a title page, then lines of dialogue."""

    kind = "lm"

    def attention_view(self, model, text=None, max_len=48):
        return None  # Task's default: qkv.viz labels the tokens

    def __init__(self):
        from qkv.tasks.base import LanguageModelTask
        from qkv.tasks.vocab import CharVocab

        play = "THE TRAGEDY OF TESTS\n\nby Nobody\n\n" + "ROMEO.\nBut, soft! what light through yonder window breaks?\n\n" * 40
        self.vocab = CharVocab(play)
        self.lm = LanguageModelTask(torch.tensor(self.vocab.encode(play)), self.vocab, block_size=16)
        self.examples, self.view_text = self.lm.examples, self.lm.view_text


def _tiny_gpt(vocab_size):
    from qkv.models.transformer.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab_size, n_layers=1, d_model=16, n_heads=2, d_ff=32, max_len=128))


def test_lm_default_text_is_a_held_out_line_of_dialogue_cut_at_a_word():
    task = _TinyLM()
    assert task.examples(1)[0]["text"].startswith("THE TRAGEDY")  # what `qkv viz` showed before
    text = task.view_text(30)
    assert text == "ROMEO.\nBut, soft! what light"  # a paragraph's start, no word split
    view = viz.attention_view(task, _tiny_gpt(task.vocab.size), max_len=30)
    assert view.caption == text and view.cut is None
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        task.view_text(0)


def test_long_text_is_cut_and_says_so(shakespeare_cache, capsys):
    from qkv.cli import main

    run = shakespeare_cache / "run"
    assert main(["train", "gpt", "--task", "shakespeare-char", "--out", str(run), "--steps", "1", "--threads", "1",
                 "--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "task.block_size=16",
                 "--batch-size", "2", "--eval-batches", "1", "--progress", "false", "--tensorboard", "false"]) == 0
    capsys.readouterr()
    text = "To be, or not to be, that is the question"
    assert main(["viz", str(run), "--text", text, "--max-len", "8", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"text cut to 8 tokens; pass --max-len {len(text)}" in out
    assert main(["viz", str(run), "--text", text, "--max-len", str(len(text)), "--threads", "1"]) == 0
    assert "text cut" not in capsys.readouterr().out
