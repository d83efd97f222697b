"""The table of paper claims and their verdicts: ``docs/reproductions/claims.json`` and the
``docs/reproductions/README.md`` generated from it.

Every entry is one claim of one paper, measured over at least ``MIN_SEEDS`` seeds:

    {"id", "model", "paper", "claim", "command", "better", "seeds", "ours", "baseline",
     "margin", "verdict", "why", "budget", "commit", "date"}

and, beside them: ``run``, the command as data (``{"script": "benchmarks/NAME.py", "args": [...]}``,
which ``command`` renders; ``benchmarks/reproduce.py``, ``qkv reproduce ID``, runs it), ``machine``,
``kind`` (``KINDS``: a reproduction, or an implementation check with its ``kind_reason``) and
``minutes`` (the estimated wall-clock minutes of the command).

``ours`` holds one value per seed of the measurement the paper predicts to win, ``baseline``
one value per seed (or a single value for a fixed baseline, such as an exact optimum). The
verdict is computed here and only here (``verdict``), by a one-sided Welch t-test at ``ALPHA``:

    d  = mean(ours) - mean(baseline)              (negated when ``better == "lower"``)
    se = sqrt(var(ours) / n_o + var(baseline) / n_b)     (sample variances, ddof 1;
                                                          a fixed baseline contributes 0)
    t  = (d + margin) / se,  df by Welch-Satterthwaite (n_o - 1 against a fixed baseline)
    "reproduced"  iff  P(T_df >= t) < ALPHA,  otherwise "not reproduced"

``margin`` is 0 for a claim that ours *beats* the baseline. A claim of *comparable* quality
("matches the Transformer", "on par with") cannot be won outright; it states its tolerance in
the claim's own words and units (e.g. "within 0.02 of the Transformer's accuracy": margin 0.02),
and is reproduced iff the test rejects "ours is worse than the baseline by the tolerance or more"
— a non-inferiority test. The margin is part of the claim, fixed before the run.

A *deterministic* measurement (peak bytes of a step, a fitted cost exponent: repeats that differ
by timer noise at most) is no sample of seeds: such a claim carries ``"deterministic": true``,
``seeds`` counts its repeats (>= 1), and it is reproduced iff *every* repeat of ours beats
*every* value of the baseline (less the margin) — judged on its own terms, never by a t-test.

Provenance: ``commit`` and ``date`` say at which commit of this repository the numbers were
measured (``record`` writes them from ``git``; ``dirty`` lists the files the claim depends on
that had uncommitted changes then). The files a claim depends on are its script (named in its
``command``) and the paths the script declares in its module-level ``DEPENDS`` literal (a dict
from claim id, or ``"*"`` for all of the script's claims, to paths; ``@name`` expands ``GROUPS``).
A claim is **stale** (``stale``) when any of them changed since its commit, its commit is
unknown, or it was measured on uncommitted changes; a stale claim does not count as reproduced
until it is rerun. The per-seed values in claims.json are the raw results.

A reproduction script records its claims with ``record(...)`` after measuring them; ``why`` is
the measured cause (the script composes it from its numbers). A claim that does not reproduce
may carry a budget curve (``curve``: the same measurement at larger budgets, each point with its
per-seed values and its own computed verdict), so that "it would plausibly reproduce with more
training" is a measurement. ``claims-pending.json`` lists the claims whose last run had fewer
than ``MIN_SEEDS`` seeds (``pend``), with the command that reruns them.

    python benchmarks/claims.py           # regenerate docs/reproductions/README.md
    python benchmarks/claims.py --check   # exit 1 if a verdict or the README is out of date, or
                                          # a claim is stale (listed with the files that changed)
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from qkv._io import atomic_write_text  # a killed writer leaves the old file or the new one

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "docs" / "reproductions" / "claims.json"
PENDING = ROOT / "docs" / "reproductions" / "claims-pending.json"
README = ROOT / "docs" / "reproductions" / "README.md"

MIN_SEEDS = 3
ALPHA = 0.05
BETTER = ("higher", "lower")
VERDICTS = ("reproduced", "not reproduced")
FIELDS = ("id", "model", "paper", "claim", "command", "better", "seeds", "ours", "baseline", "margin", "verdict",
          "why", "budget", "commit", "date")
UNKNOWN = "unknown"
# What a claim is evidence of: a reproduction of the paper's claim, or a check that the implementation
# behaves as the paper's mechanism must (true by construction, or measured where it cannot fail) -- a strict
# reader's distinction; an implementation check carries ``kind_reason``, why it is not a reproduction.
KINDS = ("reproduction", "implementation-check")
# What a claim carries that no script measures: its kind and the estimated minutes of its run. A script
# recording the claim again keeps them (``record``).
STRUCTURE = ("kind", "kind_reason", "minutes")
# How every recorded command runs: from the repository root, the checkout's src first, one thread.
ENV = (("PYTHONPATH", "src"), ("OMP_NUM_THREADS", "1"))
# Where a measurement was taken (``provenance``): what a claim and each point of its curve carry.
PROVENANCE = ("commit", "date", "dirty", "machine")

# Path groups a script's DEPENDS may name with "@": what most reproductions' numbers depend on.
GROUPS: Dict[str, tuple] = {
    "training": ("benchmarks/_repro.py", "src/qkv/train/trainer.py", "src/qkv/train/schedules.py",
                 "src/qkv/models/base.py", "src/qkv/models/losses.py", "src/qkv/tasks/base.py", "src/qkv/_seeding.py"),
    "transformer": ("src/qkv/models/transformer/stack.py", "src/qkv/models/transformer/transformer.py",
                    "src/qkv/attention/base.py", "src/qkv/attention/_ops.py", "src/qkv/attention/multihead.py",
                    "src/qkv/attention/softmax.py", "src/qkv/blocks/feedforward.py", "src/qkv/blocks/residual.py",
                    "src/qkv/positional.py", "src/qkv/masks.py", "src/qkv/functional.py"),
    "rnn": ("src/qkv/models/rnn/seq2seq.py", "src/qkv/attention/alignment.py", "src/qkv/scores.py"),
    "text": ("src/qkv/tasks/data.py", "src/qkv/tasks/vocab.py", "src/qkv/tasks/lm.py"),
}

__all__ = ["CLAIMS", "PENDING", "README", "MIN_SEEDS", "ALPHA", "KINDS", "mean", "standard_error", "p_value", "verdict",
           "check_claim", "make_claim", "record", "pend", "add_point", "load", "save", "render_readme",
           "write_readme", "check", "depends", "stale", "provenance", "parse_command", "render_command"]


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


def welch_df(ours: Sequence[float], baseline: Sequence[float]) -> float:
    """Welch-Satterthwaite degrees of freedom of the difference of the means (a single value on
    one side contributes no variance and no degrees of freedom)."""
    parts = [(standard_error(xs) ** 2, len(xs) - 1) for xs in (ours, baseline) if len(xs) > 1]
    total = sum(v for v, _ in parts)
    if total == 0:
        return float(max([n for _, n in parts], default=1))
    return total ** 2 / sum(v ** 2 / n for v, n in parts if v > 0)


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
    Lentz), on the side where it converges fast."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


def t_sf(t: float, df: float) -> float:
    """P(T >= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def p_value(ours: Sequence[float], baseline: Sequence[float], better: str, margin: float = 0.0) -> float:
    """One-sided Welch t-test of "ours beats the baseline less ``margin`` in the ``better``
    direction": the probability of a difference this large if it were not so. With no spread at all
    (every value equal on each side) the difference decides alone: 0 if it favours ours, else 1."""
    d, se = difference(ours, baseline, better)
    if se == 0:
        return 0.0 if d + margin > 0 else 1.0
    return t_sf((d + margin) / se, welch_df(ours, baseline))


def gap(ours: Sequence[float], baseline: Sequence[float], better: str, margin: float = 0.0, unit: str = "") -> str:
    """What decides a verdict, measured: the difference in the claim's direction (plus the margin),
    its standard error, the one-sided Welch test's p, and how many seeds went ours' way (one value
    per seed on both sides)."""
    d, se = difference(ours, baseline, better)
    base = list(baseline) if len(baseline) == len(ours) else list(baseline) * len(ours)
    wins = sum((o < b) if better == "lower" else (o > b) for o, b in zip(ours, base))
    p = p_value(ours, baseline, better, margin)
    return (f"difference {d:+.3f}{' ' + unit if unit else ''} in the claim's direction"
            + (f" plus the margin {margin:g}" if margin else "")
            + f", standard error {se:.3f}, one-sided Welch p = {p:.3f} (needs < {ALPHA:g}); ours ahead in {wins} of "
            f"{len(ours)} seeds" + (" (the seeds' spread, not the gap, decides)" if d > 0 and wins == len(ours) else ""))


def _check_margin(margin: Any) -> None:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin >= 0:
        raise ValueError(f"margin must be a number >= 0, got {margin!r}")


def verdict(ours: Sequence[float], baseline: Sequence[float], better: str, margin: float = 0.0,
            deterministic: bool = False) -> str:
    """``"reproduced"`` iff the one-sided Welch t-test finds mean(ours) ahead of mean(baseline)
    less ``margin`` (the tolerance of a claim of comparable quality) in the ``better`` direction at
    level ``ALPHA``, else ``"not reproduced"``. ``deterministic``: a repeated deterministic
    measurement, reproduced iff every value of ours beats every value of the baseline less
    ``margin``."""
    _check_margin(margin)
    if deterministic:
        if better not in BETTER:
            raise ValueError(f"better must be one of {BETTER}, got {better!r}")
        worst = min(ours) if better == "higher" else -max(ours)
        best = max(baseline) if better == "higher" else -min(baseline)
        return VERDICTS[0] if worst + margin > best else VERDICTS[1]
    return VERDICTS[0] if p_value(ours, baseline, better, margin) < ALPHA else VERDICTS[1]


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
    not match, it has fewer than ``MIN_SEEDS`` seeds (a deterministic one: fewer than one repeat),
    it lacks its provenance, or its verdict is not the computed one."""
    cid = entry.get("id", "?")
    missing = [f for f in FIELDS if f not in entry]
    if missing:
        raise ValueError(f"claim {cid!r} lacks the fields {missing}")
    for f in ("id", "model", "paper", "claim", "command", "commit", "date"):
        if not isinstance(entry[f], str) or not entry[f].strip():
            raise ValueError(f"claim {cid!r}: {f} must be a non-empty string, got {entry[f]!r}")
    if entry["commit"] != UNKNOWN and not (len(entry["commit"]) == 40 and
                                           all(ch in "0123456789abcdef" for ch in entry["commit"])):
        raise ValueError(f"claim {cid!r}: commit must be a full git hash or {UNKNOWN!r}, got {entry['commit']!r}")
    deterministic = entry.get("deterministic", False)
    if not isinstance(deterministic, bool):
        raise ValueError(f"claim {cid!r}: deterministic must be true or false, got {deterministic!r}")
    least = 1 if deterministic else MIN_SEEDS
    seeds = entry["seeds"]
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < least:
        raise ValueError(f"claim {cid!r}: seeds must be an integer >= {least}, got {seeds!r}")
    ours, base = _numbers("ours", entry["ours"]), _numbers("baseline", entry["baseline"])
    if len(ours) != seeds:
        raise ValueError(f"claim {cid!r}: ours has {len(ours)} values for {seeds} seeds")
    if len(base) not in (1, seeds):
        raise ValueError(f"claim {cid!r}: baseline has {len(base)} values; expected 1 (fixed) or {seeds} (one per seed)")
    expected = verdict(ours, base, entry["better"], entry["margin"], deterministic)
    if entry["verdict"] != expected:
        raise ValueError(f"claim {cid!r}: verdict {entry['verdict']!r} but the numbers give {expected!r}")
    if not isinstance(entry["why"], str) or not entry["why"].strip():
        raise ValueError(f"claim {cid!r}: why must say what was measured")
    _check_structure(entry)
    for point in entry.get("curve", []):
        if not isinstance(point, Mapping) or not {"budget", "ours", "baseline", "verdict"} <= set(point):
            raise ValueError(f"claim {cid!r}: a curve point needs budget, ours, baseline and verdict, got {point!r}")
        p_ours, p_base = _numbers("curve ours", point["ours"]), _numbers("curve baseline", point["baseline"])
        if len(p_base) not in (1, len(p_ours)) or len(p_ours) < least:
            raise ValueError(f"claim {cid!r}: curve point {point['budget']!r} needs >= {least} seeds and a "
                             f"baseline of 1 or {len(p_ours)} values")
        if point["verdict"] != verdict(p_ours, p_base, entry["better"], entry["margin"], deterministic):
            raise ValueError(f"claim {cid!r}: curve point {point['budget']!r} has a verdict its numbers do not give")


def _check_structure(entry: Mapping[str, Any]) -> None:
    """The fields no script measures: the command as data (``run``, which ``command`` renders), the
    claim's ``kind`` (an implementation check says why in ``kind_reason``), the estimated ``minutes``
    of its run and the ``machine`` it was measured on."""
    cid = entry.get("id", "?")
    run = entry.get("run")
    if run is not None:
        if not isinstance(run, Mapping) or set(run) != {"script", "args"} or not isinstance(run["script"], str) \
                or not isinstance(run["args"], list) or not all(isinstance(a, str) for a in run["args"]):
            raise ValueError(f"claim {cid!r}: run must be {{'script': str, 'args': [str, ...]}}, got {run!r}")
        if parse_command(entry["command"]) != dict(run) or entry["command"] != render_command(run):
            raise ValueError(f"claim {cid!r}: command {entry['command']!r} is not the one its run gives, "
                             f"{render_command(run)!r}")
    kind = entry.get("kind", KINDS[0])
    if kind not in KINDS:
        raise ValueError(f"claim {cid!r}: kind must be one of {KINDS}, got {kind!r}")
    reason = entry.get("kind_reason")
    if kind == "implementation-check" and (not isinstance(reason, str) or not reason.strip()):
        raise ValueError(f"claim {cid!r}: an implementation check needs kind_reason, why it is not a reproduction")
    if kind == "reproduction" and reason is not None:
        raise ValueError(f"claim {cid!r}: kind_reason belongs to an implementation check, not a reproduction")
    minutes = entry.get("minutes")
    if minutes is not None and (isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0):
        raise ValueError(f"claim {cid!r}: minutes must be a number > 0, got {minutes!r}")
    machine = entry.get("machine")
    if machine is not None and (not isinstance(machine, str) or not machine.strip()):
        raise ValueError(f"claim {cid!r}: machine must be a non-empty string, got {machine!r}")


def make_claim(*, id: str, model: str, paper: str, claim: str, command: str, better: str,
               ours: Sequence[float], baseline: Union[float, Sequence[float]],
               why: Union[str, Mapping[str, str]], budget: str, margin: float = 0.0,
               curve: Sequence[Mapping[str, Any]] = (), deterministic: bool = False,
               commit: str = UNKNOWN, date: str = UNKNOWN, dirty: Sequence[str] = (), machine: Optional[str] = None,
               kind: str = KINDS[0], kind_reason: Optional[str] = None,
               minutes: Optional[float] = None) -> Dict[str, Any]:
    """A checked claim entry with its verdict computed. ``command``: the shell line that measures it;
    when it runs a benchmarks/ script it is kept as data too (``run``: the script and its arguments,
    ``parse_command``) and written back in the one form ``render_command`` gives. ``why``: a string,
    or a mapping from the verdict (``"reproduced"`` / ``"not reproduced"``) to the sentence for that
    outcome. ``curve``: ``[{"budget": "800 steps", "ours": [...], "baseline": [...]}, ...]``, larger
    budgets of the same measurement; each point's verdict is computed too. ``commit``, ``date``,
    ``dirty``, ``machine``: where it was measured (``provenance``). ``kind``: one of ``KINDS``
    (``kind_reason`` says why an implementation check is not a reproduction); ``minutes``: the
    estimated wall-clock minutes of its command."""
    ours, base = _numbers("ours", ours), _numbers("baseline", baseline)
    v = verdict(ours, base, better, margin, deterministic)
    if isinstance(why, Mapping):
        if v not in why:
            raise ValueError(f"why has no sentence for the verdict {v!r} (keys {sorted(why)})")
        why = why[v]
    run = parse_command(command)
    entry = {"id": id, "model": model, "paper": paper, "claim": claim,
             "command": command if run is None else render_command(run), "better": better,
             "seeds": len(ours), "ours": ours, "baseline": base, "margin": float(margin), "verdict": v, "why": why,
             "budget": budget, "commit": commit, "date": date}
    if run is not None:
        entry["run"] = run
    if machine is not None:
        entry["machine"] = machine
    entry["kind"] = kind
    if kind_reason is not None:
        entry["kind_reason"] = kind_reason
    if minutes is not None:
        entry["minutes"] = minutes
    if deterministic:
        entry["deterministic"] = True
    if dirty:
        entry["dirty"] = sorted(dirty)
    if curve:
        entry["curve"] = [{"budget": str(p["budget"]), "ours": _numbers("curve ours", p["ours"]),
                           "baseline": _numbers("curve baseline", p["baseline"]),
                           "verdict": verdict(_numbers("curve ours", p["ours"]), _numbers("curve baseline", p["baseline"]),
                                              better, margin, deterministic),
                           **{k: p[k] for k in PROVENANCE if k in p}} for p in curve]
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
    atomic_write_text(path, json.dumps(list(entries), indent=1, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------ provenance

def _git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def script_of(command: str) -> Optional[str]:
    """The reproduction script a claim's command runs (``benchmarks/NAME.py``), or None."""
    found = re.search(r"benchmarks/([A-Za-z0-9_]+\.py)", command)
    return f"benchmarks/{found.group(1)}" if found else None


def parse_command(command: str) -> Optional[Dict[str, Any]]:
    """A recorded command as data: ``{"script": "benchmarks/NAME.py", "args": [...]}`` (the words after
    the script, as the shell splits them); the environment assignments and the interpreter before the
    script are dropped (every command runs with ``ENV``). None when the command runs no benchmarks/
    script."""
    try:
        words = shlex.split(command)
    except ValueError as err:
        raise ValueError(f"command {command!r} is not a shell command line: {err}") from None
    at = next((i for i, w in enumerate(words) if re.fullmatch(r"(\./)?benchmarks/[A-Za-z0-9_]+\.py", w)), None)
    if at is None:
        return None
    return {"script": words[at].removeprefix("./"), "args": words[at + 1:]}


def render_command(run: Mapping[str, Any]) -> str:
    """The shell line of ``run`` (``parse_command``'s inverse), with ``ENV``: what a reader pastes."""
    return " ".join([*(f"{k}={v}" for k, v in ENV), "python", run["script"], *map(shlex.quote, run["args"])])


def _seeds_span(args: Sequence[str]) -> Optional[tuple]:
    """``(start, stop)``: where the values of ``--seeds`` lie in ``args`` (None without the flag)."""
    if "--seeds" not in args:
        return None
    start = list(args).index("--seeds") + 1
    stop = next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))
    return start, stop


