"""The timing's one decision (grader.judge.timing.decision.verdict), row by row of its table, on
evidence made up here: every row reached, every edge exact, and each attack of the field as its
figures would read (fast only while recorded or captured, the margin-rider, the student's own
load on the host) scored at its slower figure."""

from __future__ import annotations

import pytest

from grader.judge.timing import decision
from grader.judge.timing.decision import EAGER, GRAPH, MARGINS, QUEUED, Evidence, Figure, Margins, verdict

M = MARGINS
STEADY_REPS = ((1.0, 1.02, 0.99),) * 4


def ev(*figures: Figure, replay: float = 1.0, launches: int = 1, capturable: bool = True, busiest: int = 4,
       own: int = 0, cpus: int = 16, placements=STEADY_REPS, streams: int = 1) -> Evidence:
    return Evidence(replay, launches, figures, capturable=capturable, why_eager="" if capturable else "it synchronizes",
                    busiest=busiest, own_threads=own, cpus=cpus, placements=placements, streams=streams)


def graph(ms: float) -> Figure:
    return Figure(GRAPH, ms, 50)


def queued(ms: float, host_work: bool = False) -> Figure:
    return Figure(QUEUED, ms, 64, host_work)


def eager(ms: float) -> Figure:
    return Figure(EAGER, ms, 50, host_work=True)


BUSY = {"busiest": 40, "cpus": 16}


# (evidence, outcome, scored_ms, scored_from): one case per row of the table, in its order
ROWS = [
    pytest.param(ev(graph(-0.5), queued(0.0)), "unclear", 1.0, "replay", id="no figure: held"),
    pytest.param(ev(graph(0.5), queued(1.0)), "faster", 1.0, "replay", id="graph faster: conclusive"),
    pytest.param(ev(eager(0.4), capturable=False), "faster", 1.0, "replay", id="eager faster: conclusive"),
    pytest.param(ev(graph(0.5), queued(1.3), **BUSY), "unsteady", 1.3, QUEUED, id="faster, unsteady: slowest"),
    pytest.param(ev(graph(0.5), queued(0.6), streams=2), "agrees", 1.0, "replay",
                 id="many streams, faster: their overlap, the replay scored"),
    pytest.param(ev(graph(1.0), queued(2.0)), "slower", 2.0, QUEUED, id="queued slower: conclusive"),
    pytest.param(ev(graph(1.0), queued(2.0), **BUSY), "unsteady", 2.0, QUEUED, id="slower, unsteady: slower"),
    pytest.param(ev(graph(1.2)), "clock", 1.2, GRAPH, id="beyond the spread: the clock's"),
    pytest.param(ev(graph(1.05), queued(0.97)), "agrees", 1.0, "replay", id="within the spread: replay"),
]


@pytest.mark.parametrize("evidence, outcome, scored, source", ROWS)
def test_each_row_of_the_table_decides_as_it_says(evidence, outcome, scored, source):
    got = verdict(evidence)
    assert (got.outcome, got.scored_from) == (outcome, source), got
    assert got.scored_ms == pytest.approx(scored)
    assert got.conclusive == (outcome in ("faster", "slower")) and got.held == (outcome == "unclear")
    assert bool(got.message) == (outcome != "agrees")


def test_every_figure_is_evidence_and_none_is_set_aside_because_it_is_slower():
    # the first attack of the field: five adds per call except while recorded or captured, its queued burst
    # 3.97 ms against the 0.75 ms replayed: a conclusive finding naming both figures
    got = verdict(ev(graph(0.75), queued(3.97), replay=0.75))
    assert got.outcome == "slower" and got.clock_ms == 3.97
    assert "3.9700 ms per call by the grader's clock over 64 calls" in got.message
    assert "queued eagerly behind a GPU gate" in got.message and "0.7500 ms for the kernels" in got.message
    assert "5.29x slower" in got.message
    # the slower figure is the one scored wherever it comes from, the graph's or the queued burst's
    assert verdict(ev(graph(1.2), queued(1.0))).scored_ms == 1.2
    assert verdict(ev(graph(1.0), queued(1.2))).scored_ms == 1.2


def test_the_margin_rider_gains_no_more_than_the_spread():
    # sixty launches, half a pass less only while recorded: 1.36x by the clock, within the old slow margin plus
    # its per-launch slack; scored at the clock's figure now
    got = verdict(ev(graph(1.36), queued(1.3), launches=60))
    assert got.outcome == "clock" and got.scored_ms == 1.36
    # whatever it drops while recorded, what it gains is at most the spread and its launches' slack
    for recorded_gain in (0.05, 0.1, 0.2, 0.5):
        true_ms = 1.0 + recorded_gain
        scored = verdict(ev(graph(true_ms), launches=60)).scored_ms
        assert scored >= true_ms / (1 + M.spread) - 1e-9


