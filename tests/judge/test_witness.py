"""The grader's own clock on the student's calls (grader.judge.witness): how its brackets become a
per-call figure, when a worker's figures are confirmed, scored over, or called forged, and the
refusal of a reply written ahead. The bursts themselves run on a GPU (tests/gpu/test_gpu.py)."""

from __future__ import annotations

import math
import os

import pytest

from grader import protocol
from grader.judge import perf, witness
from grader.judge.witness import Witness, confirm, disagreement
from grader.results import Severity
from grader.sandbox.process import WorkerProcess


def _witness(student_ms: float, reference_ms: float, calls: int = 20, rounds: int = 5, eager: str = "",
             overhead_s: float = 0.004) -> Witness:
    """Brackets of `rounds` bursts whose calls take these true times, plus the protocol's own cost."""
    return Witness(calls=calls, student_s=[overhead_s + calls * student_ms / 1e3] * rounds,
                   reference_s=[overhead_s + calls * reference_ms / 1e3] * rounds, eager=eager)


def test_the_per_call_figure_is_the_reference_time_plus_the_difference_of_the_brackets():
    w = Witness(calls=10, student_s=[0.030, 0.031], reference_s=[0.020, 0.020])
    assert w.per_call_ms([1.0, 1.1]) == pytest.approx([2.0, 2.2])


def test_calls_per_burst_follow_the_reference_time_within_bounds():
    assert witness.burst_calls(1.0) == 40
    assert witness.burst_calls(0.001) == witness.MAX_CALLS
    assert witness.burst_calls(100.0) == witness.MIN_CALLS
    assert witness.burst_calls(0.0) == witness.MAX_CALLS
    # a result of 1 GiB: no more calls than the burst's memory holds, never fewer than the least
    assert witness.burst_calls(0.001, 1 << 30) == witness.BURST_MEMORY >> 30
    assert witness.burst_calls(0.001, 1 << 40) == witness.MIN_CALLS


def test_every_witnessed_round_is_a_round_the_timing_always_runs():
    """The last burst lets the burst's memory go; it must come in a round that always runs."""
    assert witness.ROUNDS <= perf.MIN_ROUNDS


def test_seeds_are_new_each_time():
    assert len({witness.new_seed() for _ in range(50)}) == 50


def test_an_honest_worker_is_confirmed():
    c = confirm(_witness(1.30, 1.0), [1.30] * 5, [1.0] * 5, host_ms=1.4)
    assert c.confirmed and not c.tampered and not c.note
    assert c.agreement == pytest.approx(1.0)


def test_noise_within_the_margin_is_confirmed():
    c = confirm(_witness(1.30 * (1 + witness.AGREEMENT_MARGIN / 2), 1.0), [1.30] * 5, [1.0] * 5, host_ms=1.4)
    assert c.confirmed


def test_a_worker_faster_than_the_grader_clock_shows_is_confirmed_only_as_a_bound():
    """The grader's clock is a floor under nothing: a worker reporting more than it shows is not
    helped by it (its own, slower figure is scored)."""
    c = confirm(_witness(1.0, 1.0), [1.3] * 5, [1.0] * 5, host_ms=1.4)
    assert c.confirmed and c.agreement < 1


def test_figures_shortened_by_a_fifth_under_a_cuda_graph_are_called_forged_with_both_figures():
    c = confirm(_witness(1.30, 1.0), [1.04] * 5, [1.0] * 5, host_ms=1.4)
    assert not c.confirmed and c.tampered
    assert "20% shorter than the grader's own clock" in c.tampered and "1.0400 ms" in c.tampered and "1.3000 ms" in c.tampered
    assert "CUDA graph" in c.tampered


