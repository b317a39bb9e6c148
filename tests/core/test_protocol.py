"""The worker protocol (grader.protocol): every message survives the wire; a reply that is
not what its request expects is a failure with a message, never a KeyError in the judge;
the worker answers only the requests it has a handler for; and a student's function that
forges a reply on the worker's pipe gets its call failed as a crash, not graded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
from safetensors.torch import save_file

from tests.conftest import SANDBOX, REPO_ROOT
from grader.settings import Settings
from grader import protocol as p
from grader.protocol import (Call, CallReply, Contender, Description, Exit, Failure, Load, Ok, Ping, ProtocolError, Roofline,
                             RooflineReply, Run, RunReply, Sample, Time, TimeReply)

LAYOUT = {"x": {"size": [2, 3], "stride": [1, 2], "offset": 1}, "eps": {"value": 1e-5}, "causal": {"value": True}}
TENSOR_REPLY = RunReply(seconds=0.25, launches={"add_kernel": 2}, blocks={"BLOCK_SIZE": 1024}, ops=["aten::add"],
                        result_type="Tensor", dtype="float16", shape=[2, 3], stride=[3, 1], device="cpu", aliases=["x"])
TUPLE_REPLY = RunReply(seconds=1.0, launches={}, blocks={}, ops=[], result_type="tuple",
                       outputs=[Description("float32", [4], [1], "cpu", []), Description("float32", [], [], "cpu", ["w"])])
TIME_REPLY = TimeReply(event_ms=[0.5, 0.25], marks=[(1, 2, 3), (4, 5, 6)], settle_marks=[(7, 8, 9)], host_ms=[0.75],
                       activities=[("add_kernel", 7, 10, 20), ("spin_kernel", 7, 21, 30)], activity_error=None,
                       first_call_ms=12.5, launches=2, tampered=["time.time_ns"], output_numel=1 << 20)

# each request with an example of what it is answered with
EXCHANGES = [
    (Ping(), Ok()),
    (Load({"student": Contender("/job/repo", "kernels/add.py", "vector_add")}), Ok()),
    (Load({}), Ok()),
    (Run("student", "/job/inputs/a.safetensors", LAYOUT, "cpu", "/job/outputs/a.safetensors", record_ops=True), TENSOR_REPLY),
    (Run("student", "/i", {}, "cuda", "/o"), TUPLE_REPLY),
    (Time("torch", ["/p/set0.safetensors", "/p/set1.safetensors"], LAYOUT, reps=30), TIME_REPLY),
    (Time("student", ["/p/set0.safetensors"], {}, reps=5, warmup=0),
     TimeReply([], [], [], [], None, "RuntimeError: no CUPTI", 0.0, 0, [], None)),
    (Call("student", "/job/inputs/fresh.safetensors", LAYOUT, "fresh", record_ops=True), CallReply(["aten::mul"], 1)),
    (Sample("reference", ["set0", "fresh"], "/job/perf/indices.safetensors", "/job/outputs/s.safetensors"), Ok()),
    (Roofline(), RooflineReply("NVIDIA H200", 3900.5, {"float16": 700.0, "float32": 400.25})),
    (p.WarmBurst(["float32", "bfloat16"]), Ok()),
    (p.PrepareBurst("student", "/p/set0.safetensors", LAYOUT, 8, 16), p.BurstReady("", {"first call": 0.04})),
    (Call("torch", "/p/set0.safetensors", LAYOUT, "truth"), CallReply([], 0, numel=1 << 28)),
]


@pytest.mark.parametrize("request_, reply", EXCHANGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(request_, reply):
    line = p.encode(request_)
    assert line.endswith("\n") and line.count("\n") == 1  # one message, one line
    assert json.loads(line)["op"] == request_.op
    assert p.decode_request(line) == request_
    wire = p.encode(reply)
    assert json.loads(wire)["ok"] is True
    assert p.decode_reply(request_, wire) == reply
    failure = Failure("error", "ValueError: no", 'File "k.py", line 3, in f')
    assert p.decode_reply(request_, p.encode(failure)) == failure


def test_exit_and_every_op_have_a_request_class():
    assert p.decode_request(p.encode(Exit())) == Exit()
    assert set(p.REQUESTS) == {"ping", "load", "run", "time", "prepare_burst", "warm_burst", "burst", "drop_burst", "call",
                               "sample", "roofline", "compare", "exit"}


def test_the_wire_format_is_todays_json():
    """The lines the grading process and the worker exchanged before the typed messages
    still mean the same: field names, "op" and "ok" are unchanged."""
    old_run = '{"op": "run", "contender": "student", "inputs": "/i", "layout": {}, "device": "cpu", "output": "/o", "record_ops": true}'
    assert p.decode_request(old_run) == Run("student", "/i", {}, "cpu", "/o", record_ops=True)
    old_time = '{"op": "time", "contender": "c", "inputs": ["/a"], "layout": {}, "reps": 30}'
    assert p.decode_request(old_time).warmup == 3  # the worker's default, as before
    bare = '{"ok": true, "seconds": 0.5, "launches": {"k": 1}, "blocks": {}, "ops": [], "result_type": "NoneType"}'
    reply = p.decode_reply(Run("s", "/i", {}, "cpu", "/o"), bare)
    assert reply == RunReply(0.5, {"k": 1}, {}, [], "NoneType")
    assert reply.meta()["device"] is None and reply.meta()["outputs"] is None  # what grader.judge.verdict reads
    failure = p.decode_reply(Ping(), '{"ok": false, "kind": "missing", "message": "kernels/x.py not found", "traceback": ""}')
    assert failure == Failure("missing", "kernels/x.py not found")
    assert json.loads(p.encode(Failure("memory", "m", "tb", output="stdout stays here"))) == \
        {"ok": False, "kind": "memory", "message": "m", "traceback": "tb"}


RUN = Run("s", "/i", {}, "cpu", "/o")
GOOD_RUN = json.loads(p.encode(TENSOR_REPLY))


@pytest.mark.parametrize("request_, line, expected", [
    (RUN, {k: v for k, v in GOOD_RUN.items() if k != "seconds"}, "the reply to run: field 'seconds' is missing"),
    (RUN, {**GOOD_RUN, "seconds": "0.1"}, "the reply to run: field 'seconds' must be a number, not a string"),
    (RUN, {**GOOD_RUN, "launches": {"k": True}}, "field 'launches'['k'] must be an integer, not a boolean"),
    (RUN, {**GOOD_RUN, "launches": [["k", 1]]}, "field 'launches' must be an object, not a list"),
    (RUN, {**GOOD_RUN, "ops": "aten::add"}, "field 'ops' must be a list, not a string"),
    (RUN, {**GOOD_RUN, "shape": [2, None]}, "field 'shape'[1] must be an integer, not null"),
    (RUN, {**GOOD_RUN, "outputs": [{"dtype": "float32"}]}, "field 'outputs'[0]: field 'shape' is missing"),
    (RUN, {**GOOD_RUN, "verdict": "passed"}, "the reply to run: unexpected field 'verdict'"),
    (RUN, {k: v for k, v in GOOD_RUN.items() if k != "ok"}, "'ok' must be true or false, not None"),
    (RUN, {"ok": False, "kind": "infra_error", "message": "not my fault"}, "kind 'infra_error' is not one a worker may report"),
    (RUN, {"ok": False, "kind": "timeout", "message": "m"}, "kind 'timeout' is not one a worker may report"),
    (RUN, {"ok": False, "message": "m"}, "the failure reply to run: field 'kind' is missing"),
    (Time("s", [], {}, 1), {**json.loads(p.encode(TIME_REPLY)), "marks": [[1, 2]]}, "field 'marks'[0] must be a list of 3"),
    (Time("s", [], {}, 1), {**json.loads(p.encode(TIME_REPLY)), "activities": [["k", 1, 2, "3"]]},
     "field 'activities'[0][3] must be an integer, not a string"),
    (Roofline(), {"ok": True, "gpu": "x", "copy_gbps": 1.0}, "field 'gemm_tflops' is missing"),
    (Ping(), [1, 2], "not a JSON object but a list"),
])
def test_a_malformed_reply_is_a_protocol_error_that_says_what_is_wrong(request_, line, expected):
    with pytest.raises(ProtocolError) as info:
        p.decode_reply(request_, json.dumps(line))
    assert expected in str(info.value)


def test_a_reply_that_is_not_json_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="not JSON"):
        p.decode_reply(Ping(), b'{"ok": tru')


def test_a_worker_failure_output_is_not_the_workers_to_claim():
    failure = p.decode_reply(Ping(), '{"ok": false, "kind": "error", "message": "m", "traceback": "", "output": "forged"}')
    assert failure.output == ""


# -- the worker's dispatch (grader.worker.server.answer), without starting a worker ------------

def _worker():
    """A Worker without __init__ (which would set torch's global switches in this process):
    its handler table is all `answer` needs to dispatch."""
    from grader.worker.server import Worker

    return object.__new__(Worker)


@pytest.mark.parametrize("line, expected", [
    ('{"op": "__init__"}', "unknown request op '__init__'"),
    ('{"op": "handlers"}', "unknown request op 'handlers'"),
    ('{"op": "_load_cuda", "path": "/etc/passwd"}', "unknown request op '_load_cuda'"),
    ('{"contender": "s"}', "unknown request op None"),
    ('{"op": "run", "contender": "s"}', "field 'inputs' is missing"),
    ('{"op": "ping", "extra": 1}', "unexpected field 'extra'"),
    ("not json", "not JSON"),
])
def test_the_worker_answers_a_request_it_cannot_read_with_a_failure(line, expected):
    from grader.worker.server import answer

    reply = answer(_worker().handlers(), line, [])
    assert isinstance(reply, Failure) and reply.kind == "error"
    assert expected in reply.message and reply.message.startswith("the worker cannot read this request")


def test_the_worker_dispatches_each_request_type_to_its_own_handler():
    from grader.worker.server import answer

    worker = _worker()
    handlers = worker.handlers()
    assert set(handlers) == set(p.REQUESTS.values()) - {Exit}
    assert all(h.__self__ is worker and h.__name__ == cls.op for cls, h in handlers.items())
    assert answer(handlers, p.encode(Ping()), []) == Ok()
    assert answer(handlers, p.encode(Exit()), []) == Exit()
    assert answer({}, p.encode(Ping()), []) == Failure("error", "the worker does not answer ping requests")


def test_a_handler_that_raises_or_trips_the_bounds_check_answers_a_failure(tmp_path):
    from grader.worker import memcheck
    from grader.worker.server import answer

    def boom(req):
        raise KeyError("nope")

    reply = answer({Ping: boom}, p.encode(Ping()), [])
    assert reply.kind == "error" and reply.message == "KeyError: 'nope'"

    def violates(req):
        memcheck.LAST_VIOLATION = {"message": "out-of-bounds load of x_ptr"}
        return Ok()  # the student caught the OutOfBounds: the violation still decides

    try:
        assert answer({Ping: violates}, p.encode(Ping()), []) == Failure("memory", "out-of-bounds load of x_ptr")
    finally:
        memcheck.LAST_VIOLATION = None


# -- what the worker may import ---------------------------------------------------------------

def test_the_protocol_imports_the_standard_library_only_and_the_worker_only_codec_and_protocol():
    probe = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        before = set(sys.modules)  # site's own (.pth hooks) are not the protocol's
        import grader.protocol
        outside = sorted(m for m in set(sys.modules) - before if m.split(".")[0] not in sys.stdlib_module_names)
        print(outside)
        import grader.worker.server, grader.worker.memcheck, grader.worker.timing, grader.codec
        print(sorted(m for m in sys.modules if m.startswith("grader")))
        """)
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=600, check=True).stdout
    protocol_imports, worker_imports = out.splitlines()
    assert eval(protocol_imports) == ["grader", "grader.protocol"]
    assert set(eval(worker_imports)) == {"grader", "grader.protocol", "grader.codec", "grader.worker", "grader.worker.server",
                                         "grader.worker.memcheck", "grader.worker.timing", "grader.worker.calling"}


