"""Record docs/reproductions/linearize.md's claims and write its page from the runs saved in
linearize.json, measuring nothing — for measurements taken by several processes side by side
(``repro_linearize.py --variants A B`` on one core, ``--variants C D`` on the other), each of which
recorded only its own variants' claims and page.

    PYTHONPATH=src python benchmarks/report_linearize.py

Every variant present in linearize.json goes on the page and into the claims (the best one after the
fine-tune decides ``linearize-within-1.2x-softmax``), with the budget the runs were measured at
(``settings``). The claims are stamped with the current commit, as ``repro_linearize.py`` stamps
them: run it on the code the runs were measured with (a claim whose files changed since is stale).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import repro_linearize as repro  # noqa: E402

from qkv._io import atomic_write_text  # noqa: E402


def main() -> None:
    results = json.loads((repro.DOC.parent / "linearize.json").read_text())
    for key, entry in results["runs"].items():  # runs saved before the script kept their transfer loss
        variant, seed = key.split("/")
        record = repro.OUT / f"{variant}-s{seed}" / "linearize.json"
        if "transfer_mse" not in entry and record.is_file():
            entry["transfer_mse"] = json.loads(record.read_text())["stages"]["transfer"]["metrics"].get("loss")
    atomic_write_text(repro.DOC.parent / "linearize.json", json.dumps(results, indent=2))
    present = {key.split("/")[0] for key in results["runs"]}
    args = argparse.Namespace(**results["settings"], new_tokens=16)
    args.variants = [v for v in repro.VARIANTS if v in present]
    args.seeds = max(sum(1 for key in results["runs"] if key.split("/")[0] == v) for v in args.variants)
    verdicts = repro.record(results, args)
    repro.write_page(repro.DOC, results, args, verdicts)
    print(f"linearize: {verdicts}; wrote {repro.DOC}")


if __name__ == "__main__":
    main()
