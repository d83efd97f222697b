"""The table of paper claims and their verdicts: ``docs/reproductions/claims.json`` and the
``docs/reproductions/README.md`` generated from it.

Every entry is one claim of one paper, measured over at least ``MIN_SEEDS`` seeds:

    {"id", "model", "paper", "claim", "command", "better", "seeds", "ours", "baseline",
     "margin", "verdict", "why", "budget"}

``ours`` holds one value per seed of the measurement the paper predicts to win, ``baseline``
one value per seed (or a single value for a fixed baseline, such as an exact optimum). The
verdict is computed here and only here (``verdict``):

    d  = mean(ours) - mean(baseline)              (negated when ``better == "lower"``)
    se = sqrt(var(ours) / n_o + var(baseline) / n_b)     (Welch; sample variances, ddof 1;
                                                          a fixed baseline contributes 0)
    "reproduced"  iff  d + margin > 2 se,  otherwise "not reproduced"

``margin`` is 0 for a claim that ours *beats* the baseline. A claim of *comparable* quality
("matches the Transformer", "on par with") cannot be won outright; it states its tolerance in
the claim's own words and units (e.g. "within 0.02 of the Transformer's accuracy": margin 0.02),
and is reproduced iff ours beats the baseline minus that tolerance by more than 2 se — a
non-inferiority test. The margin is part of the claim, fixed before the run, and printed in
the README.

A reproduction script records its claims with ``record(...)`` after measuring them; ``why`` is
the measured cause (the script composes it from its numbers). A claim that does not reproduce
may carry a budget curve (``curve``: the same measurement at larger budgets, each point with its
per-seed values and its own computed verdict), so that "it would plausibly reproduce with more
training" is a measurement. ``claims-pending.json`` lists the
claims whose last run had fewer than ``MIN_SEEDS`` seeds, with the command that reruns them.

    python benchmarks/claims.py           # regenerate docs/reproductions/README.md
    python benchmarks/claims.py --check   # exit 1 if a verdict or the README is out of date
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "docs" / "reproductions" / "claims.json"
PENDING = ROOT / "docs" / "reproductions" / "claims-pending.json"
README = ROOT / "docs" / "reproductions" / "README.md"

MIN_SEEDS = 3
BETTER = ("higher", "lower")
VERDICTS = ("reproduced", "not reproduced")
FIELDS = ("id", "model", "paper", "claim", "command", "better", "seeds", "ours", "baseline", "margin", "verdict",
          "why", "budget")

__all__ = ["CLAIMS", "PENDING", "README", "MIN_SEEDS", "mean", "standard_error", "verdict", "check_claim",
           "make_claim", "record", "add_point", "load", "save", "render_readme", "write_readme", "check"]


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def standard_error(xs: Sequence[float]) -> float:
    """Standard error of the mean of ``xs`` (sample variance, ddof 1); 0 for a single value."""
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def difference(ours: Sequence[float], baseline: Sequence[float], better: str) -> tuple[float, float]:
    """``(d, se)``: how far ``ours`` beats ``baseline`` in the ``better`` direction (positive =
    ours wins), and the Welch standard error of that difference."""
    if better not in BETTER:
        raise ValueError(f"better must be one of {BETTER}, got {better!r}")
    d = mean(ours) - mean(baseline)
    se = math.sqrt(standard_error(ours) ** 2 + standard_error(baseline) ** 2)
    return (d if better == "higher" else -d), se


def gap(ours: Sequence[float], baseline: Sequence[float], better: str, margin: float = 0.0, unit: str = "") -> str:
    """What decides a verdict, measured: the difference in the claim's direction (plus the margin),
    twice its standard error, and how many seeds went ours' way (one value per seed on both sides)."""
    d, se = difference(ours, baseline, better)
    base = list(baseline) if len(baseline) == len(ours) else list(baseline) * len(ours)
    wins = sum((o < b) if better == "lower" else (o > b) for o, b in zip(ours, base))
    return (f"difference {d:+.3f}{' ' + unit if unit else ''} in the claim's direction"
            + (f" plus the margin {margin:g}" if margin else "")
            + f" against twice its standard error {2 * se:.3f}; ours ahead in {wins} of {len(ours)} seeds"
            + (" (the seeds' spread, not the gap, decides)" if d > 0 and wins == len(ours) else ""))


