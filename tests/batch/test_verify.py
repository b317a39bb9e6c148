"""`grader verify` where a figure cannot be re-timed: each case is exit 2 with the reason, never a
traceback (the GPU half, a figure that holds and one that does not, is in tests/gpu/test_batch_gpu.py)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import COURSE, run_cli
from grader.batch.store import RECORD_FORMAT


def _job(out, details, student="ann", folder="ann"):
    path = out / "students" / folder / "jobs" / "vector_add.json"
    path.parent.mkdir(parents=True)
    tests = [{"kind": "performance", "message": "m", "details": details}] if details is not None else []
    path.write_text(json.dumps({"format": RECORD_FORMAT, "student": student, "folder": folder, "assignment": "vector_add",
                                "result": {"tests": tests}}))


REPLAYED = {"timed_by": "replay", "ratio_to_reference": 1.0, "gpu": "H100",
            "replay": {"kept": {"student": "a" * 64, "reference": "b" * 64}, "placements": 6,
                       "inputs": {"seed": 1, "set": 0, "case": "n=2^28", "dtype": "float32"},
                       "student": {"median_ms": 1.0}, "reference": {"median_ms": 1.0}}}


@pytest.mark.parametrize("make, words", [
    (lambda out: None, "is not a graded class folder"),
    (lambda out: _job(out, REPLAYED, student="bob", folder="bob"), "no graded job of 'ann' for 'vector_add'"),
    (lambda out: _job(out, None), "this job has no performance test"),
    (lambda out: _job(out, {"timed_by": "fallback", "replay_refused": "launches on 2 streams"}),
     "not timed by replay, so there is nothing to re-time: launches on 2 streams"),
    (lambda out: _job(out, {**REPLAYED, "replay": {**REPLAYED["replay"], "inputs": {"case": "other", "dtype": "float32"}}}),
     "scoring case changed"),
])
def test_a_figure_that_cannot_be_verified_says_why_with_exit_2(tmp_path, make, words):
    case = COURSE.get("vector_add").performance.case.name
    REPLAYED["replay"]["inputs"]["case"] = case
    out = tmp_path / "out"
    out.mkdir()
    make(out)
    run = run_cli(["verify", "out", "ann", "vector_add"], tmp_path)
    assert run.returncode == 2 and words in run.stdout + run.stderr, run.stdout + run.stderr
    assert "Traceback" not in run.stderr


def test_missing_kept_records_are_named(tmp_path):
    out = tmp_path / "out"
    details = json.loads(json.dumps(REPLAYED))
    details["replay"]["inputs"]["case"] = COURSE.get("vector_add").performance.case.name
    _job(out, details)
    run = run_cli(["verify", "out", "ann", "vector_add"], tmp_path)
    assert run.returncode == 2 and "the student's kept record is missing" in run.stdout + run.stderr


@pytest.mark.parametrize("kept, words", [
    ({"student": "../../../../tmp", "reference": "b" * 64}, "names no kept student record"),
    ({"student": "/etc", "reference": "b" * 64}, "names no kept student record"),
    ("nothing", "names no kept student record"),
])
def test_a_forged_kept_folder_never_leads_out_of_the_class_folder(tmp_path, kept, words):
    """The record is input: its kept folder's name is a SHA-256 or nothing (#47)."""
    elsewhere = tmp_path / "tmp"
    elsewhere.mkdir()
    (elsewhere / "launches.json").write_text("{}")  # a launches.json anywhere on the machine
    out = tmp_path / "out"
    details = json.loads(json.dumps(REPLAYED))
    details["replay"]["inputs"]["case"] = COURSE.get("vector_add").performance.case.name
    details["replay"]["kept"] = kept
    _job(out, details)
    run = run_cli(["verify", "out", "ann", "vector_add"], tmp_path)
    assert run.returncode == 2 and words in run.stdout + run.stderr, run.stdout + run.stderr
    assert "Traceback" not in run.stderr


def test_a_kept_record_that_is_a_link_is_refused(tmp_path):
    out = tmp_path / "out"
    details = json.loads(json.dumps(REPLAYED))
    details["replay"]["inputs"]["case"] = COURSE.get("vector_add").performance.case.name
    _job(out, details)
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "launches.json").write_text("{}")
    (out / "replay").mkdir()
    (out / "replay" / ("a" * 64)).symlink_to(tmp_path / "real")
    run = run_cli(["verify", "out", "ann", "vector_add"], tmp_path)
    assert run.returncode == 2 and "the student's kept record is missing" in run.stdout + run.stderr


@pytest.mark.parametrize("plant", ["zero", "fifo", "huge"])
def test_a_job_record_that_is_a_device_a_fifo_or_too_large_is_no_record(tmp_path, plant):
    """jobs/<assignment>.json is read bounded, never through a link, never from a FIFO (#47): the
    command says there is no such job, at once, instead of filling memory or hanging."""
    import os

    out = tmp_path / "out"
    _job(out, REPLAYED)
    path = out / "students" / "ann" / "jobs" / "vector_add.json"
    record = path.read_text()
    path.unlink()
    if plant == "zero":
        path.symlink_to("/dev/zero")
    elif plant == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(record + " " * (64 << 20))  # a record, padded past the limit
    run = run_cli(["verify", "out", "ann", "vector_add"], tmp_path, timeout=120)
    assert run.returncode == 2 and "no graded job of 'ann'" in run.stdout + run.stderr, run.stdout + run.stderr


def test_an_assignment_name_that_is_a_path_is_refused(tmp_path):
    out = tmp_path / "out"
    _job(out, REPLAYED)
    run = run_cli(["verify", "out", "ann", "../../ann/jobs/vector_add"], tmp_path)
    assert run.returncode == 2 and "is not an assignment's name" in run.stdout + run.stderr, run.stdout + run.stderr
