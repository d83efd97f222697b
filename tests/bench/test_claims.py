"""The claims table (benchmarks/claims.py): verdicts computed from the per-seed numbers, the
README generated from claims.json, and every published claim with at least three seeds."""

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import claims  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def entry(**kw):
    fields = dict(id="x", model="m", paper="p", claim="c.", command="python benchmarks/repro_x.py", better="higher",
                  ours=[0.9, 0.91, 0.92], baseline=[0.5, 0.52, 0.51], why="measured", budget="tiny")
    fields.update(kw)
    return claims.make_claim(**fields)


def test_student_t_tail_matches_the_tables():
    # one-sided 5 % critical values of Student's t (any statistics table) and a few exact tails
    for df, critical in [(1, 6.313752), (2, 2.919986), (4, 2.131847), (10, 1.812461), (30, 1.697261)]:
        assert claims.t_sf(critical, df) == pytest.approx(0.05, abs=2e-6)
    assert claims.t_sf(0.0, 3) == pytest.approx(0.5)
    assert claims.t_sf(1.0, 1) == pytest.approx(0.25)  # Cauchy: 1/2 - atan(1)/pi
    assert claims.t_sf(-2.919986, 2) == pytest.approx(0.95, abs=2e-6)
    assert claims.t_sf(2.5, 3.7) == pytest.approx(1 - claims.t_sf(-2.5, 3.7))


def test_welch_t_test_verdict():
    ours, base = [1.0, 2.0, 3.0], [0.0, 0.0, 3.0]
    d, se = claims.difference(ours, base, "higher")
    assert d == pytest.approx(1.0)
    assert se == pytest.approx(math.sqrt(1.0 / 3 + 3.0 / 3))  # sample variances 1 and 3, n = 3 each
    # Welch-Satterthwaite: (1/3 + 1)^2 / ((1/3)^2 / 2 + 1 / 2) = 3.2
    assert claims.welch_df(ours, base) == pytest.approx((4 / 3) ** 2 / ((1 / 9) / 2 + 1 / 2))
    assert claims.p_value(ours, base, "higher") == pytest.approx(claims.t_sf(1.0 / se, 3.2))
    assert claims.verdict(ours, base, "higher") == "not reproduced"
    assert claims.verdict([10, 11, 12], base, "higher") == "reproduced"
    assert claims.verdict(ours, base, "lower") == "not reproduced"  # ours is worse when lower is better
    assert claims.verdict([0.1, 0.2, 0.15], [0.5, 0.6, 0.55], "lower") == "reproduced"


def test_the_t_test_is_stricter_than_two_standard_errors():
    # gtrxl-vs-lstm-memory's numbers: the gap exceeds 2 SE, but with ~2 degrees of freedom the
    # one-sided Welch test at 5 % does not reject (p = 0.067)
    ours, base = [43.0, 52.0, 46.0], [86.0, 191.0, 103.0]
    d, se = claims.difference(ours, base, "lower")
    assert d > 2 * se
    assert claims.p_value(ours, base, "lower") == pytest.approx(0.0666, abs=1e-3)
    assert claims.verdict(ours, base, "lower") == "not reproduced"


def test_fixed_baseline_contributes_no_variance():
    d, se = claims.difference([1.10, 1.12, 1.14], [1.0], "lower")
    assert d == pytest.approx(-0.12) and se == pytest.approx(claims.standard_error([1.10, 1.12, 1.14]))
    assert claims.welch_df([1.10, 1.12, 1.14], [1.0]) == pytest.approx(2.0)  # a one-sample test: n - 1
    assert claims.verdict([1.10, 1.12, 1.14], [1.0], "lower") == "not reproduced"
    assert claims.verdict([1.10, 1.12, 1.14], [1.2], "lower") == "reproduced"


def test_equal_measurements_do_not_reproduce():
    # no spread at all (se = 0): a tie is not a win, the difference alone decides
    assert claims.verdict([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], "higher") == "not reproduced"
    assert claims.verdict([1.0, 1.0, 1.0], [0.99, 0.99, 0.99], "higher") == "reproduced"


