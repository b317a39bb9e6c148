"""The timing's one decision: what every measurement of a function's own calls makes of its
replayed figure. Pure: no clock, no process, no GPU; the figures come in `Evidence`, every
margin in one frozen `Margins`, and `verdict` is the whole rule.

The score is the slowest credible figure of the function's ordinary calls. The replay times the
kernels the student's worker recorded (a record the student's process wrote); the grader's own
clock times the function's calls from outside, in a CUDA graph burst (no host work in the
bracket), in a queued eager burst behind a GPU gate (the function's Python runs at every call,
its host work hidden behind the gate), or eagerly with a synchronization per call (a function
that cannot be captured: its host work is then part of what its calls cost). Every one of them
is evidence; none is set aside because it is slower. A function that can tell which call is
watched gains nothing by it: whichever calls are slow set the score.

`steady`: the host's run queue less the student's own threads (`Evidence.own_threads`: load the
student made never excuses it) no longer than its CPUs, and each replay's reps on one placement
of its buffers within `Margins.steady` of each other. `slack`: `Margins.launch_slack_ms` per
recorded launch. `credible`: a figure above zero, and not the bracket of a capturable function
is any figure above zero: one whose bracket holds the function's own host work (`Figure.host_work`)
counts too (a function that cannot be captured, or whose Python outran the gate: that work is
what its calls cost), but never accuses.

Rows, checked in order (R: the replayed time per call; F: the clock's figures above zero; the
accusing edges, fast and slow, take the slack too; the spread's edge does not, so that a
function of many launches that does less only while recorded gains the spread alone):

| path           | clock against replay          | host     | scored from       | outcome            |
|----------------|-------------------------------|----------|-------------------|--------------------|
| any            | no F                          | any      | R, held           | unclear            |
| graph, queued  | some F < R(1 - fast)          | steady   | nothing           | faster, conclusive |
| host work in F | some F < R(1 - eager_fast)    | steady   | nothing           | faster, conclusive |
| any            | faster as above               | unsteady | slowest of R, F   | unsteady           |
| many streams   | faster as above               | any      | (the rows below)  | (never faster)     |
| no host work   | max F > R(1 + slow)           | steady   | nothing           | slower, conclusive |
| any            | max F > R(1 + slow)           | unsteady | max F             | unsteady           |
| any            | max F > R(1 + spread)         | any      | max F             | clock              |
| any            | within the spread             | any      | R                 | agrees             |

A record whose launches were on several streams (`Evidence.streams`) is replayed one after another
on one stream, so calls that overlap them are faster than the replay with nothing left out: no
"faster" there, the replay (the slower) scored.

`unsteady` is never a hold: the slower reading is scored and the finding's figures are kept for
a TA. A hold (`unclear`) names the clock's failure first and the replayed figure after it."""

from __future__ import annotations

from dataclasses import dataclass, field

GRAPH, QUEUED, EAGER = "graph burst", "queued burst", "eager burst"  # Figure.source


@dataclass(frozen=True)
class Margins:
    """Every margin of the decision (docs/performance.md says how each was measured)."""

    # the honest spread: a clock figure within it of the replay agrees (the replay, the finer
    # figure, is scored); beyond it the slower figure is scored. What a function that can tell
    # recorded calls from ordinary ones gains at most (docs/performance.md: to be measured)
    spread: float = 0.10
    fast: float = 0.25  # faster than the replay in a graph or queued burst: less work than the record
    eager_fast: float = 0.50  # the same where the bracket holds the function's and the reference's host work
    slow: float = 0.30  # slower, no host work in the bracket, on a steady host: the calls are not the record's
    launch_slack_ms: float = 0.005  # per recorded launch: a launch in a burst beyond the replay's back to back
    steady: float = 0.25  # a replay's reps on one placement may spread this much on a steady host


MARGINS = Margins()


@dataclass(frozen=True)
class Figure:
    """One measurement of the function's own calls by the grader's clock, per call."""

    source: str  # GRAPH, QUEUED or EAGER
    ms: float
    calls: int
    # the bracket holds the function's host work (an eager burst synchronized per call, or a
    # queued burst whose gate the function's own host work may have outran): never an accusation
    host_work: bool = False


@dataclass(frozen=True)
class Evidence:
    """Everything measured of a replayed function's calls."""

    replay_ms: float  # the student's replayed time per call
    launches: int  # the student's recorded launches per call
    figures: tuple[Figure, ...]
    capturable: bool = True  # the function's burst could be captured in a CUDA graph
    why_eager: str = ""  # why not ("" where it could)
    busiest: int = 0  # the most threads the host had ready to run around any bracket or replay
    own_threads: int = 0  # of them, the student's own (its worker's and its children's)
    cpus: int = 1
    placements: tuple[tuple[float, ...], ...] = ()  # each replay's reps on one placement of its buffers
    # the streams the record's launches were on: the replay runs them one after another on one stream, so calls
    # that overlap them are faster than their replay with no work left out (never "faster", scored at the replay)
    streams: int = 1


