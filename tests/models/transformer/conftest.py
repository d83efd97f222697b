"""Fixtures shared by the transformer model tests."""

import pytest


@pytest.fixture
def tiny_shakespeare(tmp_path, monkeypatch):
    """A one-play Shakespeare data set in a temporary ``QKV_DATA`` (CLI training tests); returns its root."""
    texts = tmp_path / "data" / "shakespeare" / "texts"
    texts.mkdir(parents=True)
    (texts / "hamlet_gut.txt").write_text("HAMLET\n\nTo be, or not to be, that is the question:\n" * 60)
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "data"))
    return tmp_path / "data"
