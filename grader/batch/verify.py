"""`grader verify OUT STUDENT ASSIGNMENT`: a stored speed figure timed again from what the job kept.

A grade timed by replay (grader.judge.replay_stage) keeps the checked records of the student's and
the reference's launches in OUT/replay/<sha256 of launches.json>/ and, in the job's result, their
hashes, the input set's seed, index, case and dtype and the figures. Verifying makes that input
set again from the seed, computes torch's result on it here (the truth), replays both records as
the grade did (each in a sandboxed process of its own, over the same placements), checks the
student's replayed result whole against the truth, and compares the new ratio with the stored
one. Any GPU will do: the GPU the grade ran on is named beside this one, since a ratio can move
between GPU models.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from grader.batch.store import RECORD_FORMAT, read_back
from grader.safefiles import open_plain
from grader.sanitize import one_line

if TYPE_CHECKING:
    from grader.settings import Settings
    from grader.spec import Course

TOLERANCE = 0.03  # a figure holds when the new ratio is within 3% of the stored one
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # an assignment's name as the command takes it
KEPT = re.compile(r"[0-9a-f]{64}")  # a kept record's folder: the SHA-256 of its launches.json


class VerifyError(Exception):
    """The figure cannot be verified (no such job, not timed by replay, records missing): one line."""


@dataclass
class Verified:
    stored_ratio: float
    ratio: float
    stored_gpu: str
    gpu: str
    wrong: str = ""  # the student's replayed result against the truth here
    lines: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return not self.wrong and abs(self.ratio / self.stored_ratio - 1) <= TOLERANCE


def find_record(out: Path, student: str, assignment: str) -> dict:
    """The stored job of `student` (the roster's name or the folder's) for `assignment`. A record
    is input: read bounded, never through a link, a FIFO or a device (grader.safefiles)."""
    students = Path(out) / "students"
    if not NAME.fullmatch(assignment):
        raise VerifyError(f"{one_line(assignment, 80)!r} is not an assignment's name")
    if not students.is_dir():
        raise VerifyError(f"{out} is not a graded class folder (no students/ in it)")
    for folder in sorted(p for p in students.iterdir() if p.is_dir() and not p.is_symlink()):
        try:
            record = read_back(folder / "jobs" / f"{assignment}.json")
        except (OSError, ValueError):  # none, a link, a FIFO, too large, not JSON: not this student's record
            continue
        if (isinstance(record, dict) and record.get("format") == RECORD_FORMAT
                and student in (record.get("student"), folder.name)):
            return record
    raise VerifyError(f"no graded job of {student!r} for {assignment!r} in {out}")


def kept_records(out: Path, replay: dict) -> dict[str, Path]:
    """The folders of OUT/replay/ the record names, each a SHA-256 (never a path that leads out
    of OUT), a plain folder holding a plain launches.json; VerifyError where one is not."""
    kept = replay.get("kept")
    folders = {}
    for c in ("student", "reference"):
        name = kept.get(c) if isinstance(kept, dict) else None
        if not isinstance(name, str) or not KEPT.fullmatch(name):
            raise VerifyError(f"the record names no kept {c} record of OUT/replay/ (a SHA-256): it is malformed")
        folder = Path(out) / "replay" / name
        try:
            os.close(open_plain(folder / "launches.json"))
        except OSError:
            raise VerifyError(f"the {c}'s kept record is missing from {folder.parent}") from None
        folders[c] = folder
    return folders


def timing_of(record: dict) -> dict:
    """The performance test's details, where it was timed by replay."""
    result = record.get("result")
    tests = result.get("tests") if isinstance(result, dict) else None
    tests = tests if isinstance(tests, list) else []
    perf = [t for t in tests if isinstance(t, dict) and t.get("kind") == "performance"]
    if not perf:
        raise VerifyError("this job has no performance test")
    details = perf[0].get("details")
    details = details if isinstance(details, dict) else {}
    if details.get("timed_by") != "replay" or "ratio_to_reference" not in details:
        why = details.get("replay_refused") or perf[0].get("message") or "not timed by replay"
        raise VerifyError("this speed figure was not timed by replay, so there is nothing to re-time: "
                          f"{one_line(str(why), 200)}")
    ratio = details["ratio_to_reference"]
    if type(ratio) not in (int, float) or not math.isfinite(float(ratio)) or ratio <= 0:
        raise VerifyError("the record's stored ratio is malformed")
    return details