@dataclass(frozen=True)
class SpeedVerdict:
    """What the timing is worth: `scored_ms` is the figure the score is computed from."""

    outcome: str  # "agrees", "clock", "unsteady", "faster", "slower", "unclear"
    scored_ms: float
    scored_from: str  # "replay" or a Figure's source
    clock_ms: float  # the decisive clock figure (the slowest credible one, or the fastest for "faster")
    replay_ms: float
    message: str  # for the student ("" where the figures agree)
    unsteady: str = ""  # why the host was too unsteady to accuse ("" where steady)
    set_aside: tuple[str, ...] = field(default_factory=tuple)  # figures that measured nothing, and why

    @property
    def conclusive(self) -> bool:
        return self.outcome in ("faster", "slower")

    @property
    def held(self) -> bool:
        return self.outcome == "unclear"

    @property
    def ratio(self) -> float:
        return self.clock_ms / self.replay_ms if self.replay_ms > 0 else float("inf")


def unsteady(e: Evidence, m: Margins = MARGINS) -> str:
    """Why the measurements were too unsteady to accuse anyone ("" where steady). The student's
    own threads are taken off the run queue first: its load never excuses it."""
    others = e.busiest - e.own_threads
    if others > e.cpus:
        return (f"the host had {others} threads of other jobs ready to run on its {e.cpus} CPUs while the calls "
                "were timed")
    for reps in e.placements:
        timed = [x for x in reps if x > 0]
        if len(timed) >= 2 and max(timed) / min(timed) - 1 > m.steady:
            return (f"the replay's reps on one placement of its buffers, the same kernels on the same buffers, took "
                    f"from {min(timed):.4f} to {max(timed):.4f} ms")
    return ""


def _words(f: Figure, replay_ms: float) -> str:
    how = {GRAPH: "captured in a CUDA graph (no host work in it)",
           QUEUED: "queued eagerly behind a GPU gate (your Python at every call, its host work hidden)",
           EAGER: "run eagerly, synchronized after each call (its host work in it)"}[f.source]
    if f.source == QUEUED and f.host_work:
        how = "queued eagerly behind a GPU gate shorter than your Python's host work (that work in it)"
    return (f"{f.ms:.4f} ms per call by the grader's clock over {f.calls} calls on fresh inputs, {how}; "
            f"{replay_ms:.4f} ms for the kernels your function's record names, replayed")


def verdict(e: Evidence, m: Margins = MARGINS) -> SpeedVerdict:
    """The decision table of this module's docstring, row by row."""
    r, slack = e.replay_ms, m.launch_slack_ms * e.launches
    credible, aside = [], []
    for f in e.figures:
        if not f.ms > 0:
            aside.append(f"{f.source}: measured nothing ({f.ms:.4f} ms per call: the reference's burst beside it "
                         "took longer than its own work explains)")
        else:
            credible.append(f)
    set_aside = tuple(aside)
    if not credible:
        return SpeedVerdict("unclear", r, "replay", 0.0, r,
                       "the grader's own clock could not time your function's calls (" + "; ".join(aside) + "), so "
                       f"the replayed figure ({r:.4f} ms) could not be confirmed", set_aside=set_aside)
    why = unsteady(e, m)
    slowest = max(credible, key=lambda f: f.ms)

    def fast_edge(f: Figure) -> float:
        return r * (1 - (m.eager_fast if f.host_work else m.fast)) - slack

    faster = [f for f in credible if f.ms < fast_edge(f)] if e.streams == 1 else []
    if faster:
        f = min(faster, key=lambda f: f.ms)
        words = _words(f, r)
        if not why:
            return SpeedVerdict("faster", r, "replay", f.ms, r,
                           f"your function's own calls are faster than the kernels its record names ({words}): the "
                           "calls did less work than their record says", set_aside=set_aside)
        top = max(r, slowest.ms)
        return SpeedVerdict("unsteady", top, "replay" if top == r else slowest.source, f.ms, r,
                       f"scored at the slower reading ({top:.4f} ms per call): the grader's clock read your calls "
                       f"faster than their record ({words}), but {why}", why, set_aside)
    words = _words(slowest, r)
    if slowest.ms > r * (1 + m.slow) + slack:
        if not why and not slowest.host_work:
            times = slowest.ms / r if r > 0 else float("inf")
            return SpeedVerdict("slower", slowest.ms, slowest.source, slowest.ms, r,
                           f"your function's own calls are {times:.2f}x slower than the kernels its record "
                           f"names ({words}): the calls do not run what their record says", set_aside=set_aside)
        if why:
            return SpeedVerdict("unsteady", slowest.ms, slowest.source, slowest.ms, r,
                           f"scored at the slower reading: {words} ({why}, so no finding, but the slower figure "
                           "counts)", why, set_aside)
    if slowest.ms > r * (1 + m.spread):  # no launch slack here: what a margin-rider gains is the spread alone
        because = ("your function's own calls are slower than its recorded ones" if not slowest.host_work else
                   f"your function could not be captured in a CUDA graph ({e.why_eager}), so its host work counts"
                   if not e.capturable else "your function's own host work outran the grader's gate, so it counts")
        return SpeedVerdict("clock", slowest.ms, slowest.source, slowest.ms, r,
                       f"scored on the grader's own clock: {words}; {because}", why, set_aside)
    return SpeedVerdict("agrees", r, "replay", slowest.ms, r, "", why, set_aside)
