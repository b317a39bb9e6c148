"""One student never stops the class: a hostile repo per hole, built with git in a temp dir,
run through the real CLI (`grader fetch`, `grader grade --lock`, `grader grade --resume`,
`grader similarity`). Each asserts the hostile student's row says the right reason, that every
other student is pinned and graded normally, that lock.json, index.html, summary.json and the
gradebooks exist and hold everyone, that nothing crashed or hung, and that --resume works after.

The holes: commit dates no datetime can hold (year 3,170,843, before year 1, a 5,000-digit
number, none at all, a +9959 time zone), a corrupt object, a branch at a blob, branch names
that are not UTF-8 or hide a bidi override, a grader.toml that cannot be parsed or names a path
with a NUL byte, a module that is a link out of the repo, a module too large to compare, a
FIFO in a checkout.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.classbuild import FIXTURES, git, make_repo, unmarked
from tests.conftest import REPO_ROOT, run_cli

QUICK = ["--device", "cpu", "--jobs", "2", "-a", "vector_add", "--case", "n=1", "--dtype", "float32", "--seed", "3"]
COURSE = """\
[assignments.vector_add]
deadline = "2025-02-01T00:00:00Z"

[late_policy]
penalty_per_day = 10
max_penalty = 50
"""
SECRET = "TOP_SECRET_OF_THE_GRADING_MACHINE_7f3a"
HONEST = ("alice", "bob")
# fetched, and graded as `good` is: 0.13 of vector_add's 10 points on this quick CPU run (a partial
# run: the share of the one case it grades, as grader check gives it)
GRADED_NORMALLY = (*HONEST, "future", "ancient", "longdate", "nodate", "tz9959", "bidi", "linkin", "bigmodule")
UNFETCHED = {
    "corrupt": "git fetch failed",
    "blobhead": "the head of branch 'main' is not a commit",
    "notutf8": "is not named in UTF-8 text",
    "empty": "the repository is empty: no commit has been pushed",
    "missing": "no such folder",
}


def literal_commit(repo: Path, committer: bytes) -> str:
    """A commit on top of HEAD whose committer line is `committer` byte for byte (git's own
    tools refuse to write such dates: `hash-object --literally` does not check), now main's head."""
    tree, parent = git(repo, "rev-parse", "HEAD^{tree}"), git(repo, "rev-parse", "HEAD")
    body = (f"tree {tree}\nparent {parent}\nauthor student <s@example.edu> 1736510400 +0000\n".encode()
            + b"committer " + committer + b"\n\nhostile date\n")
    sha = subprocess.run(["git", "hash-object", "-t", "commit", "--literally", "-w", "--stdin"], cwd=repo, input=body,
                         capture_output=True, check=True).stdout.decode().strip()
    git(repo, "update-ref", "refs/heads/main", sha)
    return sha


def loose_object(repo: Path, sha: str) -> Path:
    path = repo / ".git" / "objects" / sha[:2] / sha[2:]
    os.chmod(path, 0o644)
    return path