def test_eagerly_timed_the_worker_host_clock_decides_whether_it_is_forgery():
    eager = "RuntimeError: operation not permitted when stream is capturing"
    # host work, honestly reported: the host clock says a whole call takes longer than back to back
    honest = confirm(_witness(1.30, 1.0, eager=eager), [1.04] * 5, [1.0] * 5, host_ms=1.45)
    assert not honest.confirmed and not honest.tampered
    assert "scored on the grader's own clock" in honest.note and "could not be captured in a CUDA graph" in honest.note
    # the host clock forged too: it claims a whole call in less than the calls take back to back
    forged = confirm(_witness(1.30, 1.0, eager=eager), [1.04] * 5, [1.0] * 5, host_ms=1.05)
    assert forged.tampered and "its own host clock claims 1.0500 ms" in forged.tampered


def test_a_disagreement_between_the_margins_moves_the_score_and_accuses_nobody():
    c = confirm(_witness(1.30, 1.0), [1.30 / 1.12] * 5, [1.0] * 5, host_ms=1.4)
    assert not c.confirmed and not c.tampered and "larger than timing noise" in c.note
    assert c.student_ms == pytest.approx([1.30] * 5)


def test_samples_that_match_the_reference_agree():
    ref = [[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]]
    near = [[v * (1 + 1e-3) for v in row] for row in ref]
    assert disagreement(near, ref, atol=1e-3, rtol=1e-3) == ""


def test_reused_results_are_wrong_and_said_so():
    ref = [[1.0, -2.0, 0.5, 0.7], [3.0, 0.1, -1.0, 2.0]]
    stale = [ref[0], ref[0]]  # the first call's results sent again for the second
    said = disagreement(stale, ref, atol=1e-3, rtol=1e-3)
    assert said.startswith("4 of 8 sampled elements wrong (call 2 of 2: 1 where the reference has 3)")


def test_nan_and_a_wrong_shape_are_wrong():
    assert "1 of 2" in disagreement([[math.nan, 1.0]], [[1.0, 1.0]], atol=1e-3, rtol=1e-3)
    assert disagreement([[1.0]], [[1.0, 2.0]], atol=1e-3, rtol=1e-3) == "the samples do not have the expected shape"
    assert disagreement([], [[1.0]], atol=1e-3, rtol=1e-3) == "the samples do not have the expected shape"


def test_without_an_oracle_only_elements_both_kept_are_compared():
    """Dropout: the student's mask is its own; where both kept an element its value must agree."""
    ref = [[2.0, 0.0, 4.0, 0.0]]
    own_mask = [[0.0, 6.0, 4.0, 0.0]]
    assert disagreement(own_mask, ref, atol=1e-6, rtol=1e-5, oracle=False) == ""
    stale = [[0.0, 6.0, 5.0, 0.0]]
    assert "1 of 1 sampled elements wrong" in disagreement(stale, ref, atol=1e-6, rtol=1e-5, oracle=False)


def _pipe_worker():
    rx, tx = os.pipe()
    w = object.__new__(WorkerProcess)
    w._rx, w._buffer = rx, b""
    return w, tx


def test_a_reply_written_ahead_is_seen_and_refused():
    w, tx = _pipe_worker()
    try:
        assert not w.unasked()
        os.write(tx, b'{"ok": true, "values": []}\n')
        assert w.unasked()
        with pytest.raises(witness.WitnessRefused, match="before it was asked"):
            witness.bracketed(w, "student", 1, timeout=1)
    finally:
        os.close(tx)
        os.close(w._rx)


def test_the_burst_messages_travel_and_are_checked():
    for message in (protocol.PrepareBurst("student", "/in/set0.safetensors", {"x": {}}, 20, 16), protocol.RunBurst("student", 7),
                    protocol.PrepareBurst("student", "/in/set0.safetensors", {}, 64, 16, graph=False, queued=True),
                    protocol.RunBurst("student", 7, gate_ms=120.5)):
        assert protocol.decode_request(protocol.encode(message)) == message
    reply = protocol.decode_reply(protocol.RunBurst("student", 7), protocol.encode(protocol.BurstReply([[1.0, math.nan]])))
    assert reply.values[0][0] == 1.0 and math.isnan(reply.values[0][1])
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_reply(protocol.RunBurst("student", 7), '{"ok": true, "values": "fast"}')
    with pytest.raises(protocol.ProtocolError):  # a reply for another request does not pass for one
        protocol.decode_reply(protocol.PrepareBurst("student", "x", {}, 4, 16), '{"ok": true, "values": []}')


