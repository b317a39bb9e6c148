"""The timing stage's scored path (grader.judge.perf._by_replay, grader.judge.replay_stage) on the
CPU, with fake workers that answer as real ones do and a fake replay process: what the stage
decides from each kind of record and replay, and that an honest record is scored on the
replay's own times, placement by placement. The GPU halves are in tests/gpu/test_replay_gpu.py."""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from grader import proctable
from grader.codec import write_inputs
from grader.judge import perf, replay_process, replay_stage, witness
from grader.judge.timing import confirmation
from grader.judge.context import GradingContext
from grader import protocol as p
from grader.protocol import Call, CallReply, Compare, CompareReply, Failure, Ok, Sample, Time
from grader.results import Outcome
from grader.settings import Settings
from tests.conftest import COURSE
from tests.replay.test_launchrecord import _record

N = 4096
CALLS = 8  # calls per burst of the grader's clock (as at vector_add's timing size)
SPEC = COURSE.get("vector_add")
ROOFLINE = {"copy_gbps": 1e9, "gpu": "fake", "gemm_tflops": {}}
SETTINGS = Settings(threads=3, sandbox_uids="70000-70010")  # the session's: what its replay processes start with


def _d(result) -> dict:
    """A result's details as results.json has them."""
    return result.details.to_json()


class FakeWorker:
    """A worker's answers: recorded calls write a launch record (changed by `edit`), whole
    results are written as the worker's Sample does, Time replies carry fixed times."""

    def __init__(self, result: torch.Tensor, ops=(), edit=None, fail_record: str = "", can_write: bool = False) -> None:
        self.result, self.ops, self.edit, self.fail_record = result, list(ops), edit, fail_record
        self.kept: dict[str, torch.Tensor] = {}
        self.closed = False
        # the worker's process as the timing stage reaches it: bursts for the grader's clock go to it; its isolation
        # as grader.sandbox.files.worker_cannot_write reads it (`can_write`: it runs as the grader's uid, unmounted)
        isolation = SimpleNamespace(mode="plain" if can_write else "sandbox", user_switch=not can_write,
                                    namespaces=False)
        self.process = SimpleNamespace(proc=SimpleNamespace(pid=999_999_999), request=self.request,
                                       unasked=lambda: False, isolation=isolation)
        self.eager = ""  # why its burst cannot be a CUDA graph ("" where it can)
        self.prepared: list[p.PrepareBurst] = []
        self.let_go: list[str] = []
        self.calls = 0
        self.timed = 0  # torch's rounds asked for (Time requests)
        self.log: list | None = None  # the stage's events, where a test wants this worker's warm-ups among them
        self.name = ""

    def sharing_gpu(self):
        return contextlib.nullcontext()

    def request(self, message, timeout):
        if isinstance(message, Call):
            if self.fail_record and message.record_launches:
                return Failure("error", self.fail_record)
            self.kept[message.key] = self.result.clone()
            if message.record_launches:
                folder = Path(message.record_launches)
                folder.mkdir(parents=True, exist_ok=True)
                raw = _record(folder)
                if self.edit:
                    self.edit(raw, self.calls)
                self.calls += 1
                (folder / "launches.json").write_text(json.dumps(raw))
            return CallReply(ops=self.ops, launches=1, numel=self.result.numel())
        if isinstance(message, Sample):  # as grader.worker.server does it, over what this fake keeps
            from grader.worker import server

            worker = server.Worker.__new__(server.Worker)
            worker.torch, worker.retained = torch, {(message.contender, k): v for k, v in self.kept.items()}
            return worker.sample(message)
        if isinstance(message, Compare):  # the trusted worker's comparison, as grader.worker.server does it
            return self.compare(message)
        if isinstance(message, p.DropBurst):  # untimed: a burst let go, not run again
            self.let_go.append(message.contender)
            return Ok()
        if isinstance(message, p.WarmBurst):  # untimed: the grader's clock's own kernel compiled ahead
            if self.log is not None:
                self.log.append(f"warm {self.name}")
            return Ok()
        if isinstance(message, p.PrepareBurst):
            self.prepared.append(message)
            return p.BurstReady(eager=self.eager if message.graph else "asked to run eagerly")
        if isinstance(message, Time):
            self.timed += 1
            return SimpleNamespace(host_ms=[0.5] * 3, first_call_ms=1.0)
        raise AssertionError(message)

    def close(self):
        self.closed = True

    def unasked(self) -> bool:  # a reply written before its request: none here
        return False

    def compare(self, req):
        """The trusted worker's own comparison (grader.worker.server.Worker.compare), over what
        this fake keeps."""
        from grader.worker import server

        worker = server.Worker.__new__(server.Worker)  # only its comparison: no torch set-up
        worker.torch, worker.retained = torch, {("kept", k): v for k, v in self.kept.items()}
        reply = worker.compare(req)
        self.kept.update({k: v for (_, k), v in worker.retained.items()})
        return p.decode_reply(req, p.encode(reply))  # through the pipe's encoding, as the real worker's reply comes


