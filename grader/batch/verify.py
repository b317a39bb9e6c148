"""`grader verify OUT STUDENT ASSIGNMENT`: a stored speed figure timed again from what the job kept.

A grade timed by replay (grader.judge.replaying) keeps the checked records of the student's and
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
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from grader.batch.store import RECORD_FORMAT, read_json
from grader.sanitize import one_line

if TYPE_CHECKING:
    from grader.settings import Settings
    from grader.spec import Course

TOLERANCE = 0.03  # a figure holds when the new ratio is within 3% of the stored one


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
    """The stored job of `student` (the roster's name or the folder's) for `assignment`."""
    students = Path(out) / "students"
    if not students.is_dir():
        raise VerifyError(f"{out} is not a graded class folder (no students/ in it)")
    for folder in sorted(p for p in students.iterdir() if p.is_dir() and not p.is_symlink()):
        record = read_json(folder / "jobs" / f"{assignment}.json")
        if record and record.get("format") == RECORD_FORMAT and student in (record.get("student"), folder.name):
            return record
    raise VerifyError(f"no graded job of {student!r} for {assignment!r} in {out}")


def timing_of(record: dict) -> dict:
    """The performance test's details, where it was timed by replay."""
    tests = (record.get("result") or {}).get("tests") or []
    perf = [t for t in tests if isinstance(t, dict) and t.get("kind") == "performance"]
    if not perf:
        raise VerifyError("this job has no performance test")
    details = perf[0].get("details") or {}
    if details.get("timed_by") != "replay" or "ratio_to_reference" not in details:
        why = details.get("replay_refused") or perf[0].get("message") or "not timed by replay"
        raise VerifyError("this speed figure was not timed by replay, so there is nothing to re-time: "
                          f"{one_line(why, 200)}")
    return details


def verify(out: Path, student: str, assignment: str, course: "Course", settings: "Settings",
           timeout: float = 600.0) -> Verified:
    """Time the stored figure again here (a GPU is needed), with the assignment as `course` has it
    and the replay processes started under `settings` (the command's); VerifyError if it cannot be."""
    import torch

    from grader.judge import replayed, replaying
    from grader.judge.runcache import write_perf_set
    from grader.spec import UnknownAssignment

    record = find_record(out, student, assignment)
    details = timing_of(record)
    replay = details["replay"]
    try:
        spec = course.get(assignment)
    except UnknownAssignment as exc:
        raise VerifyError(exc.args[0]) from None
    inputs = replay["inputs"]
    if spec.performance is None or spec.performance.case.name != inputs.get("case") \
            or spec.performance.dtype != inputs.get("dtype"):
        raise VerifyError("the assignment's scoring case changed since this grade: its figure cannot be re-timed")
    records = {c: Path(out) / "replay" / replay["kept"][c] for c in ("student", "reference")}
    for c, folder in records.items():
        if not (folder / "launches.json").is_file():
            raise VerifyError(f"the {c}'s kept record is missing from {folder.parent}")
    if not torch.cuda.is_available():
        raise VerifyError("no CUDA GPU is visible here: a replay needs one")
    with tempfile.TemporaryDirectory(prefix="grader-verify-") as tmp:
        work = Path(tmp)
        layout = write_perf_set(spec, spec.performance.case, inputs["dtype"], int(inputs["seed"]),
                                int(inputs.get("set", 0)), work / "inputs.safetensors")
        (work / "layout.json").write_text(json.dumps(layout))
        truth = _truth(spec, work / "inputs.safetensors", layout)
        runs = {c: replayed.run(records[c], work / "inputs.safetensors", work / "layout.json", work / c, replaying.REPS,
                                timeout, placements=replay.get("placements", replaying.PLACEMENTS), settings=settings)
                for c in ("reference", "student")}
        for c, r in runs.items():
            if r.refused or r.failed:
                raise VerifyError(f"the {c}'s record could not be replayed here: {r.refused or r.failed}")
        tol = spec.tolerance
        dtype = inputs["dtype"]
        reference = replayed.results(runs["reference"], [truth])[0].reshape(-1)
        student_out = replayed.results(runs["student"], [truth])[0].reshape(-1)
        wrong = replaying.wrong_against_truth(student_out, truth, reference, tol.atol[dtype], tol.rtol[dtype])
        ratio = statistics.median(_per_placement(runs["student"], runs["reference"]))
    return Verified(float(details["ratio_to_reference"]), ratio, str(details.get("gpu", "?")),
                    torch.cuda.get_device_name(0), wrong,
                    [f"student {runs['student'].median_ms:.4f} ms, reference {runs['reference'].median_ms:.4f} ms "
                     f"per call (stored: {replay['student']['median_ms']} and {replay['reference']['median_ms']})"])


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