def _timings(worker_ms: float, reference_ms: float, w: Witness, unfinished: list[str] | None = None) -> perf.Timings:
    t = perf.Timings(times={"student": [[worker_ms] * 3] * 5, "reference": [[reference_ms] * 3] * 5},
                     host_ms={"student": [[worker_ms + 0.2]] * 5, "reference": [[reference_ms + 0.2]] * 5})
    t.witness = w
    t.unfinished = unfinished or []
    return t


def test_the_timing_stage_keeps_an_honest_worker_figures():
    t = _timings(1.3, 1.0, _witness(1.3, 1.0))
    findings: list = []
    details = perf._witnessed(t, findings)
    assert details and details.confirmed and details.graph and not findings
    assert t.times["student"][0] == [1.3] * 3


def test_the_timing_stage_scores_over_a_short_figure_and_flags_a_forged_one():
    t = _timings(1.3 / 1.12, 1.0, _witness(1.3, 1.0))
    findings: list = []
    details = perf._witnessed(t, findings)
    assert not findings and details and not details.confirmed and "scored on the grader's own clock" in (details.note or "")
    # results.json's witness: the keys in the order it always had them (no "eager": the burst was a graph)
    assert list(details.to_json()) == ["calls", "cost_s", "prepare_s", "agreement", "confirmed", "graph", "student_ms",
                                       "worker_ms", "brackets_ms", "note"]
    assert t.times["student"][0] == pytest.approx([1.3] * 3)  # the score comes from the grader's clock
    forged = _timings(1.04, 1.0, _witness(1.3, 1.0))
    findings = []
    perf._witnessed(forged, findings)
    assert [f.severity for f in findings] == [Severity.CONCLUSIVE] and "shorter than the grader's own clock" in findings[0].text


def test_wrong_burst_results_are_conclusive_unless_calls_return_unfinished():
    w = _witness(1.3, 1.0)
    w.wrong = "4 of 8 sampled elements wrong"
    findings: list = []
    perf._witnessed(_timings(1.3, 1.0, w), findings)
    assert findings[0].severity == Severity.CONCLUSIVE and "results reused, or not computed" in findings[0].text
    findings = []
    perf._witnessed(_timings(1.3, 1.0, w, unfinished=["call 3"]), findings)
    assert findings[0].severity == Severity.REVIEW and "returns before its work is done" in findings[0].text


class _FakeWorker:
    """A worker as the timing stage sees it: prepares bursts and answers them with samples drawn
    from the seed (the same for every honest contender), logging each request in `log`."""

    def __init__(self, name: str, log: list, eager: str = "", stale: bool = False, fails: bool = False, ahead: bool = False):
        self.name, self.log, self.eager, self.stale, self.fails, self.ahead = name, log, eager, stale, fails, ahead
        self.kept = None
        self.timeouts: list[float] = []

    def unasked(self) -> bool:
        return self.ahead

    def request(self, message, timeout):
        self.log.append((self.name, message))
        self.timeouts.append(timeout)
        if isinstance(message, protocol.PrepareBurst):
            self.calls = message.calls
            return protocol.BurstReady(eager=self.eager if message.graph else "asked to run eagerly")
        if self.fails:
            return protocol.Failure("error", "RuntimeError: the burst broke")
        rng = __import__("random").Random(message.seed)
        values = [[rng.uniform(-1, 1) for _ in range(witness.SAMPLES)] for _ in range(self.calls)]
        if self.stale:
            self.kept = self.kept or values
            return protocol.BurstReply(self.kept)
        return protocol.BurstReply(values)


def _run_bursts(student: _FakeWorker, reference: _FakeWorker, rounds: int = witness.ROUNDS, student_ms: float = 1.0):
    from tests.conftest import COURSE

    spec = COURSE.get("vector_add")
    t = perf.Timings(times={"student": [[student_ms]] * rounds, "reference": [[0.5]] * rounds}, output_numel=1 << 20)
    workers = {"student": student, "reference": reference}
    for r in range(rounds):
        failed = perf._bursts(spec, workers, t, __file__, {}, 10.0, r)
        if failed:
            return t, failed
    return t, None