class FakeReplay:
    """A replay process as the session's factory hands one to the stage (ReplayProcess): the
    record it is given noted in `asked`, each step in `events`; at `go` it answers `answers[who]`
    (a dict of times and result, a Replayed, or an exception raised when its record is placed),
    its result folder written as the real one writes it."""

    def __init__(self, job: Path, placements: int, answers: dict, truth: torch.Tensor, asked: list,
                 events: list) -> None:
        self.job, self.placements, self.answers, self.truth = job, placements, answers, truth
        self.asked, self.events = asked, events
        self.who = ""
        self.stopped = False

    def place(self, record, inputs, layout):
        self.who = "reference" if Path(record).name == "reference" else "student"
        self.asked.append((self.who, self.placements))
        got = self.answers.get(self.who, {})
        if isinstance(got, Exception):
            raise got
        return got if isinstance(got, replay_process.Replayed) else self

    def loaded(self):
        return self

    def arm(self):
        self.events.append(f"arm {self.who}")
        return self

    def go(self, allowed=frozenset()):
        self.events.append(f"go {self.who}")
        got = self.answers.get(self.who, {})
        out = self.job / "result"
        out.mkdir(parents=True)
        result = got.get("result", self.truth)
        save_file({"output.0": result.clone()}, str(out / "last.safetensors"))
        placements = got.get("placements", [[1.0] * 8] * 6)
        ms = [t for p in placements for t in p]
        finite = result[torch.isfinite(result)].double()
        sums = got.get("sums", [[[float(finite.sum()), float(finite.abs().sum()),
                                  float((~torch.isfinite(result)).sum())]]] * len(ms))
        return replay_process.Replayed(ms=ms, folder=out, placements=placements, others=got.get("others", []),
                                       sums=sums, pending=self)

    def settle(self, replay, picks=None):
        """As the real replay does when told the judge's indices: only the elements there."""
        self.events.append(f"settle {self.who}")
        self.stopped = True
        self.picks = picks
        if picks is not None and replay.folder is not None:
            whole = load_file(str(replay.folder / "last.safetensors"))["output.0"].reshape(-1)
            idx = load_file(str(picks))["idx"]
            save_file({"output.0": whole[idx].contiguous(), "numel.output.0": torch.tensor([whole.numel()])},
                      str(replay.folder / "last.safetensors"))
        return replay

    def cancel(self):
        self.stopped = True

    def stop(self):
        self.stopped = True


