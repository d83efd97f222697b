"""Hugging Face checkpoints in and out of qkv's BERT and GPT (qkv/hf/checkpoints.py):
tiny random transformers models built offline, saved with safetensors, read by qkv, compared
output for output; and qkv models written with format="huggingface", read by transformers."""

import json
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from qkv.models import BERT, GPT, Performer, QKVModel, load_pretrained  # noqa: E402
from qkv.train.checkpoint import CheckpointError  # noqa: E402
from qkv.models import AlRfouLM  # noqa: E402

ATOL = 1e-5  # float32 rounding of the same computation in another order
BERT_SIZES = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
                  max_position_embeddings=20, type_vocab_size=3)
GPT2_SIZES = dict(vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=20, bos_token_id=0, eos_token_id=0)


def _hf(cls_name, config, directory, seed=0):
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


def _bert_config(**kw):
    return transformers.BertConfig(**{**BERT_SIZES, **kw})


def _gpt2_config(**kw):
    return transformers.GPT2Config(**{**GPT2_SIZES, **kw})


def _inputs(B=3, L=9, vocab=40, types=3):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (B, L), generator=g)
    token_types = torch.randint(0, types, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, 6:] = False  # right padding
    mask[2, 2:] = False
    return ids, token_types, mask


def _load(cls, directory, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = cls.from_pretrained(directory, **kw).eval()
    return model, [str(w.message) for w in caught]


# ----------------------------------------------------------------------------- transformers -> qkv


def test_bert_for_pretraining_gives_transformers_mlm_and_nsp_logits(tmp_path):
    hf = _hf("BertForPreTraining", _bert_config(), tmp_path)
    ours, said = _load(BERT, tmp_path)
    ids, types, mask = _inputs()
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask.long())
        out = ours(ids, types, mask)
    assert ours.config.head == "pretraining" and ours.config.layer_norm_eps == 1e-12
    torch.testing.assert_close(out.logits, theirs.prediction_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.aux["nsp_logits"], theirs.seq_relationship_logits, atol=ATOL, rtol=0)
    assert said == []  # every head it uses came from the checkpoint


def test_plain_bert_model_is_an_encoder_without_heads(tmp_path):
    """A BertModel checkpoint loads as head="encoder": no MLM/NSP/classifier is built or computed
    (all-MiniLM-L6-v2 computed a random 30,522-token MLM head on every call), no warning, and the
    output has transformers' last_hidden_state and pooler_output; 0/1 integer masks are taken."""
    hf = _hf("BertModel", _bert_config(hidden_act="relu"), tmp_path)
    ours, said = _load(BERT, tmp_path)
    assert ours.config.head == "encoder" and said == []
    assert not any(n.startswith(("mlm_", "nsp_", "classifier")) for n, _ in ours.named_parameters())
    ids, types, mask = _inputs()
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask.long())
        out = ours(ids, types, mask.long())
    assert out.logits is None and out.last_hidden_state is out.hidden
    torch.testing.assert_close(out.last_hidden_state, theirs.last_hidden_state, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.pooler_output, theirs.pooler_output, atol=ATOL, rtol=0)
    ours.save_pretrained(tmp_path / "back", format="huggingface")  # and back: a BertModel again
    again = transformers.AutoModel.from_pretrained(tmp_path / "back").eval()
    assert type(again).__name__ == "BertModel"
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).pooler_output,
                                   theirs.pooler_output, atol=ATOL, rtol=0)


def test_plain_bert_model_asked_for_pretraining_heads_says_which_start_fresh(tmp_path):
    _hf("BertModel", _bert_config(hidden_act="relu"), tmp_path)
    ours, said = _load(BERT, tmp_path, head="pretraining")
    assert len(said) == 1 and "\n" not in said[0]
    assert "masked-LM head" in said[0] and "next-sentence head" in said[0] and "pooler" not in said[0]


def test_a_checkpoint_with_heads_loads_as_an_encoder_when_asked(tmp_path):
    hf = _hf("BertForPreTraining", _bert_config(), tmp_path)
    ours, said = _load(BERT, tmp_path, head="encoder")
    ids, types, mask = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, types, mask).hidden,
                                   hf.bert(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).last_hidden_state,
                                   atol=ATOL, rtol=0)
    assert said == []


