"""`qkv reproduce` (benchmarks/reproduce.py): every claim's command is data that regenerates it as
recorded; one claim rerun end to end in a copy of the repository; --list, --dry-run and a bad id;
a smaller measurement never replaces a bigger one; claims of kind implementation-check."""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import claims  # noqa: E402
import reproduce  # noqa: E402

from qkv import cli  # noqa: E402
from qkv._errors import UserError  # noqa: E402

CHEAP = "performer-orthogonal"  # random heads, no training: seconds
PUBLISHED = claims.load(claims.CLAIMS)


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def common(path, **kw):
    fields = dict(path=path, pending=path.with_name("pending.json"), readme=path.with_name("README.md"), id="a",
                  model="m", paper="p", claim="c.", better="higher", baseline=[0.5], why="w", budget="b",
                  command="python benchmarks/repro_x.py --only errors")
    fields.update(kw)
    return fields


# ------------------------------------------------------------------ the recorded commands, audited

@pytest.mark.parametrize("e", PUBLISHED, ids=[e["id"] for e in PUBLISHED])
def test_every_claims_command_is_data_that_reruns_it_as_recorded(e):
    run = e["run"]
    assert (ROOT / run["script"]).is_file() and claims.render_command(run) == e["command"]
    n = claims.seeds_of(run)
    if n is None:  # the script fixes its seeds: only the T-maze grid (3 learning rates x depths x 5 seeds)
        assert run == {"script": "benchmarks/repro_long_context.py", "args": ["--only", "tmaze"]}, e["id"]
    else:
        assert n == e["seeds"], f"{e['id']}: its command runs {n} seeds, its entry has {e['seeds']}"
    for flag, value in zip(run["args"], run["args"][1:] + [""]):
        if flag.endswith("-steps") and value.isdigit():  # every training budget the command names is the entry's
            values = run["args"][run["args"].index(flag) + 1:]
            for v in values[:next((i for i, w in enumerate(values) if w.startswith("--")), len(values))]:
                assert re.search(rf"\b{v}\b", e["budget"]), f"{e['id']}: {flag} {v} not in its budget {e['budget']!r}"


def test_the_errors_claims_name_the_seeds_they_were_measured_with():
    # `repro_efficient.py --only errors` alone runs 3 seeds; these entries have 5
    for cid in ("performer-orthogonal", "performer-features", "lsh-rounds"):
        e = reproduce.find(PUBLISHED, cid)
        assert e["seeds"] == 5 and e["run"]["args"] == ["--only", "errors", "--seeds", "5"]


def test_commands_parse_and_render_as_one_form():
    run = claims.parse_command("OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_adaptive.py --part ut "
                               "--variant 'b_h = -1 (default)' --seeds 5")
    assert run == {"script": "benchmarks/repro_adaptive.py",
                   "args": ["--part", "ut", "--variant", "b_h = -1 (default)", "--seeds", "5"]}
    assert claims.parse_command(claims.render_command(run)) == run
    assert claims.render_command(run).startswith("PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/")
    assert claims.parse_command("make bench") is None
    assert claims.seeds_of(run) == 5 and claims.with_seeds(run, 3)["args"][-2:] == ["--seeds", "3"]
    listed = {"script": "benchmarks/x.py", "args": ["--seeds", "0", "1", "2", "3", "4", "--threads", "1"]}
    assert claims.seeds_of(listed) == 5
    assert claims.with_seeds(listed, 3)["args"] == ["--seeds", "0", "1", "2", "--threads", "1"]
    with pytest.raises(ValueError, match="fixes the seeds"):
        claims.with_seeds({"script": "benchmarks/x.py", "args": ["--only", "tmaze"]}, 3)
    e = claims.make_claim(**{k: v for k, v in common(Path("c.json")).items() if k not in ("path", "pending", "readme")},
                          ours=[0.9, 0.9, 0.9])
    e["command"] = "python benchmarks/repro_x.py --only errors"  # hand-edited: no longer the run's
    with pytest.raises(ValueError, match="is not the one its run gives"):
        claims.check_claim(e)


# ------------------------------------------------------------------ the writer: bigger entries stay

