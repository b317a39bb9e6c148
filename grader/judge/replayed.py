"""The judge's side of a replay (grader.replay): one contender's replay run in a process of its
own, what it hands back read as data, the replayed result compared whole with the expected one,
and what the figure is worth.

Not yet called by the timing stage (grader.judge.perf): docs/security.md, "Replay", says what
remains to wire.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grader.replay.record import RecordError, read_file

MAX_REPLY_BYTES = 1 << 20


@dataclass
class Replayed:
    """What a replay process handed back: its per-rep times, or why it did not time."""

    ms: list[float] = field(default_factory=list)
    refused: str = ""  # the record was refused (the fallback times this contender)
    failed: str = ""  # the replay broke (a kernel faulted, the process died or ran out of time)
    others: list[int] = field(default_factory=list)  # other processes that held the GPU meanwhile
    folder: Path | None = None  # first.safetensors and last.safetensors: the results of its first and last rep

    @property
    def median_ms(self) -> float | None:
        return sorted(self.ms)[len(self.ms) // 2] if self.ms else None


def run(record: Path, inputs: Path, layout: Path, out: Path, reps: int, timeout: float, env: dict | None = None) -> Replayed:
    """`python -m grader.replay` on one record; a process that fails or overruns is a failed replay."""
    cmd = [sys.executable, "-m", "grader.replay", str(record), str(inputs), str(layout), str(out), "--reps", str(reps)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Replayed(failed=f"the replay did not finish in {timeout:.0f} s")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Replayed(failed=f"the replay process exited with {done.returncode}: {tail[:200]}")
    return read(out)


def read(out: Path) -> Replayed:
    """replay.json in `out`, bounded and typed (the process ran a student's binary)."""
    try:
        data = json.loads(read_file(Path(out) / "replay.json", MAX_REPLY_BYTES))
    except (RecordError, ValueError) as exc:
        return Replayed(failed=f"the replay's answer cannot be read ({str(exc)[:120]})")
    if not isinstance(data, dict):
        return Replayed(failed="the replay's answer is not an object")
    for key in ("refused", "failed"):
        if key in data:
            return Replayed(**{key: str(data[key])[:400]})
    ms, others = data.get("ms"), data.get("other_gpu_processes", [])
    if not (isinstance(ms, list) and ms and all(type(t) in (int, float) and math.isfinite(t) and t > 0 for t in ms)):
        return Replayed(failed="the replay's times are not positive numbers")
    if not (isinstance(others, list) and all(type(p) is int for p in others)):
        return Replayed(failed="the replay's list of GPU processes is not a list of process ids")
    return Replayed(ms=[float(t) for t in ms], others=others[:16], folder=Path(out))


def mismatch(replayed: list[torch.Tensor], expected: list[torch.Tensor], rtol: float, atol: float) -> str:
    """'' when every element of every result matches, else the evidence in words."""
    if len(replayed) != len(expected):
        return f"{len(replayed)} results where {len(expected)} are expected"
    for i, (got, want) in enumerate(zip(replayed, expected)):
        if got.shape != want.shape:
            return f"result {i} has shape {list(got.shape)}, not {list(want.shape)}"
        g, w = got.double(), want.double()
        same_nan = torch.isnan(g) & torch.isnan(w)
        bad = ~(same_nan | (torch.isclose(g, w, rtol=rtol, atol=atol) & ~torch.isnan(g)))
        count = int(bad.sum())
        if count:
            where = int(bad.reshape(-1).nonzero()[0])
            return (f"{count} of {g.numel()} elements of result {i} are wrong "
                    f"(the first at flat index {where}: {float(g.reshape(-1)[where]):.6g} where {float(w.reshape(-1)[where]):.6g} is expected)")
    return ""


def launches_differ(a: dict, b: dict) -> str:
    """'' when two records of the same function on inputs of the same shape make the same
    launches (kernels, grids, argument roles), else how they differ: then no one record stands
    for the function, and it is timed the fallback way."""
    def shape(record: dict) -> list:
        return [(x.get("kernel"), x.get("grid"), [(y.get("kind"), y.get("role"), y.get("ref")) for y in x.get("args", [])])
                for x in record.get("launches", []) if isinstance(x, dict)]

    sa, sb = shape(a), shape(b)
    if len(sa) != len(sb):
        return f"one call made {len(sa)} launches, another {len(sb)}"
    for i, (x, y) in enumerate(zip(sa, sb)):
        if x != y:
            return f"launch {i} differs between two calls (kernel, grid or arguments)"
    return ""


@dataclass
class Decision:
    kind: str  # scored | fallback | retry | review | conclusive
    message: str
    ratio: float | None = None


def decide(student: Replayed, reference: Replayed, wrong: str, differ: str = "") -> Decision:
    """What a replay's figure is worth. `wrong`: `mismatch` of the student's replayed results
    against the expected ones; `differ`: `launches_differ` of two of its records."""
    if reference.refused or reference.failed:
        return Decision("fallback", f"the reference could not be replayed ({reference.refused or reference.failed})")
    if student.others or reference.others:
        return Decision("retry", f"other processes held the GPU while the replay was timed: {student.others + reference.others}")
    if student.refused:
        return Decision("fallback", f"your kernels could not be replayed: {student.refused}")
    if differ:
        return Decision("fallback", f"your function's launches change from call to call: {differ}")
    if student.failed:  # a clean record whose replay breaks: evidence for a TA, not a verdict
        return Decision("review", f"your recorded kernels failed when launched again on the grader's own buffers: {student.failed}")
    if wrong:
        return Decision("conclusive", "the Triton kernels your function launched do not compute the result on their own: "
                        f"launched again on the grader's own buffers, {wrong}")
    return Decision("scored", "timed by replay", student.median_ms / reference.median_ms)
