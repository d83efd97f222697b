"""The claims table (benchmarks/claims.py): verdicts computed from the per-seed numbers, the
README generated from claims.json, and every published claim with at least three seeds."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import claims  # noqa: E402


def entry(**kw):
    fields = dict(id="x", model="m", paper="p", claim="c.", command="python benchmarks/repro_x.py", better="higher",
                  ours=[0.9, 0.91, 0.92], baseline=[0.5, 0.52, 0.51], why="measured", budget="tiny")
    fields.update(kw)
    return claims.make_claim(**fields)


def test_welch_standard_error_and_verdict():
    ours, base = [1.0, 2.0, 3.0], [0.0, 0.0, 3.0]
    d, se = claims.difference(ours, base, "higher")
    assert d == pytest.approx(1.0)
    assert se == pytest.approx(math.sqrt(1.0 / 3 + 3.0 / 3))  # sample variances 1 and 3, n = 3 each
    assert claims.verdict(ours, base, "higher") == "not reproduced"  # 1.0 < 2 * 1.155
    assert claims.verdict([10, 11, 12], base, "higher") == "reproduced"
    assert claims.verdict(ours, base, "lower") == "not reproduced"  # ours is worse when lower is better
    assert claims.verdict([0.1, 0.2, 0.15], [0.5, 0.6, 0.55], "lower") == "reproduced"


def test_fixed_baseline_contributes_no_variance():
    d, se = claims.difference([1.10, 1.12, 1.14], [1.0], "lower")
    assert d == pytest.approx(-0.12) and se == pytest.approx(claims.standard_error([1.10, 1.12, 1.14]))
    assert claims.verdict([1.10, 1.12, 1.14], [1.0], "lower") == "not reproduced"
    assert claims.verdict([1.10, 1.12, 1.14], [1.2], "lower") == "reproduced"


def test_equal_measurements_do_not_reproduce():
    # no spread at all (se = 0): a tie is not a win
    assert claims.verdict([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], "higher") == "not reproduced"
    assert claims.verdict([1.0, 1.0, 1.0], [0.99, 0.99, 0.99], "higher") == "reproduced"


def test_a_comparable_claim_is_a_non_inferiority_test():
    ours, base = [0.90, 0.91, 0.92], [0.92, 0.93, 0.94]  # ours 0.02 behind, se of the difference 0.0082
    assert claims.verdict(ours, base, "higher") == "not reproduced"
    assert claims.verdict(ours, base, "higher", margin=0.01) == "not reproduced"  # -0.01 < 2 se
    assert claims.verdict(ours, base, "higher", margin=0.04) == "reproduced"  # 0.02 > 2 se
    with pytest.raises(ValueError, match="margin"):
        claims.verdict(ours, base, "higher", margin=-0.1)


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
        assert e["seeds"] >= claims.MIN_SEEDS and len(e["ours"]) == e["seeds"]
        assert e["verdict"] == claims.verdict(e["ours"], e["baseline"], e["better"], e["margin"])
    assert claims.check() == []


def test_gap_says_what_decided_the_verdict():
    text = claims.gap([2.0, 2.1, 1.9], [2.05, 2.0, 2.1], "lower", 0.05, "bpc")
    assert text.startswith("difference +0.050 bpc in the claim's direction plus the margin 0.05")
    assert "ours ahead in 2 of 3 seeds" in text
    assert "ours ahead in 3 of 3 seeds (the seeds' spread" in claims.gap([0.6, 0.9, 0.61], [0.5], "higher")