def build_class(root: Path) -> Path:
    repos = root / "repos"
    for name in (*HONEST, "future", "ancient", "longdate", "nodate", "tz9959", "corrupt", "blobhead", "linkout", "linkin",
                 "bigmodule", "toml_nul", "toml_bad"):
        make_repo(repos / name)
    literal_commit(repos / "future", b"student <s@example.edu> 100000000000000 +0000")  # the year 3,170,843
    literal_commit(repos / "ancient", b"student <s@example.edu> -100000000000000 +0000")  # before the year 1
    literal_commit(repos / "longdate", b"student <s@example.edu> " + b"9" * 5000 + b" +0000")
    literal_commit(repos / "nodate", b"student <s@example.edu>")
    literal_commit(repos / "tz9959", b"student <s@example.edu> 1736510400 +9959")
    # a corrupt object: the blob of the kernel, overwritten
    loose_object(repos / "corrupt", git(repos / "corrupt", "rev-parse", "HEAD:kernels/vector_add.py")).write_bytes(b"garbage")
    # main pointing at a blob, written where git would refuse to
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repos / "blobhead", input="x", capture_output=True,
                          text=True, check=True).stdout.strip()
    (repos / "blobhead" / ".git" / "refs" / "heads" / "main").write_text(blob + "\n")
    # branch names: one not UTF-8, one with a right-to-left override, each the repo's only branch
    make_repo(repos / "notutf8", branch="tmp")
    head = git(repos / "notutf8", "rev-parse", "HEAD")
    (repos / "notutf8" / ".git" / "refs" / "heads" / os.fsdecode(b"\xff\xfe")).write_text(head + "\n")
    (repos / "notutf8" / ".git" / "HEAD").write_bytes(b"ref: refs/heads/\xff\xfe\n")
    git(repos / "notutf8", "branch", "-D", "tmp")
    make_repo(repos / "bidi", branch="fix\u202eyaml.exe")
    # similarity: a link out of the repo, a link inside it, a module too large to compare
    (root / "secret.py").write_text(f"# {SECRET}\n" + (FIXTURES / "good" / "kernels" / "vector_add.py").read_text())
    module = repos / "linkout" / "kernels" / "vector_add.py"
    module.unlink()
    module.symlink_to(root / "secret.py")
    git(repos / "linkout", "commit", "-qam", "a link")
    (repos / "linkin" / "src").mkdir()
    shutil.move(repos / "linkin" / "kernels" / "vector_add.py", repos / "linkin" / "src" / "impl.py")
    (repos / "linkin" / "kernels" / "vector_add.py").symlink_to("../src/impl.py")
    git(repos / "linkin", "add", "-A")
    git(repos / "linkin", "commit", "-qm", "a link inside")
    big = repos / "bigmodule" / "kernels" / "vector_add.py"
    big.write_text(big.read_text() + "\n" + "# padding\n" * 30_000)
    git(repos / "bigmodule", "commit", "-qam", "big")
    # grader.toml: a path with a NUL byte (crashed the similarity pass), and one that is not TOML
    (repos / "toml_nul" / "grader.toml").write_text('[assignments.vector_add]\nmodule = "kernels/\\u0000.py"\n')
    git(repos / "toml_nul", "add", "-A")
    git(repos / "toml_nul", "commit", "-qm", "toml")
    (repos / "toml_bad" / "grader.toml").write_text("[assignments.vector_add\nmodule = \n")
    git(repos / "toml_bad", "add", "-A")
    git(repos / "toml_bad", "commit", "-qm", "toml")
    (root / "emptyrepo").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root / "emptyrepo", check=True)
    names = sorted(p.name for p in repos.iterdir())
    rows = ["student,repo", *(f"{n},repos/{n}" for n in names), "empty,emptyrepo", "missing,repos/nowhere"]
    (root / "roster.csv").write_text("\n".join(rows) + "\n")
    (root / "course.toml").write_text(COURSE)
    return root / "roster.csv"


def everyone() -> set[str]:
    return {*GRADED_NORMALLY, "toml_nul", "toml_bad", "linkout", *UNFETCHED}


def table(path: Path, key: str = "student") -> dict[str, dict]:
    """A gradebook by `key`; QUICK's columns are marked partial, and read here by the assignment's name."""
    rows = csv.DictReader(io.StringIO(path.read_text()))
    return {row[key]: {unmarked(k): v for k, v in row.items()} for row in rows}