@pytest.fixture
def stage(tmp_path, monkeypatch):
    """Runs `_by_replay` with the given workers and replay answers; returns the TestResult (or
    the fallback's reason) and what the fake replay was asked."""
    x, y = torch.randn(N), torch.randn(N)
    workdir = tmp_path / "job" / "vector_add"
    workdir.mkdir(parents=True)
    files = []
    layout = None
    for i in range(2):
        layout = write_inputs({"x": x, "y": y}, tmp_path / f"set{i}.safetensors")
        files.append(str(tmp_path / f"set{i}.safetensors"))
    truth = x + y
    monkeypatch.setattr(perf, "call_times", lambda reply: ([0.4] * 3, [0.4] * 3, None))
    monkeypatch.setattr(replay_stage, "stop_student", lambda student: (student.close() or "", {4242}))
    # a quiet host around every bracket and replay (this machine's own run queue is not the test's): a test sets
    # `run.load` to the threads ready to run it wants the stage to see
    monkeypatch.setattr(proctable, "runnable", lambda: run.load)
    asked, events, spawned, brackets = [], [], [], []

    @contextlib.contextmanager
    def held(lock):  # the session's GPU locks, each taking and release noted in order
        events.append(f"{lock}+")
        yield
        events.append(f"{lock}-")

    def run(student, trusted=None, replays=None, store=None, cache=None, clock_ms=None, samples=None,
            eager_ms=None, eager_samples=None, queued_ms=None):
        """`clock_ms`: the student's time per call by the grader's clock (its bursts' brackets), by
        default its replayed median; `samples`: what its bursts' samples are (the reference's: 1.0);
        `eager_*`: the same of the eager round after the graph's (by default as the graph's);
        `queued_ms`: what the student's worker says its calls took to queue, per gated round (0)."""
        trusted = trusted or FakeWorker(truth)
        for worker, name in ((student, "student"), (trusted, "trusted")):
            if isinstance(worker, FakeWorker):
                worker.log, worker.name = events, name
        answers = dict(replays or {})
        got_student = answers.get("student", {})
        replay_ms = statistics.median(t for p_ in got_student.get("placements", [[1.0]]) for t in p_) \
            if isinstance(got_student, dict) else 1.0

        def fake_bracketed(worker, c, seed, timeout, last=False, gate_ms=0.0):  # the grader's clock around a burst
            checked = len(brackets) >= 2 * confirmation.BURST_ROUNDS  # the eager round after the graph's
            brackets.append((c, last))
            calls = confirmation.EAGER_CALLS if checked else CALLS
            per_call = 1.0 if c == "reference" else (replay_ms if clock_ms is None else clock_ms)
            if checked and eager_ms is not None and c == "student":  # one figure, or one per eager round
                # the queued burst's first round (ungated, sizing the gate) reads as its first gated one
                eager_round = max(0, (len(brackets) - 1 - 2 * confirmation.BURST_ROUNDS) // 2 - 1)
                per_call = eager_ms[eager_round] if isinstance(eager_ms, list) else eager_ms
            values = [[1.0] * 4] * calls if c == "reference" or samples is None else samples
            if checked and eager_samples is not None and c == "student":
                values = eager_samples
            said = 0.0
            if checked and queued_ms is not None and c == "student" and gate_ms > 0:
                gated = sum(1 for b in brackets[2 * confirmation.BURST_ROUNDS:] if b[0] == "student") - 2
                said = queued_ms[min(gated, len(queued_ms) - 1)]
            run.gates.append(gate_ms) if checked and c == "student" else None
            return p.BurstReply(values=values, queued_ms=said), 0.05 + gate_ms / 1e3 + per_call * calls / 1e3

        monkeypatch.setattr(witness, "bracketed", fake_bracketed)
        monkeypatch.setattr(witness, "burst_calls", lambda *a: CALLS)

        def replay_process_factory(job, reps, timeout, placements):  # the session's (Resources.replay_process)
            spawned.append(Path(job).name)
            return FakeReplay(Path(job), placements, answers, truth, asked, events)

        ctx = GradingContext("cuda", 1, replay_store=str(store) if store else None)
        session = SimpleNamespace(context=ctx, alone_on_gpu=lambda: held("alone"), sharing_gpu=lambda: held("shared"),
                                  setup_slot=lambda: held("slot"), cache=cache, settings=SETTINGS,
                                  replay_process=replay_process_factory)

        stage = perf.Stage(session, SPEC, student, workdir, 30, dict(ROOFLINE))
        got, fallback = perf._by_replay(stage, trusted, files, layout)
        return got if got is not None else fallback

    run.truth, run.asked, run.events, run.spawned, run.brackets = truth, asked, events, spawned, brackets
    run.gates = []  # the gate of each of the student's queued bursts, in order (0: the ungated one)
    run.load = 1
    return run


def test_the_sessions_factory_starts_each_replay_process_with_its_isolation_gpu_and_settings(tmp_path, monkeypatch):
    """Resources.replay_process, the one place a grading starts a replay process: the session's
    isolation, GPU and settings handed to it as to a worker, the stage's reps and placements."""
    from grader.judge.resources import Resources

    started = []

    class Started:  # the sandboxed process, as WorkerProcess would start it
        def __init__(self, *args, **kw) -> None:
            started.append(kw)

    monkeypatch.setattr(replay_process, "WorkerProcess", Started)
    ctx = GradingContext("cuda", 1, isolation="none", gpu="3")
    got = Resources(ctx, SETTINGS, COURSE).replay_process(tmp_path / "run-student", 7, 30.0, 3)
    assert isinstance(got, replay_process.Pending) and got.job == tmp_path / "run-student" and got.timeout == 30.0
    [kw] = started
    assert kw["settings"] is SETTINGS and kw["isolation"] == "none" and kw["gpu"] == "3"
    argv = kw["command"]
    assert argv[argv.index("--reps") + 1] == "7" and argv[argv.index("--placements") + 1] == "3"
    # the stage's replays hand back their last result at the judge's indices, copied there after their times
    assert argv[argv.index("--pick") + 1] == str(tmp_path / "run-student" / replay_process.PICK) and got.picked


def test_an_honest_record_is_scored_on_the_replays_times_placement_by_placement(stage, tmp_path):
    student = FakeWorker(stage.truth)
    placements = [[1.2] * 8, [1.1] * 8, [1.3] * 8, [1.2] * 8, [1.2] * 8, [1.2] * 8]
    got = stage(student, replays={"student": {"placements": placements}}, store=tmp_path / "store")
    assert got.outcome in (Outcome.PASSED, Outcome.FAILED), got.message
    assert _d(got)["timed_by"] == "replay"
    assert _d(got)["ratio_to_reference"] == pytest.approx(1.2)
    assert _d(got)["figures"]["student"]["median_ms"] == pytest.approx(1.2)
    assert _d(got)["figures"]["torch"]["median_ms"] == pytest.approx(0.4)
    assert student.closed, "the student's worker must be gone before anything is timed"
    # set up under the GPU held shared, timed alone, the last results written before the set-up slot is left,
    # and compared with the GPU shared again (the recorded calls' sharing is the student worker's own)
    locks = [e for e in stage.events if e[-1] in "+-" or e.split()[0] in ("arm", "go")]
    # the grader's clock's own kernel compiled in both workers first, the GPU shared: not inside its exclusive hold
    assert stage.events.index("warm student") < stage.events.index("alone+"), stage.events
    assert stage.events.index("warm trusted") < stage.events.index("alone+"), stage.events
    # first the function's own calls by the grader's clock, the GPU held alone, the student's worker still alive
    # rounds in a CUDA graph, alternating which goes first, then the eager rounds (the function's Python at each
    # call), alternating too; each burst let go untimed after its rounds, never inside a bracket
    assert locks[:2] == ["alone+", "alone-"] and [b[0] for b in stage.brackets] == \
        ["student", "reference", "reference", "student"] * 2 + ["student", "reference"] + \
        ["student", "reference", "reference", "student"] * 2  # the queued burst: one round ungated, three gated
    assert not any(b[1] for b in stage.brackets) and student.let_go == ["student", "student"]
    assert [m.graph for m in student.prepared] == [True, False]
    assert [m.calls for m in student.prepared] == [CALLS, confirmation.EAGER_CALLS]
    locks = locks[2:]
    assert locks[:10] == ["slot+", "shared+", "arm student", "arm reference", "shared-",
                          "alone+", "go reference", "go student", "alone-", "slot-"], stage.events
    settled = [i for i, e in enumerate(stage.events) if e.startswith("settle")]
    assert len(settled) == 2 and max(settled) < stage.events.index("slot-") and locks[10:] == ["shared+", "shared-"]
    assert _d(got)["confirmation"]["verdict"] == "agrees" and _d(got)["confirmation"]["clock_ms"] == pytest.approx(1.2)
    assert [a[0] for a in stage.asked] == ["student", "reference"] and stage.asked[0][1] == replay_stage.PLACEMENTS
    kept = _d(got)["replay"]["kept"]
    assert (tmp_path / "store" / kept["student"] / "launches.json").is_file()
    assert (tmp_path / "store" / kept["reference"] / "launches.json").is_file()
    assert _d(got)["replay"]["inputs"] == {"seed": 1, "set": 0, "case": SPEC.performance.case.name,
                                               "dtype": SPEC.performance.dtype}


@pytest.mark.parametrize("can_write", [False, True])
def test_the_replays_input_set_is_the_timed_file_itself_only_where_the_worker_cannot_write_it(stage, tmp_path,
                                                                                             can_write):
    """The set handed to the replays is the first timed set: the same file (a hard link, no
    gigabytes copied) where the student's worker cannot write it, else a copy made after its
    recorded calls, which it never saw. Either way the bytes are the set's."""
    got = stage(FakeWorker(stage.truth, can_write=can_write))
    assert got.outcome in (Outcome.PASSED, Outcome.FAILED), got.message
    timed, handed = tmp_path / "set0.safetensors", tmp_path / "job" / "vector_add.replay" / "inputs.safetensors"
    assert handed.read_bytes() == timed.read_bytes()
    assert handed.stat().st_ino != timed.stat().st_ino if can_write else handed.stat().st_ino == timed.stat().st_ino


def test_a_result_the_kernels_do_not_compute_alone_is_conclusive_with_the_evidence(stage):
    wrong = stage.truth.clone()
    wrong[100:] = float("nan")  # only what a sample would check was computed: the rest is the replay's poison
    got = stage(FakeWorker(stage.truth), replays={"student": {"result": wrong}})
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive"
    assert "do not compute the result on their own" in got.message
    assert f"{N - 100} of {N} elements" in got.message and "flat index 100" in got.message


def test_work_done_openly_in_torch_is_named_and_sent_for_review_not_called_cheating(stage):
    def torch_work(raw, i):
        raw["torch_work"] = ["torch wrote output 0 (aten::add_.Tensor)"]

    wrong = stage.truth - 1.0
    got = stage(FakeWorker(stage.truth, edit=torch_work), replays={"student": {"result": wrong}})
    assert got.outcome == Outcome.FLAGGED and got.severity == "review"
    assert "torch wrote output 0 (aten::add_.Tensor)" in got.message and "not replayed" in got.message


def test_a_vendor_op_at_the_timing_size_is_conclusive_before_anything_is_replayed(stage):
    student = FakeWorker(stage.truth, ops=["aten::add.Tensor"])
    got = stage(student)
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive" and "aten::add.Tensor" in got.message
    assert stage.asked == [] and not student.closed


def test_a_wrong_result_at_the_timing_size_is_conclusive_even_at_one_element(stage):
    almost = stage.truth.clone()
    almost[N - 1] += 10.0  # one element, the last: the judge's indices always hold a result's ends
    got = stage(FakeWorker(almost))
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive"
    assert f"1 of {N} elements are wrong (the first at flat index {N - 1}" in got.message


@pytest.mark.parametrize("edit, why", [
    (lambda raw, i: raw.update(why_not=["launches on 2 streams"]), "launches on 2 streams"),
    (lambda raw, i: raw["launches"][0].update(grid=[4 + i, 1, 1]), "launches change from call to call"),
    (lambda raw, i: raw["launches"][0]["args"][0].update(ref="../etc"), "could not be replayed"),
])
def test_a_record_that_cannot_be_replayed_leaves_the_worker_alive_for_the_fallback(stage, edit, why):
    student = FakeWorker(stage.truth, edit=edit)
    got = stage(student)
    assert isinstance(got, str) and why in got
    assert not student.closed and stage.asked == []


def _on_two_streams(raw, i):
    second = json.loads(json.dumps(raw["launches"][0]))
    second["stream"] = 1
    raw["launches"].append(second)
    raw["sequence"].append({"launch": len(raw["launches"]) - 1})


def test_a_record_of_two_streams_is_replayed_and_its_overlap_neither_accused_nor_credited(stage):
    """An honest kernel split over two streams joined back to the caller's: replayed whole, one
    launch after another; its own calls, which overlap the two, read faster than that (graph and
    queued at 0.5 ms against 1 ms replayed), which accuses nobody: scored at the replay."""
    got = stage(FakeWorker(stage.truth, edit=_on_two_streams), clock_ms=0.5, eager_ms=0.5)
    assert got.outcome in (Outcome.PASSED, Outcome.FAILED) and not got.severity, got.message
    assert "launches on 2 streams were replayed one after another" in got.message
    c = _d(got)["confirmation"]
    assert c["verdict"] == "agrees" and c["scored_from"] == "replay", c


def test_the_students_processes_on_the_gpu_twice_is_not_scored_and_other_jobs_workers_are_not_counted(stage):
    got = stage(FakeWorker(stage.truth), replays={"student": {"others": [777]}})  # another job's idle worker: fine
    assert got.outcome in (Outcome.PASSED, Outcome.FAILED), got.message
    stage.asked.clear()
    got = stage(FakeWorker(stage.truth), replays={"student": {"others": [4242]}})  # one of the stopped student's
    assert got.outcome == Outcome.INFRA_ERROR and "other processes held the GPU" in got.message


def test_a_reference_whose_replay_is_wrong_is_ours_to_fix_not_a_grade(stage):
    got = stage(FakeWorker(stage.truth), replays={"reference": {"result": torch.zeros(N)}})
    assert got.outcome == Outcome.INFRA_ERROR and "the reference's replay is wrong" in got.message


def test_a_replay_that_breaks_goes_to_review(stage):
    got = stage(FakeWorker(stage.truth), replays={"student": replay_process.Replayed(failed="RuntimeError: illegal memory access")})
    assert got.outcome == Outcome.FLAGGED and got.severity == "review" and "illegal memory access" in got.message


def test_a_result_of_another_size_is_wrong_and_says_its_size(stage, monkeypatch):
    got = stage(FakeWorker(torch.zeros(N * 9)))  # right at every index the judge asks for: zeros where x + y is not
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive"
    assert f"wrong results at the timing size: {N * 9} elements where the truth has another number" in got.message


def test_the_students_sample_is_bounded_by_the_judges_indices(stage, monkeypatch):
    """A worker that answers the judge's indices with a file far larger than they ask for: refused
    unread past the bound, the student's (conclusive), never the trusted worker's memory."""
    worker = FakeWorker(stage.truth)
    answer = worker.request

    def bloated(message, timeout):
        if isinstance(message, Sample):
            save_file({"rec0": torch.zeros(N * 9), "numel.rec0": torch.tensor([N])}, message.output)
            return Ok()
        return answer(message, timeout)

    worker.request = bloated
    worker.process.request = bloated
    got = stage(worker)
    assert got.outcome == Outcome.FLAGGED and "cannot be read" in got.message and "larger than" in got.message


def test_stopping_the_student_leaves_none_of_its_processes(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                            start_new_session=True)
    time.sleep(1.0)
    tree = proctable.tree(proc.pid)
    assert len(tree) == 2

    class Worker:
        process = SimpleNamespace(proc=proc)

        def close(self):
            import os
            import signal
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    assert replay_stage.stop_student(Worker(), grace_s=5) == ("", tree)
    assert not any(Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2] for p in tree)


