"""``qkv._io.atomic_folder``: a folder that appears only complete, replaces only what it may, and
leaves everything as it was when filling it fails."""

import pytest

from qkv._errors import UserError
from qkv._io import atomic_folder


def test_appears_whole_and_replaces_only_what_it_may(tmp_path):
    out = tmp_path / "out"
    with atomic_folder(out) as tmp:
        (tmp / "a.txt").write_text("1")
        assert not out.exists()  # nothing at OUT until the block ends
    assert [p.name for p in out.iterdir()] == ["a.txt"]
    with pytest.raises(UserError, match=r"already holds other files \(a.txt\)"):
        with atomic_folder(out):
            pass
    with atomic_folder(out, replaceable=lambda p: (p / "a.txt").is_file()) as tmp:
        (tmp / "b.txt").write_text("2")
    assert [p.name for p in out.iterdir()] == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left


def test_a_failure_leaves_everything_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_folder(out, replaceable=lambda p: True) as tmp:
            (tmp / "new.txt").write_text("new")
            raise RuntimeError("failed half-way")
    assert [p.name for p in out.iterdir()] == ["old.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_folder(empty) as tmp:  # an empty folder is filled
        (tmp / "x").write_text("x")
    assert (empty / "x").read_text() == "x"
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is a file, not a folder"):
        with atomic_folder(tmp_path / "file" / "sub"):
            pass
