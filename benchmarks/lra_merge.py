"""Merge the results of several ``qkv bench lra`` runs (one process per cell, as
``benchmarks/gpu_lra.sh`` runs them on one GPU) into one results file, then write its page:

    python benchmarks/lra_merge.py OUT RUN_DIR [RUN_DIR ...]

OUT/lra-results.json gets every run's cells, tasks and invocations (a cell key found in two runs is
an error: it would hide one of them); the page, OUT/lra.md and OUT/img/lra.png, is what
``qkv bench lra --report-only --out OUT`` writes. Every run is read and checked before OUT changes,
and OUT changes as a whole (``qkv._io.atomic_directory``; other files there stay): a merge killed at
any point leaves the old results and page or the new ones, never new results beside an old page.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from qkv._errors import UserError  # noqa: E402
from qkv._io import atomic_directory, atomic_write_text  # noqa: E402
from qkv.bench import lra  # noqa: E402


def merge(runs: list[Path]) -> dict:
    merged: dict = {"cells": {}, "speed": {}, "tasks": {}, "missing": {}, "invocations": []}
    for run in runs:
        path = run / "lra-results.json"
        if not path.is_file():
            print(f"lra_merge: {run}: no lra-results.json (the run did not finish a cell); left out", file=sys.stderr)
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            cells, machine = data["cells"], data["machine"]
            if not isinstance(cells, dict):
                raise TypeError("its cells are not a mapping")
        except (ValueError, KeyError, TypeError) as err:
            raise SystemExit(f"lra_merge: {path} is not a `qkv bench lra` results file ({type(err).__name__}: {err})")
        clash = sorted(set(cells) & set(merged["cells"]))
        if clash:
            raise SystemExit(f"lra_merge: {run}: cell {clash[0]!r} is in an earlier run too")
        merged["cells"].update(cells)
        merged["tasks"].update(data.get("tasks", {}))
        merged["missing"].update(data.get("missing", {}))
        merged["invocations"].extend(data.get("invocations", []))
        merged["machine"] = machine
        merged["date"] = max(merged.get("date", ""), data.get("date", ""))
    if not merged["cells"]:
        raise SystemExit("lra_merge: no finished cell in any run")
    merged["command"] = "; ".join(i["command"] for i in merged["invocations"])
    merged["last_run_seconds"] = max(i["seconds"] for i in merged["invocations"])
    return merged


def write(out: Path, merged: dict) -> Path:
    """``merged`` and its page into ``out``, as one change of the folder."""
    seeds = sorted({c["seed"] for c in merged["cells"].values()})
    device = torch.device(merged["machine"].get("device", "cpu"))
    with atomic_directory(out) as new:
        atomic_write_text(new / lra.RESULTS_FILE, json.dumps(merged, indent=1) + "\n")
        lra.write_report(merged, new / "lra.md", {}, [], seeds, device)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the merged lra-results.json and lra.md")
    parser.add_argument("runs", type=Path, nargs="+", help="the runs' --out folders")
    args = parser.parse_args(argv)
    for run in args.runs:
        if not run.is_dir():
            parser.error(f"{run}: not a folder (give the --out folders of `qkv bench lra` runs)")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"{args.out}: a file, not a folder for the merged results")
    merged = merge(args.runs)
    try:
        write(args.out, merged)
    except UserError as err:
        print(f"lra_merge: {err}", file=sys.stderr)
        return 2
    print(f"lra_merge: {len(merged['cells'])} cells from {len(merged['invocations'])} runs -> "
          f"{args.out}/{lra.RESULTS_FILE} and {args.out}/lra.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