def seeds_of(run: Mapping[str, Any]) -> Optional[int]:
    """How many seeds ``run`` asks for: ``--seeds N``, or the number of seeds it lists (``--seeds 0 1
    2``); None when it names none (its script fixes them)."""
    span = _seeds_span(run["args"])
    if span is None:
        return None
    values = run["args"][span[0]:span[1]]
    return int(values[0]) if len(values) == 1 else len(values)


def with_seeds(run: Mapping[str, Any], n: int) -> Dict[str, Any]:
    """``run`` asking for ``n`` seeds in the form it already uses (a count, or a list of consecutive
    seeds from its first); ValueError if it names none (its script fixes them)."""
    span = _seeds_span(run["args"])
    if span is None:
        raise ValueError(f"{run['script']} {' '.join(run['args'])} names no --seeds: its script fixes the seeds")
    args, (start, stop) = list(run["args"]), span
    values = [str(n)] if stop - start == 1 else [str(int(args[start]) + i) for i in range(n)]
    return {"script": run["script"], "args": args[:start] + values + args[stop:]}


def declared(script: str, root: Path = ROOT) -> Dict[str, List[str]]:
    """The script's module-level ``DEPENDS`` literal (claim id or ``"*"`` -> paths), read without
    importing the script; ``{}`` if it declares none."""
    path = Path(root) / script
    if not path.exists():
        return {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DEPENDS" for t in node.targets):
            value = ast.literal_eval(node.value)
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, (list, tuple)) and
                                                      all(isinstance(x, str) for x in v) for k, v in value.items()):
                raise ValueError(f"{script}: DEPENDS must be a dict from claim id (or '*') to a list of paths")
            return {k: list(v) for k, v in value.items()}
    return {}


