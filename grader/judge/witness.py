"""The grader's own clock on the student's calls: a figure no code in the worker can shorten.

Every figure the timed loop reports (grader.worker.timing) is measured inside the student's
process, so student code that has read the grader's source can rewrite it: the activity
collector, torch's event classes (in Python or in C, through ctypes), the clock, the reply.
The witness does not ask the worker how long anything took. Each round, the grading process
sends the student's worker and then the reference's (a worker that never imports student
code) the same request: run the prepared burst (grader.worker.timing.Burst, `calls` calls back
to back, captured in a CUDA graph where the function allows) on inputs drawn from a seed told
only now, and send back sampled elements of every call's result. The grading process times the
request with its own clock, from sending it to reading the reply, and compares the samples
with the reference's.

Why the bracket cannot be shortened by anything in the worker:
- the inputs are drawn from a seed the worker learns when the bracket starts, so nothing can
  be computed ahead, and results cannot be cached between bursts;
- the samples must match the reference's on those inputs, so work skipped or results reused
  show as wrong values (a conclusive finding), and a reply cannot come before the work;
- a reply written ahead, before the request, is refused (`WorkerProcess.unasked`).
Anything else student code does in the worker lengthens the bracket, never shortens it.

The reference's burst runs the same inputs through the same protocol, so the difference of
the two brackets, per call, is the student's time minus the reference's, free of the
protocol's own costs (the pipe, the redraws, the samples). Added to the reference's GPU time
in that round (a trusted figure: its worker runs no student code) it is the student's time
per call by the grader's clock. Where that is longer than the worker's own figure by more than
the honest spread (AGREEMENT_MARGIN, measured: docs/performance.md), the speed is scored on
the grader's clock; where it is longer by more than TAMPER_MARGIN and the burst was a CUDA
graph (no host work in it), or the worker's own host clock claims even less, that is conclusive.

What it does not cover: a worker that skips the burst's work and computes only the sampled
elements, fast enough, from inputs it also redraws itself (docs/security.md, "Timing").
"""

from __future__ import annotations

import math
import os
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, cast

from grader import proctable
from grader.protocol import BurstReply, Failure, RunBurst
from grader.sandbox.process import WorkerProcess

BURST_GPU_MS = 40.0  # the reference's GPU time in one burst: long enough that the pipe's jitter is small beside it
MIN_CALLS, MAX_CALLS = 4, 256
SAMPLES = 16  # per call: a result reused or not computed is wrong in nearly all of them
# What a burst's results may hold at once: a CUDA graph keeps every call's result where the
# function's memory is used on several streams (record_stream), so calls are bounded by it too.
BURST_MEMORY = 16 << 30
ROUNDS = 5  # rounds with a burst (the timed rounds go on without, as far as their interval needs)
# How far the grader's clock may exceed the worker's own figure before the score moves to the
# grader's clock: above the largest honest disagreement measured on the H100 (docs/performance.md).
AGREEMENT_MARGIN = 0.08
# How far the grader's clock must exceed both the worker's GPU figure and its own host clock
# (each call, synchronized, by the worker's clock) for the disagreement to be called tampering:
# an honest call is never faster by the host's clock than back to back.
TAMPER_MARGIN = 0.15


class WitnessRefused(Exception):
    """The worker answered a burst before it was asked (a reply written ahead)."""


