"""save_pretrained -> from_pretrained gives identical outputs for the stack's models; broken
checkpoints fail with a clear error."""

from __future__ import annotations

import json

import pytest
import torch

from qkv.models.base import QKVModel
from qkv.models.transformer.al_rfou import AlRfouConfig, AlRfouLM
from qkv.models.transformer.bert import BERT, BERTConfig
from qkv.models.transformer.gpt import GPT, GPTConfig
from qkv.models.transformer.transformer import Transformer, TransformerConfig
from qkv.models.transformer.transformer_xl import GTrXL, GTrXLConfig, TransformerXL, TransformerXLConfig

SMALL = dict(n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0, max_len=16)
MODELS = {
    "gpt": lambda: GPT(GPTConfig(vocab_size=11, attention="window", attention_kwargs={"radius": 2}, **SMALL)),
    "al-rfou": lambda: AlRfouLM(AlRfouConfig(vocab_size=11, n_targets=2, **SMALL)),
    "bert": lambda: BERT(BERTConfig(vocab_size=11, **SMALL)),
    "transformer": lambda: Transformer(TransformerConfig(vocab_size=11, tgt_vocab_size=9, **SMALL)),
    "transformer-xl": lambda: TransformerXL(TransformerXLConfig(vocab_size=11, mem_len=4, **SMALL)),
    "gtrxl": lambda: GTrXL(GTrXLConfig(vocab_size=11, mem_len=4, **SMALL)),
}


def run(model):
    ids = torch.randint(3, 9, (2, 6), generator=torch.Generator().manual_seed(0))
    if isinstance(model, Transformer):
        return model(ids, ids[:, :4]).logits
    return model(ids).logits


@pytest.mark.parametrize("name", sorted(MODELS))
def test_save_load_identical(name, tmp_path):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    model.save_pretrained(tmp_path)
    loaded = QKVModel.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model) and loaded.config == model.config
    assert torch.equal(run(loaded), run(model))
    head = loaded.lm_head if hasattr(loaded, "lm_head") else loaded.mlm_decoder
    assert head.weight.data_ptr() == (loaded.decoder if name == "transformer" else loaded.stack).embed.token.weight.data_ptr()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_truncated_or_corrupt_checkpoint(name, tmp_path):
    MODELS[name]().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        QKVModel.from_pretrained(tmp_path)
    weights.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="corrupt or truncated"):
        QKVModel.from_pretrained(tmp_path)


def test_bad_config_file(tmp_path):
    MODELS["gpt"]().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config"):
        QKVModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model": "gpt", "config": {"n_layers": -1}}))
    with pytest.raises(ValueError, match="n_layers"):
        QKVModel.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError):
        QKVModel.from_pretrained(tmp_path / "missing")


def test_wrong_model_class(tmp_path):
    MODELS["gpt"]().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="gpt"):
        BERT.from_pretrained(tmp_path)
