"""Reading a timed loop's GPU activity records (TRUSTED side; the worker collects them in
grader.worker.timing): how long each call kept the GPU busy on any stream, whether a call returned
before its work was done, and whether work ran while no call was running.

The host marks each call: `before` (the GPU idle, all earlier work done), `after` (our L2 flush
done, GPU idle again) and the call's return. So each call owns a flush window [before, after),
which must hold our flush alone, and a call window [after, next before), which holds our sleep
and whatever the call made the GPU do, on any stream or thread: a call's busy time is the span
the GPU spent on its own activities (the union of their intervals: overlapping streams count
once, and the host's gaps between launches, a slow wrapper's Python, not at all). An activity belongs to the window that
holds
its midpoint: the GPU's records and the host's marks share a clock only to within microseconds,
and every activity starts and ends well inside its window (a synchronize separates windows).

A settle call (no sleep before it) is followed at once by a marker on the caller's stream; an
activity of the call that ends after the marker began was still running when the caller's
stream was done: the function returned an unfinished result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

SHADOW = "spin_kernel"  # torch.cuda._sleep's kernel: our launch shadow and the settle marker
FINISH_TOLERANCE_NS = 1_000  # an activity may end this long after the marker began (timestamps' grain)


@dataclass(frozen=True)
class Activity:
    name: str
    stream: int
    start: int  # ns
    end: int

    @property
    def mid(self) -> float:
        return (self.start + self.end) / 2


@dataclass
class Reading:
    # per timed call: GPU time of its own work; 0.0 where it ran none
    busy_ms: list[float] = field(default_factory=list)
    kernels: list[int] = field(default_factory=list)  # per timed call: its GPU activities
    unfinished: list[str] = field(default_factory=list)  # settle calls whose work outlived the return
    strays: list[str] = field(default_factory=list)  # GPU work while none of the calls ran
    problems: list[str] = field(default_factory=list)  # the records do not fit the loop: the timing is not trusted


def read(records: Sequence[Sequence], marks: Sequence[Sequence[int]], settle_marks: Sequence[Sequence[int]]) -> Reading:
    """`records`: [name, stream, start_ns, end_ns]; `marks` and `settle_marks`: per call, the
    host's [before, after, returned] in the records' clock (grader.worker.timing.time_function)."""
    activities = sorted((Activity(str(n), int(s), int(a), int(b)) for n, s, a, b in records), key=lambda x: x.start)
    calls = [(m, False) for m in marks] + [(m, True) for m in settle_marks]
    reading = Reading()
    if not calls:
        return reading
    bounds = [m[0] for m, _ in calls] + [float("inf")]
    windows: list[tuple[list[Activity], list[Activity]]] = [([], []) for _ in calls]
    for a in activities:
        if a.mid < bounds[0]:
            reading.strays.append(f"{a.name} ran before the first timed call")
            continue
        i = next(k for k in range(len(calls)) if a.mid < bounds[k + 1])
        (windows[i][0] if a.mid < calls[i][0][1] else windows[i][1]).append(a)
    for i, ((_, settle), (flush, work)) in enumerate(zip(calls, windows)):
        label = f"settle call {i - len(marks) + 1}" if settle else f"timed call {i + 1}"
        if not flush:
            reading.problems.append(f"{label}: the L2 flush is missing from the records")
        for a in flush[1:]:  # ours is the first: it was launched the moment the GPU was idle
            reading.strays.append(f"{a.name} ran while no call of yours was running (before {label})")
        shadows = [a for a in work if SHADOW in a.name]
        if not shadows:
            reading.problems.append(f"{label}: the {'marker' if settle else 'launch shadow'} is missing from the "
                                    f"records")
            continue
        if settle:
            marker = shadows[-1]  # launched after the call returned: the last of ours
            own = [a for a in work if a is not marker]
            late = [a for a in own if a.end > marker.start + FINISH_TOLERANCE_NS]
            if late:
                worst = max(late, key=lambda a: a.end)
                reading.unfinished.append(f"{worst.name} ran {(worst.end - marker.start) / 1e6:.3f} ms past the return "
                                          f"of {label}"
                                          + (f" ({len(late)} activities)" if len(late) > 1 else ""))
        else:
            own = [a for a in work if a is not shadows[0]]  # the sleep was launched before the call began
            reading.busy_ms.append(union_ns(own) / 1e6)
            reading.kernels.append(len(own))
    return reading


def union_ns(activities: list[Activity]) -> int:
    """How long at least one of `activities` was running."""
    total, reach = 0, None
    for a in sorted(activities, key=lambda x: x.start):
        if reach is None or a.start > reach:
            total += a.end - a.start
            reach = a.end
        elif a.end > reach:
            total += a.end - reach
            reach = a.end
    return total