@pytest.mark.parametrize("ms, outcome", [
    (1.0 * (1 + M.spread) - 1e-6, "agrees"),
    (1.0 * (1 + M.spread) + 1e-6, "clock"),  # no launch slack in the spread's edge
    (1.0 * (1 + M.slow) + M.launch_slack_ms - 1e-6, "clock"),
    (1.0 * (1 + M.slow) + M.launch_slack_ms + 1e-6, "slower"),
    (1.0 * (1 - M.fast) - M.launch_slack_ms + 1e-6, "agrees"),
    (1.0 * (1 - M.fast) - M.launch_slack_ms - 1e-6, "faster"),
])
def test_the_edges_are_exact(ms, outcome):
    assert verdict(ev(graph(ms))).outcome == outcome


def test_each_launch_buys_its_slack_in_every_edge():
    tiny = 0.05 + 8 * M.launch_slack_ms * 0.9  # eight launches of a tiny kernel: their own cost in the burst
    assert verdict(ev(graph(tiny), replay=0.05, launches=8)).outcome == "clock"  # scored on it, never accused
    assert verdict(ev(graph(tiny), replay=0.05, launches=1)).outcome == "slower"
    assert verdict(ev(graph(0.745), launches=2)).outcome == "agrees"  # two launches: the fast edge at 0.74


def test_host_work_in_a_bracket_counts_in_the_score_but_never_accuses_of_slowness():
    # a function that cannot be captured: its eager burst's host work is what its calls cost
    got = verdict(ev(eager(3.0), capturable=False))
    assert got.outcome == "clock" and got.scored_ms == 3.0 and "it synchronizes" in got.message
    # a capturable function whose Python outran the queued burst's gate: counted, not accused
    got = verdict(ev(graph(1.0), queued(3.0, host_work=True)))
    assert got.outcome == "clock" and got.scored_ms == 3.0 and "outran the grader's gate" in got.message
    # faster stays conclusive with host work in the bracket (it only lengthens one), beyond the wider margin
    assert verdict(ev(eager(0.73), capturable=False)).outcome == "agrees"
    assert verdict(ev(eager(0.45), capturable=False)).outcome == "faster"
    assert verdict(ev(graph(0.73))).outcome == "faster"  # in a graph: no such excuse


def test_the_students_own_load_never_excuses_it():
    # a forged record and the student's own threads on every CPU: the host's queue is its own, the finding stands
    forged = ev(graph(5.7), queued(5.5), busiest=26, own=12)
    got = verdict(forged)
    assert got.outcome == "slower" and not got.unsteady and got.scored_ms == 5.7
    # others' load: no accusation, but the slower reading is scored, never held with the forged one shown first
    busy = verdict(ev(graph(5.7), busiest=26, own=2))
    assert busy.outcome == "unsteady" and busy.scored_ms == 5.7 and not busy.held
    assert busy.message.startswith("scored at the slower reading: 5.7000 ms per call")
    assert "24 threads of other jobs ready to run on its 16 CPUs" in busy.unsteady


def test_unsteady_replays_withhold_an_accusation_but_never_the_slower_figure():
    spread = STEADY_REPS + ((1.0, 1.0, 1.0 * (1 + M.steady) + 1e-3),)
    got = verdict(ev(graph(2.0), placements=spread))
    assert got.outcome == "unsteady" and got.scored_ms == 2.0 and "took from 1.0000 to 1.2510 ms" in got.unsteady
    assert verdict(ev(graph(2.0), placements=STEADY_REPS + ((1.0, 1.0 * (1 + M.steady) - 1e-3),))).outcome == "slower"
    assert decision.unsteady(ev(busiest=16, cpus=16)) == ""  # as many ready as CPUs: steady
    assert decision.unsteady(ev(busiest=17, cpus=16)) != ""


def test_a_figure_that_measured_nothing_is_named_and_the_others_decide():
    got = verdict(ev(graph(-1.4), queued(1.0)))
    assert got.outcome == "agrees" and got.set_aside and "measured nothing" in got.set_aside[0]
    held = verdict(ev(graph(-0.5)))
    assert held.message.startswith("the grader's own clock could not time your function's calls")
    assert "(1.0000 ms) could not be confirmed" in held.message