def test_a_comparable_claim_is_a_non_inferiority_test():
    ours, base = [0.90, 0.91, 0.92], [0.92, 0.93, 0.94]  # ours 0.02 behind, se of the difference 0.0082
    assert claims.verdict(ours, base, "higher") == "not reproduced"
    assert claims.verdict(ours, base, "higher", margin=0.01) == "not reproduced"  # -0.01: worse by the tolerance
    assert claims.verdict(ours, base, "higher", margin=0.04) == "reproduced"  # +0.02 / 0.0082 = t 2.45 on 4 df
    with pytest.raises(ValueError, match="margin"):
        claims.verdict(ours, base, "higher", margin=-0.1)


def test_a_deterministic_claim_is_judged_by_every_repeat():
    # cost exponents below a bound: every repeat must be below, however small the spread
    assert claims.verdict([1.00, 1.01, 1.07], [1.2], "lower", deterministic=True) == "reproduced"
    assert claims.verdict([1.00, 1.01, 1.25], [1.2], "lower", deterministic=True) == "not reproduced"
    assert claims.verdict([1.19], [8.86], "lower", deterministic=True) == "reproduced"  # one repeat is enough
    e = entry(ours=[1.19], baseline=[8.86], better="lower", deterministic=True)
    assert e["deterministic"] is True and e["seeds"] == 1 and e["verdict"] == "reproduced"
    with pytest.raises(ValueError, match="seeds must be an integer >= 3"):
        entry(ours=[1.19], baseline=[8.86], better="lower")  # a seeded claim needs its seeds


def test_make_claim_computes_the_verdict_and_picks_why():
    e = entry(why={"reproduced": "won", "not reproduced": "lost"})
    assert e["verdict"] == "reproduced" and e["why"] == "won" and e["seeds"] == 3
    e = entry(ours=[0.5, 0.52, 0.51], why={"reproduced": "won", "not reproduced": "lost"})
    assert e["verdict"] == "not reproduced" and e["why"] == "lost"


@pytest.mark.parametrize("change, message", [
    (dict(ours=[0.9, 0.91]), "seeds"),
    (dict(baseline=[0.5, 0.5]), "baseline has 2 values"),
    (dict(better="bigger"), "better must be"),
    (dict(ours=[0.9, float("nan"), 0.9]), "finite"),
    (dict(why=""), "why"),
])
def test_invalid_claims_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        entry(**change)


def test_a_budget_curve_gets_its_own_verdicts():
    e = entry(ours=[0.5, 0.52, 0.51], curve=[{"budget": "800 steps", "ours": [0.9, 0.91, 0.92],
                                             "baseline": [0.5, 0.52, 0.51]}])
    assert e["verdict"] == "not reproduced" and e["curve"][0]["verdict"] == "reproduced"
    e["curve"][0]["verdict"] = "not reproduced"
    with pytest.raises(ValueError, match="curve point '800 steps'"):
        claims.check_claim(e)
    with pytest.raises(ValueError, match="seeds"):
        entry(curve=[{"budget": "x", "ours": [0.9], "baseline": [0.5]}])


def test_a_hand_written_verdict_is_refused():
    e = entry()
    e["verdict"] = "not reproduced"
    with pytest.raises(ValueError, match="the numbers give 'reproduced'"):
        claims.check_claim(e)