def burst_calls(reference_ms: float, result_bytes: int = 0) -> int:
    """Calls per burst: about BURST_GPU_MS of the reference's GPU time, and no more results than
    BURST_MEMORY holds."""
    calls = MAX_CALLS if not reference_ms > 0 else math.ceil(BURST_GPU_MS / reference_ms)
    if result_bytes > 0:
        calls = min(calls, BURST_MEMORY // result_bytes)
    return max(MIN_CALLS, min(MAX_CALLS, calls))


def new_seed() -> int:
    """A seed nobody can know before the request that carries it."""
    return secrets.randbits(62)


def bracketed(worker: WorkerProcess, contender: str, seed: int, timeout: float,
              last: bool = False, gate_ms: float = 0.0) -> tuple[BurstReply | Failure, float]:
    """The burst's reply and its seconds by the grading process's clock, request to reply."""
    if worker.unasked():
        raise WitnessRefused("the worker wrote a reply before it was asked")
    start = time.perf_counter()
    reply = worker.request(RunBurst(contender, seed, last, gate_ms), timeout)
    elapsed = time.perf_counter() - start
    reply = cast("BurstReply | Failure", reply)  # request(): the reply its request expects, or a Failure
    return reply, elapsed


def disagreement(student: list[list[float]], reference: list[list[float]], atol: float, rtol: float,
                 oracle: bool = True) -> str:
    """"" if the student's samples match the reference's, else what is wrong. Without an oracle
    (results that depend on the kernel's own random numbers, as dropout's) only the elements
    both kept (nonzero in both) are compared."""
    if len(student) != len(reference) or any(len(s) != len(r) for s, r in zip(student, reference)):
        return "the samples do not have the expected shape"
    scale = max((abs(v) for row in reference for v in row if math.isfinite(v)), default=0.0)
    wrong = compared = 0
    first: tuple[int, float, float] | None = None
    for call, (s_row, r_row) in enumerate(zip(student, reference)):
        for s, r in zip(s_row, r_row):
            if not oracle and (s == 0 or r == 0):
                continue
            compared += 1
            allowed = atol + 1e-3 * scale + (rtol + 0.02) * abs(r)
            if not (abs(s - r) <= allowed):  # NaN is wrong too
                wrong += 1
                if first is None:
                    first = (call, s, r)
    if not wrong:
        return ""
    assert first is not None  # set at the first wrong element
    call, s, r = first
    return (f"{wrong} of {compared} sampled elements wrong (call {call + 1} of {len(student)}: {s:.6g} where the "
            f"reference has {r:.6g})")


@dataclass
class Witness:
    """Each round's bursts: the calls per burst, and the brackets' seconds by the grader's clock."""

    calls: int = 0
    student_s: list[float] = field(default_factory=list)
    reference_s: list[float] = field(default_factory=list)
    eager: str = ""  # why the student's burst is not a CUDA graph ("" where it is; the reference's then is not either)
    wrong: str = ""  # what was wrong with the student's samples, if anything
    prepare_s: float = 0.0  # preparing both bursts (warm-up and capture), untimed
    # the replay's confirmation (grader.judge.timing.confirmation): one more burst of each, eager (the function's own
    # Python at every call, after the graph's calls), its brackets
    checked_s: dict[str, float] = field(default_factory=dict)
    checked_calls: int = 0  # the calls of that eager burst
    gate_ms: float = 0.0  # the gate that burst was queued behind (grader.worker.timing.Burst)
    checked_host: bool = False  # no gated round's host work was hidden (confirmation.kept_round): it may be in them
    busiest: int = 0  # the most threads the host had ready to run around any bracket (grader.proctable.runnable)

    # the most threads of others than the student's ready to run at once: its own load never excuses it
    others: int = 0
    student: Callable[[], set[int]] | None = None  # the student's processes now (its worker's tree, its uid's)

    def note_load(self) -> None:
        """The host's run queue now, kept where it is the longest seen (grader.proctable.runnable),
        and how much of it was not the student's own."""
        now = proctable.runnable() or 0
        self.busiest = max(self.busiest, now)
        # the student's share is read only where it can matter (more ready than CPUs): the process table's scan
        # costs milliseconds, twice a bracket
        busy = now > (os.cpu_count() or 1)
        own = proctable.running_threads(self.student()) if self.student is not None and busy else 0
        self.others = max(self.others, now - own)

    def cost_s(self) -> float:
        """What the witness adds to a job: preparing the bursts and running them."""
        return self.prepare_s + sum(self.student_s) + sum(self.reference_s) + sum(self.checked_s.values())

    def per_call_ms(self, reference_ms: list[float]) -> list[float]:
        """The student's time per call, each round, by the grader's clock: the reference's GPU
        time in that round plus the difference of the two bursts, per call."""
        return [r + (s - b) * 1e3 / self.calls for r, s, b in zip(reference_ms, self.student_s, self.reference_s)]


@dataclass(frozen=True)
class Confirmation:
    """What the grader's clock says of the worker's figures."""

    agreement: float  # the grader's clock over the worker's figure (median of rounds): 1.0 honest
    confirmed: bool
    student_ms: list[float]  # per round, by the grader's clock
    tampered: str  # conclusive: the worker's figures contradict the grader's clock ("" if not)
    note: str  # for the student, when the score moved to the grader's clock


def confirm(witness: Witness, student_ms: list[float], reference_ms: list[float],
            host_ms: float | None) -> Confirmation:
    """Compare the worker's figure each round (`student_ms`, the median it reported on the
    scored clock) with the grader's clock. `host_ms`: the worker's own median host time of one
    call, synchronized (its settle calls)."""
    clock = witness.per_call_ms(reference_ms)
    agreement = statistics.median(c / s if s > 0 else math.inf for c, s in zip(clock, student_ms))
    confirmed = agreement <= 1 + AGREEMENT_MARGIN
    tampered = note = ""
    if not confirmed:
        by_clock, reported = statistics.median(clock), statistics.median(student_ms)
        shorter = 1 - reported / by_clock
        said = (f"the worker's timings are {shorter:.0%} shorter than the grader's own clock shows "
                f"({reported:.4f} ms per call reported, {by_clock:.4f} ms by the grader's clock "
                f"over {witness.calls} calls back to back on fresh inputs")
        if agreement > 1 + TAMPER_MARGIN and not witness.eager:
            # in a CUDA graph the bracket holds the calls' GPU work and nothing of their host work
            tampered = said + ", replayed as a CUDA graph): the timing was changed inside the worker"
        elif agreement > 1 + TAMPER_MARGIN and host_ms is not None and by_clock > host_ms * (1 + TAMPER_MARGIN):
            tampered = (said + f"), and its own host clock claims {host_ms:.4f} ms for a whole call: the timing was "
                        "changed inside the worker")
        else:
            why = (f"your function could not be captured in a CUDA graph ({witness.eager}), "
                   "so its host work counts there"
                   if witness.eager else "the difference is larger than timing noise")
            note = (f"scored on the grader's own clock: {by_clock:.4f} ms per call over {witness.calls} calls back to "
                    f"back on fresh inputs, where the worker reported {reported:.4f} ms ({why})")
    return Confirmation(round(agreement, 4), confirmed, clock, tampered, note)