def test_ratios_are_over_the_replayed_time_and_no_replayed_time_never_divides_by_zero():
    assert verdict(ev(graph(1.0), replay=2.0)).ratio == 0.5
    assert verdict(ev(graph(1.0), replay=0.0)).ratio == float("inf")


def test_every_margin_lives_in_one_frozen_record():
    with pytest.raises(AttributeError):
        MARGINS.spread = 1.0  # type: ignore[misc]
    wide = Margins(spread=0.5)
    assert verdict(ev(graph(1.2))).outcome == "clock" and verdict(ev(graph(1.2)), wide).outcome == "agrees"


REPLAYED = "1.0000 ms for the kernels your function's record names, replayed"
IN_A_GRAPH = "captured in a CUDA graph (no host work in it)"
QUEUED_WORDS = "queued eagerly behind a GPU gate (your Python at every call, its host work hidden)"
BUSY_WORDS = "the host had 40 threads of other jobs ready to run on its 16 CPUs while the calls were timed"
NOTHING = "measured nothing ({} ms per call: the reference's burst beside it took longer than its own work explains)"


@pytest.mark.parametrize("evidence, message", [
    (ev(graph(-0.5), queued(0.0)),
     f"the grader's own clock could not time your function's calls (graph burst: {NOTHING.format('-0.5000')}; queued "
     f"burst: {NOTHING.format('0.0000')}), so the replayed figure (1.0000 ms) could not be confirmed"),
    (ev(graph(0.5), queued(1.0)),
     f"your function's own calls are faster than the kernels its record names (0.5000 ms per call by the grader's "
     f"clock over 50 calls on fresh inputs, {IN_A_GRAPH}; {REPLAYED}): the calls did less work than their record says"),
    (ev(graph(0.5), queued(1.3), **BUSY),
     f"scored at the slower reading (1.3000 ms per call): the grader's clock read your calls faster than their record "
     f"(0.5000 ms per call by the grader's clock over 50 calls on fresh inputs, {IN_A_GRAPH}; {REPLAYED}), but "
     f"{BUSY_WORDS}"),
    (ev(graph(1.0), queued(2.0)),
     f"your function's own calls are 2.00x slower than the kernels its record names (2.0000 ms per call by the "
     f"grader's clock over 64 calls on fresh inputs, {QUEUED_WORDS}; {REPLAYED}): the calls do not run what their "
     "record says"),
    (ev(graph(1.0), queued(2.0), **BUSY),
     f"scored at the slower reading: 2.0000 ms per call by the grader's clock over 64 calls on fresh inputs, "
     f"{QUEUED_WORDS}; {REPLAYED} ({BUSY_WORDS}, so no finding, but the slower figure counts)"),
    (ev(graph(1.2)),
     f"scored on the grader's own clock: 1.2000 ms per call by the grader's clock over 50 calls on fresh inputs, "
     f"{IN_A_GRAPH}; {REPLAYED}; your function's own calls are slower than its recorded ones"),
    (ev(eager(3.0), capturable=False),
     "scored on the grader's own clock: 3.0000 ms per call by the grader's clock over 50 calls on fresh inputs, run "
     f"eagerly, synchronized after each call (its host work in it); {REPLAYED}; your function could not be captured "
     "in a CUDA graph (it synchronizes), so its host work counts"),
    (ev(graph(1.0), queued(3.0, host_work=True)),
     "scored on the grader's own clock: 3.0000 ms per call by the grader's clock over 64 calls on fresh inputs, "
     f"queued eagerly behind a GPU gate shorter than your Python's host work (that work in it); {REPLAYED}; your "
     "function's own host work outran the grader's gate, so it counts"),
    (ev(graph(1.05)), ""),
])
def test_each_outcome_reads_exactly(evidence, message):
    assert verdict(evidence).message == message


