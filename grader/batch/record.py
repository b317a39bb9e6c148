"""A job's record: what one student x assignment job ended with, as stored in
OUT/students/<student>/jobs/<assignment>.json (grader.batch.store) and read back by the class
view, `--resume`, the reviews and the student's reports.

`JobRecord.to_json` writes the keys the records have always had, so class folders graded before
still load; `JobRecord.from_json` checks every field's type on read, so a malformed record is a
RecordError that names the file and the field, not a KeyError somewhere in the class view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RECORD_FORMAT = 1
STATUSES = ("graded", "infra_error")  # a job's status, not an outcome: infra_error is ours, retried


class RecordError(ValueError):
    """A stored record that is not one: the file and what is wrong with it, in one line."""


@dataclass
class JobRecord:
    student: str
    folder: str  # the student's folder name under OUT/students
    assignment: str
    status: str  # graded | infra_error
    error: str  # why the job ended in infra_error ("" when graded)
    key: dict  # what a stored grade must match to be reused (grader.batch.jobs.job_key)
    attempt: str
    commit: str | None
    repo: str | None  # the repository's URL
    seed: int
    gpu: str | None
    environment: dict  # the run's environment: torch, Triton, the isolation that ran, the roofline
    started: str  # ISO 8601, UTC
    finished: str
    seconds: float
    result: dict | None = None  # AssignmentResult.to_json(); None when the job ended in infra_error
    phase_seconds: dict | None = None  # where a graded job's time went
    node: str | None = None  # the Ray node that ran the job
    extra: dict = field(default_factory=dict)  # keys this version does not know, kept as they were

    def to_json(self) -> dict:
        data: dict[str, Any] = {"format": RECORD_FORMAT}
        for name in _REQUIRED:
            data[name] = getattr(self, name)
        data["result"] = self.result
        if self.phase_seconds is not None:
            data["phase_seconds"] = self.phase_seconds
        if self.node is not None:
            data["node"] = self.node
        return {**data, **self.extra}

    @classmethod
    def from_json(cls, data: object, where: str = "a job record") -> "JobRecord":
        """The record `data` holds; RecordError naming `where` and the field where it holds none."""
        if not isinstance(data, dict):
            raise RecordError(f"{where}: not a job record (a JSON object), but {type(data).__name__}")
        if data.get("format") != RECORD_FORMAT:
            raise RecordError(f"{where}: record format {data.get('format')!r}, this grader reads {RECORD_FORMAT}")
        for name, kinds in {**_REQUIRED, **_OPTIONAL}.items():
            if name not in data and name in _REQUIRED:
                raise RecordError(f"{where}: the record has no {name!r}")
            value = data.get(name)
            if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
                wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
                raise RecordError(f"{where}: {name!r} must be {wanted}, not {type(value).__name__}")
        if data["status"] not in STATUSES:
            raise RecordError(f"{where}: 'status' must be {' or '.join(STATUSES)}, not {str(data['status'])[:40]!r}")
        known = {"format", *_REQUIRED, *_OPTIONAL}
        values: dict[str, Any] = {k: data.get(k) for k in (*_REQUIRED, *_OPTIONAL)}  # each of its type, checked above
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})


_NONE = type(None)
# the stored keys in their order, each with the JSON types it may hold
_REQUIRED: dict[str, tuple[type, ...]] = {
    "student": (str,), "folder": (str,), "assignment": (str,), "status": (str,), "error": (str,), "key": (dict,),
    "attempt": (str,), "commit": (str, _NONE), "repo": (str, _NONE), "seed": (int,), "gpu": (str, _NONE),
    "environment": (dict,), "started": (str,), "finished": (str,), "seconds": (int, float)}
_OPTIONAL: dict[str, tuple[type, ...]] = {"result": (dict, _NONE), "phase_seconds": (dict, _NONE), "node": (str, _NONE)}
