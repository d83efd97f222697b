"""The real SmolLM2-135M-Instruct (``qkv data fetch smollm2``) running in qkv's ``Llama``, against
transformers' ``LlamaForCausalLM`` on the same weights: logits over 256 tokens of Shakespeare
(within 1e-4 with the same matrix product on both sides; qkv's oneDNN products sum in another order),
greedy generation with the per-key/value-head cache (a plain prompt and the chat template), a
left-padded batch, and the ``window`` kernel at a radius past the text equal to softmax. Each model is loaded once per module; skipped when the checkpoint is not cached.

The run path (``qkv train llama --task shakespeare-char --init DIR``, then ``qkv eval`` and
``qkv generate --prompt``) is tested on a tiny transformers Llama with a byte-level BPE tokenizer
written here, and ``from_pretrained`` on a GGUF file on the reader tests' tiny one, so they run
everywhere.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from qkv import Llama
from qkv.cli import main
from qkv.tasks import data
from qkv.tasks.pretrained_vocab import CheckpointTokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

needs_smollm2 = pytest.mark.skipif(not data.is_cached("smollm2"), reason="run `qkv data fetch smollm2` first")
PROMPTS = ["The capital of France is", "Once upon a time, in a small village,"]
IM_END = 2  # <|im_end|>: SmolLM2's eos (and pad) id


# --------------------------------------------------------------------------- the run path, on a tiny Llama


def byte_spelling():
    """GPT-2's byte alphabet (printable Latin-1 bytes as themselves, the others from U+0100 on)."""
    kept = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


