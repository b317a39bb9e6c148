"""The replay's figure confirmed by the grader's own clock: does the record describe the function?

A replay (grader.judge.replay_stage) times the kernels the student's worker recorded, and the
record is written inside the student's process: a worker can rewrite a launch's scalar argument,
copy a faster binary over its compiled files, or take a faster path only while it is recorded or
only at the replay's buffers. So before the worker is stopped, the grading process times the
function's own calls at the timing size from outside, the way the fallback's witness does
(grader.judge.witness): a burst of calls on inputs drawn from a seed told only then, the
request bracketed by the grading process's clock, every call's result sampled and checked
against the reference's burst on the same inputs, the reference's burst run the same way in the
trusted worker so that the difference of the two brackets, per call, plus the reference's
replayed time, is the student's time per call by the grader's clock.

That figure and the student's replayed figure must agree (`decide`):
- the function's calls faster than its own replayed kernels by more than FAST_MARGIN: its calls
  did less work than its record says (conclusive, both figures named);
- slower by more than SLOW_MARGIN (plus LAUNCH_SLACK_MS per launch) where the burst is a CUDA
  graph, so that no host work is in it: the calls do not run what their record says
  (conclusive);
- slower where the burst had to run eagerly (the function synchronizes, so its host work is in
  the bracket): no accusation, the score comes from the grader's clock (the slower figure);
- no figure at all (the reference's bursts beside the student's took longer than its own work
  explains): the replayed figure is unconfirmed, its points held for a TA's review.
The margins are above the honest spread measured on the GPU (docs/performance.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# How much faster than its own replayed kernels a function's calls may look by the grader's clock
# before that is called less work than the record: the replay's placements move a kernel's time by
# up to 17% on an H100, and the burst runs at one placement (docs/performance.md).
FAST_MARGIN = 0.25
# The same where the burst ran eagerly (each call synchronized, the function's own Python and the
# reference's in the brackets): an honest synchronizing wrapper measured 0.73x on an H200.
EAGER_FAST_MARGIN = 0.50
# How much slower, in a CUDA graph (no host work), before the calls are not what the record says.
SLOW_MARGIN = 0.30
# Per recorded launch: what a launch costs in the burst beyond the replay's back-to-back launches.
LAUNCH_SLACK_MS = 0.005
BURST_ROUNDS = 5  # bursts per contender, alternating which goes first (the median round decides)
# Calls in the eager burst after the graph's: the function's own Python runs at each, so a function right
# only for its first calls is wrong in it (its results are not kept: no memory bound)
EAGER_CALLS = 64
# An accusation needs steady measurements. Both clocks are read on the host (the grader's brackets hold the
# host's scheduling; a replay's events hold any wait of the GPU for its launches past the sleep that covers
# them), and eight checks on one H200 read honest kernels 1.50x slower by the grader's clock and at 1.8x
# their own time replayed. So a conclusive verdict stands only where the host had no more threads ready to
# run than CPUs around every bracket and replay, and a replay's reps on one placement of its buffers (the
# same kernels on the same buffers) spread by no more than STEADY; else it is held for a TA's review
# (`steadied`), its reading kept for the TA.
STEADY = 0.25
# Eager bursts of each contender, alternating which goes first: one bracket holds each call's host
# work, which a busy machine's scheduler can lengthen for either contender at random (an honest
# kernel's single eager round read 0.38x its replay with eight checks beside it); the round most in
# the student's favour decides, so only less work in every round is called less work.
EAGER_ROUNDS = 3


@dataclass(frozen=True)
class Agreement:
    """What the grader's clock says of a replayed figure."""

    # "agrees", "faster" (conclusive), "slower" (conclusive), "host" (scored on the clock), "unclear" (no figure:
    # the replay's points held for a TA's review)
    verdict: str
    clock_ms: float  # the student's time per call by the grader's clock (median of the rounds)
    replay_ms: float  # the student's replayed time per call
    ratio: float  # clock_ms / replay_ms
    message: str  # for the student: the finding, or the note on the clock's score ("" where they agree)

    @property
    def conclusive(self) -> bool:
        return self.verdict in ("faster", "slower")


def clock_ms(student_s: list[float], reference_s: list[float], calls: int, reference_ms: float) -> list[float]:
    """The student's time per call, each round, by the grader's clock: the reference's replayed
    time plus the difference of the two bursts' brackets, per call."""
    return [reference_ms + (s - r) * 1e3 / calls for s, r in zip(student_s, reference_s)]