def depends(entry: Mapping[str, Any], root: Path = ROOT) -> List[str]:
    """The files (and folders) claim ``entry``'s numbers depend on: its script, and what the script
    declares for all its claims (``"*"``) and for this one, ``@group`` names expanded."""
    script = script_of(entry["command"])
    if script is None:
        return []
    table = declared(script, root)
    paths = [script]
    for name in table.get("*", []) + table.get(entry["id"], []):
        if name.startswith("@"):
            if name[1:] not in GROUPS:
                raise ValueError(f"{script}: DEPENDS names the unknown group {name!r} (known: {sorted(GROUPS)})")
            paths += GROUPS[name[1:]]
        else:
            paths.append(name)
    return sorted(set(paths))


def _head(root: Path = ROOT) -> Optional[str]:
    done = _git("rev-parse", "HEAD", root=root)
    return done.stdout.strip() if done.returncode == 0 else None


# the commit this process started at: a measurement is of the code it started with, even if a commit
# lands while it runs (then the files that commit changed count as changed under the measurement)
_STARTED_AT = _head()


def provenance(paths: Sequence[str], root: Path = ROOT, started: Optional[str] = None) -> Dict[str, Any]:
    """Where a measurement is being taken: the commit the process started at (``started``; by
    default the one this module was imported at, for ``ROOT``), today's date (UTC), and which of
    ``paths`` differ from that commit now, uncommitted or committed since (``dirty``: the claim will
    be stale until it is rerun on committed code)."""
    now = _head(root)
    started = started or (_STARTED_AT if Path(root) == ROOT else None) or now
    today = time.strftime("%Y-%m-%d", time.gmtime())
    if started is None:
        return {"commit": UNKNOWN, "date": today, "dirty": [], "machine": machine()}
    changed = set()
    if paths:
        changed |= {line[3:] for line in _git("status", "--porcelain", "--", *paths, root=root).stdout.splitlines()}
        if now and now != started:
            changed |= set(_git("diff", "--name-only", started, now, "--", *paths, root=root).stdout.split())
    return {"commit": started, "date": today, "dirty": sorted(changed), "machine": machine()}


