"""Benchmark reports are replaced whole: ``kill -9`` at any moment of ``write_markdown`` /
``write_json`` / ``save_figure`` leaves the old report or the new one, never a mix or a truncated
file, and no temporary file beside it."""

import json
import multiprocessing
import random
import sys
import time

import pytest
import torch

from qkv.bench import common

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork and SIGKILL are POSIX")


def _reports():
    machine = common.describe_machine(torch.device("cpu"))
    small = ("old", [("x" * 200 + "\n") * 50])
    large = ("new", [("y" * 200 + "\n") * 5000])  # ~1 MB: a write takes long enough to be cut
    return machine, small, large


def _write_forever(path, kind):
    machine, small, large = _reports()
    while True:
        for title, sections in (small, large):
            if kind == "markdown":
                common.write_markdown(path, title, machine, "cmd", "date", sections)
            else:
                common.write_json(path, {"title": title, "sections": sections})


def _whole(path, kind):
    text = path.read_text()
    if kind == "markdown":
        title = text.splitlines()[0]
        assert title in ("# old", "# new"), title
        line, count = ("x" * 200 + "\n", 50) if title == "# old" else ("y" * 200 + "\n", 5000)
        assert text.count(line) == count, "a truncated or mixed report"
    else:
        payload = json.loads(text)  # a truncated file is not JSON
        assert payload["title"] in ("old", "new")


@pytest.mark.parametrize("kind", ["markdown", "json"])
def test_kill_9_while_writing_a_report_leaves_the_old_or_the_new_one(tmp_path, kind):
    path = tmp_path / ("report.md" if kind == "markdown" else "report.json")
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(0)
    for _ in range(6):
        proc = ctx.Process(target=_write_forever, args=(path, kind))
        proc.start()
        time.sleep(0.3 + rng.random() * 0.3)
        proc.kill()  # SIGKILL
        proc.join()
        assert path.exists()
        _whole(path, kind)
        leftovers = [p.name for p in tmp_path.iterdir() if p.name != path.name]
        # a temporary file the killed write left is hidden and never read as the report
        assert all(name.startswith(f".{path.name}.") and name.endswith(".tmp") for name in leftovers), leftovers