def decide(clock: list[float], replay_ms: float, launches: int, eager: str, calls: int,
           eager_ms: float | None = None) -> Agreement:
    """Compare the grader's clock (`clock`, per round, from `clock_ms`) with the student's replayed
    time per call. `eager`: why the student's burst was not a CUDA graph ("" where it was);
    `eager_ms`: the clock's figure of one more burst run eagerly after a graph's (None without),
    which may show the calls faster too (host work only lengthens a bracket), never slower."""
    by_clock = statistics.median(clock)
    ratio = by_clock / replay_ms if replay_ms > 0 else float("inf")
    if by_clock <= 0:  # the reference's bursts took longer than the student's by more than its own work: something
        # outside the calls lengthened them (work or memory the student's process held, say), no measure of either
        return Agreement("unclear", by_clock, replay_ms, ratio,
                         f"the grader's own clock could not time your function's calls ({by_clock:.4f} ms per call "
                         f"over {calls} calls: the reference's bursts beside them took longer than its own work "
                         "explains), so the replayed figure could not be confirmed")
    if eager_ms is not None and eager_ms <= 0:  # likewise: that round measured nothing
        eager_ms = None
    eager_below = replay_ms * (1 - EAGER_FAST_MARGIN) - LAUNCH_SLACK_MS * launches
    fast_below = eager_below if eager else replay_ms * (1 - FAST_MARGIN) - LAUNCH_SLACK_MS * launches
    if eager_ms is not None and eager_ms < eager_below and not by_clock < fast_below:
        by_clock, ratio = eager_ms, (eager_ms / replay_ms if replay_ms > 0 else float("inf"))
        how = "on fresh inputs, run eagerly (your Python at every call)"
    else:
        how = "back to back on fresh inputs"
    figures = (f"{by_clock:.4f} ms per call by the grader's clock over {calls} calls {how}, "
               f"{replay_ms:.4f} ms for the kernels your function's record names, replayed")
    if by_clock < fast_below or how != "back to back on fresh inputs":
        return Agreement("faster", by_clock, replay_ms, ratio,
                         f"your function's own calls are faster than the kernels its record names ({figures}): "
                         "the calls did less work than their record says")
    if by_clock > replay_ms * (1 + SLOW_MARGIN) + LAUNCH_SLACK_MS * launches:
        if not eager:
            return Agreement("slower", by_clock, replay_ms, ratio,
                             f"your function's own calls are {ratio:.2f}x slower than the kernels its record names "
                             f"({figures}, captured in a CUDA graph, so no host work is in it): the calls do not "
                             "run what their record says")
        return Agreement("host", by_clock, replay_ms, ratio,
                         f"scored on the grader's own clock: {figures}; your function could not be captured in a "
                         f"CUDA graph ({eager}), so its host work counts there")
    return Agreement("agrees", by_clock, replay_ms, ratio, "")


def unsteady(busiest: int, cpus: int, placements: list[list[float]]) -> str:
    """Why the measurements were too unsteady to accuse anyone ("" where they were steady): the
    host's run queue around the brackets and replays (`busiest` threads ready to run, grader.proctable.runnable)
    longer than its `cpus`, or the reps of a replay on one placement of its buffers (each list of
    `placements`) spread by more than STEADY."""
    if busiest > cpus:
        return f"the host had {busiest} threads ready to run on its {cpus} CPUs while the calls were timed"
    for reps in placements:
        timed = [x for x in reps if x > 0]
        if len(timed) >= 2 and max(timed) / min(timed) - 1 > STEADY:
            return (f"the replay's reps on one placement of its buffers, the same kernels on the same buffers, took "
                    f"from {min(timed):.4f} to {max(timed):.4f} ms")
    return ""


def steadied(agreement: Agreement, why: str) -> Agreement:
    """A conclusive verdict reached while the measurements were unsteady (`unsteady`): no
    accusation, the figure unconfirmed (its points held for a TA's review), the clock's reading
    kept in the words for the TA."""
    if not agreement.conclusive or not why:
        return agreement
    return Agreement("unclear", agreement.clock_ms, agreement.replay_ms, agreement.ratio,
                     f"the machine was too busy for the grader's own clock to confirm it ({why}; the clock read "
                     f"{agreement.clock_ms:.4f} ms per call against {agreement.replay_ms:.4f} ms replayed)")


# What a student changes so that the replay can time the function, by why it could not (the
# record's `why_not`, grader.worker.launches, and the judge's reasons, grader.judge.replay_stage).
CHANGES = (
    ("streams", "launch every kernel on the caller's stream (torch.cuda.current_stream()), not on streams of your own"),
    ("tensor from elsewhere", "allocate every buffer your kernels use inside the call (torch.empty), or take it "
                              "from the arguments: keep no device tensor between calls"),
    ("buffer from elsewhere", "allocate every buffer your kernels use inside the call (torch.empty), or take it "
                              "from the arguments: keep no device tensor between calls"),
    ("device address", "pass tensors to your kernels, not their addresses as integers"),
    ("change from call to call", "make every call at the same shapes launch the same kernels with the same grids"),
    ("TMA descriptor", "build tensor descriptors on the device (tl.make_tensor_descriptor) or from "
                       "triton.tools.tensor_descriptor.TensorDescriptor over the call's own tensors"),
    ("interpreter", "run on a GPU with compiled Triton kernels"),
    ("the reference could not be replayed", ""),  # ours: nothing for the student to change
)
GENERAL_CHANGE = ("compute the result with your own Triton kernels, launched in every call on the caller's stream, "
                  "on the inputs, the result and buffers the call allocates")


def what_to_change(why: str) -> str:
    """What the student changes so that the replay times the function ("" where nothing of theirs
    stopped it)."""
    for words, change in CHANGES:
        if words in why:
            return change
    return GENERAL_CHANGE


def unconfirmed(message: str, ratio: float, fraction: float) -> str:
    """The message of a replayed figure the grader's clock could not confirm: held for review."""
    return (f"held for a TA's review (not an accusation): {ratio:.3f}x the reference kernel's time by replay, but "
            f"{message}; its {fraction:.0%} of the speed points wait for the review")


def held(why: str, ratio: float, fraction: float) -> str:
    """The message of a figure the grader could not verify (timed in the student's worker, not by
    replay): its points wait for a TA's review (`grader review --clear`); the student is told what
    to change to be replayed."""
    change = what_to_change(why)
    told = f"; to be timed by replay, {change}" if change else ""
    return (f"held for a TA's review (not an accusation): {ratio:.3f}x the reference kernel's time, timed in your "
            f"worker, not by replay ({why}), so the grader could not verify the figure; its {fraction:.0%} of the "
            f"speed points wait for the review{told}")