def verdict(ours: Sequence[float], baseline: Sequence[float], better: str, margin: float = 0.0) -> str:
    """``"reproduced"`` iff mean(ours) beats mean(baseline) (less ``margin``, the tolerance of a
    claim of comparable quality) in the ``better`` direction by more than twice the standard
    error of the difference, else ``"not reproduced"``."""
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin >= 0:
        raise ValueError(f"margin must be a number >= 0, got {margin!r}")
    d, se = difference(ours, baseline, better)
    return VERDICTS[0] if d + margin > 2 * se else VERDICTS[1]


def _numbers(name: str, xs: Any) -> List[float]:
    if isinstance(xs, (int, float)) and not isinstance(xs, bool):
        xs = [xs]
    if not isinstance(xs, (list, tuple)) or not xs:
        raise ValueError(f"{name} must be a non-empty list of numbers, got {xs!r}")
    out = []
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"{name} must hold finite numbers, got {x!r}")
        out.append(float(x))
    return out


def check_claim(entry: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the field if ``entry`` is not a valid claim, its seed counts do
    not match, it has fewer than ``MIN_SEEDS`` seeds, or its verdict is not the computed one."""
    cid = entry.get("id", "?")
    missing = [f for f in FIELDS if f not in entry]
    if missing:
        raise ValueError(f"claim {cid!r} lacks the fields {missing}")
    for f in ("id", "model", "paper", "claim", "command"):
        if not isinstance(entry[f], str) or not entry[f].strip():
            raise ValueError(f"claim {cid!r}: {f} must be a non-empty string, got {entry[f]!r}")
    seeds = entry["seeds"]
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < MIN_SEEDS:
        raise ValueError(f"claim {cid!r}: seeds must be an integer >= {MIN_SEEDS}, got {seeds!r}")
    ours, base = _numbers("ours", entry["ours"]), _numbers("baseline", entry["baseline"])
    if len(ours) != seeds:
        raise ValueError(f"claim {cid!r}: ours has {len(ours)} values for {seeds} seeds")
    if len(base) not in (1, seeds):
        raise ValueError(f"claim {cid!r}: baseline has {len(base)} values; expected 1 (fixed) or {seeds} (one per seed)")
    expected = verdict(ours, base, entry["better"], entry["margin"])
    if entry["verdict"] != expected:
        raise ValueError(f"claim {cid!r}: verdict {entry['verdict']!r} but the numbers give {expected!r}")
    if not isinstance(entry["why"], str) or not entry["why"].strip():
        raise ValueError(f"claim {cid!r}: why must say what was measured")
    for point in entry.get("curve", []):
        if not isinstance(point, Mapping) or not {"budget", "ours", "baseline", "verdict"} <= set(point):
            raise ValueError(f"claim {cid!r}: a curve point needs budget, ours, baseline and verdict, got {point!r}")
        p_ours, p_base = _numbers("curve ours", point["ours"]), _numbers("curve baseline", point["baseline"])
        if len(p_base) not in (1, len(p_ours)) or len(p_ours) < MIN_SEEDS:
            raise ValueError(f"claim {cid!r}: curve point {point['budget']!r} needs >= {MIN_SEEDS} seeds and a "
                             f"baseline of 1 or {len(p_ours)} values")
        if point["verdict"] != verdict(p_ours, p_base, entry["better"], entry["margin"]):
            raise ValueError(f"claim {cid!r}: curve point {point['budget']!r} has a verdict its numbers do not give")


def make_claim(*, id: str, model: str, paper: str, claim: str, command: str, better: str,
               ours: Sequence[float], baseline: Union[float, Sequence[float]],
               why: Union[str, Mapping[str, str]], budget: str, margin: float = 0.0,
               curve: Sequence[Mapping[str, Any]] = ()) -> Dict[str, Any]:
    """A checked claim entry with its verdict computed. ``why``: a string, or a mapping from the
    verdict (``"reproduced"`` / ``"not reproduced"``) to the sentence for that outcome. ``curve``:
    ``[{"budget": "800 steps", "ours": [...], "baseline": [...]}, ...]``, larger budgets of the same
    measurement; each point's verdict is computed too."""
    ours, base = _numbers("ours", ours), _numbers("baseline", baseline)
    v = verdict(ours, base, better, margin)
    if isinstance(why, Mapping):
        if v not in why:
            raise ValueError(f"why has no sentence for the verdict {v!r} (keys {sorted(why)})")
        why = why[v]
    entry = {"id": id, "model": model, "paper": paper, "claim": claim, "command": command, "better": better,
             "seeds": len(ours), "ours": ours, "baseline": base, "margin": float(margin), "verdict": v, "why": why,
             "budget": budget}
    if curve:
        entry["curve"] = [{"budget": str(p["budget"]), "ours": _numbers("curve ours", p["ours"]),
                           "baseline": _numbers("curve baseline", p["baseline"]),
                           "verdict": verdict(_numbers("curve ours", p["ours"]), _numbers("curve baseline", p["baseline"]),
                                              better, margin)} for p in curve]
    check_claim(entry)
    return entry


def load(path: Path = CLAIMS) -> List[Dict[str, Any]]:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else []


def save(entries: Sequence[Mapping[str, Any]], path: Path = CLAIMS) -> None:
    ids = [e["id"] for e in entries]
    if len(set(ids)) != len(ids):
        raise ValueError(f"claim ids must be unique, got {sorted(i for i in ids if ids.count(i) > 1)}")
    for e in entries:
        check_claim(e)
    Path(path).write_text(json.dumps(list(entries), indent=1, ensure_ascii=False) + "\n")


def record(*, path: Path = CLAIMS, readme: Optional[Path] = README, pending: Path = PENDING,
           **fields: Any) -> Dict[str, Any]:
    """Add or replace (by ``id``) one claim in ``path`` from a reproduction's per-seed results,
    drop it from the pending list, and regenerate ``readme`` (None: leave it). Arguments as
    ``make_claim``. The recorded claim's budget-curve points stay (re-measuring the main budget does
    not erase the larger ones), except those ``curve`` gives again. Returns the entry."""
    entries = load(path)
    at = next((i for i, e in enumerate(entries) if e["id"] == fields.get("id")), None)
    if at is not None and entries[at].get("curve"):
        given = [dict(p, budget=str(p["budget"])) for p in fields.get("curve", ())]
        kept = [p for p in entries[at]["curve"] if p["budget"] not in {g["budget"] for g in given}]
        fields = {**fields, "curve": sorted(given + kept, key=lambda p: _budget_key(p["budget"]))}
    entry = make_claim(**fields)
    if at is None:
        entries.append(entry)
    else:
        entries[at] = entry
    save(entries, path)
    waiting = [p for p in load(pending) if p["id"] != entry["id"]]
    if Path(pending).exists():
        Path(pending).write_text(json.dumps(waiting, indent=1, ensure_ascii=False) + "\n")
    if readme is not None:
        write_readme(path, pending, readme)
    print(f"claim {entry['id']}: {entry['verdict']} (ours {fmt(entry['ours'])}, baseline {fmt(entry['baseline'])})")
    return entry


def add_point(claim_id: str, budget: str, ours: Sequence[float], baseline: Union[float, Sequence[float]], *,
              path: Path = CLAIMS, readme: Optional[Path] = README, pending: Path = PENDING) -> Dict[str, Any]:
    """Add (or replace, by ``budget``) one point of the budget curve of the recorded claim
    ``claim_id``: the same measurement at a larger budget, with its own computed verdict."""
    entries = load(path)
    at = next((i for i, e in enumerate(entries) if e["id"] == claim_id), None)
    if at is None:
        raise ValueError(f"no claim {claim_id!r} in {path}: record it at its main budget first")
    e = entries[at]
    ours, base = _numbers("curve ours", ours), _numbers("curve baseline", baseline)
    point = {"budget": str(budget), "ours": ours, "baseline": base,
             "verdict": verdict(ours, base, e["better"], e["margin"])}
    e["curve"] = sorted([p for p in e.get("curve", []) if p["budget"] != point["budget"]] + [point],
                        key=lambda p: _budget_key(p["budget"]))
    save(entries, path)
    if readme is not None:
        write_readme(path, pending, readme)
    print(f"claim {claim_id} at {budget}: {point['verdict']} (ours {fmt(ours)}, baseline {fmt(base)})")
    return point


def _budget_key(budget: str):
    head = budget.split()[0] if budget.split() else ""
    return (0, float(head)) if head.replace(".", "", 1).isdigit() else (1, budget)


# ------------------------------------------------------------------ README

def fmt(xs: Sequence[float]) -> str:
    """``mean ± se`` (or the single value); decimals by the mean's size (3 below 1, 2 below 10, else 1)."""
    m = mean(xs)
    digits = 3 if abs(m) < 1 else 2 if abs(m) < 10 else 1
    return f"{m:.{digits}f}" if len(xs) == 1 else f"{m:.{digits}f} ± {standard_error(xs):.{digits}f}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _curve(points: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{p['budget']}: {fmt(p['ours'])} vs {fmt(p['baseline'])}, {p['verdict']}" for p in points) or "—"