def test_record_adds_then_replaces_and_regenerates_the_readme(tmp_path):
    path, pending, readme = tmp_path / "claims.json", tmp_path / "pending.json", tmp_path / "README.md"
    pending.write_text(json.dumps([{"id": "b", "model": "m", "paper": "p", "claim": "c", "one_seed": "0.5",
                                    "command": "x", "time": "1 min"}]))
    common = dict(path=path, pending=pending, readme=readme, model="m", paper="p", claim="c.", command="cmd",
                  better="higher", baseline=[0.5, 0.5, 0.5], why="w", budget="b")
    claims.record(id="a", ours=[0.9, 0.9, 0.9], **common)
    claims.record(id="b", ours=[0.4, 0.5, 0.6], **common)
    claims.record(id="a", ours=[0.5, 0.6, 0.4], **common)
    saved = claims.load(path)
    assert [e["id"] for e in saved] == ["a", "b"]  # replaced in place, not appended
    assert saved[0]["verdict"] == "not reproduced" and saved[0]["ours"] == [0.5, 0.6, 0.4]
    assert claims.load(pending) == []  # a recorded claim leaves the pending list
    assert readme.read_text() == claims.render_readme(saved, [])
    assert claims.check(path, pending, readme) == []
    claims.add_point("b", "800 steps", [0.9, 0.95, 0.92], [0.5, 0.5, 0.5], path=path, readme=readme, pending=pending)
    claims.add_point("b", "400 steps", [0.5, 0.6, 0.4], [0.5, 0.5, 0.5], path=path, readme=readme, pending=pending)
    curve = claims.load(path)[1]["curve"]
    assert [(p["budget"], p["verdict"]) for p in curve] == [("400 steps", "not reproduced"), ("800 steps", "reproduced")]
    assert "800 steps: 0.923 ± 0.015 vs 0.500 ± 0.000, reproduced" in readme.read_text()
    claims.record(id="b", ours=[0.5, 0.5, 0.6], **common)  # the main budget re-measured: its curve stays
    assert [p["budget"] for p in claims.load(path)[1]["curve"]] == ["400 steps", "800 steps"]
    claims.record(id="b", ours=[0.5, 0.5, 0.6], curve=[{"budget": "800 steps", "ours": [0.1, 0.2, 0.1],
                                                         "baseline": [0.5]}], **common)
    curve = claims.load(path)[1]["curve"]
    assert [(p["budget"], p["verdict"]) for p in curve] == [("400 steps", "not reproduced"), ("800 steps", "not reproduced")]
    with pytest.raises(ValueError, match="no claim 'zz'"):
        claims.add_point("zz", "1", [1, 1, 1], [0], path=path, readme=readme, pending=pending)
    readme.write_text(readme.read_text() + "edited by hand\n")
    assert any("not the one generated" in p for p in claims.check(path, pending, readme))


def test_published_claims_are_valid_and_the_readme_is_in_sync():
    published = claims.load(claims.CLAIMS)
    assert published, "docs/reproductions/claims.json is empty"
    for e in published:
        assert len(e["ours"]) == e["seeds"] and (e.get("deterministic") or e["seeds"] >= claims.MIN_SEEDS)
        assert e["verdict"] == claims.verdict(e["ours"], e["baseline"], e["better"], e["margin"],
                                              e.get("deterministic", False))
        assert e["commit"] == claims.UNKNOWN or len(e["commit"]) == 40, e["id"]
        assert claims.script_of(e["command"]), f"{e['id']}: its command names no benchmarks/ script"
        assert claims.depends(e), e["id"]  # every script declares what its claims depend on (or at least itself)
    assert claims.check() == []


def test_gap_says_what_decided_the_verdict():
    text = claims.gap([2.0, 2.1, 1.9], [2.05, 2.0, 2.1], "lower", 0.05, "bpc")
    assert text.startswith("difference +0.050 bpc in the claim's direction plus the margin 0.05")
    assert "one-sided Welch p = " in text
    assert "ours ahead in 2 of 3 seeds" in text
    assert "ours ahead in 3 of 3 seeds (the seeds' spread" in claims.gap([0.6, 0.9, 0.61], [0.5], "higher")


# ------------------------------------------------------------------ provenance and staleness

