"""Issue 37 item 7: no orphans. ``kill -9`` of ``qkv bench lra --jobs 2`` left its two workers and
multiprocessing's resource tracker running; a ``torchrun`` rank outlived ``torchrun``. Each test
starts the parent in a subprocess, waits until its workers run, kills the parent with SIGKILL and
counts the processes that were under it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from _toy_train import script_env

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(root: int) -> set:
    children: dict = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _wait_for(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def _started(cmd, **kwargs):
    """``Popen(cmd)``; whatever happens, neither it nor a process under it outlives the test."""
    parent = subprocess.Popen(cmd, env=script_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
    seen: set = set()
    try:
        yield parent, seen
    finally:
        for pid in [parent.pid, *_descendants(parent.pid), *seen]:
            if _alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        parent.wait(timeout=10)


def _kill_and_count(parent: subprocess.Popen, workers: set) -> set:
    """SIGKILL ``parent``; the processes of ``workers`` still running a few seconds later."""
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.1)
    return {p for p in workers if _alive(p)}


def test_lra_workers_and_resource_tracker_die_with_the_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time

        def cell(folder):  # stands for a cell: says it runs, then works for a long time
            open(os.path.join(folder, f"worker.{os.getpid()}"), "w").close()
            time.sleep(120)

        if __name__ == "__main__":
            from qkv.bench import lra
            pool = lra._worker_pool(2)
            for _ in range(2):
                pool.submit(cell, sys.argv[1])
            time.sleep(120)
    """))
    with _started([sys.executable, str(script), str(tmp_path)], cwd=tmp_path) as (parent, seen):
        _wait_for(lambda: len(list(tmp_path.glob("worker.*"))) == 2, 90, "two workers to run a cell")
        seen |= _descendants(parent.pid)
        assert len(seen) == 3, seen  # two workers and the resource tracker
        assert _kill_and_count(parent, seen) == set()


@pytest.mark.skipif(not (torch.distributed.is_available() and TORCHRUN.exists()), reason="needs torchrun")
def test_torchrun_ranks_die_with_torchrun(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        from qkv.train import distributed
        distributed.setup("cpu")
        open(os.path.join(sys.argv[1], f"started-rank.{os.getpid()}"), "w").close()
        time.sleep(120)
    """))
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node", "1", str(script), str(tmp_path)]
    with _started(cmd, cwd=tmp_path) as (parent, seen):
        ranks = _wait_for(lambda: list(tmp_path.glob("started-rank.*")), 90, "the rank to start")
        seen |= _descendants(parent.pid)
        assert int(ranks[0].name.split(".")[1]) in seen
        assert _kill_and_count(parent, seen) == set()


def test_die_with_parent_ends_a_process_whose_parent_is_gone(tmp_path):
    """A parent that ended before the call (the race at start-up): the process ends at once."""
    from qkv.train.distributed import die_with_parent

    child = subprocess.run([sys.executable, "-c", "from qkv.train.distributed import die_with_parent; "
                            "die_with_parent(parent=1); print('still here')"], env=script_env(),
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 1 and "still here" not in child.stdout
    assert callable(die_with_parent)
