"""The replay on a GPU (grader.replay, grader.judge.replay_process): a contender's call recorded in a
worker process of its own (grader's own Worker, the module imported, Triton hooked), the worker
gone, the record replayed in a process with no student code (started through the sandbox
backend), and the judge's decision. Honest
kernels are scored within 3% of the event-timed ratio; cheats get no speed they did not earn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grader import spec as specs
from grader.codec import write_inputs
from grader.judge import replay_process
from grader.settings import Settings
from tests.conftest import SANDBOX, COURSE, build_submission

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

RECORD = r"""
import json, statistics, sys
from safetensors.torch import save_file
from grader.protocol import Call, Contender, Load, Time
from grader.worker import server, timing
root, module, function, inputs, layout, folder, out = sys.argv[1:8]
worker = server.Worker()
server._setup_triton(False, worker.watch)
timing.tampered()
layout = json.load(open(layout))
assert worker.load(Load({"c": Contender(root, module, function)})).ok
worker.call(Call("c", inputs, layout, "rec", record_launches=folder))
res = worker.retained[("c", "rec")]
save_file({"output.0": res.detach().cpu().contiguous()}, out)
timed = worker.time(Time("c", [inputs], layout, 20))
print(json.dumps({"event_ms": statistics.median(timed.event_ms)}))
"""


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    work = tmp_path_factory.mktemp("replay")
    spec = COURSE.get("vector_add")
    inputs = spec.make_inputs(spec.performance.case.params, getattr(torch, spec.performance.dtype), torch.Generator().manual_seed(0))
    layout = write_inputs(inputs, work / "inputs.safetensors")
    (work / "layout.json").write_text(json.dumps(layout))
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")

    def run(name: str, root: Path, module: str):
        rec, out = work / f"{name}.rec", work / f"{name}.out"
        rec.mkdir()
        # the replay process started first: it imports torch and Triton while the call is recorded, and
        # touches the GPU only once told to go, after the recording process has ended (as the timing stage's)
        pending = replay_process.spawn(out, 20, 300, settings=Settings(), sandbox=SANDBOX)
        try:
            done = subprocess.run([sys.executable, "-c", RECORD, str(root), module, spec.function,
                                   str(work / "inputs.safetensors"), str(work / "layout.json"), str(rec),
                                   str(work / f"{name}.call.safetensors")], capture_output=True, text=True, env=env,
                                  timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
        except BaseException:
            replay_process.cancel(pending)
            raise
        event_ms = json.loads(done.stdout.strip().splitlines()[-1])["event_ms"]
        placed = replay_process.place(pending, rec, work / "inputs.safetensors", work / "layout.json")
        return replay_process.settle(replay_process.go(placed)), event_ms

    reference = run("reference", ROOT / "reference", "vector_add.py")

    def student(fixture: str):
        repo = build_submission(work / "repos" / fixture, fixture)
        got, event_ms = run(fixture.replace("/", "_"), repo, "kernels/vector_add.py")
        from safetensors.torch import load_file
        wrong = ""
        if got.folder is not None:
            expected = [load_file(str(work / "reference.call.safetensors"))["output.0"]]
            wrong = replay_process.mismatch(replay_process.results(got, expected), expected, 1e-5, 1e-5)
        return replay_process.decide(got, reference[0], wrong), event_ms / reference[1]

    return student


def test_the_correct_sample_is_scored_by_replay_within_three_percent_of_event_timing(case):
    decision, event_ratio = case("good")
    assert decision.kind == "scored", decision.message
    assert abs(decision.ratio / event_ratio - 1) < 0.03, (decision.ratio, event_ratio)


def test_work_hidden_from_the_events_is_replayed_at_its_true_speed(case):
    decision, event_ratio = case("gpu/cheat_side_stream")
    assert event_ratio < 0.1  # the events alone would have given it the speed of nothing
    assert decision.kind == "scored" and 0.9 < decision.ratio < 1.2, decision


@pytest.mark.parametrize("fixture, words", [
    # all its work in torch, none in a kernel (what torch did is noted beside the record, not a refusal)
    ("gpu/cheat_vendor_large", "the record has no launch"),
    ("gpu/cheat_cache", "the record has no launch"),  # the recorded call answered from its cache
    ("gpu/replay_smuggled", "is an integer that holds a device address"),
])
def test_what_cannot_be_replayed_falls_back_with_the_reason(case, fixture, words):
    decision, _ = case(fixture)
    assert decision.kind == "fallback" and words in decision.message, decision