def machine() -> str:
    """The machine a measurement is taken on, in one line: CPU, cores, torch (``qkv.bench.common``'s
    description, the one the reproductions' pages give)."""
    import torch
    from qkv.bench.common import describe_machine
    info = describe_machine(torch.device("cpu"))
    return f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}"


def stale(entry: Mapping[str, Any], root: Path = ROOT) -> Optional[str]:
    """Why claim ``entry`` is stale, or None when its numbers still stand for the code as it is:
    its commit is unknown or not in this history, it was measured on uncommitted changes, or a file
    it depends on changed since its commit (committed or not)."""
    commit = entry.get("commit", UNKNOWN)
    if commit == UNKNOWN:
        return "measured at an unknown commit"
    if entry.get("dirty"):
        return f"measured with uncommitted changes to {', '.join(entry['dirty'])}"
    if _git("cat-file", "-e", f"{commit}^{{commit}}", root=root).returncode != 0:
        return f"its commit {commit[:12]} is not in this repository's history"
    paths = depends(entry, root)
    if not paths:
        return "its command names no benchmarks/ script, so what it depends on is unknown"
    changed = [f for f in _git("diff", "--name-only", commit, "--", *paths, root=root).stdout.split()
               if _code_changed(commit, f, root)]
    return f"code changed since {commit[:12]}: {', '.join(changed)}" if changed else None


