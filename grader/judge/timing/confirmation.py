"""The grader's own clock on a replayed function's calls: the bursts' arithmetic, and the words
of a figure it could not confirm.

A replay (grader.judge.replay_stage) times the kernels the student's worker recorded, and the
record is written inside the student's process: a worker can rewrite a launch's scalar argument,
copy a faster binary over its compiled files, or take a faster path only while it is recorded or
only at the replay's buffers. So before the worker is stopped, the grading process times the
function's own calls at the timing size from outside, the way the fallback's witness does
(grader.judge.witness): bursts of calls on inputs drawn from a seed told only then, the request
bracketed by the grading process's clock, every call's result sampled and checked against the
reference's burst on the same inputs, the reference's burst run the same way in the trusted
worker so that the difference of the two brackets, per call, plus the reference's replayed time,
is the student's time per call by the grader's clock (`clock_ms`). What those figures make of
the replayed one is grader.judge.timing.decision's alone.
"""

from __future__ import annotations

BURST_ROUNDS = 5  # bursts per contender, alternating which goes first (the median round is the graph's figure)
# Calls in the queued eager burst after the graph's: the function's own Python runs at each, so a function right
# only for its first calls is wrong in it (its results are not kept: no memory bound); fewer for a function of
# many launches, so that every launch of the burst fits the GPU's launch queue behind the gate
EAGER_CALLS = 64
QUEUED_LAUNCHES = 768  # launches a queued burst may hold behind its gate (the driver queues about 1024)
# the burst's own launches per call (grader.worker.timing.Burst._body): the inputs redrawn (one per buffer, two or
# three), the cache flushed, the sample gathered and copied
BURST_LAUNCHES = 6
# Gated queued bursts of each contender, alternating which goes first: the median round is its figure
# (confirmation.kept_round: a busy machine's scheduler can lengthen either contender's bracket at random), every
# round's samples checked
EAGER_ROUNDS = 3
# The gate before a queued burst: at least this many times the longest ungated bracket seen, so that the
# function's host work of the whole burst happens while the GPU still runs the gate; at most GATE_MAX_MS
GATE_FACTOR = 1.5
GATE_MAX_MS = 3000.0
# Gated rounds redone, at most, where a contender's calls took longer to queue than the gate held the GPU (its host
# work then in the bracket: on a busy host an honest function's Python slows, and its queued figure with it)
GATE_RETRIES = 2
GATE_OUTRAN = 0.9  # a contender's calls queued in more than this share of the gate: its host work may have outrun it


def gate_outran(queued_ms: dict[str, float], gate_ms: float) -> bool:
    """Whether a gated round's host work may have outrun its gate: by the workers' own readings of
    how long their calls took to queue (`BurstReply.queued_ms`). A student's worker that says so
    falsely only has its round redone, or its figure counted as holding host work, which is never
    an accusation; one that hides it only keeps its own host work in its own figure."""
    return any(q > GATE_OUTRAN * gate_ms for q in queued_ms.values())


def kept_round(rounds: list[tuple[dict[str, float], bool]]) -> tuple[dict[str, float], bool]:
    """The queued burst's figure: the median round (the lower of two) by the student's bracket
    less the reference's, among the rounds whose host work the gate hid, else among all; and
    whether its bracket may hold host work. The median, not the fastest or the slowest: one round
    another job lengthened, on either contender's side, moves it neither way."""
    if not rounds:
        return {}, False
    hidden = [s for s, outran in rounds if not outran]
    pool = sorted(hidden or [s for s, _ in rounds], key=lambda s: s["student"] - s["reference"])
    return pool[(len(pool) - 1) // 2], not hidden


def clock_ms(student_s: list[float], reference_s: list[float], calls: int, reference_ms: float) -> list[float]:
    """The student's time per call, each round, by the grader's clock: the reference's replayed
    time plus the difference of the two bursts' brackets, per call."""
    return [reference_ms + (s - r) * 1e3 / calls for s, r in zip(student_s, reference_s)]


def queued_calls(launches: int) -> int:
    """Calls in a queued burst: EAGER_CALLS, fewer where the function's launches (and the burst's
    own, BURST_LAUNCHES per call) would overflow QUEUED_LAUNCHES."""
    return max(4, min(EAGER_CALLS, QUEUED_LAUNCHES // (max(launches, 1) + BURST_LAUNCHES)))


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
    """The message of a replayed figure the grader's clock could not confirm: held for review,
    the clock's failure first and the replayed figure only after it."""
    return (f"held for a TA's review (not an accusation): {message}; by replay alone {ratio:.3f}x the reference "
            f"kernel's time, whose {fraction:.0%} of the speed points wait for the review")


def held(why: str, ratio: float, fraction: float) -> str:
    """The message of a figure the grader could not verify (timed in the student's worker, not by
    replay): its points wait for a TA's review (`grader review --clear`); the student is told what
    to change to be replayed."""
    change = what_to_change(why)
    told = f"; to be timed by replay, {change}" if change else ""
    return (f"held for a TA's review (not an accusation): {ratio:.3f}x the reference kernel's time, timed in your "
            f"worker, not by replay ({why}), so the grader could not verify the figure; its {fraction:.0%} of the "
            f"speed points wait for the review{told}")