def test_a_smaller_measurement_never_replaces_a_bigger_entry(tmp_path, capsys):
    path = tmp_path / "claims.json"
    claims.record(**common(path, command="python benchmarks/repro_x.py --only errors --seeds 5"),
                  ours=[0.9, 0.91, 0.92, 0.93, 0.94])
    before = path.read_text()
    # the script's own command, 3 seeds (its default): refused, the 5-seed entry stays
    kept = claims.record(**common(path), ours=[0.1, 0.1, 0.1])
    assert path.read_text() == before and kept["seeds"] == 5
    assert "the recorded entry has 5 and stays" in capsys.readouterr().out
    # the same measurement again, from a script whose command omits --seeds: the recorded command stays
    again = claims.record(**common(path), ours=[0.8, 0.91, 0.92, 0.93, 0.95])
    assert again["ours"][0] == 0.8 and again["run"]["args"] == ["--only", "errors", "--seeds", "5"]
    # more seeds replace it, and the command says how many
    more = claims.record(**common(path), ours=[0.9] * 7)
    assert more["seeds"] == 7 and more["run"]["args"][-1] == "7"
    # a new budget is a new measurement: the script's command, the old one kept in the curve
    other = claims.record(**common(path, budget="b2", command="python benchmarks/repro_x.py --steps 9"), ours=[0.9] * 3)
    assert other["run"]["args"] == ["--steps", "9"] and [p["budget"] for p in other["curve"]] == ["b"]


def test_kind_and_minutes_stay_through_a_rerun_and_kinds_are_counted_apart(tmp_path):
    path = tmp_path / "claims.json"
    claims.record(**common(path), ours=[0.9, 0.91, 0.92])
    entries = claims.load(path)
    entries[0].update(kind="implementation-check", kind_reason="true by construction", minutes=0.5)
    claims.save(entries, path)
    e = claims.record(**common(path), ours=[0.8, 0.91, 0.92])
    assert (e["kind"], e["kind_reason"], e["minutes"]) == ("implementation-check", "true by construction", 0.5)
    claims.record(**common(path, id="b"), ours=[0.1, 0.1, 0.1])
    text = path.with_name("README.md").read_text()
    assert "implementation check: true by construction" in text
    assert "By kind: 1 reproductions (0 reproduced), 1 implementation checks (1 reproduced)." in text
    s = claims.summary(claims.load(path), root=tmp_path)
    assert s["by_kind"]["implementation-check"]["listed"] == 1 and s["by_kind"]["reproduction"]["listed"] == 1
    for bad, message in [(dict(kind="check"), "kind must be one of"),
                         (dict(kind="implementation-check", kind_reason=" "), "needs kind_reason"),
                         (dict(kind="reproduction", kind_reason="x"), "kind_reason belongs"),
                         (dict(minutes=0), "minutes must be")]:
        with pytest.raises(ValueError, match=message):
            claims.check_claim({**e, **bad})


def test_the_published_kinds():
    checks = {e["id"] for e in PUBLISHED if e["kind"] == "implementation-check"}
    assert checks == {"gtrxl-vs-trxl-stability", "performer-features", "lsh-rounds", "bahdanau-dates",
                      "bahdanau-length-copy", "bahdanau-length-bible", "adaptive-span-cost", "performer-lm",
                      "sparse-transformer-lm", "transformer-xl-lm", "san-layers", "pointer-hull",
                      "bert-pretrained-finetune", "restricted-attention-cost"}
    assert all(e["kind"] == "reproduction" for e in PUBLISHED if e["id"] not in checks)
    readme = claims.README.read_text()
    assert f"By kind: {len(PUBLISHED) - len(checks)} reproductions" in readme and "14 implementation checks" in readme


# ------------------------------------------------------------------ the command line