def test_each_verdict_carries_exactly_its_figures():
    assert verdict(ev(graph(0.5), queued(1.3), **BUSY)) == decision.SpeedVerdict(
        "unsteady", 1.3, QUEUED, 0.5, 1.0, verdict(ev(graph(0.5), queued(1.3), **BUSY)).message, BUSY_WORDS, ())
    assert verdict(ev(graph(0.5), **BUSY)).scored_from == "replay"  # the replay the slower reading there
    agrees = verdict(ev(graph(1.05), queued(0.98)))
    assert (agrees.scored_ms, agrees.clock_ms, agrees.replay_ms, agrees.unsteady) == (1.0, 1.05, 1.0, "")
    slower = verdict(ev(graph(1.0), queued(2.0)))
    assert (slower.scored_ms, slower.scored_from, slower.clock_ms, slower.ratio) == (2.0, QUEUED, 2.0, 2.0)
    faster = verdict(ev(graph(0.5), queued(0.6)))
    assert (faster.scored_ms, faster.scored_from, faster.clock_ms) == (1.0, "replay", 0.5)  # the fastest figure named
    # an unsteady host's reason is kept even where the figures agree (no finding to withhold)
    assert verdict(ev(graph(1.0), **BUSY)).unsteady == BUSY_WORDS and verdict(ev(graph(1.0), **BUSY)).outcome == "agrees"


def test_the_students_threads_are_taken_off_exactly():
    assert decision.unsteady(ev(busiest=20, own=4, cpus=16)) == ""  # 16 others on 16 CPUs: steady
    assert decision.unsteady(ev(busiest=21, own=4, cpus=16)) == (
        "the host had 17 threads of other jobs ready to run on its 16 CPUs while the calls were timed")
    assert decision.unsteady(ev(placements=((0.0, 1.0, 1.2),))) == ""  # a rep that measured nothing is not a spread
    assert decision.unsteady(ev(placements=((1.3,),))) == ""  # one rep: no spread


EXACT = Margins(spread=0.5, fast=0.5, eager_fast=0.75, slow=1.0, launch_slack_ms=0.25, steady=0.5)  # edges in binary


@pytest.mark.parametrize("ms, outcome", [(2.25, "clock"), (2.2500001, "slower"), (1.5, "agrees"), (1.5000001, "clock"),
                                         (0.25, "agrees"), (0.2499999, "faster")])
def test_each_edge_belongs_to_the_milder_side(ms, outcome):
    assert verdict(ev(graph(ms)), EXACT).outcome == outcome


def test_the_steadiness_edge_and_its_margin_are_the_records():
    assert decision.unsteady(ev(placements=((1.0, 1.5),)), EXACT) == ""  # exactly the margin: steady
    assert decision.unsteady(ev(placements=((1.0, 1.75),)), EXACT) != ""  # two reps are enough to spread
    assert decision.unsteady(ev(placements=((0.5, 0.9),)), EXACT) != ""  # a ratio, not a product
    # the verdict reads steadiness with its own margins: steady under EXACT, unsteady under the defaults
    spread = ((1.0, 1.4),)
    assert verdict(ev(graph(3.0), placements=spread), EXACT).outcome == "slower"
    assert verdict(ev(graph(3.0), placements=spread)).outcome == "unsteady"


GONE = "graph burst: " + NOTHING.format("-1.0000")


@pytest.mark.parametrize("evidence, expected", [
    (ev(graph(-1.0), queued(2.0)), ("slower", 2.0, QUEUED, 2.0, 1.0, "", (GONE,))),
    (ev(graph(-1.0), queued(0.5)), ("faster", 1.0, "replay", 0.5, 1.0, "", (GONE,))),
    (ev(graph(-1.0), queued(0.5), **BUSY), ("unsteady", 1.0, "replay", 0.5, 1.0, BUSY_WORDS, (GONE,))),
    (ev(graph(-1.0), queued(2.0), **BUSY), ("unsteady", 2.0, QUEUED, 2.0, 1.0, BUSY_WORDS, (GONE,))),
    (ev(graph(-1.0), queued(1.2), **BUSY), ("clock", 1.2, QUEUED, 1.2, 1.0, BUSY_WORDS, (GONE,))),
    (ev(graph(-1.0)), ("unclear", 1.0, "replay", 0.0, 1.0, "", (GONE,))),
])
def test_every_verdict_keeps_its_figures_its_reason_and_what_measured_nothing(evidence, expected):
    got = verdict(evidence)
    assert (got.outcome, got.scored_ms, got.scored_from, got.clock_ms, got.replay_ms, got.unsteady, got.set_aside) \
        == expected, got


def test_streams_replayed_one_after_another_still_score_slower_calls_slower():
    """Overlap explains calls faster than a serialized replay, never slower ones."""
    got = verdict(ev(graph(1.0), queued(2.0), streams=2))
    assert (got.outcome, got.scored_ms) == ("slower", 2.0), got
    got = verdict(ev(graph(1.0), queued(1.2), streams=2))
    assert (got.outcome, got.scored_ms) == ("clock", 1.2), got