def test_the_timing_stage_prepares_both_bursts_then_brackets_each_round_in_turn():
    log: list = []
    t, failed = _run_bursts(_FakeWorker("student", log), _FakeWorker("reference", log))
    assert failed is None and not t.witness.wrong and not t.witness.eager
    prepares = [(who, m) for who, m in log if isinstance(m, protocol.PrepareBurst)]
    assert sorted(who for who, _ in prepares) == ["reference", "student"] and all(m.graph for _, m in prepares)
    assert prepares[0][1].calls == witness.burst_calls(0.5, (1 << 20) * 4)
    bursts = [(who, m) for who, m in log if isinstance(m, protocol.RunBurst)]
    assert len(t.witness.student_s) == len(t.witness.reference_s) == witness.ROUNDS
    # one seed per round, told to both; the order alternates; the last round lets the bursts go
    for r in range(witness.ROUNDS):
        (a, ma), (b, mb) = bursts[2 * r], bursts[2 * r + 1]
        assert ma.seed == mb.seed and (a, b) == (("student", "reference") if r % 2 == 0 else ("reference", "student"))
        assert ma.last == mb.last == (r == witness.ROUNDS - 1)
    assert len({m.seed for _, m in bursts}) == witness.ROUNDS


def test_a_kernel_far_slower_than_the_reference_is_given_the_time_its_burst_needs():
    """The calls per burst follow the reference's time (which the student cannot move), so a burst
    of a kernel 1,000x slower takes 1,000x longer: it is waited for, not timed out."""
    student = _FakeWorker("student", [])
    _run_bursts(student, _FakeWorker("reference", []), rounds=1, student_ms=500.0)
    calls = witness.burst_calls(0.5, (1 << 20) * 4)
    assert student.timeouts[-1] == pytest.approx(4 * calls * 0.5) and student.timeouts[-1] > 20.0


def test_an_uncapturable_student_burst_gets_an_eager_reference_mirror():
    log: list = []
    t, _ = _run_bursts(_FakeWorker("student", log, eager="RuntimeError: capture"), _FakeWorker("reference", log), rounds=1)
    assert t.witness.eager == "RuntimeError: capture"
    reference_prepares = [m for who, m in log if who == "reference" and isinstance(m, protocol.PrepareBurst)]
    assert [m.graph for m in reference_prepares] == [True, False]


def test_the_workers_reason_for_an_eager_burst_is_bounded_and_shown_inert():
    """The reason comes from the student's worker and ends in the message a student and a TA read."""
    log: list = []
    hostile = "\x1b]0;owned\x07\x1b[2J" + "x" * 100_000
    t, _ = _run_bursts(_FakeWorker("student", log, eager=hostile), _FakeWorker("reference", log), rounds=1)
    assert len(t.witness.eager) <= 300 and "\x1b" not in t.witness.eager and t.witness.eager.startswith("\\x1b]0;owned")
    c = confirm(_witness(1.30, 1.0, eager=t.witness.eager), [1.19] * 5, [1.0] * 5, host_ms=1.45)
    assert "\x1b" not in c.note and len(c.note) < 600


def test_stale_burst_results_are_recorded_as_wrong():
    log: list = []
    t, _ = _run_bursts(_FakeWorker("student", log, stale=True), _FakeWorker("reference", log))
    assert "sampled elements wrong (call 1 of" in t.witness.wrong


def test_a_student_burst_that_fails_ends_the_timing_as_its_own_failure_and_a_reference_one_as_ours():
    log: list = []
    _, failed = _run_bursts(_FakeWorker("student", log, fails=True), _FakeWorker("reference", log))
    assert failed[0] == "student" and "the burst broke" in failed[1].message
    from grader.sandbox.process import WorkerFailure

    with pytest.raises(WorkerFailure, match="the reference's burst failed"):
        _run_bursts(_FakeWorker("student", []), _FakeWorker("reference", [], fails=True))