def test_a_process_left_behind_by_the_student_is_named(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        class Worker:
            process = SimpleNamespace(proc=child)

            def close(self):  # a worker whose stop leaves its process running
                pass

        assert "still running after it was stopped" in replay_stage.stop_student(Worker(), grace_s=0.5)[0]
    finally:
        child.kill()
        child.wait()


def test_the_references_figure_is_kept_for_the_run_while_torchs_time_holds(stage, tmp_path, monkeypatch):
    from grader.judge.runcache import RunCache

    cache = RunCache(tmp_path / "cache")
    trusted = FakeWorker(stage.truth)
    first = stage(FakeWorker(stage.truth), trusted=trusted, cache=cache)
    assert _d(first)["replay"]["reference"]["kept"] is False and trusted.timed == 3, "torch's three rounds"
    assert [a[0] for a in stage.asked] == ["student", "reference"]
    assert stage.spawned == ["run-student", "run-reference"]
    stage.asked.clear()
    stage.spawned.clear()
    trusted = FakeWorker(stage.truth)
    again = stage(FakeWorker(stage.truth), trusted=trusted, cache=cache)  # the next student: the reference is kept
    assert [a[0] for a in stage.asked] == ["student"] and _d(again)["replay"]["reference"]["kept"] is True
    assert trusted.timed == 1, "one round of torch's anchors the kept figure"
    assert stage.spawned == ["run-student"], "no replay process is started for a reference whose figure is kept"
    assert _d(again)["ratio_to_reference"] == _d(first)["ratio_to_reference"]
    stage.asked.clear()
    monkeypatch.setattr(perf, "call_times", lambda reply: ([0.45] * 3, [0.45] * 3, None))  # the GPU drifted by 12%
    drifted = stage(FakeWorker(stage.truth), cache=cache)
    assert sorted(a[0] for a in stage.asked) == ["reference", "student"] and _d(drifted)["replay"]["reference"]["kept"] is False


def test_the_trusted_workers_comparison_reads_a_hostile_file_as_data(tmp_path):
    """What the trusted worker is handed (a student's result, a replay's) is read bounded and never
    through a link; anything but one floating-point tensor is refused in one line."""
    from grader.worker import server

    worker = server.Worker.__new__(server.Worker)
    truth = torch.arange(8.0)
    worker.torch, worker.retained = torch, {("torch", "truth"): truth, ("reference", "rec0"): truth.clone()}
    indices = tmp_path / "picks.safetensors"
    save_file({"idx": torch.arange(8)}, str(indices))  # the judge's: every element of so small a result

    def compare(tensors=None, link=None, limit=0, sized=True):
        path = tmp_path / f"r{len(list(tmp_path.iterdir()))}.safetensors"
        if link:
            path.symlink_to(link)
        else:
            if sized and "output.0" in tensors:  # as a worker writes it: the result's size beside its elements
                tensors = dict(tensors, **{"numel.output.0": torch.tensor([8])})
            save_file(tensors, str(path))
        return worker.compare(Compare(str(path), "output.0", limit, "truth", "rec0", 1e-6, 1e-6, str(indices)))

    right = compare({"output.0": truth.clone()})
    assert (right.numel, right.wrong, right.sampled) == (8, 0, 8)
    wrong = truth.clone()
    wrong[5] = 99.0
    got = compare({"output.0": wrong})
    assert (got.wrong, got.first, got.got, got.want) == (1, 5, "99", "5")
    never_written = truth.clone()
    never_written[2] = float("nan")  # memory the kernel never wrote: a NaN in the words, not a broken reply
    got = compare({"output.0": never_written})
    assert (got.wrong, got.first, got.got) == (1, 2, "nan")
    assert p.decode_reply(Compare("f", "o", 0, "t", "r", 0.0, 0.0, "i"), p.encode(got)) == got
    assert "cannot be read" in compare(link="/etc/passwd").message
    assert "larger than" in compare({"output.0": torch.zeros(20_000)}).message  # bounded by the sample's size (and a header)
    assert "not one floating-point tensor" in compare({"output.0": torch.zeros(8, dtype=torch.int32)}).message
    assert "holds no tensor 'output.0'" in compare({"other": truth.clone()}).message
    assert "holds no tensor 'numel.output.0'" in compare({"output.0": truth.clone()}, sized=False).message
    assert "size is not one integer" in compare({"output.0": truth.clone(), "numel.output.0": torch.tensor([8.0])},
                                                sized=False).message


def test_a_rep_faster_and_wrong_beside_a_right_last_one_is_conclusive(stage):
    """A kernel right only now and then (by the GPU's clock, say): the last rep is checked against
    torch's result, every other rep by its sums."""
    sums = [[[1.0, 1.0, 0.0]]] * 40 + [[[float(stage.truth.double().sum()), float(stage.truth.double().abs().sum()), 0.0]]] * 8
    got = stage(FakeWorker(stage.truth), replays={"student": {"sums": sums}})
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive", got.message
    assert "rep 1 of 48 computed another result 0 than the last rep" in got.message


def test_the_trusted_worker_breaking_is_ours_never_the_students(stage):
    from grader.sandbox.process import WorkerFailure

    class Broken(FakeWorker):
        def compare(self, req):
            raise WorkerFailure("crashed", "the worker sent a malformed reply", "")

    got = stage(FakeWorker(stage.truth), trusted=Broken(stage.truth))
    assert got.outcome == Outcome.INFRA_ERROR and "the trusted worker failed" in got.message and not got.severity


def test_the_trusted_worker_out_of_memory_while_comparing_flags_no_one(stage, monkeypatch):
    """Several jobs on one GPU can leave the trusted worker no memory to compare the student's
    result: not scored, said as ours, no flag (a run of the GPU tests eight at once once flagged an
    honest result this way)."""
    from grader.worker import server

    def no_memory(self, *args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(server.Worker, "_sampled", no_memory)
    got = stage(FakeWorker(stage.truth))
    assert got.outcome == Outcome.INFRA_ERROR and not got.severity
    assert "the trusted worker could not compare the result: OutOfMemoryError" in got.message


def test_a_spec_scored_against_the_faster_keeps_torchs_three_rounds(stage, tmp_path, monkeypatch):
    """Where the yardstick is the faster of the reference and torch per round, torch's rounds are
    part of the score: a kept reference figure does not cut them to one."""
    import dataclasses
    import sys

    from grader.judge.runcache import RunCache

    faster = dataclasses.replace(SPEC, performance=dataclasses.replace(SPEC.performance, against="faster"))
    monkeypatch.setattr(sys.modules[__name__], "SPEC", faster)  # the stage fixture's spec
    cache = RunCache(tmp_path / "cache")
    stage(FakeWorker(stage.truth), cache=cache)
    trusted = FakeWorker(stage.truth)
    again = stage(FakeWorker(stage.truth), trusted=trusted, cache=cache)
    assert _d(again)["replay"]["reference"]["kept"] is True and trusted.timed == 3


# the function's own calls by the grader's clock against its replayed kernels (grader.judge.confirmation)

def test_calls_faster_than_their_own_replayed_kernels_are_conclusive_with_both_figures(stage):
    """A record that names more work than the calls do (a scalar of the launch rewritten, a slower
    binary swapped in, a slow path only at the replay's buffers): the calls by the grader's clock
    beat their own kernels."""
    got = stage(FakeWorker(stage.truth), replays={"student": {"placements": [[4.0] * 8] * 6}}, clock_ms=1.0)
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive", got.message
    assert "faster than the kernels its record names" in got.message
    assert "1.0000 ms per call by the grader's clock" in got.message and "4.0000 ms" in got.message
    assert _d(got)["confirmation"]["verdict"] == "faster"


def test_calls_slower_than_their_replayed_kernels_in_a_graph_are_conclusive(stage):
    """A record faster than what runs (a scalar rewritten, a faster binary over the cache file, a fast
    path only while recorded): in a CUDA graph no host work explains the difference."""
    got = stage(FakeWorker(stage.truth), clock_ms=4.0)
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive", got.message
    assert "4.00x slower than the kernels its record names" in got.message and "do not run what" in got.message


@pytest.mark.parametrize("clock, placements", [(4.0, None), (0.5, [[1.0] * 8] * 6)])
def test_a_busy_host_withholds_the_accusation_but_scores_the_slower_reading(stage, monkeypatch, clock, placements):
    """Both clocks are read on the host: with more threads of other jobs ready to run than CPUs
    around the brackets and replays, neither a slower nor a faster reading accuses anyone; the
    slower of the two readings is scored (never a hold that shows the faster one first)."""
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 16)
    stage.load = 40
    replays = {"student": {"placements": placements}} if placements else None
    got = stage(FakeWorker(stage.truth), clock_ms=clock, replays=replays)
    assert got.outcome != Outcome.FLAGGED and not got.severity and not _d(got).get("held"), got.message
    assert "40 threads of other jobs ready to run on its 16 CPUs" in got.message
    confirmed = _d(got)["confirmation"]
    assert confirmed["verdict"] == "unsteady" and confirmed["unsteady"]
    assert _d(got)["ratio_to_reference"] == pytest.approx(max(clock, 1.0))


@pytest.mark.parametrize("clock, placements", [(4.0, None), (0.5, [[1.0] * 8] * 6)])
def test_as_many_threads_ready_as_cpus_is_steady_and_the_accusation_stands(stage, monkeypatch, clock, placements):
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 16)
    stage.load = 16
    replays = {"student": {"placements": placements}} if placements else None
    got = stage(FakeWorker(stage.truth), clock_ms=clock, replays=replays)
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive", got.message
    assert "unsteady" not in _d(got)["confirmation"]


