"""``qkv export`` read by transformers' pipelines, each compared with qkv's own answer on the same
run: a MiniLM classifier on sentence pairs (segment ids), a char LM generating a batch of prompts
of different lengths (left padding) and up to its context limit, a GPT classifier, and a
``bert-pretrain`` run in a fill-mask pipeline."""

import json

import pytest
import torch

from qkv import runs
from qkv.cli import main
from qkv.tasks import data

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

# the real checkpoint lives in the user's cache; byte_data moves QKV_DATA, so it is found first
MINILM = data.minilm_dir() if data.is_cached("minilm") else None
needs_minilm = pytest.mark.skipif(MINILM is None, reason="run `qkv data fetch minilm` first")

TINY_LM = ["--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--lr", "1e-2",
           "--threads", "1"]


@needs_minilm
def test_a_minilm_classifier_reads_a_sentence_pair_with_its_segments(byte_data, tmp_path, train_argv, capsys):
    """A pair gives ``token_type_ids`` 0 for ``[CLS] A [SEP]`` and 1 for ``B [SEP]``, as MiniLM's own
    tokenizer does; the pipeline's scores are qkv's on those segments."""
    run, out = tmp_path / "run", tmp_path / "out"
    assert main(train_argv("bert", "bbc-news", run, "--init", str(MINILM), "--threads", "1", "--steps", "1",
                           "--set", "task.max_len=16")) == 0, capsys.readouterr().err
    assert main(["export", str(run), str(out)]) == 0, capsys.readouterr().err
    first, second = "Shares rose at the market.", "The film won an award."
    exported = transformers.AutoTokenizer.from_pretrained(str(out))(first, second)
    assert dict(exported) == dict(transformers.AutoTokenizer.from_pretrained(str(MINILM))(first, second))
    trained = runs.load(run)
    tok, model = trained.task.vocab, trained.model
    a, b = tok.encode(first), tok.encode(second)
    ids = torch.tensor([[tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]])
    types = torch.tensor([[0] * (len(a) + 2) + [1] * (len(b) + 1)])
    with torch.no_grad():
        ours = model(ids, token_type_ids=types).logits.softmax(-1)[0]
        one_segment = model(ids, token_type_ids=torch.zeros_like(types)).logits.softmax(-1)[0]
    assert (ours - one_segment).abs().max() > 1e-5  # the segments matter: all-zero ids would be a wrong number
    pipe = transformers.pipeline("text-classification", model=str(out))
    theirs = {s["label"]: s["score"] for s in pipe({"text": first, "text_pair": second}, top_k=None)}
    names = list(trained.task.class_names)
    torch.testing.assert_close(torch.tensor([theirs[n] for n in names]), ours, atol=1e-5, rtol=0)


