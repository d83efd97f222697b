"""``qkv train bert --task bbc-news --init DIR`` from a Hugging Face checkpoint directory: the task
takes the checkpoint's tokenizer, the weights come from the bert_checkpoint, and ``qkv eval``, ``viz``
and ``viz --html`` work on the run (a tiny random BERT with a tiny WordPiece tokenizer; the BBC
articles from the cache)."""

import json

import pytest
import torch

from qkv.cli import main
from qkv.tasks.bbc import is_bbc_cached

transformers = pytest.importorskip("transformers")
needs_bbc = pytest.mark.skipif(not is_bbc_cached(), reason="BBC News is not cached (qkv data fetch bbc)")



@needs_bbc
def test_fine_tune_from_a_hugging_face_checkpoint(bert_checkpoint, tmp_path, train_argv, capsys):
    run = tmp_path / "run"
    code = main(train_argv("bert", "bbc-news", run, "--init", str(bert_checkpoint), "--threads", "1", "--set", "task.max_len=16"))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "has no classifier: it starts fresh" in err and "fresh: classifier.weight, classifier.bias" in out
    info = json.loads((run / "run.json").read_text())
    # the run keeps its own copy of the checkpoint's tokenizer (named relative to the run)
    assert info["task"] == "bbc-news-tokens" and info["task_options"]["tokenizer"] == "tokenizer.json"
    assert (run / "tokenizer.json").read_bytes() == (bert_checkpoint / "tokenizer.json").read_bytes()
    c = info["model_config"]
    assert (c["n_layers"], c["d_model"], c["vocab_size"], c["head"], c["num_labels"]) == (2, 16, 24, "classification", 5)
    assert main(["eval", str(run), "--max-examples", "4", "--threads", "1"]) == 0, capsys.readouterr().err
    assert main(["viz", str(run), "--out", str(tmp_path / "a.png"), "--threads", "1"]) == 0, capsys.readouterr().err
    assert main(["viz", str(run), "--html", str(tmp_path / "a.html"), "--threads", "1"]) == 0, capsys.readouterr().err
    assert (tmp_path / "a.png").stat().st_size > 1000 and "[CLS]" in (tmp_path / "a.html").read_text()


@needs_bbc
def test_the_encoder_is_the_checkpoints(bert_checkpoint, tmp_path, train_argv, capsys):
    """With a vanishing learning rate the run's encoder is the checkpoint's: its hidden states are transformers'."""
    run = tmp_path / "run"
    assert main(train_argv("bert", "bbc-news", run, "--init", str(bert_checkpoint), "--lr", "1e-12", "--threads", "1",
                           "--set", "task.max_len=16", "--set", "dropout=0.0")) == 0, capsys.readouterr().err
    from qkv.models import load_pretrained

    ours = load_pretrained(run / "model").eval()
    theirs = transformers.BertModel.from_pretrained(bert_checkpoint).eval()
    ids = torch.randint(0, 24, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).hidden, theirs(input_ids=ids).last_hidden_state, atol=1e-5, rtol=0)


def test_a_task_with_its_own_vocabulary_is_refused(bert_checkpoint, tmp_path, train_argv, capsys):
    code = main(train_argv("bert", "bert-pretrain", tmp_path / "run", "--init", str(bert_checkpoint)))
    err = capsys.readouterr().err
    assert code == 2 and "reads the ids of its own tokenizer" in err and "bert-pretrain" in err
    assert not (tmp_path / "run").exists()


@needs_bbc
def test_a_checkpoint_of_another_architecture_is_refused(wordpiece_dir, tmp_path, train_argv, capsys):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=24, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    transformers.GPT2Model(config).save_pretrained(wordpiece_dir)  # beside a tokenizer.json
    code = main(train_argv("bert", "bbc-news", tmp_path / "run", "--init", str(wordpiece_dir)))
    err = capsys.readouterr().err
    assert code == 2 and "loads into qkv.models.GPT, not BERT" in err, err
    assert not (tmp_path / "run").exists()


@needs_bbc
def test_the_run_outlives_its_checkpoint(bert_checkpoint, tmp_path, train_argv, capsys):
    """The run reads its own tokenizer copy: after the checkpoint is gone, and with the run moved
    elsewhere, eval and a resume still work."""
    import shutil

    run = tmp_path / "run"
    assert main(train_argv("bert", "bbc-news", run, "--init", str(bert_checkpoint), "--threads", "1",
                           "--set", "task.max_len=16")) == 0, capsys.readouterr().err
    shutil.rmtree(bert_checkpoint)
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    run.rename(moved)
    capsys.readouterr()
    assert main(["eval", str(moved), "--max-examples", "4", "--threads", "1"]) == 0, capsys.readouterr().err
    argv = ["train", "bert", "--task", "bbc-news", "--out", str(moved), "--resume", "--steps", "3", "--threads", "1",
            "--progress", "false", "--tensorboard", "false"]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads((moved / "run.json").read_text())["task_options"]["tokenizer"] == "tokenizer.json"
