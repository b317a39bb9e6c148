"""course.toml: the late rule worked by hand, extensions, the acceptance window, and errors
that name the line."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from fractions import Fraction

import pytest

from tests.conftest import COURSE
from grader.batch.course import CourseError, Late, LatePolicy, class_deadline, load_course

D = datetime(2025, 2, 1, 0, 0, tzinfo=timezone.utc)
POLICY = LatePolicy(grace=timedelta(hours=1), per_day=Fraction(10), cap=Fraction(50))

GOOD = """\
[course]
name = "Kernels 101"

[assignments.vector_add]
points = 20
deadline = "2025-02-01T00:00:00Z"

[assignments.softmax]
deadline = 2025-02-08T00:00:00Z

[late_policy]
grace_hours = 1
penalty_per_day = 10
max_penalty = 50

[[extensions]]
student = "alice"
assignment = "vector_add"
hours = 48

[[extensions]]
student = "bob"
until = "2025-03-01T12:00:00+01:00"

[similarity]
threshold = 0.5

[leaderboard]
named = ["carol"]
"""


def write(tmp_path, text: str):
    path = tmp_path / "course.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("after,days,percent", [
    # the documented rule: lateness counts from deadline + 1 h grace, in started 24 h days, 10% each, capped at 50%
    (timedelta(hours=25), 1, 10),  # 25 h late: 24 h after the grace = exactly one day
    (timedelta(hours=25, seconds=1), 2, 20),  # one second into the second day
    (timedelta(hours=1), 0, 0),  # the last moment of the grace period
    (timedelta(hours=1, seconds=1), 1, 10),  # one second after the grace: a started day
    (timedelta(minutes=30), 0, 0),
    (timedelta(days=10), 10, 50),  # ten days: 100% would be charged, the cap is 50%
    (timedelta(hours=-3), 0, 0),  # early
])
def test_late_rule_worked_by_hand(after, days, percent):
    late = Late.of(D + after, D, POLICY)
    assert (late.days, late.percent) == (days, Fraction(percent))
    assert late.late == (after > timedelta(0))


def test_25_hours_late_loses_a_tenth_of_the_points_earned():
    late = Late.of(D + timedelta(hours=25), D, POLICY)
    # 8 points earned, 10% deducted: 0.8, exactly (no float rounding)
    assert late.penalty(Fraction(8)) == Fraction(4, 5)
    assert 8 - late.penalty(Fraction(8)) == Fraction(36, 5)
    text = late.explain(POLICY)
    assert "25.0 h after your deadline" in text and "1 started day" in text and "10%" in text
    assert "set by your own machine" in text


def test_without_a_policy_late_work_costs_nothing():
    late = Late.of(D + timedelta(days=3), D, None)
    assert late.late and late.percent == 0 and "no late policy" in late.explain(None)


def test_course_file_is_read(tmp_path):
    c = load_course(write(tmp_path, GOOD), COURSE)
    assert c.name == "Kernels 101" and c.order == ["vector_add", "softmax"]
    assert c.points == {"vector_add": Fraction(20)}
    assert c.deadlines["softmax"] == datetime(2025, 2, 8, tzinfo=timezone.utc)  # a TOML datetime works too
    assert c.policy == POLICY
    assert c.similarity_threshold == 0.5 and c.named == {"carol"}
    # accept_days unset: commits are graded until the penalty reaches its cap (50 / 10 = 5 days after the grace)
    assert c.cutoff(D) == D + timedelta(hours=1) + timedelta(days=5)
    # the course's points scale the spec's: 3 of 6 is 10 of 20
    assert c.scale("vector_add", Fraction(3), Fraction(6)) == (Fraction(10), Fraction(20))
    assert c.scale("softmax", Fraction(3), Fraction(6)) == (Fraction(3), Fraction(6))


def test_an_extension_moves_the_deadline_for_that_student_only(tmp_path):
    c = load_course(write(tmp_path, GOOD), COURSE)
    assert c.deadline_for("alice", "vector_add") == D + timedelta(hours=48)
    assert c.deadline_for("alice", "softmax") == datetime(2025, 2, 8, tzinfo=timezone.utc)  # hers names vector_add only
    assert c.deadline_for("dan", "vector_add") == D
    assert c.deadline_for("bob", "softmax") == datetime(2025, 3, 1, 11, tzinfo=timezone.utc)  # `until`, any assignment
    # 25 h after the class deadline is on time for alice, 10% for dan
    submitted = D + timedelta(hours=25)
    assert Late.of(submitted, c.deadline_for("alice", "vector_add"), c.policy).percent == 0
    assert Late.of(submitted, c.deadline_for("dan", "vector_add"), c.policy).percent == 10
    # a command-line deadline replaces the course's; an extension in hours still moves it
    override = datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert c.deadline_for("alice", "vector_add", override) == override + timedelta(hours=48)


def test_one_fetch_needs_one_deadline(tmp_path):
    c = load_course(write(tmp_path, GOOD), COURSE)
    with pytest.raises(ValueError, match="different deadlines.*vector_add 2025-02-01.*softmax 2025-02-08.*-a NAME"):
        class_deadline(c, ["vector_add", "softmax"], None)
    base, per_student = class_deadline(c, ["vector_add"], None)
    assert base == D
    assert per_student("alice") == (D + timedelta(hours=48), D + timedelta(hours=48 + 1) + timedelta(days=5))
    assert per_student("dan") == (D, D + timedelta(hours=1) + timedelta(days=5))


@pytest.mark.parametrize("text,line,words", [
    ("[course]\nname = \"x\n", 2, "not valid TOML"),
    ("[course]\nname = 'x'\n\n[late_policy]\ngrace_hours = 1\npenalty_per_dya = 10\n", 6, "unknown key 'penalty_per_dya'"),
    ("[assignments.vector_add]\npoints = 5\ndeadline = \"2025-02-30T00:00:00Z\"\n", 3, "not an ISO 8601 date"),
    ("[assignments.vector_add]\n\ndeadline = \"2025-02-01T00:00:00\"\n", 3, "has no time zone"),
    ("[assignments.vector_add]\npoints = -2\n", 2, "points must be a positive number"),
    ("[assignments.vectoradd]\npoints = 2\n", 1, "unknown assignment 'vectoradd'"),
    ("[late_policy]\npenalty_per_day = \"10%\"\n", 2, "penalty_per_day must be a number between 0 and 100"),
    ("[[extensions]]\nstudent = \"a\"\nhours = 5\n\n[[extensions]]\nstudent = \"b\"\nhours = 2\ndays = 1\n", 6,
     "extension for b: give exactly one of hours, days or until"),
    ("[[extensions]]\nstudent = \"a\"\nhours = 5\n\n[[extensions]]\nstudent = \"b\"\nuntil = \"soon\"\n", 7, "until 'soon' is not"),
    ("[course]\nname = 'x'\n[grading]\nfoo = 1\n", 3, "unknown table [grading]"),
    ("[similarity]\nthreshold = 60\n", 2, "threshold must be a number in (0, 1]"),
    ("[course]\nname = 'x'\ndeadline = 2025-02-01T00:00:00Z\n", 3, "unknown key 'deadline' in [course] (known: name)"),
    ("[ci]\n\nscore = \"cpu\"\n", 3, "score must be one of 'cpu-gradable', 'whole', not 'cpu'"),
    ("[ci]\nscores = \"whole\"\n", 2, "unknown key 'scores' in [ci] (known: score)"),
])
def test_a_bad_course_file_names_the_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(CourseError) as err:
        load_course(path, COURSE)
    message = str(err.value)
    assert message.startswith(f"{path}, line {line}: "), message
    assert words in message, message


def test_the_documented_example_is_a_valid_course_file(tmp_path):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent.parent / "docs" / "course.md").read_text()
    example = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)
    c = load_course(write(tmp_path, example), COURSE)
    assert c.order == ["vector_add", "softmax"] and c.policy.accept_days == 5 and c.named == {"bob"}
    assert c.similarity_threshold == 0.6 and c.similarity_common_share == 0.5
    assert c.ci_score == "cpu-gradable" and load_course(write(tmp_path, "[ci]\nscore = \"whole\"\n"), COURSE).ci_score == "whole"