def _char_lm(tmp_path, train_argv, capsys, block=16):
    run, out = tmp_path / "run", tmp_path / "out"
    assert main(train_argv("gpt", "shakespeare-char", run, *TINY_LM, "--set", f"task.block_size={block}",
                           steps=30, batch_size=8)) == 0, capsys.readouterr().err
    assert main(["export", str(run), str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return run, out


def _qkv_generate(run, prompt, n, capsys):
    assert main(["generate", str(run), "--prompt", prompt, "--max-new-tokens", str(n), "--temperature", "0",
                 "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert printed.endswith("\n")
    return printed[:-1]  # the text as printed, newlines of its own included


def test_a_batch_of_prompts_of_different_lengths_generates_each_as_alone(shakespeare_cache, tmp_path, train_argv,
                                                                          capsys):
    """The LM's tokenizer pads on the left: each row's next token follows its own last character,
    so a batch gives what each prompt gives alone with ``qkv generate``."""
    run, out = _char_lm(tmp_path, train_argv, capsys)
    prompts = ["To be", "HAMLET\n\nTo"]
    ours = [_qkv_generate(run, p, 6, capsys) for p in prompts]
    assert json.loads((out / "tokenizer_config.json").read_text())["padding_side"] == "left"
    pipe = transformers.pipeline("text-generation", model=str(out))
    theirs = pipe(prompts, max_new_tokens=6, batch_size=2)
    assert [t[0]["generated_text"] for t in theirs] == ours


def _test_texts(n):
    """The first ``n`` articles of the bbc-news test split (bbc-bytes reads the same partition)."""
    from qkv.tasks.bbc import load_bbc
    from qkv.tasks.classify import split_indices

    articles = load_bbc()
    return [articles[i][0] for i in split_indices(len(articles), key="bbc-news")["test"][:n].tolist()]


SMALL = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32", "--threads", "1"]


def test_a_gpt_classifier_in_a_text_classification_pipeline(byte_data, tmp_path, train_argv, capsys):
    """A GPT classifier exports as GPT2ForSequenceClassification (its bias moved into the final
    norm's): the pipeline's scores on a padded batch are qkv's on each text alone."""
    run, out = tmp_path / "run", tmp_path / "out"
    assert main(train_argv("gpt", "bbc-bytes", run, *SMALL, "--set", "task.max_len=40", steps=3)) == 0, \
        capsys.readouterr().err
    assert main(["export", str(run), str(out)]) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["architectures"] == ["GPT2ForSequenceClassification"]
    trained = runs.load(run)
    id2label = json.loads((out / "config.json").read_text())["id2label"]
    texts, names = _test_texts(4), [id2label[str(i)] for i in range(len(id2label))]
    assert trained.model.classifier.bias.abs().max() > 0  # a bias to move: the fold is exercised
    pipe = transformers.pipeline("text-classification", model=str(out))
    theirs = pipe(texts, truncation=True, top_k=None, batch_size=4)  # rows of different lengths: padded
    for text, scores in zip(texts, theirs):
        ids = torch.tensor([trained.task.vocab.encode(text)[:40]])
        with torch.no_grad():
            ours = trained.model(ids).logits.softmax(-1)[0]
        by_name = {s["label"]: s["score"] for s in scores}
        torch.testing.assert_close(torch.tensor([by_name[n] for n in names]), ours, atol=1e-5, rtol=0)


def test_a_bert_pretrain_run_in_a_fill_mask_pipeline(byte_data, tmp_path, train_argv, capsys):
    """bert-pretrain's word vocabulary exports as a WordLevel tokenizer that splits as qkv does;
    the fill-mask pipeline's words and scores are qkv's MLM head at the ``[MASK]``."""
    run, out = tmp_path / "run", tmp_path / "out"
    assert main(train_argv("bert", "bert-pretrain", run, *SMALL, "--set", "task.max_len=24", steps=3)) == 0, \
        capsys.readouterr().err
    assert main(["export", str(run), str(out)]) == 0, capsys.readouterr().err
    trained = runs.load(run)
    vocab = trained.task.vocab
    before, after = "Headline 12 news", "news sport."
    ids = torch.tensor([[vocab.cls_id, *vocab.encode(before), vocab.mask_id, *vocab.encode(after), vocab.sep_id]])
    with torch.no_grad():
        probs = trained.model(ids).logits[0, 1 + len(vocab.encode(before))].softmax(-1)
    top = probs.topk(5)
    pipe = transformers.pipeline("fill-mask", model=str(out))
    theirs = pipe(f"{before} [MASK] {after}", top_k=5)
    assert [t["token"] for t in theirs] == top.indices.tolist()
    assert [t["token_str"] for t in theirs] == [vocab.words[i] for i in top.indices.tolist()]
    torch.testing.assert_close(torch.tensor([t["score"] for t in theirs]), top.values, atol=1e-5, rtol=0)


def test_generation_runs_to_the_models_positions_as_qkv_generate(shakespeare_cache, tmp_path, train_argv, capsys):
    """generation_config.json says the limit (the model's positions): the pipeline generates up to
    it, greedy, and gives qkv generate's text of that length."""
    run, out = _char_lm(tmp_path, train_argv, capsys, block=16)
    positions = runs.load(run).model.config.max_len
    assert json.loads((out / "generation_config.json").read_text())["max_length"] == positions
    prompt = "To be"
    ours = _qkv_generate(run, prompt, positions - len(prompt), capsys)
    theirs = transformers.pipeline("text-generation", model=str(out))(prompt)[0]["generated_text"]
    assert theirs == ours and len(ours) == positions


def test_save_pretrained_of_a_runs_model_writes_its_tokenizer(byte_data, tmp_path, train_argv, capsys):
    """``run.model.save_pretrained(dir, format="huggingface")`` from Python writes what ``qkv export``
    writes (the tokenizer, the class names): the pipeline's labels and scores are qkv's. A model
    whose vocabulary no tokenizer reproduces is refused with the reason."""
    from qkv._errors import UserError
    from qkv.hf.tokenizer import remember_text
    from qkv.tasks.vocab import WordVocab

    run = tmp_path / "run"
    assert main(train_argv("bert", "bbc-news", run, *SMALL, "--set", "task.max_len=12", steps=3)) == 0, \
        capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / "exported")]) == 0, capsys.readouterr().err
    trained = runs.load(run)
    trained.model.save_pretrained(tmp_path / "saved", format="huggingface")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"):
        assert (tmp_path / "saved" / name).read_bytes() == (tmp_path / "exported" / name).read_bytes(), name
    texts, vocab = _test_texts(4), trained.task.vocab
    pipe = transformers.pipeline("text-classification", model=str(tmp_path / "saved"))
    for text, scores in zip(texts, pipe(texts, truncation=True, top_k=None)):
        ids = torch.tensor([[vocab.cls_id, *vocab.encode(text)[:10], vocab.sep_id]])
        with torch.no_grad():
            ours = trained.model(ids).logits.softmax(-1)[0]
        by_name = {s["label"]: s["score"] for s in scores}
        torch.testing.assert_close(torch.tensor([by_name[n] for n in trained.task.class_names]), ours, atol=1e-5, rtol=0)

    class CommaWords:  # a task whose words qkv splits at commas: no tokenizers counterpart
        vocab, max_len, class_names = WordVocab(["a", "b"], split=lambda text: text.split(",")), 12, None

    remember_text(trained.model, CommaWords())
    with pytest.raises(UserError, match="a WordVocab splits text by qkv's own rules"):
        trained.model.save_pretrained(tmp_path / "refused", format="huggingface")
    assert not (tmp_path / "refused").exists()