def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path):
    """A small git repository with a reproduction script that declares what its claims depend on."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "src").mkdir()
    (root / "benchmarks" / "repro_x.py").write_text(
        '"""A reproduction."""\nDEPENDS = {"*": ["src/a.py"], "c2": ["src/b.py", "@training"]}\nSTEPS = 3\n')
    for name in "abc":
        (root / "src" / f"{name}.py").write_text(f'"""Module {name}."""\nX = 1  # a comment\n')
    git(root, "init", "-q")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "one")
    return root


def commit_all(root, message="next"):
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", message)


def test_depends_reads_the_scripts_declaration_without_importing_it(repo):
    c1 = {"id": "c1", "command": "OMP_NUM_THREADS=1 python benchmarks/repro_x.py --seeds 3"}
    c2 = dict(c1, id="c2")
    assert claims.depends(c1, repo) == ["benchmarks/repro_x.py", "src/a.py"]
    assert set(claims.depends(c2, repo)) == {"benchmarks/repro_x.py", "src/a.py", "src/b.py",
                                             *claims.GROUPS["training"]}
    (repo / "benchmarks" / "repro_x.py").write_text('DEPENDS = {"*": ["@nope"]}\n')
    with pytest.raises(ValueError, match="unknown group '@nope'"):
        claims.depends(c1, repo)
    (repo / "benchmarks" / "repro_x.py").write_text('DEPENDS = {"*": "src/a.py"}\n')
    with pytest.raises(ValueError, match="DEPENDS must be a dict"):
        claims.depends(c1, repo)


def test_a_claim_is_stale_when_code_it_depends_on_changed(repo):
    head = git(repo, "rev-parse", "HEAD")
    c1 = {"id": "c1", "command": "python benchmarks/repro_x.py", "commit": head, "date": "2026-11-27"}
    c2 = dict(c1, id="c2")
    assert claims.stale(c1, repo) is None and claims.stale(c2, repo) is None
    (repo / "src" / "c.py").write_text("X = 2\n")  # not a dependency
    (repo / "src" / "a.py").write_text('"""Module a, reworded."""\nX = 1  # another comment\n')  # no code change
    (repo / "benchmarks" / "repro_x.py").write_text(
        '"""A reproduction."""\nDEPENDS = {"*": ["src/a.py"], "c2": ["src/b.py", "@training", "src/c.py"]}\nSTEPS = 3\n')
    commit_all(repo)
    assert claims.stale(c1, repo) is None  # docstrings, comments and the declaration itself are not code
    assert "src/c.py" in claims.stale(c2, repo)  # c2 now declares c.py, which changed
    (repo / "src" / "b.py").write_text("X = 2\n")
    commit_all(repo)
    assert claims.stale(c1, repo) is None
    assert "src/b.py" in claims.stale(c2, repo)
    (repo / "src" / "a.py").write_text("X = 3\n")  # uncommitted: the code as it is now counts
    assert "code changed since" in claims.stale(c1, repo) and "src/a.py" in claims.stale(c1, repo)


def test_unknown_foreign_or_dirty_provenance_is_stale(repo):
    head = git(repo, "rev-parse", "HEAD")
    c1 = {"id": "c1", "command": "python benchmarks/repro_x.py", "commit": head, "date": "2026-11-27"}
    assert "unknown commit" in claims.stale(dict(c1, commit=claims.UNKNOWN), repo)
    assert "not in this repository's history" in claims.stale(dict(c1, commit="0" * 40), repo)
    assert "uncommitted changes to src/a.py" in claims.stale(dict(c1, dirty=["src/a.py"]), repo)
    assert "names no benchmarks/ script" in claims.stale(dict(c1, command="make bench"), repo)


def test_provenance_names_the_commit_and_the_dirty_dependencies(repo):
    head = git(repo, "rev-parse", "HEAD")
    p = claims.provenance(["src/a.py", "src/b.py"], repo)
    assert p["commit"] == head and p["dirty"] == [] and len(p["date"]) == 10
    (repo / "src" / "b.py").write_text("X = 5\n")
    (repo / "src" / "c.py").write_text("X = 5\n")
    assert claims.provenance(["src/a.py", "src/b.py"], repo)["dirty"] == ["src/b.py"]


def test_record_stamps_the_provenance_and_a_dirty_run_is_stale(tmp_path):
    path, pending, readme = tmp_path / "claims.json", tmp_path / "pending.json", tmp_path / "README.md"
    e = claims.record(path=path, pending=pending, readme=readme, id="a", model="m", paper="p", claim="c.",
                      command="python benchmarks/repro_nope.py", better="higher", ours=[0.9, 0.91, 0.92],
                      baseline=[0.5, 0.5, 0.5], why="w", budget="b")
    assert e["commit"] == git(ROOT, "rev-parse", "HEAD") and e["date"] == time.strftime("%Y-%m-%d", time.gmtime())
    assert claims.load(path)[0]["commit"] == e["commit"]
    given = claims.record(path=path, pending=pending, readme=readme, id="b", model="m", paper="p", claim="c.",
                          command="python benchmarks/repro_nope.py", better="higher", ours=[0.9, 0.91, 0.92],
                          baseline=[0.5], why="w", budget="b", commit="a" * 40, date="2026-01-01", dirty=["src/x.py"])
    assert given["dirty"] == ["src/x.py"] and "uncommitted changes" in claims.stale(given)
    assert "(uncommitted changes)" in readme.read_text()
    bad = dict(given, commit="HEAD")
    with pytest.raises(ValueError, match="commit must be a full git hash"):
        claims.check_claim(bad)


def test_a_run_with_too_few_seeds_goes_on_the_pending_list(tmp_path):
    path, pending, readme = tmp_path / "claims.json", tmp_path / "pending.json", tmp_path / "README.md"
    common = dict(path=path, pending=pending, readme=readme, model="m", paper="p", claim="c.", better="higher",
                  baseline=[0.5], why="w", budget="20 steps")
    item = claims.record(id="a", ours=[0.9], command="python benchmarks/repro_x.py --only cls --seeds 1", **common)
    assert item["command"] == "python benchmarks/repro_x.py --only cls --seeds 3"
    assert claims.load(path) == [] and [p["id"] for p in claims.load(pending)] == ["a"]
    assert "Claims awaiting a run with 3 seeds" in readme.read_text() and "0.900 against 0.500" in readme.read_text()
    claims.record(id="a", ours=[0.9, 0.91, 0.92], command="python benchmarks/repro_x.py --seeds 3", **common)
    assert claims.load(pending) == [] and claims.load(path)[0]["verdict"] == "reproduced"
    claims.record(id="a", ours=[0.1], command="python benchmarks/repro_x.py --seeds 1", **common)  # a smoke run
    assert claims.load(pending) == [] and claims.load(path)[0]["ours"] == [0.9, 0.91, 0.92]  # the recorded stays
    assert claims.add_point("a", "40 steps", [0.9], [0.5], path=path, readme=readme, pending=pending) is None


def test_summary_counts_stale_claims_apart(repo):
    head = git(repo, "rev-parse", "HEAD")
    base = dict(model="m", paper="p", claim="c.", command="python benchmarks/repro_x.py", better="higher",
                baseline=[0.5, 0.5, 0.5], why="w", budget="b", commit=head, date="2026-11-27")
    entries = [claims.make_claim(id="c1", ours=[0.9, 0.91, 0.92], **base),
               claims.make_claim(id="c2", ours=[0.9, 0.91, 0.92], **base),
               claims.make_claim(id="c3", ours=[0.4, 0.5, 0.6], **base)]
    (repo / "src" / "b.py").write_text("X = 2\n")
    s = claims.summary(entries, [{"id": "p"}], repo)
    assert (s["listed"], s["reproduced"], s["not_reproduced"], s["pending"]) == (3, 1, 1, 1)
    assert list(s["stale"]) == ["c2"]


def test_numbers_recorded_again_keep_their_provenance(tmp_path):
    path, pending, readme = tmp_path / "claims.json", tmp_path / "pending.json", tmp_path / "README.md"
    common = dict(path=path, pending=pending, readme=readme, id="a", model="m", paper="p", claim="c.",
                  command="python benchmarks/repro_nope.py", better="higher", baseline=[0.5, 0.5, 0.5], why="w",
                  budget="b")
    claims.record(ours=[0.9, 0.91, 0.92], commit="a" * 40, date="2026-01-01", **common)
    again = claims.record(ours=[0.9, 0.91, 0.92], **common)  # a section re-recorded from saved results
    assert (again["commit"], again["date"]) == ("a" * 40, "2026-01-01")
    new = claims.record(ours=[0.8, 0.91, 0.92], **common)  # a new measurement: stamped now
    assert new["commit"] == git(ROOT, "rev-parse", "HEAD")


def test_measured_says_whether_the_numbers_are_new(tmp_path):
    path, pending, readme = tmp_path / "claims.json", tmp_path / "pending.json", tmp_path / "README.md"
    common = dict(path=path, pending=pending, readme=readme, id="a", model="m", paper="p", claim="c.",
                  command="python benchmarks/repro_nope.py", better="higher", baseline=[0.5, 0.5, 0.5], why="w",
                  budget="b", ours=[0.9, 0.91, 0.92])
    claims.record(commit="a" * 40, date="2026-01-01", **common)
    assert claims.record(measured=True, **common)["commit"] == git(ROOT, "rev-parse", "HEAD")  # a bit-exact rerun
    claims.record(commit="a" * 40, date="2026-01-01", **common)
    assert claims.record(measured=False, **dict(common, ours=[0.1, 0.1, 0.1]))["commit"] == "a" * 40
    fresh = claims.record(measured=False, **dict(common, id="new"))
    assert fresh["commit"] == claims.UNKNOWN and "unknown commit" in claims.stale(fresh)


def test_a_commit_landing_during_a_run_makes_its_files_dirty(repo):
    started = git(repo, "rev-parse", "HEAD")
    (repo / "src" / "a.py").write_text("X = 9\n")
    commit_all(repo)  # committed while the measurement ran: it measured the code it started with
    p = claims.provenance(["src/a.py", "src/b.py"], repo, started=started)
    assert p["commit"] == started and p["dirty"] == ["src/a.py"]
    assert claims.provenance(["src/b.py"], repo, started=started)["dirty"] == []


_WRITER = """
import sys
sys.path.insert(0, {bench!r})
import claims
from pathlib import Path
tmp = Path({tmp!r})
for i in range({n}):
    claims.record(id=f"{{sys.argv[1]}}-{{i}}", path=tmp / "claims.json", pending=tmp / "pending.json",
                  readme=tmp / "README.md", model="m", paper="p", claim="c.", command="cmd", better="higher",
                  ours=[0.9, 0.91, 0.92], baseline=[0.5, 0.5, 0.5], why="w", budget="b")
    claims.add_point(f"{{sys.argv[1]}}-{{i}}", "2 steps", [0.9, 0.9, 0.9], [0.5], path=tmp / "claims.json",
                     pending=tmp / "pending.json", readme=tmp / "README.md")