# -- a forged reply, through a real worker ------------------------------------------------------

FORGER = """
import fcntl, os

def f():
    # the worker's own reply pipe: the write end of a pipe that is not stdout or stderr (found the
    # way any code in the worker can, whether the worker was exec'd or forked from the zygote)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            pipe = fd > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
            if pipe and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                os.write(fd, (LINE + "\\n").encode())
        except OSError:
            pass
"""


@pytest.mark.slow
@pytest.mark.parametrize("forged, expected", [
    ('{"ok": false, "kind": "infra_error", "message": "the grader broke, not me"}', "kind 'infra_error' is not one a worker may report"),
    ('{"ok": true, "seconds": 0.0}', "field 'launches' is missing"),
])
def test_a_reply_forged_by_student_code_fails_the_call_as_a_crash(tmp_path, forged, expected):
    from grader.sandbox.process import WorkerFailure, WorkerProcess

    repo = tmp_path / "job" / "repo"
    repo.mkdir(parents=True)
    (repo / "mod.py").write_text(f"LINE = {forged!r}\n" + FORGER)
    inputs = tmp_path / "job" / "none.safetensors"
    save_file({}, str(inputs))
    inputs.chmod(0o644)
    outputs = tmp_path / "job" / "outputs"
    outputs.mkdir()
    worker = WorkerProcess(repo, tmp_path / "job" / "scratch", interpret=True, writable=[outputs], settings=Settings(), sandbox=SANDBOX)
    try:
        assert worker.request(Load({"s": Contender(str(repo), "mod.py", "f")}), 300) == Ok()
        with pytest.raises(WorkerFailure) as info:
            worker.request(Run("s", str(inputs), {}, "cpu", str(outputs / "o.safetensors")), 120)
        assert info.value.outcome == "crashed"
        assert info.value.failure.kind == "crashed"
        assert info.value.message.startswith("the worker sent a malformed reply: ") and expected in info.value.message
        assert worker.proc.poll() is not None  # killed: nothing more it says is read
    finally:
        worker.close()


