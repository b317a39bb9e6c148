"""Rosters: the three layouts, and a malformed roster stopping everything with one clear line."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from grader.batch.roster import RosterError, load_roster


def write(tmp_path, text: str, name: str = "roster.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_plain_roster_resolves_local_paths_against_its_folder(tmp_path):
    path = write(tmp_path, "student,repo,commit\nalice,repos/alice,\nbob,file:///srv/bob.git,0123abcd\ncarol,git@host:c/r.git,\n")
    entries = load_roster(path)
    assert [(e.student, e.repo, e.commit) for e in entries] == [
        ("alice", str(tmp_path / "repos" / "alice"), None),
        ("bob", "file:///srv/bob.git", "0123abcd"),
        ("carol", "git@host:c/r.git", None),
    ]


def test_excel_byte_order_mark_and_header_case_are_accepted(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_bytes("\ufeffStudent , Repo\nalice,https://example.edu/a.git\n".encode("utf-8"))
    assert load_roster(path)[0].repo == "https://example.edu/a.git"


def test_classroom_roster_forms_repo_urls_from_org_and_prefix(tmp_path):
    # the columns of the roster GitHub Classroom exports from its Students tab
    path = write(tmp_path, 'identifier,github_username,github_id,name\n'
                           '"alice@uni.edu",alice-gh,101,"Alice A"\n'
                           'bob@uni.edu,,,"Bob B"\n')
    entries = load_roster(path, org="cs-course", prefix="hw1-")
    alice, bob = entries
    assert (alice.student, alice.repo, alice.github_username, alice.name) == (
        "alice@uni.edu", "https://github.com/cs-course/hw1-alice-gh", "alice-gh", "Alice A")
    assert alice.folder == "alice@uni.edu"
    # a student who never linked a GitHub account is that student's problem, not the roster's
    assert bob.repo is None and "no GitHub account is linked" in bob.problem
    enterprise = load_roster(path, org="https://git.uni.edu/cs-course", prefix="hw1")[0]
    assert enterprise.repo == "https://git.uni.edu/cs-course/hw1-alice-gh"


def test_classroom_grades_export_carries_the_repo_url(tmp_path):
    path = write(tmp_path, "assignment_name,assignment_url,starter_code_url,github_username,roster_identifier,"
                           "student_repository_name,student_repository_url,submission_timestamp,points_awarded,points_available\n"
                           "hw1,u,s,alice-gh,alice@uni.edu,hw1-alice-gh,https://github.com/org/hw1-alice-gh,,0,10\n")
    [e] = load_roster(path)
    assert (e.student, e.repo, e.github_username) == ("alice@uni.edu", "https://github.com/org/hw1-alice-gh", "alice-gh")


@pytest.mark.parametrize("text,kw,message", [
    ("", {}, "the file is empty"),
    ("name,url\nalice,x\n", {}, "unknown header 'name,url'"),
    ("student,repo\n", {}, "a header but no student"),
    ("student,repo\nalice,\n", {}, "line 2: student 'alice' has no repo"),
    ("student,repo\n,repos/x\n", {}, "line 2: no student id"),
    ("student,repo\nalice,a\nbob,b\nalice,c\n", {}, "student 'alice' appears twice"),
    ("student,repo\na b,x\na_b,y\n", {}, "map to the same folder 'a_b'"),
    ("student,repo\nalice,a,extra\n", {}, "line 2: 3 fields, but the header has 2"),
    ("student,repo,commit\nalice,a,main\n", {}, "commit 'main' of 'alice' is not a commit hash"),
    ("identifier,github_username,github_id,name\na,b,1,c\n", {}, "give --org ORG and --prefix PREFIX"),
])
def test_malformed_rosters_are_refused_with_the_reason(tmp_path, text, kw, message):
    with pytest.raises(RosterError, match=None) as info:
        load_roster(write(tmp_path, text), **kw)
    assert message in str(info.value)


def test_missing_and_non_utf8_rosters(tmp_path):
    with pytest.raises(RosterError, match="no such file"):
        load_roster(tmp_path / "nope.csv")
    path = tmp_path / "latin1.csv"
    path.write_bytes("student,repo\nJos\xe9,x\n".encode("latin-1"))
    with pytest.raises(RosterError, match="not UTF-8"):
        load_roster(path)


@pytest.mark.parametrize("command", ["fetch", "grade"])
def test_malformed_roster_exits_2_with_one_line(tmp_path, command):
    roster = write(tmp_path, "name,url\nalice,x\n")
    run = run_cli([command, "--roster", str(roster), "--out", str(tmp_path / "out")], tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "unknown header" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "out" / "lock.json").exists()


def test_lms_columns_are_kept_for_the_gradebooks_and_publish(tmp_path):
    path = write(tmp_path, "student,repo,name,canvas_user_id,sis_login_id,gradescope_sid,email\n"
                           "alice,repos/a,Alice L,4021,alice@uni.edu,S100,alice@uni.edu\n"
                           "bob,repos/b,Bob,,bob01,,\n")
    alice, bob = load_roster(path)
    assert alice.lms == {"canvas_user_id": "4021", "sis_login_id": "alice@uni.edu", "gradescope_sid": "S100",
                         "email": "alice@uni.edu"}
    assert bob.lms == {"sis_login_id": "bob01"}  # an empty cell is no identity


def test_lms_columns_also_ride_on_classroom_s_exports(tmp_path):
    path = write(tmp_path, "github_username,roster_identifier,student_repository_url,canvas_user_id\n"
                           "al,alice,https://github.com/o/a-al,17\n")
    assert load_roster(path)[0].lms == {"canvas_user_id": "17"}


@pytest.mark.parametrize("row, message", [
    ("alice,repos/a,12ab,", "line 2: canvas_user_id '12ab' of 'alice' is not a Canvas user id"),
    ("alice,repos/a,,alice-at-uni", "line 2: email 'alice-at-uni' of 'alice' is not an email address"),
])
def test_a_malformed_lms_column_names_its_line_and_student(tmp_path, row, message):
    path = write(tmp_path, f"student,repo,canvas_user_id,email\n{row}\n")
    with pytest.raises(RosterError, match=message):
        load_roster(path)


def test_two_students_with_one_lms_identity_are_refused(tmp_path):
    path = write(tmp_path, "student,repo,sis_login_id\nalice,repos/a,AL@uni.edu\nbob,repos/b,al@uni.edu\n")
    with pytest.raises(RosterError, match="line 3: sis_login_id 'al@uni.edu' is given to both 'alice' and 'bob'"):
        load_roster(path)


def test_a_control_character_in_an_lms_id_is_refused(tmp_path):
    path = write(tmp_path, "student,repo,sis_user_id\nalice,repos/a,\x1b[31mX\n")
    with pytest.raises(RosterError, match="line 2: sis_user_id of 'alice' holds a control character"):
        load_roster(path)
