"""A course's spec that raises while a class is graded: one course error, exit 2, naming the
spec's file, function, line and case; not an infra_error retried for every student."""

from __future__ import annotations

import json

from tests.classbuild import make_class
from tests.conftest import run_cli
from tests.coursebuild import broken_course


def test_grade_says_a_broken_spec_once_and_grades_nothing_of_it(tmp_path, monkeypatch):
    roster = make_class(tmp_path, {"alice": "good", "bob": "good", "carol": "good"})
    monkeypatch.setenv("GRADER_COURSE", str(broken_course(tmp_path / "course")))
    monkeypatch.delenv("GRADER_REFERENCE_DIR", raising=False)
    run = run_cli(["grade", "--roster", str(roster), "--out", "out", "-a", "fails_inputs", "--device", "cpu",
                   "--jobs", "1", "--case", "n=1", "--dtype", "float32", "--seed", "3", "--retries", "2"], tmp_path)
    said = run.stdout + run.stderr
    assert run.returncode == 2, said
    line = "assignments/fails_inputs/spec.py:13: make_inputs() raised KeyError: 'n' on case n=1 [float32]"
    assert line in run.stderr and "the assignment is broken, not your code" in run.stderr, said
    assert said.count("course error") == 1 and "trying again" not in said, said
    jobs = [json.loads(p.read_text()) for p in (tmp_path / "out" / "students").glob("*/jobs/fails_inputs.json")]
    assert len(jobs) == 1 and jobs[0]["course_error"] is True and line in jobs[0]["error"], jobs