def test_a_replay_whose_reps_spread_on_one_placement_accuses_no_one(stage):
    """The same kernels on the same buffers, rep after rep: reps from 0.5 to 1.0 ms on one placement
    mean the replay's events held the host's delays, so its figure cannot support "faster"."""
    placements = [[0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]] + [[1.0] * 8] * 5
    got = stage(FakeWorker(stage.truth), replays={"student": {"placements": placements}}, clock_ms=0.4)
    assert got.outcome != Outcome.FLAGGED and not got.severity, got.message  # scored on the slower reading: the replay
    assert "the replay's reps on one placement of its buffers, the same kernels on the same buffers, took from " \
           "0.5000 to 1.0000 ms" in got.message
    assert _d(got)["confirmation"]["verdict"] == "unsteady"


@pytest.mark.parametrize("load", [1, 40])
def test_an_honest_reading_is_scored_alike_on_a_busy_host_and_a_quiet_one(stage, monkeypatch, load):
    """The load only withholds accusations: a reading that agrees is scored, busy or not."""
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 16)
    stage.load = load
    got = stage(FakeWorker(stage.truth), clock_ms=1.0)
    assert got.outcome == Outcome.PASSED and _d(got)["score_fraction"] == 1.0, got.message
    assert _d(got)["confirmation"]["verdict"] == "agrees" and "unsteady" not in _d(got)["confirmation"]


