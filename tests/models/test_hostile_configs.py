"""Hostile config.json files (issue 37, items 2-4): every entry of the table is refused with one
line naming the file and the field (a ``CheckpointError``, a ``qkv.UserError``) before any tensor is
built — in qkv's format and in Hugging Face's, through ``from_pretrained`` and through
``qkv train --init`` — and weights the qkv format refuses (NaN, inf, one dtype among another) are
refused in Hugging Face's too. Add a row here for every new field or format a loader reads."""

import json
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from qkv._errors import UserError
from qkv.cli import main
from qkv.models import QKVModel
from qkv.models.transformer.bert import BERT, BERTConfig
from qkv.models.transformer.gpt import GPT, GPTConfig
from qkv.train.checkpoint import CheckpointError

TINY = dict(vocab_size=11, max_len=16, n_layers=1, d_model=8, n_heads=2, d_ff=16, dropout=0.0)
DEEP = 100_000


def _qkv_dir(path):
    torch.manual_seed(0)
    GPT(GPTConfig(**TINY)).save_pretrained(path)
    return path


def _hf_dir(path):
    torch.manual_seed(0)
    BERT(BERTConfig(**{**TINY, "vocab_size": 12})).save_pretrained(path, format="huggingface")
    return path


def _raw(path, text):
    (path / "config.json").write_text(text)


def _set(path, **values):
    config = json.loads((path / "config.json").read_text())
    config.update(values)
    (path / "config.json").write_text(json.dumps(config))