def assert_outputs_hold_everyone(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    assert {s["student"] for s in summary["students"]} == everyone()
    assert summary["errors"] == []
    html = (out / "index.html").read_text()
    assert all(f">{s}<" in html for s in everyone())
    assert set(table(out / "grades.csv")) == everyone()
    assert set(table(out / "gradescope.csv", "SID")) == everyone()
    assert {r["roster_identifier"] for r in table(out / "classroom.csv", "roster_identifier").values()} == everyone()
    canvas = (out / "canvas.csv").read_text()
    assert all(f",{s}," in canvas for s in everyone())
    return summary


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    roster = build_class(root)
    fetched = run_cli(["fetch", "--roster", str(roster), "--out", "ws"], root, timeout=600)
    graded = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--course", "course.toml", *QUICK], root, timeout=900)
    return root, fetched, graded


@pytest.mark.slow
def test_fetch_pins_everyone_else_and_each_hostile_repo_says_why(hostile_class):
    root, fetched, _ = hostile_class
    assert fetched.returncode == 1, fetched.stdout + fetched.stderr  # some unfetched: each has its line
    assert "Traceback" not in fetched.stdout + fetched.stderr
    lock = {s["student"]: s for s in json.loads((root / "ws" / "lock.json").read_text())["students"]}
    assert set(lock) == everyone()
    for student, words in UNFETCHED.items():
        assert lock[student]["status"] == "unfetched" and words in lock[student]["reason"], lock[student]
        assert f"unfetched  {student}: " in fetched.stdout
    for student in everyone() - set(UNFETCHED):
        p = lock[student]
        assert p["status"] == "fetched" and p["commit"] == p["head"] == git(root / "repos" / student, "rev-parse", "HEAD"), p
    # every date is one a datetime holds, and the odd ones say what was odd
    notes = {s: " ".join(lock[s]["notes"]) for s in lock}
    assert lock["future"]["commit_date"] == "9999-12-31T23:59:59+00:00"
    assert "(100000000000000 seconds from 1970) is outside the years 1-9999" in notes["future"]
    assert lock["ancient"]["commit_date"] == "0001-01-01T00:00:00+00:00" and "outside the years 1-9999" in notes["ancient"]
    assert lock["longdate"]["commit_date"] == "9999-12-31T23:59:59+00:00" and "a number of 5000 digits" in notes["longdate"]
    assert lock["nodate"]["commit_date"] is None and "cannot be read: it counts as later than any deadline" in notes["nodate"]
    assert lock["tz9959"]["commit_date"] == "2025-01-10T12:00:00+00:00" and "time zone +9959 is not a real offset" in notes["tz9959"]
    assert lock["alice"]["commit_date"] == "2025-01-10T12:00:00+00:00" and notes["alice"] == ""
    # a branch name is shown, never run by the terminal: the override is a visible escape
    assert lock["bidi"]["branch"] == "fix\u202eyaml.exe"
    assert "\u202e" not in fetched.stdout and "fix\\u202eyaml.exe" in fetched.stdout
    assert "\ufffd\ufffd" in lock["notutf8"]["reason"]


@pytest.mark.slow
def test_grade_writes_every_output_for_everyone_and_each_row_says_why(hostile_class):
    root, _, graded = hostile_class
    out = root / "out"
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert "Traceback" not in graded.stdout + graded.stderr
    summary = assert_outputs_hold_everyone(out)
    rows = {s["student"]: s for s in summary["students"]}
    g = table(out / "grades.csv")
    for student in GRADED_NORMALLY:
        assert rows[student]["assignments"]["vector_add"]["status"] == "graded" and rows[student]["total"] == 0.13, rows[student]
    for student, words in UNFETCHED.items():
        assert rows[student]["status"] == "unfetched" and words in g[student]["note"]
    # a grader.toml that is not TOML: that student's graded zero, which says why (not the grader's infra_error)
    bad = json.loads((out / "students" / "toml_bad" / "results.json").read_text())
    assert rows["toml_bad"]["assignments"]["vector_add"]["status"] == "graded" and g["toml_bad"]["vector_add"] == "0"
    assert "grader.toml is not valid TOML" in bad["tests"][0]["output"] and bad["tests"][0]["score"] == 0
    assert rows["toml_bad"]["total"] == 0 and rows["toml_bad"]["max_total"] == rows["alice"]["max_total"]  # out of the same points
    # a path with a NUL byte names no module that can be graded: one fact, which the check says
    assert rows["toml_nul"]["assignments"]["vector_add"]["outcomes"] == {"cannot be graded": 1}
    nul = json.loads((out / "students" / "toml_nul" / "results.json").read_text())
    assert nul["tests"][0]["name"] == "vector_add: cannot be graded" and nul["tests"][0]["score"] == 0
    # late penalties over dates no datetime holds: the far future and an unreadable date are the policy's most (50%)
    for student in ("future", "longdate", "nodate"):
        assert rows[student]["late"] is True and rows[student]["late_penalty"] == 0.065 and rows[student]["final"] == 0.065, rows[student]
    assert rows["nodate"]["hours_late"] is None and g["nodate"]["hours_late"] == ""
    for student in ("ancient", "tz9959", "alice"):
        assert rows[student]["late"] is False and rows[student]["late_penalty"] == 0 and rows[student]["final"] == 0.13
    report = (out / "students" / "nodate" / "report.html").read_text()
    assert "The date of your graded commit cannot be read: it counts as later than your deadline" in report
    assert "9999-12-31T23:59:59+00:00" in (out / "students" / "future" / "report.html").read_text()


@pytest.mark.slow
def test_similarity_compares_the_others_and_says_who_could_not_be_read(hostile_class):
    root, _, _ = hostile_class
    out = root / "out"
    summary = json.loads((out / "summary.json").read_text())
    counts = summary["similarity"]["settings"]["per_assignment"]["vector_add"]
    skipped = counts["not_compared"]
    assert set(skipped) == {"linkout", "bigmodule", "toml_nul", "toml_bad"}, skipped
    assert skipped["linkout"].startswith("could not be read: the module kernels/vector_add.py leads outside the repository")
    assert skipped["bigmodule"] == "could not be read: kernels/vector_add.py is larger than 256 KiB (not a kernel module)"
    assert skipped["toml_nul"].startswith("could not be read: grader.toml: ") and "must be a path" in skipped["toml_nul"]
    assert skipped["toml_bad"].startswith("could not be read: grader.toml is not valid TOML")
    # the others are compared: the honest pair, and the link inside a repo is followed
    compared = set(GRADED_NORMALLY) - {"bigmodule"}
    assert counts["files"] == len(compared)
    assert any({p["a"], p["b"]} == {"alice", "linkin"} for p in summary["similarity"]["pairs"]["vector_add"])
    # each row says so, where the TA reads it
    rows = {s["student"]: s for s in summary["students"]}
    assert rows["linkout"]["problems"] == ["similarity of vector_add: " + skipped["linkout"]]
    assert "leads outside the repository" in table(out / "grades.csv")["linkout"]["note"]
    assert "leads outside the repository" in (out / "index.html").read_text()
    # nothing of the file behind the link reached a page
    for page in [out / "index.html", out / "summary.json", *(out / "similarity").rglob("*")]:
        assert not page.is_file() or SECRET not in page.read_text(errors="replace"), page


@pytest.mark.slow
def test_resume_and_the_similarity_command_go_on_after_every_hole(hostile_class, tmp_path):
    root, _, _ = hostile_class
    work = tmp_path / "class"
    shutil.copytree(root, work, symlinks=True)
    manifest = json.loads((work / "out" / "batch.json").read_text())
    manifest["lock"] = str(work / "ws")
    (work / "out" / "batch.json").write_text(json.dumps(manifest))
    # the cache of one student's checkout holds a FIFO where the module was: it is never opened
    module = work / "ws" / "repos" / "alice" / "kernels" / "vector_add.py"
    module.unlink()
    os.mkfifo(module)
    sim = run_cli(["similarity", "--class", "out", "--course", "course.toml"], work, timeout=300)
    assert sim.returncode == 0, sim.stdout + sim.stderr
    alice = next(line for line in sim.stdout.splitlines() if "not compared alice: could not be read: " in line)
    assert "kernels/vector_add.py" in alice and "not a regular file" in alice, alice
    assert "not compared linkout: could not be read: the module kernels/vector_add.py leads outside the repository" in sim.stdout
    assert_outputs_hold_everyone(work / "out")
    # --resume puts the pinned checkout back, keeps every grade and writes everything again
    again = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--course", "course.toml", "--resume", *QUICK], work,
                    timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"Grading 0 jobs ({len(GRADED_NORMALLY) + 3} already graded, kept)" in again.stdout
    assert stat.S_ISREG(module.lstat().st_mode)
    summary = assert_outputs_hold_everyone(work / "out")
    assert "alice" not in summary["similarity"]["settings"]["per_assignment"]["vector_add"]["not_compared"]


@pytest.mark.slow
def test_grade_from_a_roster_fetches_grades_and_resumes_past_hostile_repos(tmp_path):
    """`grader grade --roster`: the fetch inside it meets the same repos, and --resume after it."""
    repos = tmp_path / "repos"
    for name in ("alice", "future", "corrupt", "nodate"):
        make_repo(repos / name)
    literal_commit(repos / "future", b"student <s@example.edu> 100000000000000 +9959")
    literal_commit(repos / "nodate", b"student <s@example.edu>")
    loose_object(repos / "corrupt", git(repos / "corrupt", "rev-parse", "HEAD")).write_bytes(b"garbage")
    (tmp_path / "roster.csv").write_text("student,repo\n" + "".join(f"{n},repos/{n}\n" for n in sorted(p.name for p in repos.iterdir())))
    args = ["grade", "--roster", "roster.csv", "--out", "out", "--course", "course.toml", *QUICK]
    (tmp_path / "course.toml").write_text(COURSE)
    first = run_cli(args, tmp_path, timeout=600)
    assert first.returncode == 0 and "Traceback" not in first.stdout + first.stderr, first.stdout + first.stderr
    lock = {s["student"]: s for s in json.loads((tmp_path / "out" / "workspace" / "lock.json").read_text())["students"]}
    assert lock["corrupt"]["status"] == "unfetched" and "git fetch failed" in lock["corrupt"]["reason"]
    # the course's deadline pins: the far-future and the dateless heads are not graded, their parents are
    for name in ("future", "nodate"):
        assert lock[name]["commit"] != lock[name]["head"] and lock[name]["late_commits"] == 1, lock[name]
    assert lock["future"]["head_date"] == "9999-12-31T23:59:59+00:00"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    totals = {s["student"]: s["total"] for s in summary["students"]}
    assert totals == {"alice": 0.13, "future": 0.13, "nodate": 0.13, "corrupt": None}
    again = run_cli([*args, "--resume"], tmp_path, timeout=600)
    assert again.returncode == 0 and "Grading 0 jobs (3 already graded, kept)" in again.stdout, again.stdout + again.stderr
    assert set(table(tmp_path / "out" / "grades.csv")) == {"alice", "future", "nodate", "corrupt"}


# -- the pieces, without grading ----------------------------------------------------------------


def test_fetch_with_a_deadline_pins_the_commit_before_a_date_no_datetime_holds(tmp_path):
    repos = tmp_path / "repos"
    for name in ("future", "nodate", "ancient", "alice"):
        make_repo(repos / name)
    before = {n: git(repos / n, "rev-parse", "HEAD") for n in ("future", "nodate", "ancient")}
    literal_commit(repos / "future", b"student <s@example.edu> 100000000000000 +0000")
    literal_commit(repos / "nodate", b"student <s@example.edu> not-a-date")
    ancient = literal_commit(repos / "ancient", b"student <s@example.edu> -100000000000000 -0500")
    (tmp_path / "roster.csv").write_text("student,repo\n" + "".join(f"{n},repos/{n}\n" for n in ("future", "nodate", "ancient", "alice")))
    run = run_cli(["fetch", "--roster", "roster.csv", "--out", "ws", "--deadline", "2025-02-01T00:00:00Z"], tmp_path, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lock = {s["student"]: s for s in json.loads((tmp_path / "ws" / "lock.json").read_text())["students"]}
    for name in ("future", "nodate"):  # the hostile head is after the deadline (or counts as after): not graded
        assert (lock[name]["commit"], lock[name]["late"], lock[name]["late_commits"]) == (before[name], True, 1), lock[name]
    assert lock["future"]["head_date"] == "9999-12-31T23:59:59+00:00" and lock["nodate"]["head_date"] is None
    # dated before the year 1, the head is on time; the last commit dated before the deadline is its parent (2025)
    assert lock["ancient"]["head"] == ancient and lock["ancient"]["commit"] == before["ancient"]
    assert lock["alice"]["late"] is False and lock["alice"]["commit"] == lock["alice"]["head"]
    # the head passed over is said, with why and which commits were left; one dated before its parent (the
    # clocks disagree) is no late commit, and its student is not late
    assert (lock["ancient"]["late"], lock["ancient"]["late_commits"]) == (False, 0), lock["ancient"]
    skew = lock["ancient"]["passed_over"]
    assert skew.startswith(f"the branch head {ancient[:12]} (") and f"dated before commit {before['ancient'][:12]}" in skew
    assert "passed over: 1 commit(s), " + ancient[:12] in skew
    assert "is dated after the deadline" in lock["future"]["passed_over"] and lock["alice"]["passed_over"] == ""
    assert run.stdout.count("not HEAD:") == 3 and f"{ancient[:12]}" in run.stdout, run.stdout


@pytest.mark.parametrize("tail,timestamp,iso,note", [
    (b"1736510400 +0000", 1736510400, "2025-01-10T12:00:00+00:00", ""),
    (b"1736510400 -0500", 1736510400, "2025-01-10T07:00:00-05:00", ""),
    (b"1736510400 +0530 trailing words", 1736510400, "2025-01-10T17:30:00+05:30", ""),
    (b"-1 +0000", -1, "1969-12-31T23:59:59+00:00", ""),
    (b"1736510400 +9959", 1736510400, "2025-01-10T12:00:00+00:00", "time zone +9959 is not a real offset"),
    (b"1736510400 -2400", 1736510400, "2025-01-10T12:00:00+00:00", "time zone -2400 is not a real offset"),
    (b"1736510400 +0075", 1736510400, "2025-01-10T12:00:00+00:00", "time zone +0075 is not a real offset"),
    (b"1736510400", 1736510400, "2025-01-10T12:00:00+00:00", "its time zone cannot be read"),
    (b"253402300799 +1400", 253402300799, "9999-12-31T23:59:59+00:00", ""),  # the last second; +14 h would leave the calendar
    (b"100000000000000 +0000", 100000000000000, "9999-12-31T23:59:59+00:00", "outside the years 1-9999"),
    (b"-100000000000000 +0000", -100000000000000, "0001-01-01T00:00:00+00:00", "outside the years 1-9999"),
    (b"9" * 5000 + b" +0000", 10**40, "9999-12-31T23:59:59+00:00", "a number of 5000 digits"),
    (b"", None, None, "cannot be read"),
    (b"yesterday +0000", None, None, "cannot be read"),
], ids=lambda v: (v[:22].decode() or "empty") if isinstance(v, bytes) else "")
def test_a_commit_date_is_read_from_its_bytes_whatever_they_say(tail, timestamp, iso, note):
    from grader.batch.workspace import parse_commit_date

    raw = b"tree 0\nauthor a <a@b> 1 +0000\ncommitter Some One <x@y> " + tail + b"\n\nmessage\ncommitter z <z> 5 +0000\n"
    date = parse_commit_date(raw)
    assert (date.timestamp, date.iso) == (timestamp, iso) and note in date.note
    assert bool(date.note) == bool(note)


def test_a_commit_date_agrees_with_git_for_honest_commits(tmp_path):
    """Both directions: an ordinary commit's date is exactly what git says, with no note."""
    import git as gitpython

    from grader.batch.workspace import commit_dates

    repo = make_repo(tmp_path / "r", date="2025-03-01T10:00:00-08:00")
    sha = git(repo, "rev-parse", "HEAD")
    [date] = commit_dates(gitpython.Repo(repo), [sha]).values()
    assert (date.iso, date.note) == (git(repo, "log", "-1", "--format=%cI"), "") == ("2025-03-01T10:00:00-08:00", "")
    assert commit_dates(gitpython.Repo(repo), ["0" * 40])["0" * 40].timestamp is None  # not there: unreadable, no crash


def test_late_penalty_of_a_date_that_cannot_be_read_is_the_policys_most():
    from datetime import datetime, timezone
    from fractions import Fraction

    from grader.batch.course import LatePolicy, Late

    policy = LatePolicy(per_day=Fraction(10), cap=Fraction(50))
    deadline = datetime(2025, 2, 1, tzinfo=timezone.utc)
    undated = Late.of(datetime(2025, 1, 1, tzinfo=timezone.utc), deadline, policy, dated=False)
    assert undated.late and undated.percent == 50
    assert "cannot be read" in undated.explain(policy) and "past every day the policy counts" in undated.explain(policy)
    on_time = Late.of(datetime(2025, 1, 1, tzinfo=timezone.utc), deadline, policy)
    assert not on_time.late and on_time.percent == 0 and on_time.explain(policy) == ""


def test_similarity_reads_inside_the_repo_only_and_never_blocks(tmp_path):
    from grader.batch.similarity import Unreadable, read_in_repo

    repo, outside = tmp_path / "repo", tmp_path / "outside.py"
    (repo / "kernels").mkdir(parents=True)
    outside.write_text(SECRET)
    (repo / "kernels" / "real.py").write_text("x = 1\n")
    (repo / "kernels" / "inside.py").symlink_to("real.py")
    (repo / "kernels" / "out.py").symlink_to(outside)
    (repo / "kernels" / "up.py").symlink_to("../../outside.py")
    (repo / "kernels" / "zero.py").symlink_to("/dev/zero")
    (repo / "linked").symlink_to(tmp_path)  # a folder link out
    (repo / "loop.py").symlink_to("loop.py")
    os.mkfifo(repo / "kernels" / "fifo.py")
    (repo / "big.py").write_text("#" * 300_000)
    assert read_in_repo(repo, "kernels/inside.py") == "x = 1\n"
    assert read_in_repo(repo, "kernels/missing.py") is None
    for rel, words in [("kernels/out.py", "a link out of the repository"), ("kernels/up.py", "a link out of the repository"),
                       ("kernels/zero.py", "a link out of the repository"), ("linked/outside.py", "a link out of the repository"),
                       ("/etc/passwd", "a link out of the repository"), ("../outside.py", "a link out of the repository"),
                       ("kernels/fifo.py", "is not a regular file"), ("kernels", "Is a directory"),
                       ("big.py", "larger than 256 KiB"), ("loop.py", "loop.py"), ("a\0b", "is not a path")]:
        with pytest.raises(Unreadable, match=None) as caught:
            read_in_repo(repo, rel)
        assert words in str(caught.value), (rel, caught.value)
        assert SECRET not in str(caught.value)


NOBODY_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from types import SimpleNamespace
    sys.path.insert(0, sys.argv[1])
    from grader.batch.similarity import update_similarity
    from grader.batch.workspace import Lock, Pinned
    from grader.settings import Settings
    from grader.spec import Course

    COURSE = Course.find(Settings())

    def compare(root, names):
        students = [Pinned(n, None, "fetched", path=f"repos/{n}", commit=n[0] * 40) for n in names]
        view = SimpleNamespace(assignments=["vector_add"], course=None, catalogue=COURSE, similarity={}, similarity_meta={})
        update_similarity(view, root / "out", Lock(students, "now", root=root))
        return view.similarity_meta["per_assignment"]["vector_add"]

    # as root, once, on a class of two: every lazy import (the tokenizer, the page template) is
    # done before the switch, since this Python lives where an ordinary user cannot read
    compare(Path(sys.argv[3]), ["alice", "bob"])
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    assert os.getuid() == os.geteuid() == 65534
    print(json.dumps(compare(Path(sys.argv[2]), ["alice", "bob", "carol", "dan"])))
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to an ordinary user needs root")
def test_as_an_ordinary_user_an_unreadable_module_and_a_fifo_cost_only_their_line(tmp_path):
    """Permissions decide what can be read: as nobody (uid 65534), a module only root may read
    is that student's "Permission denied", a FIFO is not opened, the others are compared. The
    switch is made inside the process (as setpriv would), after the imports: this machine's
    Python lives under /root, where nobody cannot run it."""
    import tempfile

    good = (FIXTURES / "good" / "kernels" / "vector_add.py").read_text()
    warm = tmp_path / "warm"
    for name in ("alice", "bob"):
        (warm / "repos" / name / "kernels").mkdir(parents=True)
        (warm / "repos" / name / "kernels" / "vector_add.py").write_text(good)
    base = Path(tempfile.mkdtemp(prefix="grader-nobody-", dir="/tmp"))  # pytest's own folders are root's alone (0700)
    try:
        root = base / "class"
        for name in ("alice", "bob", "carol", "dan"):
            (root / "repos" / name / "kernels").mkdir(parents=True)
            if name not in ("carol", "dan"):
                (root / "repos" / name / "kernels" / "vector_add.py").write_text(good)
        (root / "out").mkdir()
        os.mkfifo(root / "repos" / "dan" / "kernels" / "vector_add.py")
        for path in [base, *base.rglob("*")]:
            os.chown(path, 65534, 65534)
        os.chmod(base, 0o755)
        secret = root / "repos" / "carol" / "kernels" / "vector_add.py"
        secret.write_text(good)  # root's, 0600
        os.chmod(secret, 0o600)
        proc = subprocess.run([sys.executable, "-c", NOBODY_SCRIPT, str(REPO_ROOT), str(root), str(warm)], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        counts = json.loads(proc.stdout.strip().splitlines()[-1])
        assert counts["not_compared"] == {"carol": "could not be read: kernels/vector_add.py: Permission denied",
                                          "dan": "could not be read: the module kernels/vector_add.py is not a regular file (a FIFO)"}
        assert counts["files"] == 2 and counts["above_threshold"] == 1  # alice and bob, compared
        assert (root / "out" / "similarity" / "vector_add" / "alice--bob.html").stat().st_uid == 65534
    finally:
        shutil.rmtree(base, ignore_errors=True)