_FINGERPRINTS: Dict[tuple, Optional[str]] = {}


def _fingerprint(text: Optional[str]) -> Optional[str]:
    """What of a Python file can change a measurement: its syntax tree without docstrings and
    without the ``DEPENDS`` declaration (``None``: no file, or not Python that parses)."""
    if text is None:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                                 and isinstance(n.value.value, str))
                         and not (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DEPENDS"
                                                                      for t in n.targets))] or [ast.Pass()]
    return ast.dump(tree)


def _code_changed(commit: str, path: str, root: Path = ROOT) -> bool:
    """Whether ``path`` differs in code (not only in comments, docstrings or its ``DEPENDS``) between
    ``commit`` and the working tree; any change to a file that is not Python counts."""
    now_path = Path(root) / path
    now = now_path.read_text() if now_path.exists() else None
    key = (str(root), commit, path)
    if key not in _FINGERPRINTS:
        shown = _git("show", f"{commit}:{path}", root=root)
        _FINGERPRINTS[key] = _fingerprint(shown.stdout) if shown.returncode == 0 else None
        if shown.returncode == 0 and _FINGERPRINTS[key] is None:
            _FINGERPRINTS[key] = "unparsed:" + shown.stdout
    before = _FINGERPRINTS[key]
    if not path.endswith(".py"):
        return True
    return before is None or _fingerprint(now) != before


# ------------------------------------------------------------------ recording