def test_calls_slower_in_an_eager_burst_are_scored_on_the_graders_clock_not_accused(stage):
    """A function that synchronizes runs its burst eagerly, its host work then in the bracket: no
    accusation, the score comes from the slower figure."""
    student = FakeWorker(stage.truth)
    student.eager = "RuntimeError: operation not permitted when stream is capturing"
    trusted = FakeWorker(stage.truth)
    got = stage(student, trusted=trusted, clock_ms=2.0)
    assert got.outcome in (Outcome.PASSED, Outcome.FAILED) and not got.severity, got.message
    assert _d(got)["ratio_to_reference"] == pytest.approx(2.0) and _d(got)["confirmation"]["verdict"] == "clock"
    assert "scored on the grader's own clock" in got.message and "could not be captured" in got.message
    # asked for a graph first; the reference's burst then prepared again as its eager mirror, and no eager round after
    assert [m.graph for m in student.prepared] == [True] and [m.graph for m in trusted.prepared] == [True, False]
    assert len(stage.brackets) == 2 * confirmation.BURST_ROUNDS


@pytest.mark.parametrize("clock, scored, verdict", [(1.08, 1.0, "agrees"), (1.2, 1.2, "clock")])
def test_calls_within_the_spread_are_scored_on_the_replay_and_beyond_it_on_the_slower_clock(stage, clock, scored,
                                                                                             verdict):
    got = stage(FakeWorker(stage.truth), clock_ms=clock)
    assert got.outcome in (Outcome.PASSED, Outcome.FAILED) and not got.severity, got.message
    assert _d(got)["ratio_to_reference"] == pytest.approx(scored) and _d(got)["confirmation"]["verdict"] == verdict