def test_list_names_every_claim_with_its_kind_status_and_minutes(capsys):
    assert cli.main(["reproduce", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert list(rows) == [e["id"] for e in PUBLISHED]
    def columns(cid):  # kind, verdict, seeds, minutes: a stale claim's verdict carries "(stale)" after it
        return [w for w in rows[cid][1:] if w != "(stale)"]
    assert columns(CHEAP)[:4] == ["repro", "reproduced", "5", "0.02"]
    assert columns("lsh-rounds")[0] == "check" and columns("pointer-sort")[3] == "?"  # no time recorded for it
    assert lines[-1].startswith(f"{len(PUBLISHED)} claims (14 implementation checks")


def test_dry_run_prints_what_would_run_and_writes_nothing(capsys):
    before = claims.CLAIMS.read_bytes()
    assert cli.main(["reproduce", CHEAP, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"run in {ROOT}: PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/repro_efficient.py --only errors " \
           "--seeds 5" in out
    assert "the same command measures performer-features, lsh-rounds too" in out
    assert cli.main(["reproduce", CHEAP, "--dry-run", "--seeds", "3"]) == 0
    out = capsys.readouterr().out
    assert "fewer than the recorded 5: in a scratch copy" in out and "--only errors --seeds 3" in out
    assert claims.CLAIMS.read_bytes() == before


@pytest.mark.parametrize("argv, message", [
    (["performer-orthogonl"], "no claim 'performer-orthogonl' in docs/reproductions/claims.json; close matches: "
                              "performer-orthogonal"),
    (["nothing-like-it"], f"`qkv reproduce --list` lists all {len(claims.load(claims.CLAIMS))}"),
    (["gtrxl-vs-trxl-speed", "--seeds", "3", "--dry-run"], "its script fixes the seeds (45 values)"),
    ([], "give a claim id or --list"),
    (["--list", CHEAP], "give a claim id or --list"),
])
def test_a_bad_request_is_one_line_and_exit_status_2(argv, message, capsys):
    assert cli.main(["reproduce", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_find_names_the_close_matches():
    with pytest.raises(UserError, match=r"close matches: lsh-rounds\b"):
        reproduce.find(PUBLISHED, "lsh-round")
    with pytest.raises(UserError) as err:
        reproduce.find(PUBLISHED, "performer-")  # a prefix: the claims that start with it
    named = str(err.value).split("close matches: ")[1].split(", ")
    assert sorted(named) == sorted(e["id"] for e in PUBLISHED if e["id"].startswith("performer-"))


# ------------------------------------------------------------------ one claim end to end

@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A git repository holding this checkout's benchmarks/ and docs/reproductions/ (src linked)."""
    root = tmp_path_factory.mktemp("checkout")
    for part in ("benchmarks", "docs/reproductions"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "src").symlink_to(ROOT / "src", target_is_directory=True)
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "the claims")
    return root


def test_a_claim_rerun_at_head_is_written_with_its_commit_machine_and_date(checkout, capfd):
    before = reproduce.find(reproduce.load(checkout), CHEAP)
    assert reproduce.run(reproduce.plan(before), checkout) == 0
    out = capfd.readouterr().out
    after = reproduce.find(reproduce.load(checkout), CHEAP)
    assert after["commit"] == git(checkout, "rev-parse", "HEAD") != before["commit"]
    assert after["date"] == time.strftime("%Y-%m-%d", time.gmtime()) and after["machine"] == claims.machine()
    assert after["run"] == before["run"] and after["seeds"] == 5 and after["verdict"] == before["verdict"]
    assert after["ours"] == pytest.approx(before["ours"], rel=1e-5)  # seeded: the same numbers (float rounding aside)
    assert f"recorded: reproduced: ours 0.681 ± 0.011 (n=5), baseline 0.747 ± 0.006; at {before['commit'][:10]}" in out
    assert f"now:      reproduced: ours 0.681 ± 0.011 (n=5)" in out
    assert "within the recorded spread: ours yes" in out and "baseline yes" in out
    assert claims.check(checkout / reproduce.CLAIMS_IN, checkout / "docs/reproductions/claims-pending.json",
                        checkout / "docs/reproductions/README.md") == []


def test_a_rerun_with_fewer_seeds_runs_in_a_scratch_copy_and_writes_nothing(checkout, capfd):
    path = checkout / reproduce.CLAIMS_IN
    page = checkout / "docs/reproductions/efficient-attention.json"
    written, page_before = path.read_bytes(), page.read_bytes()
    assert reproduce.run(reproduce.plan(reproduce.find(reproduce.load(checkout), CHEAP), seeds=3), checkout) == 0
    out = capfd.readouterr().out
    assert path.read_bytes() == written and page.read_bytes() == page_before
    assert "(scratch run, not written: 3 seeds, fewer than the recorded 5" in out
    assert re.search(r"now:      reproduced: ours 0\.\d+ ± 0\.\d+ \(n=3\), baseline .*; at unknown commit", out)


def test_reproduce_has_its_help_with_an_example(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["reproduce", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "usage: qkv reproduce" in out and "Example: qkv reproduce" in " ".join(out.split())


def test_dry_run_warns_of_uncommitted_changes_under_the_claim(checkout, capsys):
    helper = checkout / "benchmarks" / "approximation.py"  # what the errors claims depend on (DEPENDS)
    text = helper.read_text()
    helper.write_text(text + "\nX = 1\n")
    try:
        p = reproduce.plan(reproduce.find(reproduce.load(checkout), CHEAP))
        assert "uncommitted changes to benchmarks/approximation.py" in "\n".join(reproduce.describe(p, checkout))
    finally:
        helper.write_text(text)
    assert not any("uncommitted" in line for line in reproduce.describe(p, checkout))