def test_a_reply_written_ahead_stops_the_witness_before_anything_is_prepared():
    log: list = []
    with pytest.raises(witness.WitnessRefused):
        _run_bursts(_FakeWorker("student", log, ahead=True), _FakeWorker("reference", log))
    assert log == []


def test_a_busy_host_turns_the_fallbacks_forgery_finding_into_the_clocks_score_without_accusation(monkeypatch):
    """The fallback's brackets are the grader's host clock too: with more threads ready to run than
    CPUs around them, the worker's figures looking short beside them accuse no one; the score still
    comes from the clock (the slower figure), and the note says why there is no finding."""
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 16)
    w = _witness(1.3, 1.0)
    w.busiest = w.others = 40  # other jobs' threads, not the student's
    forged = _timings(1.04, 1.0, w)
    findings: list = []
    details = perf._witnessed(forged, findings)
    assert not findings and details and not details.confirmed
    assert details.note.startswith("scored on the grader's own clock, no accusation (the host had 40 threads of other jobs ready to "
                                   "run on its 16 CPUs while the calls were timed): the worker's timings are")
    assert forged.times["student"][0] == pytest.approx([1.3] * 3)
    w.busiest = w.others = 16  # as many as CPUs: steady, the finding stands
    findings = []
    perf._witnessed(_timings(1.04, 1.0, w), findings)
    assert [f.severity for f in findings] == [Severity.CONCLUSIVE]


def test_the_fallback_compiles_the_clocks_kernel_in_both_workers_with_the_gpu_shared_before_its_hold(tmp_path):
    """The burst's own kernel costs seconds at its first launch in a process: each worker is asked to
    compile it (WarmBurst) while the GPU is held shared, so that the exclusive hold does not wait on a
    compiler (grader.judge.perf._warm_bursts, called by the fallback before its hold)."""
    import contextlib
    from types import SimpleNamespace

    import torch

    from grader.codec import write_inputs

    log: list = []

    @contextlib.contextmanager
    def shared():
        log.append("shared+")
        yield
        log.append("shared-")

    workers = {c: SimpleNamespace(request=lambda m, t, c=c: log.append((c, m)) or protocol.Ok())
               for c in ("student", "reference")}
    stage = SimpleNamespace(session=SimpleNamespace(sharing_gpu=shared), timeout=10.0)
    inputs = tmp_path / "set0.safetensors"
    write_inputs({"x": torch.zeros(8, dtype=torch.float16), "w": torch.zeros(4), "idx": torch.arange(3), "eps": 1e-5},
                 inputs)
    perf._warm_bursts(stage, workers, str(inputs))
    warm = protocol.WarmBurst(["float16", "float32"])  # the set's floating dtypes, from its header: nothing loaded
    assert log == ["shared+", ("student", warm), "shared-", "shared+", ("reference", warm), "shared-"]


def test_the_students_own_threads_are_kept_apart_from_the_hosts_run_queue(monkeypatch):
    """note_load: the host's queue, and how much of it was not the student's own (its threads
    spinning never make the host look too busy to accuse it: grader.judge.timing.decision)."""
    from grader.judge import witness as w_

    monkeypatch.setattr(w_.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(w_.proctable, "runnable", lambda: 40)
    monkeypatch.setattr(w_.proctable, "running_threads", lambda pids: 30 if pids == {7, 8} else 0)
    w = w_.Witness(student=lambda: {7, 8})
    w.note_load()
    assert (w.busiest, w.others) == (40, 10)
    monkeypatch.setattr(w_.proctable, "runnable", lambda: 12)  # as many as CPUs or fewer: not read, all "others"
    monkeypatch.setattr(w_.proctable, "running_threads", lambda pids: pytest.fail("read on a quiet host"))
    w.note_load()
    assert (w.busiest, w.others) == (40, 12)
    alone = w_.Witness()  # no student named (the reference alone): the whole queue is others'
    monkeypatch.setattr(w_.proctable, "runnable", lambda: 40)
    alone.note_load()
    assert alone.others == 40