def test_wrong_samples_in_the_graders_bursts_are_conclusive_before_anything_is_replayed(stage):
    """Right for the recorded calls, wrong later (cheat_first_n): the bursts' calls come after the
    record, each on fresh inputs, and their samples are checked."""
    student = FakeWorker(stage.truth)
    got = stage(student, samples=[[1.0] * 4] * (CALLS - 1) + [[0.0] * 4])
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive", got.message
    assert "timed by its own clock are wrong" in got.message and "call 8 of 8" in got.message
    assert stage.asked == [], "no replay is timed for a function whose own calls are wrong"


def test_calls_right_in_the_graph_and_wrong_when_run_eagerly_are_conclusive(stage):
    """A graph replays what its capture launched: the eager round after it calls the function itself
    each time, and checks those results too (right only for the first calls is wrong there)."""
    calls = confirmation.EAGER_CALLS
    got = stage(FakeWorker(stage.truth), eager_samples=[[1.0] * 4] * (calls - 1) + [[7.0] * 4])
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive", got.message
    assert "timed by its own clock are wrong" in got.message and f"call {calls} of {calls}" in got.message
    assert stage.asked == []


def test_calls_faster_only_when_run_eagerly_are_conclusive(stage):
    """Fast only outside a graph's capture (which the function can detect): host work only lengthens
    a bracket, so an eager figure faster than the replay is less work than the record too."""
    got = stage(FakeWorker(stage.truth), replays={"student": {"placements": [[3.0] * 8] * 6}}, eager_ms=1.0)
    assert got.outcome == Outcome.FLAGGED and got.severity == "conclusive", got.message
    assert "queued eagerly" in got.message and "1.0000 ms per call" in got.message and "3.0000 ms" in got.message


