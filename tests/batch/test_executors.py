"""The batch's queue (grader.batch.executors.Scheduler): a course's own error is not retried, and
stops the assignment's waiting jobs only where no student's result can have caused it."""

from __future__ import annotations

from types import SimpleNamespace

from grader.batch.executors import Scheduler


def _job(student: str, assignment: str):
    return SimpleNamespace(student=student, assignment=assignment, tries=0, attempt="")


def _record(**extra):
    return SimpleNamespace(status="infra_error", error="assignments/a/spec.py:3: make_inputs() raised ...", extra=extra)


def test_a_course_error_is_not_retried_and_stops_its_assignment_only():
    events = []
    jobs = [_job(s, a) for a in ("a", "b") for s in ("alice", "bob", "carol")]
    sched = Scheduler(jobs, retries=2, on_event=lambda kind, job, record: events.append((kind, job.student,
                                                                                           job.assignment)))
    first = sched.take()
    sched.finish(first, _record(course_error=True, course_error_stops=True))
    assert ("retry", "alice", "a") not in events and ("done", "alice", "a") in events
    assert {("not_run", "bob", "a"), ("not_run", "carol", "a")} <= set(events)
    assert [(j.student, j.assignment) for j in sched.queue] == [("alice", "b"), ("bob", "b"), ("carol", "b")]
    assert sched.course_errors == {"a": "assignments/a/spec.py:3: make_inputs() raised ..."}


def test_a_property_check_that_raises_on_one_result_stops_no_other_student():
    jobs = [_job(s, "a") for s in ("alice", "bob")]
    sched = Scheduler(jobs, retries=2, on_event=lambda *a: None)
    sched.finish(sched.take(), _record(course_error=True, course_error_stops=False))
    assert [j.student for j in sched.queue] == ["bob"] and "a" in sched.course_errors
    plain = Scheduler([_job("carol", "a")], retries=1, on_event=lambda *a: None)
    job = plain.take()
    plain.finish(job, _record())  # an infra_error of ours: tried again
    assert list(plain.queue) == [job]