@pytest.mark.slow
def test_a_real_worker_answers_an_unknown_op_with_a_failure_and_goes_on(tmp_path):
    import os

    from grader.sandbox.process import WorkerProcess

    (tmp_path / "repo").mkdir()
    worker = WorkerProcess(tmp_path / "repo", tmp_path / "scratch", interpret=True, settings=Settings(), sandbox=SANDBOX)
    try:
        assert worker.request(Ping(), 300) == Ok()
        os.write(worker._tx, b'{"op": "__init__"}\n')
        line = worker._read_reply(time.monotonic() + 60, 60)
        failure = p.decode_reply(Ping(), line)
        assert isinstance(failure, Failure) and "unknown request op '__init__'" in failure.message
        assert worker.request(Ping(), 60) == Ok()
    finally:
        worker.close()


# -- the GPU handlers' replies, built on the CPU ------------------------------------------------

def _gpu_worker(monkeypatch, tmp_path):
    """A Worker whose GPU is faked: its inputs stay on the CPU, and `torch` is a stand-in for
    the switches and synchronize it calls (the real ones would change this test process)."""
    import types

    import torch

    from grader.worker import server

    worker = _worker()
    worker.functions = {"s": lambda x: x * 2}
    worker.retained, worker.input_cache, worker.roots, worker.watch = {}, {}, [], server.Watch()
    worker.torch = types.SimpleNamespace(Tensor=torch.Tensor, cuda=types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(server.Worker, "_load_cuda", lambda self, path, layout, keep=False: {"x": torch.arange(6.0)})
    return worker


def test_the_gpu_handlers_replies_decode_on_the_trusted_side(monkeypatch, tmp_path):
    import torch
    from safetensors.torch import load_file

    from grader.worker import server, timing

    worker = _gpu_worker(monkeypatch, tmp_path)
    handlers = worker.handlers()

    def time_function(fn, arg_sets, reps, warmup, on_timed_start, on_timed_end):
        """What timing.time_function returns, in its types (ints for ns, floats for ms)."""
        on_timed_start()
        outputs = [fn(*args) for args in arg_sets]
        server.LAUNCHES["add_kernel"] += reps
        on_timed_end()
        return {"event_ms": [0.5] * reps, "marks": [[1, 2, 3]] * reps, "settle_marks": [[4, 5, 6]], "host_ms": [0.75],
                "activities": [["add_kernel", 7, 10, 20]], "activity_error": None, "first_call_ms": 3.0, "outputs": outputs}

    monkeypatch.setattr(timing, "time_function", time_function)
    monkeypatch.setattr(timing, "tampered", lambda: [])
    monkeypatch.setattr(timing, "roofline", lambda: {"gpu": "H200", "copy_gbps": 4000.0, "gemm_tflops": {"float16": 700.0}})

    def exchange(request):
        reply = server.answer(handlers, p.encode(request), [])
        return p.decode_reply(request, p.encode(reply))

    timed = exchange(Time("s", ["/a", "/b"], {}, reps=4))
    assert timed == TimeReply([0.5] * 4, [(1, 2, 3)] * 4, [(4, 5, 6)], [0.75], [("add_kernel", 7, 10, 20)], None, 3.0,
                              launches=4, tampered=[], output_numel=6)
    called = exchange(Call("s", "/fresh", {}, "fresh", record_ops=True))
    assert called == CallReply(ops=["aten::mul.Tensor"], launches=0, numel=6)  # x * 2 is torch's multiply (with its overload), recorded
    idx = tmp_path / "idx.safetensors"
    save_file({"idx": torch.tensor([5, 0])}, str(idx))
    assert exchange(Sample("s", ["set0", "set1", "fresh"], str(idx), str(tmp_path / "s.safetensors"))) == Ok()
    assert {k: v.tolist() for k, v in load_file(tmp_path / "s.safetensors").items()} == \
        {"set0": [10.0, 0.0], "set1": [10.0, 0.0], "fresh": [10.0, 0.0],  # x * 2 at [5, 0]
         "numel.set0": [6], "numel.set1": [6], "numel.fresh": [6]}  # and each whole result's size
    too_far = tmp_path / "far.safetensors"
    save_file({"idx": torch.tensor([6])}, str(too_far))  # past the 6 elements of a result
    missed = exchange(Sample("s", ["set0"], str(too_far), str(tmp_path / "t.safetensors")))
    assert missed == Failure("error", "the result of the timed call on set0 is not a tensor of the expected size")
    assert exchange(Roofline()) == RooflineReply("H200", 4000.0, {"float16": 700.0})