def test_one_eager_round_slowed_by_a_busy_host_accuses_no_one(stage):
    """An honest kernel's eager round read 0.38x its replay once with eight checks beside it: each
    bracket holds every call's host work, which the scheduler can lengthen for either contender.
    Faster in one round of three is noise; faster in every round is less work (the test above)."""
    got = stage(FakeWorker(stage.truth), replays={"student": {"placements": [[3.0] * 8] * 6}},
                eager_ms=[1.0, 3.0, 3.0])
    # scored on its replay (3x the reference's time: no speed points), never flagged
    assert got.outcome == Outcome.FAILED and not got.severity and "3.000x the reference" in got.message, got.message
    eager_rounds = [b for b in stage.brackets[2 * confirmation.BURST_ROUNDS:] if not b[1]]
    assert len(eager_rounds) == 2 * (confirmation.EAGER_ROUNDS + 1)  # every round, the ungated one too
    assert [c for c, _ in eager_rounds[:4]] == ["student", "reference", "reference", "student"]  # order alternating
    assert got.details.confirmation["eager_ms"] == 3.0  # the median round decided (confirmation.kept_round)


def test_a_round_whose_host_work_outran_its_gate_is_redone_behind_a_longer_gate(stage):
    """On a busy host an honest function's Python slows, its calls take longer to queue than the
    gate holds the GPU, and its bracket holds host work: that round is redone behind a gate sized
    from what the worker said, and the figure comes from the rounds whose host work was hidden."""
    got = stage(FakeWorker(stage.truth), eager_ms=[9.0, 1.0, 1.0, 1.0], queued_ms=[10_000.0, 0.0])
    assert got.outcome == Outcome.PASSED and not got.severity, got.message
    first_gate = stage.gates[1]
    assert stage.gates[0] == 0 and first_gate < confirmation.GATE_MAX_MS
    assert stage.gates[2] == min(confirmation.GATE_MAX_MS, confirmation.GATE_FACTOR * 10_000.0) > first_gate
    assert len(stage.gates) == 1 + 1 + confirmation.EAGER_ROUNDS  # ungated, the outrun one, three hidden
    c = got.details.confirmation
    assert c["eager_ms"] == 1.0 and not [f for f in c["figures"] if f["source"] == "queued burst"][0]["host_work"]


def test_host_work_that_outruns_even_the_longest_gate_is_counted_as_host_work(stage):
    """Never hidden: the figure says its bracket holds host work (never an accusation), after at
    most GATE_RETRIES more rounds."""
    got = stage(FakeWorker(stage.truth), eager_ms=5.0, queued_ms=[1e9])
    c = got.details.confirmation
    queued = [f for f in c["figures"] if f["source"] == "queued burst"][0]
    assert queued["host_work"] and c["verdict"] == "clock" and not got.severity, (c, got.message)
    assert len(stage.gates) == 1 + confirmation.EAGER_ROUNDS + confirmation.GATE_RETRIES


def test_a_clock_that_measured_nothing_holds_the_replayed_points_for_review(stage):
    """The reference's bursts beside the student's took longer than its own work explains: no figure
    from the grader's clock, so the replay's is unconfirmed: held for a TA, no accusation."""
    got = stage(FakeWorker(stage.truth), clock_ms=-2.0)
    assert got.outcome == Outcome.FLAGGED and got.severity == "review", got.message
    assert "held for a TA's review" in got.message and "could not be confirmed" in got.message
    assert _d(got)["held"] and _d(got)["confirmation"]["verdict"] == "unclear" and _d(got)["score_fraction"] == 1.0


def test_a_burst_that_raises_is_the_students_error_and_out_of_memory_is_ours(stage, monkeypatch):
    real = FakeWorker.request

    def raising(message):
        def request(self, m, timeout):
            if isinstance(m, p.PrepareBurst) and m.contender == "student":
                return Failure("error", message)
            return real(self, m, timeout)
        return request

    monkeypatch.setattr(FakeWorker, "request", raising("ValueError: boom"))
    got = stage(FakeWorker(stage.truth))
    assert got.outcome == Outcome.ERROR and "raised while timed by the grader's clock: ValueError: boom" in got.message
    monkeypatch.setattr(FakeWorker, "request", raising("torch.OutOfMemoryError: CUDA out of memory"))
    got = stage(FakeWorker(stage.truth))
    assert got.outcome == Outcome.INFRA_ERROR and "ran out of GPU memory" in got.message
