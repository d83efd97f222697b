"""``qkv export RUN OUT``: a run as transformers' pipelines read it (its tokenizer, its class names,
its generation settings) or as qkv reads it; OUT appears only complete. Tiny models trained a few
steps on the fake BBC articles and the one-play Shakespeare of the fixtures."""

import json

import pytest
import torch

from qkv._errors import UserError
from qkv.cli import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")



def _test_texts(n):
    """The first ``n`` articles of the bbc-news test split and their texts, in the task's order."""
    from qkv.tasks.classify import split_indices
    from qkv.tasks.bbc import load_bbc

    articles = load_bbc()
    index = split_indices(len(articles), key="bbc-news")["test"][:n]
    return [articles[i][0] for i in index.tolist()]


def test_a_bert_classifier_in_a_text_classification_pipeline(byte_data, bert_checkpoint, tmp_path, train_argv, capsys):
    run, out = tmp_path / "run", tmp_path / "out"
    assert main(train_argv("bert", "bbc-news", run, "--init", str(bert_checkpoint), "--threads", "1", "--steps", "3",
                           "--set", "task.max_len=12")) == 0, capsys.readouterr().err
    assert main(["export", str(run), str(out), "--threads", "1"]) == 0, capsys.readouterr().err
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    from qkv import runs

    trained = runs.load(run)
    rows = next(trained.task.eval_batches("test", 8))
    with torch.no_grad():
        ours = trained.model(rows["input_ids"], attention_mask=rows["attention_mask"]).logits.softmax(-1)  # (8, 5)
    pipe = transformers.pipeline("text-classification", model=str(out))
    theirs = pipe(_test_texts(8), truncation=True, top_k=None)  # truncation: the task's max_len tokens
    names = list(trained.task.class_names)
    for p, scores in zip(ours, theirs):
        by_name = {s["label"]: s["score"] for s in scores}
        assert set(by_name) == set(names)  # the classes by name, not LABEL_i
        assert scores[0]["label"] == names[int(p.argmax())]
        torch.testing.assert_close(torch.tensor([by_name[n] for n in names]), p, atol=1e-5, rtol=0)


def test_a_char_gpt_in_a_text_generation_pipeline(shakespeare_cache, tmp_path, train_argv, capsys):
    run, out = tmp_path / "run", tmp_path / "out"
    tiny = ["--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
            "--set", "task.block_size=32", "--lr", "1e-2", "--threads", "1"]
    assert main(train_argv("gpt", "shakespeare-char", run, *tiny, steps=40, batch_size=8)) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "To be", "--max-new-tokens", "24", "--temperature", "0",
                 "--threads", "1"]) == 0
    ours = capsys.readouterr().out.splitlines()[0]
    assert main(["export", str(run), str(out)]) == 0, capsys.readouterr().err
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["do_sample"] is False and generation["pad_token_id"] == 0
    pipe = transformers.pipeline("text-generation", model=str(out))
    theirs = pipe("To be", max_new_tokens=24)[0]["generated_text"]
    assert theirs == ours and len(ours) > len("To be")


@pytest.mark.parametrize("kind", ["char", "byte"])
def test_an_exported_tokenizer_gives_qkvs_ids_and_text(kind, tmp_path):
    from qkv.hf.export import write_hf_tokenizer
    from qkv.tasks.vocab import ByteVocab, CharVocab

    vocab = CharVocab("To be, or not to be:\nthat is the question?") if kind == "char" else ByteVocab()
    write_hf_tokenizer(vocab, tmp_path, model_max_length=64)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    # (a literal "<pad>" in a text is the special token, as in any transformers tokenizer: not tried)
    for text in ("To be, or not", "  two  spaces\nand a newline", "unknown: Zürich ✓ <p>x", ""):
        ids = tok(text)["input_ids"]
        assert ids == vocab.encode(text), text
        assert tok.decode(ids, skip_special_tokens=True) == vocab.decode(ids)
    assert (tok.pad_token_id, tok.eos_token_id) == (vocab.pad_id, vocab.eos_id)