def write_tiny_llama(directory: Path) -> Path:
    """A 2-layer transformers Llama (4 query / 2 key-value heads) beside a byte-level BPE
    ``tokenizer.json`` and the ``tokenizer_config.json`` naming SmolLM2's specials."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "b"), ("Ġb", "e"), ("o", "r")]
    tokens = specials + [byte_spelling()[b] for b in range(256)] + ["".join(m) for m in merges]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    directory.mkdir(parents=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>"}))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tokens), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def test_a_language_models_tokenizer_takes_its_specials_from_tokenizer_config(tmp_path):
    tok = CheckpointTokenizer(write_tiny_llama(tmp_path / "ckpt"))
    assert not tok.wordpiece and (tok.unk_id, tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2, 2)
    assert tok.cls_id is None and tok.special_ids == (2, 0, 1) and tok.size == 265
    ids = tok.encode("To be, or not to be")
    assert [tok.words[i] for i in ids[:4]] == ["T", "o", "Ġbe", ","] and tok.decode(ids) == "To be, or not to be"
    (tmp_path / "ckpt" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ValueError, match="names eos_token='</s>', which tokenizer.json does not hold"):
        CheckpointTokenizer(tmp_path / "ckpt")


def test_bbc_news_refuses_a_tokenizer_without_berts_specials(tmp_path):
    from qkv.tasks.bert_tasks import BBCNewsTokens

    articles = [(f"Market shares rose {i}.", c) for i, c in enumerate(["business", "tech", "sport"] * 8)]
    with pytest.raises(ValueError, match=r"has no \[PAD\].*expected a BERT WordPiece tokenizer"):
        BBCNewsTokens(articles=articles, tokenizer=str(write_tiny_llama(tmp_path / "ckpt")))


def test_train_llama_init_from_a_checkpoint_then_eval_and_generate(tmp_path, shakespeare_cache, train_argv, capsys):
    ckpt = write_tiny_llama(tmp_path / "ckpt")
    run = tmp_path / "run"
    assert main(train_argv("llama", "shakespeare-char", run, "--init", str(ckpt), "--threads", "1",
                           "--set", "task.block_size=16", "--lr", "1e-12")) == 0
    record = json.loads((run / "run.json").read_text())
    assert record["task_options"]["tokenizer"] == "tokenizer.json" and record["model_config"]["vocab_size"] == 265
    assert (run / "tokenizer_config.json").read_bytes() == (ckpt / "tokenizer_config.json").read_bytes()
    theirs = transformers.LlamaForCausalLM.from_pretrained(ckpt).eval()
    tok = CheckpointTokenizer(run)  # the run's own copy, its specials with it
    assert tok.eos_id == 2
    prompt = "To be, or not"
    ids = torch.tensor([tok.encode(prompt)])
    expected = theirs.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    capsys.readouterr()
    assert main(["eval", str(run), "--threads", "1"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["tokens"] > 0 and metrics["loss"] > 0
    assert main(["generate", str(run), "--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0",
                 "--threads", "1"]) == 0  # lr 1e-12: the weights are still the checkpoint's
    assert capsys.readouterr().out.strip().splitlines()[-1] == tok.decode(expected[0])
    out = tmp_path / "export"  # what transformers reads back: the checkpoint's tokenizer as it is, its specials
    assert main(["export", str(run), str(out)]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok(prompt).input_ids == ids[0].tolist() and (hf_tok.eos_token, hf_tok.pad_token) == ("<|im_end|>",) * 2
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert "token_type_ids" not in hf_tok(prompt)
    assert exported.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0).tolist() == \
        expected.tolist()


def test_from_pretrained_reads_a_gguf_file_in_place(tmp_path):
    pytest.importorskip("gguf")
    from test_smollm2_gguf import write_tiny_gguf  # the tiny llama GGUF of the reader's tests (tests/integrations)

    from qkv import UserError
    from qkv.models.base import QKVModel
    from qkv.hf.gguf import read_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    model = Llama.from_pretrained(path, attention="window", attention_kwargs={"radius": 3})
    config, state_dict, _ = read_gguf(path)
    expected = Llama.from_hf(config, state_dict)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]  # nothing written beside it
    assert model.config.attention == "window" and model.config.n_kv_heads == 2
    for name, tensor in expected.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert type(QKVModel.from_pretrained(path)) is Llama
    with pytest.raises(ValueError, match=r"format must be one of \['qkv', 'huggingface'\], got 'gguf'"):
        model.save_pretrained(tmp_path / "out", format="gguf")  # read only
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(UserError, match="bad.gguf"):
        Llama.from_pretrained(tmp_path / "bad.gguf")
    with pytest.raises(FileNotFoundError, match="nor a checkpoint file"):
        Llama.from_pretrained(tmp_path / "missing.gguf")


def test_generation_multiplies_only_the_last_position_by_the_output_matrix():
    from qkv import LlamaConfig

    model = Llama(LlamaConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=40)).eval()
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, logits_to_keep=3).logits, model(ids).logits[:, -3:], rtol=0, atol=1e-6)
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[1]))
    try:
        model.generate(ids, 3, temperature=0)
    finally:
        hook.remove()
    assert rows == [1, 1, 1]  # the 9-token prompt too: its last position only
    with pytest.raises(ValueError, match="labels need every position"):
        model(ids, labels=ids, logits_to_keep=1)
    with pytest.raises(ValueError, match="logits_to_keep must be an int >= 0"):
        model(ids, logits_to_keep=-1)


def test_shakespeare_char_refuses_a_checkpoint_tokenizer_that_is_not_there(shakespeare_cache, tmp_path):
    from qkv.tasks.lm import ShakespeareChar

    with pytest.raises(FileNotFoundError, match="expected a checkpoint directory holding tokenizer.json"):
        ShakespeareChar(tokenizer=str(tmp_path / "nowhere"))


# --------------------------------------------------------------------------- the real SmolLM2-135M-Instruct


@pytest.fixture(scope="module")
def ours():
    return Llama.from_pretrained(data.smollm2_dir()).eval()


@pytest.fixture(scope="module")
def theirs():
    return transformers.AutoModelForCausalLM.from_pretrained(data.smollm2_dir(), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok():
    return CheckpointTokenizer(data.smollm2_dir())


def shakespeare_ids(tok, n):
    """``(1, n)`` ids of a held-out stretch of Shakespeare (the qkv data cache)."""
    try:
        text = data.load_shakespeare()
    except FileNotFoundError:
        pytest.skip("run `qkv data fetch shakespeare` first")
    return torch.tensor([tok.encode(text[4_800_000:4_800_000 + 8 * n])[:n]])


def chat_ids(text):
    """SmolLM2's chat template with the generation prompt (transformers' tokenizer applies it)."""
    hf_tok = transformers.AutoTokenizer.from_pretrained(data.smollm2_dir())
    ids = hf_tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@needs_smollm2
def test_logits_equal_transformers_over_256_tokens_of_shakespeare(ours, theirs, tok):
    ids = shakespeare_ids(tok, 256)
    assert ids.shape == (1, 256)
    hf_tok = transformers.AutoTokenizer.from_pretrained(data.smollm2_dir())
    assert hf_tok(tok.decode(ids[0])).input_ids == ids[0].tolist()  # qkv's tokenizer is the checkpoint's
    was = torch.backends.mkldnn.enabled
    try:  # the same matrix product on both sides (qkv's CPU inference products go through oneDNN, qkv._linear)
        torch.backends.mkldnn.enabled = False
        with torch.no_grad():
            got, expected = ours(ids).logits, theirs(ids).logits
    finally:
        torch.backends.mkldnn.enabled = was
    assert (got - expected).abs().max().item() <= 1e-4
    assert (got.argmax(-1) == expected.argmax(-1)).all()
    with torch.no_grad():  # through oneDNN: another summation order, the same logits to 1e-5 of their scale
        assert (ours(ids).logits - expected).abs().max() <= 1e-5 * expected.abs().max()


@needs_smollm2
@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat-template"])
def test_greedy_50_tokens_equal_transformers(ours, theirs, tok, chat):
    ids = torch.tensor([chat_ids("What is the capital of France?") if chat else tok.encode(PROMPTS[0])])
    expected = theirs.generate(ids, max_new_tokens=50, do_sample=False, eos_token_id=IM_END, pad_token_id=IM_END)
    got = ours.generate(ids, max_new_tokens=50, temperature=0, eos_token_id=IM_END)
    assert got.tolist() == expected.tolist()
    assert "Paris" in tok.decode(got[0, ids.shape[1]:])
    state = ours(ids, return_state=True).state  # the cache holds the 3 key/value heads, not the 9 query heads
    assert tuple(state.layers[0].self_attn.key.shape) == (1, 3, ids.shape[1], 64)


@needs_smollm2
def test_left_padded_batch_generates_each_prompt_as_alone(ours, tok):
    rows = [tok.encode(p) for p in PROMPTS]
    L = max(map(len, rows))
    assert len({len(r) for r in rows}) == 2  # the padding is real
    ids = torch.tensor([[IM_END] * (L - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows])
    batch = ours.generate(ids, max_new_tokens=20, temperature=0, attention_mask=mask)
    for row, r in zip(batch, rows):
        alone = ours.generate(torch.tensor([r]), max_new_tokens=20, temperature=0)
        assert row[L:].tolist() == alone[0, len(r):].tolist()




@needs_smollm2
def test_window_past_the_text_is_softmax(ours, tok):
    ids = shakespeare_ids(tok, 64)
    window = Llama(dataclasses.replace(ours.config, attention="window", attention_kwargs={"radius": 64})).eval()
    window.load_state_dict(ours.state_dict())
    narrow = Llama(dataclasses.replace(ours.config, attention="window", attention_kwargs={"radius": 8})).eval()
    narrow.load_state_dict(ours.state_dict())
    with torch.no_grad():
        full = ours(ids).logits
        torch.testing.assert_close(window(ids).logits, full, rtol=0, atol=1e-4)
        assert (narrow(ids).logits[0, 9:] - full[0, 9:]).abs().max() > 1e-2  # a radius inside the text does differ