def test_bert_without_pooler_loads_it_fresh(tmp_path):
    torch.manual_seed(0)
    transformers.BertModel(_bert_config(), add_pooling_layer=False).save_pretrained(tmp_path)
    _, said = _load(BERT, tmp_path, head="classification", num_labels=4)
    assert len(said) == 1 and "pooler" in said[0] and "classifier" in said[0]


def test_bert_sequence_classifier_keeps_its_labels(tmp_path):
    hf = _hf("BertForSequenceClassification", _bert_config(num_labels=5), tmp_path)
    ours, said = _load(BERT, tmp_path)
    ids, types, mask = _inputs()
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).logits
        out = ours(ids, types, mask)
    assert (ours.config.head, ours.config.num_labels) == ("classification", 5) and said == []
    torch.testing.assert_close(out.logits, theirs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("padding", ["right", "left"])
def test_gpt2_lm_head_model_gives_transformers_logits(tmp_path, padding):
    hf = _hf("GPT2LMHeadModel", _gpt2_config(), tmp_path)
    ours, said = _load(GPT, tmp_path)
    ids, types, _ = _inputs(types=40)
    mask = torch.ones_like(ids, dtype=torch.bool)
    if padding == "right":
        mask[1, 5:] = False
    else:
        mask[1, :3] = False
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).logits
        out = ours(ids, attention_mask=mask, token_type_ids=types)
    assert ours.config.activation == "gelu-tanh" and said == []
    # rows with no real key (left padding) are zeros in qkv and whatever transformers makes of them
    torch.testing.assert_close(out.logits[mask], theirs[mask], atol=ATOL, rtol=0)


def test_gpt2_model_and_untied_head(tmp_path):
    hf = _hf("GPT2Model", _gpt2_config(), tmp_path / "base")
    ours, said = _load(GPT, tmp_path / "base")
    ids, _, _ = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).hidden, hf(input_ids=ids).last_hidden_state, atol=ATOL, rtol=0)
    assert said == []  # the tied LM head is the token table
    hf = _hf("GPT2LMHeadModel", _gpt2_config(tie_word_embeddings=False), tmp_path / "untied")
    ours, _ = _load(GPT, tmp_path / "untied")
    assert not ours.config.tie_embeddings
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(input_ids=ids).logits, atol=ATOL, rtol=0)


def test_kernel_override_and_generic_loader(tmp_path):
    hf = _hf("BertModel", _bert_config(), tmp_path)
    ids, types, mask = _inputs()
    # a window wider than the input is exact softmax attention: the same hidden states
    ours, _ = _load(BERT, tmp_path, attention="window", attention_kwargs={"radius": 32})
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).last_hidden_state
        torch.testing.assert_close(ours(ids, types, mask).hidden, theirs, atol=ATOL, rtol=0)
    assert ours.stack.layers[0].self_attn.kernel.registry_name == "window"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert type(QKVModel.from_pretrained(tmp_path)) is BERT and type(load_pretrained(tmp_path)) is BERT
    with pytest.raises(ValueError, match=r"\['d_model'\] are fixed by the checkpoint"):
        BERT.from_pretrained(tmp_path, d_model=32)
    with pytest.raises(ValueError, match="shares queries and keys"):
        BERT.from_pretrained(tmp_path, attention="lsh")
    with pytest.raises(ValueError, match="learned parameters of its own"):
        BERT.from_pretrained(tmp_path, attention="linformer", attention_kwargs={"seq_len": 20, "k": 4})
    with pytest.raises(ValueError, match="loads into qkv.models.BERT, not GPT"):
        GPT.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not Performer"):
        Performer.from_pretrained(tmp_path)


# ----------------------------------------------------------------------------- qkv -> transformers


