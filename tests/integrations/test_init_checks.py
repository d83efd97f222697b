"""``qkv train MODEL --init DIR``: what cannot work is refused before anything is written (a
tokenizer with more ids than the checkpoint's vocabulary; a kernel that cannot take the pretrained
attention weights, as ``from_pretrained`` refuses it), and the run says where its architecture
comes from (not "preset cpu"). Tiny BERTs on the fixture's fake BBC articles."""

import json

import pytest
import torch

from qkv.cli import main

transformers = pytest.importorskip("transformers")


def _checkpoint(directory, vocab_size=24):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(directory)
    return directory


def test_a_tokenizer_beyond_the_checkpoints_vocabulary_is_refused(byte_data, wordpiece_dir, tmp_path, train_argv, capsys):
    _checkpoint(wordpiece_dir, vocab_size=20)  # its tokenizer.json has 24 ids
    capsys.readouterr()
    run = tmp_path / "run"
    assert main(train_argv("bert", "bbc-news", run, "--init", str(wordpiece_dir), "--set", "task.max_len=12")) == 2
    err = capsys.readouterr().err
    assert "the task's tokenizer has 24 ids, more than the checkpoint's 20 embeddings" in err
    assert len(err.strip().splitlines()) == 1 and not run.exists()


def test_lsh_is_refused_as_from_pretrained_refuses_it(byte_data, wordpiece_dir, tmp_path, train_argv, capsys):
    from qkv.models import BERT

    _checkpoint(wordpiece_dir)
    with pytest.raises(ValueError) as refused:
        BERT.from_pretrained(wordpiece_dir, attention="lsh")
    run = tmp_path / "run"
    assert main(train_argv("bert", "bbc-news", run, "--init", str(wordpiece_dir), "--attention", "lsh",
                           "--set", "task.max_len=12")) == 2
    err = capsys.readouterr().err
    assert str(refused.value) in err and "shares queries and keys" in err and not run.exists()
    # from a qkv run (--init RUN) the same
    first = tmp_path / "first"
    assert main(train_argv("bert", "bbc-news", first, "--init", str(wordpiece_dir), "--set", "task.max_len=12",
                           "--threads", "1")) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "preset cpu" not in out and f"from {wordpiece_dir}" in out
    assert json.loads((first / "run.json").read_text())["preset"] is None
    assert main(train_argv("bert", "bbc-news", run, "--init", str(first), "--attention", "lsh",
                           "--set", "task.max_len=12", "--set", f"task.tokenizer={wordpiece_dir}")) == 2
    assert "shares queries and keys" in capsys.readouterr().err and not run.exists()
