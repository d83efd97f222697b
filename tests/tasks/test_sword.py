"""The SWORD zText reader and OSIS markup stripping, on a module written by the test."""

import pytest

from qkv.tasks import sword

from conftest import write_ztext


def test_read_ztext_round_trip(tmp_path):
    entries = ["", "heading", "In the beginning", "", "ünïcode verse", "x" * 300]
    write_ztext(tmp_path, "ot", entries, entries_per_block=2)
    assert sword.read_ztext(tmp_path, "ot") == entries


def test_read_ztext_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="testament"):
        sword.read_ztext(tmp_path, "apocrypha")
    with pytest.raises(FileNotFoundError):
        sword.read_ztext(tmp_path, "nt")
    write_ztext(tmp_path, "nt", ["a", "b"])
    (tmp_path / "nt.bzv").write_bytes((tmp_path / "nt.bzv").read_bytes()[:-1])
    with pytest.raises(ValueError, match="multiple"):
        sword.read_ztext(tmp_path, "nt")


def test_strip_osis():
    raw = (
        '<div type="x-milestone" sID="pv1"/><title canonical="true" type="psalm">A Psalm of '
        '<w lemma="strong:H1732">David</w>.</title> <w lemma="strong:H7225">In the beginning</w> '
        '<transChange type="added">was</transChange> the \\nd LORD\\nd*;<note placement="foot">'
        '<reference>Gen 1</reference> a note</note> &amp; more \u00b6 text. <title type="x-section">Editorial</title>'
    )
    assert sword.strip_osis(raw) == "A Psalm of David. In the beginning was the LORD ; & more text."


def test_is_heading():
    assert sword.is_heading(0, "") and sword.is_heading(1, "x")
    assert sword.is_heading(2, '<div osisID="Gen" sID="g" type="book"/>')
    assert sword.is_heading(3, '<chapter n="1" osisID="Gen.1" sID="Gen.1"/>')
    # the end of a chapter or book closes its last verse: still a verse
    assert not sword.is_heading(4, 'last verse. <chapter eID="Gen.1" osisID="Gen.1"/> <div eID="g" type="book"/>')