# (format, what is done to config.json, a word the one line must hold: the field)
HOSTILE = {
    "deep-json-qkv": ("qkv", lambda p: _raw(p, '{"model_type": "gpt", "d_model": ' + "[" * DEEP + "]" * DEEP + "}"), "d_model"),
    "deep-json-hf": ("hf", lambda p: _raw(p, '{"model_type": "bert", "x": ' + "{\"a\": " * DEEP + "1" + "}" * DEEP + "}"), "nested too deeply"),
    "5000-digit-int-qkv": ("qkv", lambda p: _raw(p, '{"model_type": "gpt", "d_model": 1' + "0" * 5000 + "}"), "d_model"),
    "5000-digit-int-hf": ("hf", lambda p: _raw(p, '{"model_type": "bert", "hidden_size": 1' + "0" * 5000 + "}"), "hidden_size"),
    "not-an-object": ("qkv", lambda p: _raw(p, "[1, 2]"), "JSON object"),
    "not-utf8": ("qkv", lambda p: (p / "config.json").write_bytes(b'{"model_type": "\xff"}'), "not valid JSON"),
    "type_vocab_size-0": ("hf", lambda p: _set(p, type_vocab_size=0), "type_vocab_size"),
    "hidden_act-list": ("hf", lambda p: _set(p, hidden_act=["gelu"]), "hidden_act"),
    "model_type-list-hf": ("hf", lambda p: _set(p, model_type=["bert"]), "model_type"),
    "model_type-list-qkv": ("qkv", lambda p: _set(p, model_type=["gpt"]), "model_type"),
    "model_type-unknown": ("qkv", lambda p: _set(p, model_type="nonexistent"), "nonexistent"),
    "architectures-nested": ("hf", lambda p: _set(p, architectures=[["BertModel"]]), "architectures"),
    "layer_norm_eps-nan": ("hf", lambda p: _set(p, layer_norm_eps=float("nan")), "layer_norm_eps"),
    "layer_norm_eps-inf": ("hf", lambda p: _set(p, layer_norm_eps=float("inf")), "layer_norm_eps"),
    "layer_norm_eps-negative": ("hf", lambda p: _set(p, layer_norm_eps=-1.0), "layer_norm_eps"),
    "dropout-nan-hf": ("hf", lambda p: _set(p, hidden_dropout_prob=float("nan")), "hidden_dropout_prob"),
    "dropout-2-hf": ("hf", lambda p: _set(p, attention_probs_dropout_prob=2.0), "attention_dropout"),
    "hidden_size-bool": ("hf", lambda p: _set(p, hidden_size=True), "hidden_size"),
    "hidden_size-1e9": ("hf", lambda p: _set(p, hidden_size=10**9, intermediate_size=4), "d_model=1000000000"),
    "id2label-list": ("hf", lambda p: _set(p, architectures=["BertForSequenceClassification"], id2label=["a"]), "id2label"),
    "layer_norm_eps-nan-qkv": ("qkv", lambda p: _set(p, layer_norm_eps=float("nan")), "layer_norm_eps"),
    "n_layers-string": ("qkv", lambda p: _set(p, n_layers="2"), "n_layers"),
    "n_heads-0": ("qkv", lambda p: _set(p, n_heads=0), "n_heads"),
    "dropout-2-qkv": ("qkv", lambda p: _set(p, dropout=2.0), "dropout"),
    "attention_kwargs-list": ("qkv", lambda p: _set(p, attention_kwargs=[1]), "attention_kwargs"),
    "d_model-1e9-qkv": ("qkv", lambda p: _set(p, d_model=10**9), "d_model=1000000000"),
    "n_layers-1e4000": ("qkv", lambda p: _set(p, n_layers=10**4000), "n_layers"),
    "dropout-1e400-qkv": ("qkv", lambda p: _set(p, dropout=10**400), "dropout"),
    "layer_norm_eps-1e400-hf": ("hf", lambda p: _set(p, layer_norm_eps=10**400), "layer_norm_eps"),
    "unknown-field": ("qkv", lambda p: _set(p, bogus=1), "bogus"),
    "nested-layout": ("qkv", lambda p: _raw(p, json.dumps({"model": "gpt", "config": {**TINY, "d_ff": -1}})), "d_ff"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_config_is_one_line_naming_file_and_field(tmp_path, case):
    fmt, spoil, field = HOSTILE[case]
    directory = (_qkv_dir if fmt == "qkv" else _hf_dir)(tmp_path / "m")
    spoil(directory)
    started = time.monotonic()
    with pytest.raises(UserError) as e:  # CheckpointError is one
        QKVModel.from_pretrained(directory)
    message = str(e.value)
    assert time.monotonic() - started < 10
    assert "\n" not in message and len(message) < 1000, message
    assert str(directory) in message and field in message, message


def test_hostile_init_through_the_command_line_is_one_line_and_writes_nothing(shakespeare_cache, train_argv, capsys):
    out = shakespeare_cache / "run"
    for spoil, field in [(HOSTILE["deep-json-qkv"][1], "d_model"), (HOSTILE["d_model-1e9-qkv"][1], "d_model"),
                         (HOSTILE["model_type-list-qkv"][1], "model_type")]:
        directory = _qkv_dir(shakespeare_cache / "m")
        spoil(directory)
        capsys.readouterr()
        assert main(train_argv("gpt", "shakespeare-char", out, "--init", str(directory), "--threads", "1")) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(directory) in err and field in err, err
        assert not out.exists()
    # a run directory as --init, its run.json 100,000 deep
    source = shakespeare_cache / "source"
    source.mkdir()
    (source / "run.json").write_text('{"model": "gpt", "task": ' + "[" * DEEP + "]" * DEEP + "}")
    assert main(train_argv("gpt", "shakespeare-char", out, "--init", str(source), "--threads", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run.json is corrupt" in err and not out.exists()


def _spoil_weights(directory, change):
    weights = directory / "model.safetensors"
    tensors = load_file(weights)
    name = "encoder.layer.0.intermediate.dense.weight"
    name = name if name in tensors else "bert." + name
    tensors[name] = change(tensors[name])
    save_file(tensors, weights, metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_hugging_face_weights_are_refused_naming_the_tensor(tmp_path, bad):
    directory = _hf_dir(tmp_path / "m")

    def poison(t):
        t = t.clone()
        t.view(-1)[5] = bad
        return t

    name = _spoil_weights(directory, poison)
    with pytest.raises(CheckpointError, match=rf"{name}.*1 non-finite value"):
        QKVModel.from_pretrained(directory)


def test_one_float16_tensor_among_float32_is_refused_and_a_float16_checkpoint_loads_so(tmp_path):
    directory = _hf_dir(tmp_path / "m")
    name = _spoil_weights(directory, lambda t: t.to(torch.float16))
    with pytest.raises(CheckpointError, match=rf"{name}.*float16.*expects float32"):
        QKVModel.from_pretrained(directory)
    tensors = {k: v.to(torch.float16) for k, v in load_file(directory / "model.safetensors").items()}
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    model = QKVModel.from_pretrained(directory)
    assert {p.dtype for p in model.parameters()} == {torch.float16}


def _add_sparse_tensor(weights, name, size=4 * 2**30):
    """Declare in the header of the safetensors file ``weights`` one more tensor of ``size`` bytes,
    the file grown sparsely (no block of it written)."""
    data = weights.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [end, end + size]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(weights, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data[8 + n:8 + n + end])
        f.truncate(8 + len(text) + end + size)


def test_an_extra_sparse_4_gib_tensor_is_refused_from_the_header(tmp_path):
    """A 4 GiB tensor the model has no place for, in a sparse file: refused without reading it, in
    a qkv model directory, a Hugging Face one and a training checkpoint."""
    from qkv.train.checkpoint import load_checkpoint, save_checkpoint

    GPT.from_config(TINY)  # the first model sized on the meta device pays PyTorch's lazy imports, not timed
    for fmt, make in (("qkv", _qkv_dir), ("hf", _hf_dir)):
        directory = make(tmp_path / fmt)
        weights = directory / "model.safetensors"
        _add_sparse_tensor(weights, "zzz.extra")
        started = time.monotonic()
        with pytest.raises(CheckpointError, match="no place for: zzz.extra"):
            QKVModel.from_pretrained(directory)
        assert time.monotonic() - started < 2.0  # reading 4 GiB took 6.3 s
        weights.unlink()
    model = GPT(GPTConfig(**TINY))
    checkpoint = save_checkpoint(tmp_path / "step.safetensors", model, step=1)
    _add_sparse_tensor(checkpoint, "model/zzz.extra")
    started = time.monotonic()
    with pytest.raises(CheckpointError, match="no place for: model/zzz.extra"):
        load_checkpoint(checkpoint, model)
    assert time.monotonic() - started < 2.0  # reading 4 GiB took 6.3 s
    checkpoint.unlink()
