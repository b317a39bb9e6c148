"""grader fetch: clone or update into the cache, pin a commit per student, and let a broken
repo cost only its own line."""

from __future__ import annotations

import json

import git
import pytest

from tests.classbuild import commit, git as run_git, make_repo, overlay
from tests.conftest import run_cli
from grader.batch.roster import RosterEntry
from grader.batch.workspace import ensure_checkout, fetch_roster, parse_deadline, read_lock, LockError

ON_TIME = "2025-03-01T10:00:00+00:00"
LATE = "2025-03-02T10:00:00+00:00"
DEADLINE = "2025-03-01T23:59:00+00:00"


def test_clone_pins_the_head_and_checks_it_out(tmp_path):
    repo = make_repo(tmp_path / "alice", "good", ON_TIME)
    head = run_git(repo, "rev-parse", "HEAD")
    lock = fetch_roster([RosterEntry("alice", str(repo)), RosterEntry("bob", (tmp_path / "alice").as_uri())], tmp_path / "ws")
    for p in lock.students:
        assert (p.status, p.commit, p.branch, p.late) == ("fetched", head, "main", None)
        checkout = lock.checkout(p)
        assert (checkout / "kernels" / "vector_add.py").is_file()
        assert git.Repo(checkout).head.commit.hexsha == head
    # the lock on disk says the same, with checkout paths relative to it
    again = read_lock(tmp_path / "ws" / "lock.json")
    assert [(p.student, p.commit, p.path) for p in again.students] == [("alice", head, "repos/alice"), ("bob", head, "repos/bob")]


def test_deadline_pins_the_last_commit_dated_before_it_and_flags_late_work(tmp_path):
    repo = make_repo(tmp_path / "alice", "good", ON_TIME)
    on_time = run_git(repo, "rev-parse", "HEAD")
    overlay(repo, "missing_mask")
    commit(repo, "after the deadline", LATE)
    lock = fetch_roster([RosterEntry("alice", str(repo))], tmp_path / "ws", deadline=parse_deadline(DEADLINE))
    [p] = lock.students
    assert p.commit == on_time and p.head != on_time
    assert p.late is True and p.late_commits == 1
    assert "set by the student's own machine" in " ".join(p.notes) and "1 commit(s) dated after the deadline" in " ".join(p.notes)
    assert "forged" in lock.warning
    # the checkout holds the on-time version, not the late one
    assert "mask=mask" in (lock.checkout(p) / "kernels" / "vector_add.py").read_text()


def test_on_time_student_is_not_late(tmp_path):
    repo = make_repo(tmp_path / "bob", "good", ON_TIME)
    [p] = fetch_roster([RosterEntry("bob", str(repo))], tmp_path / "ws", deadline=parse_deadline(DEADLINE)).students
    assert p.late is False and p.late_commits == 0


def test_update_follows_new_commits_and_a_roster_commit_pins(tmp_path):
    repo = make_repo(tmp_path / "alice", "good", ON_TIME)
    first = run_git(repo, "rev-parse", "HEAD")
    ws = tmp_path / "ws"
    assert fetch_roster([RosterEntry("alice", str(repo))], ws).students[0].commit == first
    overlay(repo, "missing_mask")
    second = commit(repo, "second", LATE)
    lock = fetch_roster([RosterEntry("alice", str(repo))], ws)  # an update of the same cache
    assert lock.students[0].commit == second
    assert "offsets * stride_x)" in (lock.checkout(lock.students[0]) / "kernels" / "vector_add.py").read_text()
    pinned = fetch_roster([RosterEntry("alice", str(repo), commit=first[:10])], ws).students[0]
    assert pinned.commit == first and "pinned by the roster" in pinned.notes[0]


def test_checkout_moved_by_hand_is_restored_before_grading(tmp_path):
    repo = make_repo(tmp_path / "alice", "good", ON_TIME)
    lock = fetch_roster([RosterEntry("alice", str(repo))], tmp_path / "ws")
    p = lock.students[0]
    path = lock.checkout(p)
    (path / "kernels" / "vector_add.py").write_text("oops")
    (path / "stray.py").write_text("x")
    ensure_checkout(lock, p)
    assert (path / "kernels" / "vector_add.py").read_text() != "oops" and not (path / "stray.py").exists()