def verify(out: Path, student: str, assignment: str, course: "Course", settings: "Settings",
           timeout: float = 600.0) -> Verified:
    """Time the stored figure again here (a GPU is needed), with the assignment as `course` has it
    and the replay processes started under `settings` (the command's); VerifyError if it cannot be."""
    import torch

    from grader.judge import replay_process, replay_stage
    from grader.judge.runcache import write_perf_set
    from grader.sandbox.zygote import SandboxState
    from grader.spec import UnknownAssignment

    record = find_record(out, student, assignment)
    details = timing_of(record)
    replay = details.get("replay")
    if not isinstance(replay, dict):
        raise VerifyError("the record's replay is malformed")
    try:
        spec = course.get(assignment)
    except UnknownAssignment as exc:
        raise VerifyError(exc.args[0]) from None
    inputs = replay.get("inputs")
    if not isinstance(inputs, dict):
        raise VerifyError("the record's input set is malformed")
    if spec.performance is None or spec.performance.case.name != inputs.get("case") \
            or spec.performance.dtype != inputs.get("dtype"):
        raise VerifyError("the assignment's scoring case changed since this grade: its figure cannot be re-timed")
    if not isinstance(inputs.get("seed"), int) or not isinstance(inputs.get("set", 0), int):
        raise VerifyError("the record's input set (seed, set) is malformed")
    records = kept_records(out, replay)
    if not torch.cuda.is_available():
        raise VerifyError("no CUDA GPU is visible here: a replay needs one")
    with tempfile.TemporaryDirectory(prefix="grader-verify-") as tmp:
        work = Path(tmp)
        layout = write_perf_set(spec, spec.performance.case, inputs["dtype"], int(inputs["seed"]),
                                int(inputs.get("set", 0)), work / "inputs.safetensors")
        (work / "layout.json").write_text(json.dumps(layout))
        truth = _truth(spec, work / "inputs.safetensors", layout)
        sandbox = SandboxState()  # the two replays' own: no grading session runs here
        runs = {c: replay_process.run(records[c], work / "inputs.safetensors", work / "layout.json", work / c,
                                      replay_stage.REPS, timeout,
                                      placements=replay.get("placements", replay_stage.PLACEMENTS), settings=settings,
                                      sandbox=sandbox)
                for c in ("reference", "student")}
        for c, r in runs.items():
            if r.refused or r.failed:
                raise VerifyError(f"the {c}'s record could not be replayed here: {r.refused or r.failed}")
        tol = spec.tolerance
        dtype = inputs["dtype"]
        reference = replay_process.results(runs["reference"], [truth])[0].reshape(-1)
        student_out = replay_process.results(runs["student"], [truth])[0].reshape(-1)
        wrong = replay_stage.wrong_against_truth(student_out, truth, reference, tol.atol[dtype], tol.rtol[dtype])
        ratio = statistics.median(_per_placement(runs["student"], runs["reference"]))
    return Verified(float(details["ratio_to_reference"]), ratio, str(details.get("gpu", "?")),
                    torch.cuda.get_device_name(0), wrong,
                    [f"student {runs['student'].median_ms:.4f} ms, reference {runs['reference'].median_ms:.4f} ms "
                     f"per call (stored: {_stored_ms(replay, 'student')} and {_stored_ms(replay, 'reference')})"])


def _stored_ms(replay: dict, side: str) -> str:
    figures = replay.get(side)
    ms = figures.get("median_ms") if isinstance(figures, dict) else None
    return f"{ms:.4f} ms" if isinstance(ms, (int, float)) and math.isfinite(ms) else "?"


def _per_placement(student, reference) -> list[float]:
    return [statistics.median(s) / statistics.median(r) for s, r in zip(student.placements, reference.placements)]


def _truth(spec, inputs: Path, layout: dict):
    """torch's result on the input set, computed here with the spec's own baseline (trusted code)."""
    import torch
    from safetensors.torch import load_file

    from grader.codec import rebuild

    args = rebuild(load_file(str(inputs)), layout, "cuda")
    with torch.no_grad():
        out = spec.baseline(*args.values())
    torch.cuda.synchronize()
    return out.detach().reshape(-1).to("cpu")