def _no_loading_surprises(cls_name, directory):
    model, info = getattr(transformers, cls_name).from_pretrained(directory, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def test_bert_saved_for_transformers(tmp_path):
    torch.manual_seed(0)
    sizes = dict(vocab_size=40, d_model=16, n_layers=2, n_heads=2, d_ff=24, max_len=20)
    ids, types, mask = _inputs(types=2)
    pretraining = BERT.from_config({**sizes, "activation": "gelu-tanh"}).eval()
    pretraining.save_pretrained(tmp_path / "pt", format="huggingface")
    theirs = _no_loading_surprises("AutoModelForPreTraining", tmp_path / "pt")
    with torch.no_grad():
        out, ref = pretraining(ids, types, mask), theirs(input_ids=ids, token_type_ids=types, attention_mask=mask.long())
    torch.testing.assert_close(ref.prediction_logits, out.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(ref.seq_relationship_logits, out.aux["nsp_logits"], atol=ATOL, rtol=0)
    classifier = BERT.from_config({**sizes, "head": "classification", "num_labels": 3, "n_segments": 0}).eval()
    classifier.save_pretrained(tmp_path / "cls", format="huggingface")
    theirs = _no_loading_surprises("AutoModelForSequenceClassification", tmp_path / "cls")
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=ids, attention_mask=mask.long()).logits, classifier(ids, attention_mask=mask).logits,
                                   atol=ATOL, rtol=0)
    # and back into qkv: the same model
    again, _ = _load(BERT, tmp_path / "cls")
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, classifier(ids).logits, atol=ATOL, rtol=0)


def test_gpt_saved_for_transformers(tmp_path):
    torch.manual_seed(0)
    ours = GPT.from_config(dict(vocab_size=40, d_model=16, n_layers=2, n_heads=2, d_ff=24, max_len=20)).eval()
    ours.save_pretrained(tmp_path, format="huggingface")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gpt2"
    theirs = _no_loading_surprises("AutoModelForCausalLM", tmp_path)
    ids, _, _ = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=ids).logits, ours(ids).logits, atol=ATOL, rtol=0)


def test_models_transformers_cannot_represent_are_refused(tmp_path):
    sizes = dict(vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=24, max_len=20)
    with pytest.raises(ValueError, match="attention='window' has no counterpart"):
        GPT.from_config({**sizes, "attention": "window", "attention_kwargs": {"radius": 2}}).save_pretrained(
            tmp_path, format="huggingface")
    with pytest.raises(ValueError, match="Performer has no transformers counterpart"):
        Performer.from_config(sizes).save_pretrained(tmp_path, format="huggingface")
    with pytest.raises(ValueError, match=r"AlRfouLM has no transformers counterpart"):
        AlRfouLM.from_config({**sizes, "n_targets": 2}).save_pretrained(tmp_path, format="huggingface")
    with pytest.raises(ValueError, match=r"format must be one of \['qkv', 'huggingface'\]"):
        GPT.from_config(sizes).save_pretrained(tmp_path, format="onnx")
    assert not (tmp_path / "config.json").exists()


# ----------------------------------------------------------------------------- bad input


class _Trap:
    """Unpickling this runs code: it writes a file. qkv must never get that far."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickles_are_never_opened(tmp_path):
    _hf("BertModel", _bert_config(), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    trap = tmp_path / "ran"
    torch.save({"x": _Trap(trap)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin and no model.safetensors: .* never unpickles"):
        BERT.from_pretrained(tmp_path)
    # a pickle under the safetensors name is not a safetensors file either
    (tmp_path / "pytorch_model.bin").rename(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="is not a safetensors file"):
        BERT.from_pretrained(tmp_path)
    assert not trap.exists()


def test_bad_checkpoints_say_what_was_expected(tmp_path):
    _hf("BertModel", _bert_config(), tmp_path)
    weights = load_file(tmp_path / "model.safetensors")

    def rewrite(tensors):
        save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})

    def one_line(match):
        with pytest.raises(ValueError, match=match) as e:
            BERT.from_pretrained(tmp_path)
        assert "\n" not in str(e.value)

    rewrite({k: v for k, v in weights.items() if k != "encoder.layer.1.output.dense.bias"})
    one_line(r"lacks encoder.layer.1.output.dense.bias \(a bert checkpoint of 2 layers needs them\)")
    rewrite({**weights, "encoder.layer.0.adapter.weight": torch.zeros(2)})
    one_line("has no place for: encoder.layer.0.adapter.weight")
    rewrite({**weights, "encoder.layer.0.intermediate.dense.weight": torch.zeros(25, 16)})
    one_line(r"intermediate.dense.weight has shape \(25, 16\), expected \(24, 16\)")
    rewrite(weights)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    one_line(r"model_type='mamba' is not an architecture qkv represents; expected one of \['bert', 'gpt2', 'llama'")
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    one_line(r"a Hugging Face 'llama' checkpoint loads into qkv.models.Llama, not BERT")
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["BertForQuestionAnswering"]}))
    one_line("qkv reads one of")
    (tmp_path / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    one_line("position_embedding_type='relative_key' is not supported")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        BERT.from_pretrained(empty)