def test_out_appears_only_complete_and_a_foreign_folder_is_refused(shakespeare_cache, tmp_path, train_argv, capsys):
    run = tmp_path / "run"
    tiny = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
            "--set", "task.block_size=16", "--threads", "1"]
    assert main(train_argv("gpt", "shakespeare-char", run, *tiny)) == 0, capsys.readouterr().err
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(["export", str(run), str(foreign)]) == 2
    assert "already holds other files (notes.txt)" in capsys.readouterr().err
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    out = tmp_path / "out"
    assert main(["export", str(run), str(out), "--format", "qkv"]) == 0
    from qkv.models import load_pretrained

    assert json.loads((out / "vocab.json").read_text())["type"] == "char"
    assert isinstance(load_pretrained(out), type(__import__("qkv").runs.load(run).model))
    assert main(["export", str(run), str(out)]) == 0  # an earlier export is replaced, whole
    assert (out / "tokenizer.json").is_file() and not (out / "vocab.json").exists()
    # a model transformers has no counterpart for is refused, and nothing is left behind
    window = tmp_path / "window"
    assert main(train_argv("gpt", "shakespeare-char", window, *tiny, "--attention", "window",
                           "--set", "attention_kwargs.radius=4")) == 0
    capsys.readouterr()
    assert main(["export", str(window), str(tmp_path / "w-out")]) == 2
    assert "attention='window' has no counterpart" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".w-out", "w-out"))) == []


def test_berts_word_vocabulary_exports_and_another_word_split_is_refused(byte_data, tmp_path, train_argv, capsys):
    """bbc-news for BERT without --init builds BERT's word vocabulary (qkv.tasks.bbc.tokenize's
    words): it exports as a WordLevel tokenizer whose ids are qkv's, and the pipeline's scores are
    qkv's. A word vocabulary split by any other rule has no tokenizers counterpart: refused, with
    the qkv format as the way out."""
    from qkv import runs
    from qkv.hf.export import hf_tokenizer
    from qkv.tasks.vocab import WordVocab

    run, out = tmp_path / "run", tmp_path / "hf"
    tiny = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
            "--set", "task.max_len=12", "--threads", "1"]
    assert main(train_argv("bert", "bbc-news", run, *tiny)) == 0, capsys.readouterr().err
    assert main(["export", str(run), str(out)]) == 0, capsys.readouterr().err
    trained = runs.load(run)
    texts, vocab = _test_texts(4), trained.task.vocab
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in texts + ["Don't STOP: 2,225 shares' rose!\n\nZürich", ""]:
        assert tok(text)["input_ids"] == [vocab.cls_id, *vocab.encode(text), vocab.sep_id], text
    pipe = transformers.pipeline("text-classification", model=str(out))
    for text, scores in zip(texts, pipe(texts, truncation=True, top_k=None)):
        ids = torch.tensor([[vocab.cls_id, *vocab.encode(text)[:10], vocab.sep_id]])
        with torch.no_grad():
            ours = trained.model(ids).logits.softmax(-1)[0]
        by_name = {s["label"]: s["score"] for s in scores}
        torch.testing.assert_close(torch.tensor([by_name[n] for n in trained.task.class_names]), ours, atol=1e-5, rtol=0)
    with pytest.raises(UserError, match="a WordVocab splits text by qkv's own rules.*--format qkv"):
        hf_tokenizer(WordVocab(["some", "words"], split=lambda text: text.split(",")))
    assert main(["export", str(run), str(tmp_path / "mine"), "--format", "qkv"]) == 0
    assert json.loads((tmp_path / "mine" / "vocab.json").read_text())["type"] == "word"


def _tiny_runs(tmp_path, train_argv, capsys):
    """Two char-GPT runs of different widths (an export of one cannot pass for the other's)."""
    runs = []
    for width in (16, 32):
        run = tmp_path / f"run{width}"
        assert main(train_argv("gpt", "shakespeare-char", run, "--set", "n_layers=1", "--set", f"d_model={width}",
                               "--set", "n_heads=2", "--set", "d_ff=32", "--set", "task.block_size=16",
                               "--threads", "1")) == 0, capsys.readouterr().err
        runs.append(run)
    capsys.readouterr()
    return runs


def _users_model(folder, *names):
    """A folder of the user's own holding files of the names an export writes."""
    folder.mkdir()
    for name in names:
        (folder / name).write_text(f"the user's {name}")
    return folder


def _no_space(monkeypatch):
    """The disk fills while the weights are written: safetensors' own error for ENOSPC."""
    from safetensors import SafetensorError

    import qkv._modelfile as modelfile

    def full(tensors, path, metadata=None):
        open(path, "wb").write(b"\0" * 100)  # a part written, then the device is full
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modelfile, "save_file", full)