def test_each_broken_repo_costs_only_its_own_line(tmp_path):
    good = make_repo(tmp_path / "good", "good", ON_TIME)
    (tmp_path / "empty").mkdir()
    run_git(tmp_path / "empty", "init", "-q")
    (tmp_path / "plain").mkdir()
    dev_only = make_repo(tmp_path / "dev", "good", ON_TIME, branch="dev")
    late_only = make_repo(tmp_path / "late", "good", LATE)
    entries = [
        RosterEntry("ok", str(good)),
        RosterEntry("nofolder", str(tmp_path / "nowhere")),
        RosterEntry("badurl", (tmp_path / "missing.git").as_uri()),
        RosterEntry("empty", str(tmp_path / "empty")),
        RosterEntry("notgit", str(tmp_path / "plain")),
        RosterEntry("ext", "ext::sh -c touch% /tmp/grader-pwned"),
        RosterEntry("option", "--upload-pack=touch /tmp/grader-pwned"),
        RosterEntry("noaccount", None, problem="no GitHub account is linked"),
        RosterEntry("nocommit", str(good), commit="deadbeef"),
        RosterEntry("late_only", str(late_only)),
        RosterEntry("dev_only", str(dev_only)),
    ]
    lock = fetch_roster(entries, tmp_path / "ws", deadline=parse_deadline(DEADLINE), branch="main")
    reasons = {p.student: (p.status, p.reason) for p in lock.students}
    assert reasons["ok"] == ("fetched", "")
    expected = {
        "nofolder": "no such folder",
        "badurl": "does not appear to be a git repository",
        "empty": "the repository is empty",
        "notgit": "does not appear to be a git repository",
        "ext": "not a repository URL or path",
        "option": "not a repository URL or path",
        "noaccount": "no GitHub account is linked",
        "nocommit": "commit deadbeef (pinned by the roster) is not in the repository",
        "late_only": "no commit on 'main' is dated on or before the deadline",
        "dev_only": "branch 'main' not found (branches: dev)",
    }
    for student, words in expected.items():
        status, reason = reasons[student]
        assert status == "unfetched" and words in reason, (student, reason)
    data = json.loads((tmp_path / "ws" / "lock.json").read_text())
    assert [s["status"] for s in data["students"]].count("unfetched") == len(expected)


def test_deadline_needs_a_time_zone():
    assert parse_deadline("2025-03-01T23:59:00Z").utcoffset().total_seconds() == 0
    with pytest.raises(ValueError, match="no time zone"):
        parse_deadline("2025-03-01T23:59:00")
    with pytest.raises(ValueError, match="not an ISO 8601"):
        parse_deadline("next friday")


def test_malformed_lock_is_refused(tmp_path):
    (tmp_path / "lock.json").write_text("{not json")
    with pytest.raises(LockError, match="malformed"):
        read_lock(tmp_path / "lock.json")
    with pytest.raises(LockError, match="grader fetch"):
        read_lock(tmp_path / "none.json")


def test_fetch_command_prints_a_line_per_student_and_exits_1_when_some_are_unfetched(tmp_path):
    make_repo(tmp_path / "repos" / "alice", "good", ON_TIME)
    (tmp_path / "roster.csv").write_text("student,repo\nalice,repos/alice\nbob,repos/bob\n")
    run = run_cli(["fetch", "--roster", "roster.csv", "--out", "ws", "--deadline", DEADLINE], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "ok  alice: main @" in run.stdout
    assert "unfetched  bob: no such folder" in run.stdout
    assert "1 fetched, 1 unfetched" in run.stdout and "forged" in run.stdout
    assert read_lock(tmp_path / "ws").students[0].status == "fetched"


def test_the_roster_s_lms_identities_ride_in_the_lock(tmp_path):
    repo = make_repo(tmp_path / "alice")
    ids = {"canvas_user_id": "4021", "email": "alice@uni.edu"}
    fetch_roster([RosterEntry("alice", str(repo), lms=dict(ids)), RosterEntry("bob", str(tmp_path / "none"),
                                                                               lms={"sis_user_id": "B7"})],
                 tmp_path / "ws")
    alice, bob = read_lock(tmp_path / "ws").students
    assert (alice.status, alice.lms) == ("fetched", ids)
    assert (bob.status, bob.lms) == ("unfetched", {"sis_user_id": "B7"})  # kept for the gradebooks' rows too