def render_readme(entries: Sequence[Mapping[str, Any]], pending: Sequence[Mapping[str, Any]] = ()) -> str:
    """The README text: one table row per claim, then the claims awaiting a multi-seed run."""
    n_rep = sum(e["verdict"] == "reproduced" for e in entries)
    lines = [
        "# Reproductions: every claim, its seeds and its verdict",
        "",
        "Generated by `python benchmarks/claims.py` from [`claims.json`](claims.json); do not edit by hand.",
        "Each reproduction script (`benchmarks/repro_*.py`) writes its claims there when it runs.",
        "",
        f"A claim is **reproduced** iff the mean of *ours* beats the mean of the baseline in the paper's "
        f"direction by more than twice the standard error of the difference (Welch: "
        f"`sqrt(var_o / n_o + var_b / n_b)`, a fixed baseline contributing 0); every claim has at least "
        f"{MIN_SEEDS} seeds. A claim of *comparable* quality states a tolerance (the margin column) and is "
        f"reproduced iff ours beats the baseline less that tolerance by more than twice the standard error. "
        f"Values are mean ± standard error over the seeds.",
        "",
        f"**{len(entries)} claims, {n_rep} reproduced, {len(entries) - n_rep} not reproduced**"
        + (f"; {len(pending)} more await a run with {MIN_SEEDS} seeds (below)." if pending else "."),
        "",
        "| model | paper | claim | better | ours | baseline | margin | verdict | why | budget | larger budgets | command |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        lines.append("| " + " | ".join(_cell(c) for c in (
            e["model"], e["paper"], e["claim"], e["better"], f"{fmt(e['ours'])} (n={e['seeds']})",
            fmt(e["baseline"]) + ("" if len(e["baseline"]) > 1 else " (fixed)"),
            f"{e['margin']:g}" if e["margin"] else "—", f"**{e['verdict']}**", e["why"], e["budget"],
            _curve(e.get("curve", [])), f"`{e['command']}`")) + " |")
    if pending:
        lines += ["", f"## Claims awaiting a run with {MIN_SEEDS} seeds", "",
                  "Their pages report one seed; these commands rerun them with "
                  f"{MIN_SEEDS} seeds and record the verdict here.", "",
                  "| model | paper | claim | one-seed result | command | estimated time |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for p in pending:
            lines.append("| " + " | ".join(_cell(c) for c in (
                p["model"], p["paper"], p["claim"], p["one_seed"], f"`{p['command']}`", p["time"])) + " |")
    return "\n".join(lines) + "\n"


def write_readme(path: Path = CLAIMS, pending: Path = PENDING, readme: Path = README) -> str:
    text = render_readme(load(path), load(pending))
    Path(readme).write_text(text)
    return text


def check(path: Path = CLAIMS, pending: Path = PENDING, readme: Path = README) -> List[str]:
    """Problems with the table: invalid claims, wrong verdicts, or a README out of sync."""
    problems = []
    entries = load(path)
    for e in entries:
        try:
            check_claim(e)
        except ValueError as err:
            problems.append(str(err))
    if not Path(readme).exists() or Path(readme).read_text() != render_readme(entries, load(pending)):
        problems.append(f"{readme} is not the one generated from {path}: run python benchmarks/claims.py")
    return problems


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check the verdicts and the README; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    for e in load(CLAIMS):
        check_claim(e)
    write_readme()
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