def _read_only(monkeypatch):
    """OUT's file system is mounted read-only: making the folder beside it fails with EROFS."""
    import errno
    import os
    from pathlib import Path as P

    real = P.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name.startswith(".o"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(P, "mkdir", mkdir)


def test_bad_exports_are_one_line_before_anything_is_written(shakespeare_cache, tmp_path, train_argv, capsys, monkeypatch):
    """The bad-option and hostile-input table of ``qkv export``: each a one-line refusal naming what
    was wrong, exit 2, no traceback, and nothing written (a folder the user had is as it was)."""
    import os
    import shutil

    run, other = _tiny_runs(tmp_path, train_argv, capsys)
    a_file = tmp_path / "a-file.txt"
    a_file.write_text("x")
    fake_run = tmp_path / "fake-run"
    fake_run.mkdir()
    (fake_run / "run.json").write_text("{" * 100_000)  # hostile: 100,000-deep JSON
    # a run whose model/ is a link to another run's, and one whose model/ is a copy of it: exported
    # with this run's tokenizer they would not decode what the model was trained on
    linked, copied = tmp_path / "linked", tmp_path / "copied"
    for target in (linked, copied):
        shutil.copytree(run, target)
        shutil.rmtree(target / "model")
    os.symlink(other / "model", linked / "model")
    shutil.copytree(other / "model", copied / "model")
    users = tmp_path / "o5-users-model"
    _users_model(users, "config.json", "model.safetensors", "tokenizer.json")
    lone = _users_model(tmp_path / "o6-lone-config", "config.json")
    rows = [  # (command line, a word of the one line, what to break first)
        (["export", str(tmp_path / "nope"), str(tmp_path / "o1")], "nope", None),
        (["export", str(a_file), str(tmp_path / "o2")], "a-file.txt", None),
        (["export", str(run), str(a_file)], "a-file.txt", None),
        (["export", str(fake_run), str(tmp_path / "o3")], "run.json", None),
        (["export", str(run), str(users)], "already holds other files (config.json, model.safetensors, tokenizer.json)", None),
        (["export", str(run), str(lone)], "already holds other files (config.json)", None),
        (["export", str(linked), str(tmp_path / "o7")], "leads outside the run", None),
        (["export", str(copied), str(tmp_path / "o8")], "was saved by another run", None),
        (["export", str(run), str(tmp_path / "o9")], "no space left on the device", _no_space),
        (["export", str(run), str(tmp_path / "o10")], "read-only", _read_only),
    ]
    for argv, named, breaking in rows:
        with monkeypatch.context() as patch:
            if breaking is not None:
                breaking(patch)
            assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert named in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (argv, err)
    with pytest.raises(SystemExit) as exc:
        main(["export", str(run), str(tmp_path / "o4"), "--format", "onnx"])
    assert exc.value.code == 2 and "invalid choice: 'onnx'" in capsys.readouterr().err
    assert a_file.read_text() == "x"
    for folder, names in ((users, ["config.json", "model.safetensors", "tokenizer.json"]), (lone, ["config.json"])):
        assert sorted(p.name for p in folder.iterdir()) == names
        assert all((folder / n).read_text() == f"the user's {n}" for n in names)
    assert not any(p.name.startswith(("o1", "o2", "o3", "o4", "o7", "o8", "o9", ".o")) for p in tmp_path.iterdir())
    # an export is replaced by the next (its marker says it is one); an export without it, from an
    # older qkv, is refused as any folder is (remove it, then export)
    out = tmp_path / "out"
    assert main(["export", str(run), str(out)]) == 0 and main(["export", str(other), str(out)]) == 0
    (out / ".qkv-export.json").unlink()
    assert main(["export", str(run), str(out)]) == 2 and "already holds other files" in capsys.readouterr().err


def _export_forever(runs, out):
    from qkv.cli import main as cli

    while True:
        for run in runs:
            cli(["export", str(run), str(out)])


def test_kill_during_export_leaves_the_old_or_the_new_export(shakespeare_cache, tmp_path, train_argv, capsys):
    """kill -9 while ``qkv export`` replaces OUT (two runs exported in turn): OUT afterwards is one
    run's export whole — its config.json's width is the width of the weights beside it."""
    import multiprocessing
    import random
    import time

    from qkv._io import settle_directory
    from qkv._modelfile import read_layout

    runs = _tiny_runs(tmp_path, train_argv, capsys)
    out = tmp_path / "out"
    assert main(["export", str(runs[0]), str(out)]) == 0
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(0)
    for _ in range(10):
        child = ctx.Process(target=_export_forever, args=(runs, out))
        child.start()
        time.sleep(rng.uniform(0.3, 1.5))
        child.kill()
        child.join()
        settle_directory(out)  # what the next export or load does first: finish a swap cut between renames
        width = json.loads((out / "config.json").read_text())["n_embd"]
        assert read_layout(out / "model.safetensors")["transformer.wte.weight"][1][1] == width
        assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    capsys.readouterr()