"""


def test_two_reproductions_recording_at_once_keep_each_others_claims(tmp_path):
    """Two scripts side by side (one per core) each record claims into the same claims.json: every
    claim of both lands, with its curve point (without the lock, a save drops the other's claim)."""
    n = 25
    code = _WRITER.format(bench=str(ROOT / "benchmarks"), tmp=str(tmp_path), n=n)
    procs = [subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.DEVNULL) for name in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    saved = claims.load(tmp_path / "claims.json")
    assert sorted(e["id"] for e in saved) == sorted(f"{w}-{i}" for w in "ab" for i in range(n))
    assert all(e["curve"][0]["budget"] == "2 steps" for e in saved)
    assert (tmp_path / "README.md").read_text() == claims.render_readme(saved, [])


def test_a_curve_point_carries_its_provenance(tmp_path):
    path, pending, readme = tmp_path / "claims.json", tmp_path / "pending.json", tmp_path / "README.md"
    claims.record(id="a", path=path, pending=pending, readme=readme, model="m", paper="p", claim="c.",
                  command="python benchmarks/repro_x.py", better="higher", ours=[0.9, 0.9, 0.9],
                  baseline=[0.5, 0.5, 0.5], why="w", budget="b")
    point = claims.add_point("a", "9 steps", [0.6, 0.6, 0.7], [0.5], path=path, readme=readme, pending=pending)
    assert point["commit"] == claims.load(path)[0]["commit"] and point["date"] == claims.load(path)[0]["date"]


def test_the_table_says_which_curve_points_are_from_other_code():
    e = entry(commit="a" * 40, date="2026-11-27",
              curve=[{"budget": "400 steps", "ours": [0.9, 0.9, 0.9], "baseline": [0.5]},
                     {"budget": "800 steps", "ours": [0.9, 0.9, 0.9], "baseline": [0.5], "commit": "b" * 40},
                     {"budget": "900 steps", "ours": [0.9, 0.9, 0.9], "baseline": [0.5], "commit": "a" * 40}])
    text = claims.render_readme([e])
    assert "400 steps: 0.900 ± 0.000 vs 0.500, reproduced (earlier code, commit unrecorded)" in text
    assert "800 steps: 0.900 ± 0.000 vs 0.500, reproduced (at bbbbbbb)" in text
    assert "900 steps: 0.900 ± 0.000 vs 0.500, reproduced;" in text or text.count("900 steps: 0.900 ± 0.000 vs 0.500, reproduced |") == 1


def test_curve_points_keep_their_provenance_through_a_new_main_measurement(tmp_path):
    path, pending, readme = tmp_path / "claims.json", tmp_path / "pending.json", tmp_path / "README.md"
    common = dict(path=path, pending=pending, readme=readme, model="m", paper="p", claim="c.",
                  command="python benchmarks/repro_x.py", better="higher", baseline=[0.5, 0.5, 0.5], why="w", budget="b")
    old = {"budget": "900 steps", "ours": [0.8, 0.8, 0.8], "baseline": [0.5]}
    claims.save([claims.make_claim(id="a", ours=[0.7, 0.7, 0.7], curve=[old], commit="c" * 40, date="2026-01-01", **{
        k: v for k, v in common.items() if k not in ("path", "pending", "readme")})], path)
    point = claims.add_point("a", "1800 steps", [0.9, 0.9, 0.9], [0.5], path=path, readme=readme, pending=pending)
    claims.record(id="a", ours=[0.6, 0.7, 0.7], measured=True, curve=[old], **common)  # saved points given again
    curve = {p["budget"]: p for p in claims.load(path)[0]["curve"]}
    assert "commit" not in curve["900 steps"]  # unrecorded before: still unrecorded, not stamped now
    assert curve["1800 steps"]["commit"] == point["commit"]  # add_point's stamp survives the record
    claims.record(id="a", ours=[0.6, 0.7, 0.7], measured=True,
                  curve=[dict(old, ours=[0.85, 0.85, 0.85])], **common)  # new numbers at 900: stamped now
    assert claims.load(path)[0]["curve"][0]["commit"] == claims.load(path)[0]["commit"]


def test_a_claim_recorded_at_another_budget_keeps_the_replaced_measurement_in_its_curve(tmp_path):
    """Raising a claim's budget after seeing its verdict must not erase the earlier verdict: the
    measurement it replaces stays as a curve point named by its budget, with its own provenance."""
    path, pending, readme = tmp_path / "claims.json", tmp_path / "pending.json", tmp_path / "README.md"
    common = dict(path=path, pending=pending, readme=readme, model="m", paper="p", claim="c.",
                  command="python benchmarks/repro_x.py", better="higher", baseline=[0.5, 0.5, 0.5], why="w")
    claims.save([claims.make_claim(id="a", ours=[0.5, 0.6, 0.4], budget="600 steps of 16", commit="c" * 40,
                                   date="2026-01-01", curve=[{"budget": "900 steps", "ours": [0.6, 0.6, 0.7],
                                                              "baseline": [0.5], "commit": "d" * 40, "date": "2026-01-02"}],
                                   **{k: v for k, v in common.items() if k not in ("path", "pending", "readme")})], path)
    claims.record(id="a", ours=[0.9, 0.9, 0.95], budget="3000 steps of 16", measured=True, **common)
    e = claims.load(path)[0]
    assert e["budget"] == "3000 steps of 16" and e["verdict"] == "reproduced"
    curve = {p["budget"]: p for p in e["curve"]}
    assert [p["budget"] for p in e["curve"]] == ["600 steps of 16", "900 steps"]  # ordered by budget
    assert curve["600 steps of 16"]["ours"] == [0.5, 0.6, 0.4]
    assert curve["600 steps of 16"]["verdict"] == "not reproduced"
    assert (curve["600 steps of 16"]["commit"], curve["600 steps of 16"]["date"]) == ("c" * 40, "2026-01-01")
    assert curve["900 steps"]["commit"] == "d" * 40  # the earlier curve point untouched
    assert claims.check(path, pending, readme) == []
    claims.record(id="a", ours=[0.9, 0.9, 0.9], budget="3000 steps of 16", measured=True, **common)
    assert [p["budget"] for p in claims.load(path)[0]["curve"]] == ["600 steps of 16", "900 steps"]  # same budget


def _save_forever(path):
    big = [claims.make_claim(id=f"c{i}", model="m", paper="p", claim="c.", command="x", better="higher",
                             ours=[0.9, 0.9, 0.9], baseline=[0.5], why="w" * 20000, budget="b") for i in range(30)]
    while True:
        for n in (10, 30):
            claims.save(big[:n], path)


def test_kill_9_while_saving_the_claims_leaves_the_old_or_the_new_file(tmp_path):
    """claims.json is the record of every verdict: a writer killed mid-save must leave a whole file
    (10 or 30 claims), never a truncated one (a plain write_text fails this)."""
    import multiprocessing
    import random
    import time

    path = tmp_path / "claims.json"
    claims.save([], path)
    ctx, rng = multiprocessing.get_context("fork"), random.Random(0)
    for _ in range(5):
        proc = ctx.Process(target=_save_forever, args=(path,))
        proc.start()
        time.sleep(0.3 + rng.random() * 0.3)
        proc.kill()
        proc.join()
        assert len(claims.load(path)) in (0, 10, 30)  # parses: the old or the new file, whole
        assert all(p.name.startswith(".claims.json.") for p in tmp_path.iterdir() if p != path)