@contextlib.contextmanager
def _claims_lock(path: Path):
    """One writer of ``path`` (claims.json, the pending list, README) at a time: two reproductions
    running side by side (one per core) must not read the list, each add a claim, and let the later
    save drop the earlier's. An advisory ``flock`` on a file in the temporary folder named after
    ``path``; a no-op where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        fcntl = None
    if fcntl is None or _HELD:  # re-entrant: this process holds it already
        _HELD.append(path)
        try:
            yield
        finally:
            _HELD.pop()
        return
    key = hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"qkv-claims-{key}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD.append(path)
        try:
            yield
        finally:
            _HELD.pop()
            fcntl.flock(handle, fcntl.LOCK_UN)


_HELD: List[Path] = []


def record(*, path: Path = CLAIMS, readme: Optional[Path] = README, pending: Path = PENDING,
           **fields: Any) -> Dict[str, Any]:
    """Add or replace (by ``id``) one claim in ``path`` from a reproduction's per-seed results,
    stamped with its provenance (the current commit and date, and the dependent files with
    uncommitted changes), drop it from the pending list, and regenerate ``readme`` (None: leave
    it). Arguments as ``make_claim``. The recorded claim's budget-curve points stay (re-measuring
    the main budget does not erase the larger ones), except those ``curve`` gives again. A claim
    recorded again at another main budget (its ``budget`` text differs) keeps the measurement it
    replaces as a curve point named by that earlier ``budget`` text, with the commit and date it was
    measured at: raising a budget after seeing a verdict leaves the earlier verdict in view. Returns
    the entry.

    ``measured``: True when this run measured the numbers (stamped now), False when the script
    re-records saved ones (the recorded provenance stays; a new claim's is unknown); None (the
    default): stamped now unless the numbers are the same as the recorded ones — pass True from a
    rerun of a deterministic or exactly reseeded measurement, which repeats its numbers bit for bit
    (``qkv reproduce ID`` does so for claim ID through the environment variable ``QKV_REPRODUCE``).

    A claim recorded again at the same budget keeps its recorded command (``run``, with the seeds
    now measured; a script's own command line names a new claim or a new budget) and what no script
    measures (``STRUCTURE``: its kind, its estimated minutes). One measured with fewer seeds than the
    recorded entry at the same budget does not replace it: a smaller measurement never overwrites a
    bigger one (the recorded entry is returned).

    A run with fewer than ``MIN_SEEDS`` seeds (a claim that is not ``deterministic``) gets no
    verdict: the claim goes on the pending list instead (``pend``), with its command rerun at
    ``MIN_SEEDS`` seeds, and a claim already recorded stays as it is."""
    ours = _numbers("ours", fields.get("ours"))
    if len(ours) < MIN_SEEDS and not fields.get("deterministic", False):
        command = str(fields.get("command", ""))
        rerun = re.sub(r"--seeds \d+", f"--seeds {MIN_SEEDS}", command)
        if rerun == command:
            rerun = f"{command} --seeds {MIN_SEEDS}"
        return pend(id=fields["id"], model=fields["model"], paper=fields["paper"], claim=fields["claim"],
                    one_seed=f"ours {fmt(ours)} against {fmt(_numbers('baseline', fields.get('baseline')))} "
                             f"({len(ours)} seed{'s' if len(ours) > 1 else ''}; {fields.get('budget', '')})",
                    command=rerun, time="see the script's docstring", path=pending, readme=readme, claims_path=path)
    with _claims_lock(path):
        return _record(path, readme, pending, ours, fields)


def _main_to_curve(entry: Mapping[str, Any]) -> Dict[str, Any]:
    """``entry`` with its main measurement also kept as a point of its curve, named by its ``budget``
    text and carrying its provenance (a point of that name already there is left as it is)."""
    curve = list(entry.get("curve", []))
    if all(p["budget"] != entry["budget"] for p in curve):
        curve.append({"budget": entry["budget"], "ours": entry["ours"], "baseline": entry["baseline"],
                      "verdict": entry["verdict"], **{k: entry[k] for k in PROVENANCE if k in entry}})
    return {**entry, "curve": sorted(curve, key=lambda p: _budget_key(p["budget"]))}


def _record(path: Path, readme: Optional[Path], pending: Path, ours: List[float], fields: Dict[str, Any]) -> Dict[str, Any]:
    """``record``'s read-modify-write of the claims, under the lock."""
    entries = load(path)
    at = next((i for i, e in enumerate(entries) if e["id"] == fields.get("id")), None)
    if at is not None:
        recorded = entries[at]
        if fields.get("budget", recorded["budget"]) == recorded["budget"] and len(ours) < recorded["seeds"]:
            # fewer seeds at the same budget: a smaller measurement never replaces a bigger one
            print(f"claim {recorded['id']}: {len(ours)} seeds measured (ours {fmt(ours)}); the recorded entry "
                  f"has {recorded['seeds']} and stays: rerun with {recorded['seeds']} seeds to replace it")
            return recorded
        fields = {**{k: recorded[k] for k in STRUCTURE if k in recorded}, **fields}
        given = parse_command(str(fields.get("command", "")))
        if recorded.get("run") and given and given["script"] == recorded["run"]["script"] \
                and fields.get("budget", recorded["budget"]) == recorded["budget"]:
            # the same measurement again: the recorded command (data, the one `qkv reproduce` runs) stays, with
            # the seeds measured; a script's own command line names a new claim's or a new budget's
            run = recorded["run"] if seeds_of(recorded["run"]) is None else with_seeds(recorded["run"], len(ours))
            if given != run:
                print(f"claim {recorded['id']}: its recorded command stays, {render_command(run)} "
                      f"(the script's own: {render_command(given)})")
            fields["command"] = render_command(run)
    if at is not None and "budget" in fields and entries[at]["budget"] != fields["budget"]:
        entries[at] = _main_to_curve(entries[at])
    if at is not None and entries[at].get("curve"):
        given = [dict(p, budget=str(p["budget"])) for p in fields.get("curve", ())]
        kept = [p for p in entries[at]["curve"] if p["budget"] not in {g["budget"] for g in given}]
        fields = {**fields, "curve": sorted(given + kept, key=lambda p: _budget_key(p["budget"]))}
    measured = fields.pop("measured", None)
    if measured is None and os.environ.get("QKV_REPRODUCE") == fields.get("id"):
        measured = True  # `qkv reproduce ID` ran this claim's own command: its numbers are measured now
    if "commit" not in fields:
        before = entries[at] if at is not None else None
        same = before is not None and before["ours"] == ours and before["baseline"] == _numbers("baseline", fields["baseline"])
        if measured is False or (measured is None and same):
            # numbers the script did not measure in this run (a section re-recorded from saved results; by
            # default, the same numbers again): their provenance stays, or is unknown
            kept = {k: before[k] for k in PROVENANCE if k in before} if before else {}
            fields = {**kept, **fields}
        else:
            fields = {**provenance(depends({"id": fields.get("id", "?"), "command": fields.get("command", "")})),
                      **fields}
    if fields.get("curve"):
        # a curve point keeps the provenance it was recorded with while its numbers stay the same (a section
        # re-recorded from saved results); a point with new numbers is stamped as the claim is
        before = {p["budget"]: p for p in (entries[at].get("curve", []) if at is not None else [])}

        def stamped(p: Mapping[str, Any]) -> Dict[str, Any]:
            old = before.get(str(p["budget"]))
            if "commit" in p:
                return dict(p)
            if old is not None and old["ours"] == _numbers("curve ours", p["ours"]) \
                    and old["baseline"] == _numbers("curve baseline", p["baseline"]):
                return {**p, **{k: old[k] for k in PROVENANCE if k in old}}
            return {**p, **{k: fields[k] for k in ("commit", "date", "machine") if k in fields},
                    **({"dirty": fields["dirty"]} if fields.get("dirty") else {})}
        fields = {**fields, "curve": [stamped(p) for p in fields["curve"]]}
    entry = make_claim(**fields)
    if at is None:
        entries.append(entry)
    else:
        entries[at] = entry
    save(entries, path)
    waiting = [p for p in load(pending) if p["id"] != entry["id"]]
    if Path(pending).exists():
        atomic_write_text(pending, json.dumps(waiting, indent=1, ensure_ascii=False) + "\n")
    if readme is not None:
        write_readme(path, pending, readme)
    print(f"claim {entry['id']}: {entry['verdict']} (ours {fmt(entry['ours'])}, baseline {fmt(entry['baseline'])})"
          + (f"; stale until rerun on committed code ({', '.join(entry['dirty'])} changed)" if entry.get("dirty") else ""))
    return entry


def pend(*, id: str, model: str, paper: str, claim: str, one_seed: str, command: str, time: str,
         path: Path = PENDING, readme: Optional[Path] = README, claims_path: Path = CLAIMS) -> Dict[str, Any]:
    """Put claim ``id`` on the pending list (``claims-pending.json``): its last run had fewer than
    ``MIN_SEEDS`` seeds, so it gets no verdict; ``one_seed`` says what that run measured and
    ``command`` reruns it with enough seeds. A claim already recorded with its seeds stays as it is
    (a smoke or one-seed run never replaces it) and is not listed."""
    item = {"id": id, "model": model, "paper": paper, "claim": claim, "one_seed": one_seed, "command": command,
            "time": time}
    with _claims_lock(claims_path):
        return _pend(item, path, readme, claims_path)


def _pend(item: Dict[str, Any], path: Path, readme: Optional[Path], claims_path: Path) -> Dict[str, Any]:
    id, one_seed, command = item["id"], item["one_seed"], item["command"]
    if any(e["id"] == id for e in load(claims_path)):
        print(f"claim {id}: one seed measured ({one_seed}); the recorded claim with its seeds stays")
        return item
    waiting = [p for p in load(path) if p["id"] != id] + [item]
    atomic_write_text(path, json.dumps(waiting, indent=1, ensure_ascii=False) + "\n")
    if readme is not None:
        write_readme(claims_path, path, readme)
    print(f"claim {id}: pending ({one_seed}); rerun with {MIN_SEEDS} seeds: {command}")
    return item


def add_point(claim_id: str, budget: str, ours: Sequence[float], baseline: Union[float, Sequence[float]], *,
              path: Path = CLAIMS, readme: Optional[Path] = README, pending: Path = PENDING) -> Optional[Dict[str, Any]]:
    """Add (or replace, by ``budget``) one point of the budget curve of the recorded claim
    ``claim_id``: the same measurement at a larger budget, with its own computed verdict. A point
    with fewer than ``MIN_SEEDS`` seeds is not added (None). The point carries the commit and date
    it was measured at, as a claim does."""
    with _claims_lock(path):
        entries = load(path)
        at = next((i for i, e in enumerate(entries) if e["id"] == claim_id), None)
        if at is None:
            raise ValueError(f"no claim {claim_id!r} in {path}: record it at its main budget first")
        e = entries[at]
        ours, base = _numbers("curve ours", ours), _numbers("curve baseline", baseline)
        if len(ours) < MIN_SEEDS and not e.get("deterministic", False):
            print(f"claim {claim_id} at {budget}: {len(ours)} seed(s), no curve point (needs {MIN_SEEDS})")
            return None
        where = provenance(depends(e))
        point = {"budget": str(budget), "ours": ours, "baseline": base,
                 "verdict": verdict(ours, base, e["better"], e["margin"], e.get("deterministic", False)),
                 "commit": where["commit"], "date": where["date"], **({"dirty": where["dirty"]} if where["dirty"] else {}),
                 "machine": where["machine"]}
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


def _curve(points: Sequence[Mapping[str, Any]], commit: Optional[str] = None) -> str:
    """A claim's budget curve for the table; a point measured at another commit than the claim's
    main numbers (``commit``) says which, and one from before points carried a commit says so."""
    def where(p: Mapping[str, Any]) -> str:
        if "commit" not in p:
            return " (earlier code, commit unrecorded)"
        return "" if commit is None or p["commit"] == commit else f" (at {p['commit'][:7]})"
    return "; ".join(f"{p['budget']}: {fmt(p['ours'])} vs {fmt(p['baseline'])}, {p['verdict']}{where(p)}"
                     for p in points) or "—"


def _decided(e: Mapping[str, Any]) -> str:
    """The test's number for the table: the one-sided p, or the rule of a deterministic claim."""
    if e.get("deterministic"):
        return "deterministic: every repeat"
    return f"p = {p_value(e['ours'], e['baseline'], e['better'], e['margin']):.3f}"


def kind_text(e: Mapping[str, Any]) -> str:
    """A claim's kind as the pages show it: "reproduction", or "implementation check: REASON"."""
    if e.get("kind", KINDS[0]) == KINDS[0]:
        return KINDS[0]
    return f"implementation check: {e['kind_reason']}"


def _kinds_line(entries: Sequence[Mapping[str, Any]]) -> str:
    """The verdicts counted by kind (reproductions apart from implementation checks)."""
    parts = []
    for kind, name in zip(KINDS, ("reproductions", "implementation checks")):
        mine = [e for e in entries if e.get("kind", KINDS[0]) == kind]
        parts.append(f"{len(mine)} {name} ({sum(e['verdict'] == 'reproduced' for e in mine)} reproduced)")
    return "By kind: " + ", ".join(parts) + "."


def render_readme(entries: Sequence[Mapping[str, Any]], pending: Sequence[Mapping[str, Any]] = ()) -> str:
    """The README text: one table row per claim, then the claims awaiting a multi-seed run."""
    n_rep = sum(e["verdict"] == "reproduced" for e in entries)
    lines = [
        "# Reproductions: every claim, its seeds and its verdict",
        "",
        "Generated by `python benchmarks/claims.py` from [`claims.json`](claims.json); do not edit by hand.",
        "Each reproduction script (`benchmarks/repro_*.py`) writes its claims there when it runs, with the "
        "commit and date it measured them at and the per-seed values.",
        "",
        f"A claim is **reproduced** iff a one-sided Welch t-test at {ALPHA:g} finds the mean of *ours* ahead of "
        f"the mean of the baseline in the paper's direction (standard error `sqrt(var_o / n_o + var_b / n_b)`, "
        f"Welch-Satterthwaite degrees of freedom; a fixed baseline contributes no variance); every claim has at "
        f"least {MIN_SEEDS} seeds. A claim of *comparable* quality states a tolerance (the margin column, fixed "
        f"before its run) and is reproduced iff the test finds ours ahead of the baseline less that tolerance. "
        f"A *deterministic* measurement (peak memory, a fitted cost exponent) is judged by its repeats instead: "
        f"reproduced iff every repeat of ours beats every value of the baseline (less the margin). "
        f"Values are mean ± standard error over the seeds.",
        "",
        "A claim is **stale** when a file it depends on (its script and the paths the script declares in "
        "`DEPENDS`) changed since the commit it was measured at; a stale claim does not count as reproduced "
        "until it is rerun. `python benchmarks/claims.py --check` lists the stale claims and the files that "
        "changed (the table below cannot: it would change with every commit). The rules in full, and what "
        "issue 38 changed per claim: [claims-changes.md](claims-changes.md).",
        "",
        f"**{len(entries)} claims, {n_rep} reproduced at the commit they were measured at, "
        f"{len(entries) - n_rep} not reproduced**"
        + (f"; {len(pending)} more await a run with {MIN_SEEDS} seeds (below)." if pending else ".")
        + " " + _kinds_line(entries),
        "",
        "A claim's *kind* says what its verdict is evidence of: a **reproduction** tests the paper's claim; an "
        "**implementation check** tests that the implementation behaves as the paper's mechanism must (its kind "
        "column says why a strict reader would not count it as a reproduction). `qkv reproduce ID` reruns one "
        "claim's command at HEAD; `qkv reproduce --list` lists them with their estimated minutes.",
        "",
        "| model | paper | claim | kind | better | ours | baseline | margin | test | verdict | why | budget "
        "| larger budgets | measured at | command |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        n = f"(n={e['seeds']}" + (", deterministic)" if e.get("deterministic") else ")")
        measured = ("unknown commit" if e["commit"] == UNKNOWN else f"{e['commit'][:10]}, {e['date']}") + \
            (f", {e['machine']}" if e.get("machine") else "") + (" (uncommitted changes)" if e.get("dirty") else "")
        lines.append("| " + " | ".join(_cell(c) for c in (
            e["model"], e["paper"], e["claim"], kind_text(e), e["better"], f"{fmt(e['ours'])} {n}",
            fmt(e["baseline"]) + ("" if len(e["baseline"]) > 1 else " (fixed)"),
            f"{e['margin']:g}" if e["margin"] else "—", _decided(e), f"**{e['verdict']}**", e["why"], e["budget"],
            _curve(e.get("curve", []), e.get("commit")), measured, f"`{e['command']}`")) + " |")
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
    atomic_write_text(readme, text)
    return text


def check(path: Path = CLAIMS, pending: Path = PENDING, readme: Path = README) -> List[str]:
    """Problems with the table: invalid claims, wrong verdicts, or a README out of sync (staleness
    is ``stale``'s: it changes with the code, not with the table)."""
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


def summary(entries: Sequence[Mapping[str, Any]], pending: Sequence[Mapping[str, Any]] = (),
            root: Path = ROOT) -> Dict[str, Any]:
    """The counts that say how the table stands now: claims listed, reproduced and not stale,
    stale (with why, by id), not reproduced and not stale, and pending."""
    why_stale = {e["id"]: stale(e, root) for e in entries}
    why_stale = {k: v for k, v in why_stale.items() if v}
    fresh = [e for e in entries if e["id"] not in why_stale]
    by_kind = {kind: {"listed": sum(e.get("kind", KINDS[0]) == kind for e in entries),
                      "reproduced": sum(e["verdict"] == "reproduced" and e.get("kind", KINDS[0]) == kind for e in fresh),
                      "not_reproduced": sum(e["verdict"] != "reproduced" and e.get("kind", KINDS[0]) == kind
                                            for e in fresh),
                      "stale": sum(e.get("kind", KINDS[0]) == kind for e in entries if e["id"] in why_stale)}
               for kind in KINDS}
    return {"listed": len(entries), "reproduced": sum(e["verdict"] == "reproduced" for e in fresh),
            "not_reproduced": sum(e["verdict"] != "reproduced" for e in fresh), "stale": why_stale,
            "pending": len(pending), "by_kind": by_kind}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="check the verdicts and the README and list the stale claims; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        s = summary(load(CLAIMS), load(PENDING))
        for cid, why in s["stale"].items():
            print(f"stale: {cid}: {why}", file=sys.stderr)
        print(f"{s['listed']} claims listed: {s['reproduced']} reproduced and current, {s['not_reproduced']} not "
              f"reproduced and current, {len(s['stale'])} stale (rerun before they count); {s['pending']} pending")
        for kind, name in zip(KINDS, ("reproductions", "implementation checks")):
            k = s["by_kind"][kind]
            print(f"  {name}: {k['listed']} listed, {k['reproduced']} reproduced and current, {k['not_reproduced']} "
                  f"not reproduced and current, {k['stale']} stale")
        return 1 if problems or s["stale"] else 0
    for e in load(CLAIMS):
        check_claim(e)
    write_readme()
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
