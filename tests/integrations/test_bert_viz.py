"""``qkv viz`` of a BERT classifier run (fine-tuned from a checkpoint with its WordPiece tokenizer):
``--text`` and ``--max-len`` are honoured, the axes are the tokens, the figure keeps a sane size,
and an encoder's panels are not said to put cross-attention first."""

import pytest
import torch

from qkv.cli import main

transformers = pytest.importorskip("transformers")


@pytest.fixture
def bert_run(byte_data, wordpiece_dir, tmp_path, train_argv, capsys):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=24, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=128)
    transformers.BertModel(config).save_pretrained(wordpiece_dir)
    run = tmp_path / "run"
    assert main(train_argv("bert", "bbc-news", run, "--init", str(wordpiece_dir), "--threads", "1",
                           "--set", "task.max_len=128")) == 0, capsys.readouterr().err
    capsys.readouterr()
    return run


def test_text_and_max_len_are_honoured_with_tokens_on_the_axes(bert_run, capsys):
    from qkv import runs, viz

    run = runs.load(bert_run)
    view = viz.attention_view(run.task, run.model, "The film star won the award.", 48)
    assert view.x_labels == ["[CLS]", "the", "film", "star", "won", "the", "award", ".", "[SEP]"] == view.y_labels
    assert view.cut is None and view.panels[0][1].shape == (9, 9)
    cut = viz.attention_view(run.task, run.model, "the market shares rose " * 5, 8)
    assert cut.x_labels == ["[CLS]", "the", "market", "shares", "rose", "the", "market", "[SEP]"] and cut.cut == (8, 22)
    default = viz.attention_view(run.task, run.model, None, 10)  # a held-out article, cut to 10 tokens
    assert len(default.x_labels) == 10 and default.x_labels[0] == "[CLS]" and default.x_labels[-1] == "[SEP]"


def test_the_png_keeps_a_sane_size_and_says_nothing_of_cross_attention(bert_run, tmp_path, capsys):
    from PIL import Image

    png = tmp_path / "a.png"
    assert main(["viz", str(bert_run), "--out", str(png), "--text", "the market shares rose " * 30, "--max-len", "100",
                 "--max-panels", "2", "--threads", "1"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "text cut to 100 tokens; pass --max-len 122" in out and "showing 2 of 4 panels; --max-panels" in out and "cross-attention" not in out
    width, height = Image.open(png).size
    assert width <= 3000 and height <= 1800, (width, height)  # measured 2530 x 1256; uncapped panels: 3850 x 1916
