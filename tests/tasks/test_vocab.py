"""Vocabularies: round trips, specials, bad inputs."""

import pytest
import torch

from qkv.tasks.vocab import ByteVocab, CharVocab


def test_char_vocab_round_trip_and_specials():
    v = CharVocab("hello world")
    assert v.size == 4 + len(set("hello world"))
    ids = v.encode("hello")
    assert min(ids) >= 4 and v.decode(ids) == "hello"
    assert v.decode(torch.tensor([v.bos_id] + ids + [v.eos_id, v.pad_id])) == "hello"
    assert v.decode([v.bos_id, v.eos_id], skip_special=False) == "<bos><eos>"
    assert v.encode("hex!") == [v._index["h"], v._index["e"], v.unk_id, v.unk_id]
    assert CharVocab("olleh").encode("hello") == CharVocab("hello").encode("hello")  # order-free


def test_char_vocab_errors():
    with pytest.raises(TypeError, match="text"):
        CharVocab("ab").encode(b"ab")
    with pytest.raises(ValueError, match="outside"):
        CharVocab("ab").decode([99])
    with pytest.raises(ValueError, match="single characters"):
        CharVocab(["ab"])


def test_byte_vocab_round_trip():
    v = ByteVocab()
    assert (v.size, v.pad_id, v.bos_id, v.eos_id) == (259, 256, 257, 258)
    text = "naïve — ok"
    assert v.decode(v.encode(text)) == text
    assert v.encode(b"\x00\xff") == [0, 255]
    assert v.decode([v.bos_id] + v.encode("a") + [v.eos_id], skip_special=False) == "<bos>a<eos>"
    assert v.decode(v.encode("é")[:1]) == "\ufffd"  # a cut character decodes without error
