"""What the worker writes back is data: the judge trusts no claim, no text and no size of the
student's. Each class of hostile reply, by a fake reply or file where that is enough (fast), and
by a hostile submission graded for real in a sandboxed worker where the worker itself must do it.

1. a claim believed over the evidence: dtype and shape come from the saved tensor;
2. odd tensors (float8 inputs, a missing part, unknown names): a failure of the case, never an exception;
3. text that cannot be written (lone surrogates): valid UTF-8 at every sink;
4. numbers that are not numbers: refused in the reply, results.json always strict JSON;
5. sizes: a result far larger than the case's refused from its header; text bounded, the cut said.
"""

from __future__ import annotations

import base64
import json
import os
import re
import resource
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.classbuild import make_class
from tests.conftest import COURSE, build_submission, run_cli
from grader import protocol as p
from grader import spec as specs
from grader.codec import storage_of
from grader.judge.context import GradingContext
from grader.judge.session import open_session
from grader.judge.evidence import EvidenceError, Expected, read_saved
from grader.judge.verdict import judge_call
from grader.protocol import BurstReply, Failure, ProtocolError, Run, RunBurst, RunReply
from grader.report import render
from grader.submission import open_submission
from grader.settings import Settings

X = torch.tensor([1.0, -2.0, 0.5, 10.0, 0.0])
Y = torch.tensor([0.25, 4.0, -0.5, 10.0, 0.0])
CASE = COURSE.get("vector_add").cases[0]
RUN = Run("student", "/i", {}, "cpu", "/o")


def reply(**kw) -> dict:
    return {"device": "cpu", "dtype": "float32", "shape": [5], "result_type": "Tensor", **kw}


def saved(out, **more) -> dict:
    return {"input.x": storage_of(X), "input.y": storage_of(Y), "output": out, **more}


# -- 1. the judge reads evidence, never claims ------------------------------------------------------

def test_a_result_in_another_dtype_fails_whatever_the_reply_claims():
    spec = COURSE.get("vector_add")
    x16, y16 = X.half(), Y.half()
    out = (X + Y).float()  # right values, in float32 for a float16 case
    files = {"input.x": storage_of(x16), "input.y": storage_of(y16), "output": out}
    lie = reply(dtype="float16")
    verdict = judge_call(spec, CASE, "float16", {"x": x16, "y": y16}, lie, files, "cpu")
    assert verdict.outcome == "failed"
    assert verdict.message == "the result's dtype is float32, expected float16 (the input's dtype)"
    honest = {**files, "output": (x16 + y16)}
    assert judge_call(spec, CASE, "float16", {"x": x16, "y": y16}, lie, honest, "cpu").outcome == "passed"


def test_a_reply_that_misdescribes_the_saved_result_is_named():
    spec = COURSE.get("vector_add")
    verdict = judge_call(spec, CASE, "float32", {"x": X, "y": Y}, reply(shape=[7]), saved(X + Y), "cpu")
    assert verdict.outcome == "failed"
    assert "the worker's reply describes the result as float32 of shape (7,)" in verdict.message
    assert "the tensor it saved is float32 of shape (5,)" in verdict.message
    assert judge_call(spec, CASE, "float32", {"x": X, "y": Y}, reply(), saved(X + Y), "cpu").outcome == "passed"


# -- 2. odd tensors are a failure of the case, never an exception --------------------------------

def test_an_input_copy_in_float8_fails_the_case_instead_of_raising():
    spec = COURSE.get("vector_add")
    files = saved(X + Y, **{"input.y": storage_of(Y).to(torch.float8_e4m3fn)})
    verdict = judge_call(spec, CASE, "float32", {"x": X, "y": Y}, reply(), files, "cpu")
    assert verdict.outcome == "failed" and "the input y was modified in place" in verdict.message


def test_a_tuple_reply_without_its_parts_in_the_file_fails_the_case():
    spec = COURSE.get("layernorm_backward")
    from grader.judge.plan import make_inputs

    case = spec.cases[0]
    inputs = make_inputs(spec, case, "float32", 0)
    files = {f"input.{k}": storage_of(v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    part = {"device": "cpu", "dtype": "float32", "shape": list(inputs["x"].shape)}
    three = {"device": "cpu", "result_type": "tuple", "outputs": [part, part, part]}
    verdict = judge_call(spec, case, "float32", inputs, three, files, "cpu")  # no output.0 at all
    assert verdict.outcome == "failed"
    assert "the worker's reply describes 3 results, but the file it saved holds 0" in verdict.message


def write(path: Path, tensors: dict) -> Path:
    save_file(tensors, str(path))
    return path


def expected(refs=None) -> Expected:
    return Expected.of({"x": X, "y": Y}, X + Y if refs is None else refs)


def test_the_output_file_is_checked_from_its_header(tmp_path):
    out = tmp_path / "outputs"
    out.mkdir()
    good = {"input.x": storage_of(X), "input.y": storage_of(Y), "output": X + Y}
    assert torch.equal(read_saved(write(out / "a", good), expected())["output"], X + Y)
    cases = {
        "float8": ({**good, "output": (X + Y).to(torch.float8_e5m2)}, "dtype is float8_e5m2, which no case expects"),
        "unknown name": ({**good, "cache": X}, "holds a tensor no call saves ('cache')"),
        "input of another dtype": ({**good, "input.x": X.double()},
                                   "the input 'x' came back as float64 of shape (5,), not as it was given (float32 of shape (5,))"),
        "too many parts": ({**good, "output.99": X}, "holds a tensor no call saves ('output.99')"),
    }
    for name, (tensors, words) in cases.items():
        with pytest.raises(EvidenceError) as caught:
            read_saved(write(out / name.replace(" ", "_"), tensors), expected())
        assert words in str(caught.value), name
    (out / "junk").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(EvidenceError, match="header of"):
        read_saved(out / "junk", expected())
    (out / "nan").write_bytes(len(b'{"output": NaN}').to_bytes(8, "little") + b'{"output": NaN}')
    with pytest.raises(EvidenceError, match="not JSON"):
        read_saved(out / "nan", expected())


def test_a_result_far_larger_than_the_case_is_refused_before_it_is_read(tmp_path):
    """A header that claims 1 GiB of output over a sparse file: refused from the header, with
    no more memory taken than the header's."""
    out = tmp_path / "outputs"
    out.mkdir()
    n = 1 << 28  # float32: 1 GiB
    header = json.dumps({"output": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    path = out / "huge.safetensors"
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + 4 * n)  # sparse: costs no disk
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(EvidenceError) as caught:
        read_saved(path, expected())
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert "the result has shape (268435456,), expected (5,)" in str(caught.value)
    assert "far more than the 4116 the judge reads for this case; not read" in str(caught.value)
    assert grown_mb < 64, grown_mb


# -- 3, 4, 5: every reply field validated, its text made writable and bounded --------------------

def wire(**fields) -> str:
    body = {"ok": True, "seconds": 0.5, "launches": {"k": 1}, "blocks": {}, "ops": [], "result_type": "Tensor", **fields}
    return json.dumps(body)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_reply_with_a_number_that_is_not_a_number_is_refused(value):
    with pytest.raises(ProtocolError, match="field 'seconds' must be a finite number"):
        p.decode_reply(RUN, wire(seconds=value))
    with pytest.raises(ProtocolError, match="within 64 bits"):
        p.decode_reply(RUN, wire(launches={"k": 1 << 70}))
    # a sampled result may hold the NaN a kernel computed: that field says so, and keeps it
    burst = p.decode_reply(RunBurst("student", 1), json.dumps({"ok": True, "values": [[value, 1.0]]}))
    assert isinstance(burst, BurstReply) and str(burst.values[0][0]) == str(value)


def test_lone_surrogates_in_a_reply_become_replacement_characters():
    line = wire(launches={"kern\ud800el": 1}, dtype="float32")
    got = p.decode_reply(RUN, line)
    assert isinstance(got, RunReply) and list(got.launches) == ["kern\ufffdel"]
    failure = p.decode_reply(RUN, json.dumps({"ok": False, "kind": "error", "message": "bad \udfff byte",
                                              "traceback": "\ud83d\ude00 fine"}))
    assert isinstance(failure, Failure) and failure.message == "bad \ufffd byte" and failure.traceback == "\U0001F600 fine"
    failure.message.encode("utf-8")  # writable


def test_a_flood_of_text_in_a_reply_is_cut_and_says_so():
    failure = p.decode_reply(RUN, json.dumps({"ok": False, "kind": "error", "message": "A" * (5 << 20)}))
    assert len(failure.message) < p.TEXT_LIMIT + 200
    assert failure.message.endswith(f"[... {(5 << 20) - p.TEXT_LIMIT} more characters cut: the worker's text is "
                                    f"bounded to {p.TEXT_LIMIT} characters]")
    got = p.decode_reply(RUN, wire(launches={"k" * 10_000: 1}))
    assert len(next(iter(got.launches))) < p.KEY_LIMIT + 200


def test_a_reply_with_a_flood_of_names_is_refused():
    with pytest.raises(ProtocolError, match="field 'launches' holds 5000 entries, more than the 1024 a reply may"):
        p.decode_reply(RUN, wire(launches={f"k{i}": 1 for i in range(5000)}))
    with pytest.raises(ProtocolError, match="field 'ops' holds 5000 strings"):
        p.decode_reply(RUN, wire(ops=[f"aten::op{i}" for i in range(5000)]))
    assert len(p.decode_reply(RUN, wire(launches={f"k{i}": 1 for i in range(100)})).launches) == 100


def test_a_report_shows_a_bounded_amount_of_the_workers_text_in_all():
    from grader.report import REPORT_TEXT_LIMIT
    from grader.results import AssignmentResult, RunResult, TestResult

    tests = [TestResult("vector_add", "correctness", f"case {i} [float32]", "error", f"{i} " + "E" * 9000,
                        traceback=f"{i} " + "T" * 9000, output=f"{i} " + "O" * 9000) for i in range(200)]
    run = RunResult("repo", 1, {}, [AssignmentResult("vector_add", "Vector add", "kernels/vector_add.py:vector_add()", tests=tests)])
    page = render(run)
    assert len(page) < 2 * REPORT_TEXT_LIMIT, len(page)
    assert "a report shows at most 524288 characters of the worker&#39;s text in all" in page
    assert run.assignments[0].tests[-1].output.startswith("199 OOO")  # the results keep theirs
    data = run.to_gradescope()
    assert len(json.dumps(data)) < 2 * (256 << 10) + 200 * 1000, len(json.dumps(data))
    assert "a results file keeps at most 262144 characters of test output in all" in data["tests"][-1]["output"]


def test_the_worker_cuts_a_flood_of_message_before_its_pipe():
    from grader.worker.server import answer

    def raises(req):
        raise ValueError("bad \ud800 " + "A" * (5 << 20))

    reply = answer({p.Ping: raises}, p.encode(p.Ping()), [])
    assert isinstance(reply, Failure) and len(p.encode(reply)) < 3 * p.TEXT_LIMIT  # message and traceback, each cut
    assert reply.message.startswith("ValueError: bad \ufffd AAA") and "more characters cut" in reply.message


def test_a_reply_nested_too_deep_is_a_protocol_error_not_a_recursion_error():
    with pytest.raises(ProtocolError, match="nested too deep"):
        p.decode_reply(RUN, "[" * 100_000 + "]" * 100_000)


# -- the same, from a real sandboxed worker that the student's module tampered with ----------------

def graded(tmp_path: Path, fixture: str, cases: tuple[str, ...], dtypes: tuple[str, ...]):
    repo = build_submission(tmp_path / fixture, f"hostile/{fixture}")
    ctx = GradingContext("cpu", 424242, cases, dtypes, 20)
    run = open_session(ctx, Settings()).grade(open_submission(repo), [COURSE.get("softmax"), COURSE.get("vector_add")])
    return run, run.to_gradescope(), render(run)


def outcome(results: dict, name: str) -> dict:
    return next(t for t in results["tests"] if t["name"] == name)


@pytest.mark.slow
def test_a_worker_that_lies_about_its_result_or_saves_float8_inputs_fails_those_cases(tmp_path):
    run, results, page = graded(tmp_path, "claims", ("1x1", "n=127"), ("float16",))
    lie = outcome(results, "vector_add: n=127 [float16]")
    assert lie["status"] == "failed" and "the result's dtype is float32, expected float16" in lie["output"]
    odd = outcome(results, "softmax: 1x1 [float16]")
    assert odd["status"] == "failed" and "the input 'x' came back as float8_e4m3fn" in odd["output"]
    assert results["score"] == 0
    assert "Traceback" not in json.dumps(results) and "infra_error" not in json.dumps(results)
    json.loads(json.dumps(results, allow_nan=False))


@pytest.mark.slow
def test_a_result_far_larger_than_the_case_costs_the_grader_no_memory(tmp_path):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run, results, page = graded(tmp_path, "huge_result", ("n=127",), ("float32",))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    huge = outcome(results, "vector_add: n=127 [float32]")
    assert huge["status"] == "failed"
    assert "the result has shape (33554432,), expected (127,)" in huge["output"] and "not read" in huge["output"]
    assert grown_mb < 100, grown_mb  # read, the file alone is 128 MiB, and loading it as much again


# -- text and numbers through every sink of `grader check`, locally and in CI ----------------------

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f\ud800-\udfff]")  # raw controls (no newline or tab) or a lone surrogate


def check_in_ci(tmp_path: Path, repo: Path, ci: str) -> tuple:
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output), "GITHUB_WORKSPACE": str(repo)}
    if ci == "classroom50":  # what Classroom 50's runner sets
        url = "https://github.com/cs-org/cs101-vector-add-alice"
        env.update({"CLASSROOM": "cs101", "ASSIGNMENT": "vector-add", "SUBMISSION_TAG": "submit/1", "OWNER": "alice",
                    "USERNAME": "alice", "ASSIGNMENT_TYPE": "individual", "COMMIT_URL": f"{url}/commit/abc1234",
                    "RELEASE_URL": f"{url}/releases/tag/submit/1", "REVIEW_URL": f"{url}/pull/1",
                    "GITHUB_REPOSITORY": "cs-org/cs101-vector-add-alice"})
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        run = run_cli(["check", str(repo), "-a", "softmax", "-a", "vector_add", "--case", "1x1", "--case", "n=1",
                       "--case", "n=127", "--device", "cpu", "--seed", "5", "--dtype", "float32", "--ci", ci,
                       "--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out")], tmp_path)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return run, summary.read_bytes() if summary.exists() else b"", output.read_bytes() if output.exists() else b""


@pytest.mark.slow
@pytest.mark.parametrize("ci", ["github", "classroom50"])
def test_hostile_text_and_numbers_reach_every_sink_valid_bounded_and_strict(tmp_path, ci):
    repo = build_submission(tmp_path / "repo", "hostile/text")
    run, summary, output = check_in_ci(tmp_path, repo, ci)
    assert "Traceback (most recent call last)" not in run.stderr, run.stderr[-3000:]
    results_text = (tmp_path / "out" / "results.json").read_bytes().decode("utf-8")  # valid UTF-8
    results = json.loads(results_text, parse_constant=lambda c: pytest.fail(f"{c} in results.json"))  # strict JSON
    page = (tmp_path / "out" / "report.html").read_bytes().decode("utf-8")
    for text in (results_text, page, run.stdout, run.stderr, summary.decode("utf-8"), output.decode("utf-8")):
        assert not RAW.search(text), RAW.search(text)
    # each hostile call failed for its own reason, the honest one passed
    raised = outcome(results, "vector_add: n=1 [float32]")
    assert raised["outcome"] == "error" and "bad \ufffd surrogate \\x1b[2J\\x0d" in raised["output"]
    assert "characters of the message cut here" in raised["output"] or "more characters cut" in raised["output"]
    nan = outcome(results, "vector_add: n=127 [float32]")
    assert nan["outcome"] == "crashed" and "field 'seconds' must be a finite number, not nan" in nan["output"]
    passed = outcome(results, "softmax: 1x1 [float32]")
    assert passed["outcome"] == "passed" and "soft\ufffdmax\x1b[2J\rkernel" in passed["extra_data"]["details"]["kernels"]
    assert "\\x1b[2J" in page  # the report shows the student's escapes as text
    # 5 MB of message and 20,000 lines of output: nothing grew without bound
    sizes = {"results.json": len(results_text), "report.html": len(page), "stdout": len(run.stdout), "stderr": len(run.stderr),
             "summary": len(summary), "output": len(output)}
    assert max(sizes.values()) < 100_000, sizes  # from 5 MB of message and 20,000 lines of output
    assert all(len(line) < 20_000 for line in run.stdout.splitlines()), "an ::error line per case stays short"
    if ci == "github":
        assert output.startswith(b"result=")
        payload = json.loads(base64.b64decode(output.split(b"=", 1)[1]), parse_constant=lambda c: pytest.fail(c))
        assert {t["status"] for t in payload["tests"]} >= {"error", "fail"} or payload["status"] in ("fail", "error")
    else:
        body = json.loads((repo / "result.json").read_bytes().decode("utf-8"), parse_constant=lambda c: pytest.fail(c))
        assert body and not RAW.search(json.dumps(body, ensure_ascii=False))


# -- the same hostile students in a batch: each graded, nothing lost, nobody else touched -----------

@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_batch_grades_what_hostile_workers_write_back_as_the_students_failures(tmp_path):
    roster = make_class(tmp_path, {"alice": "good", "claims": "hostile/claims", "text": "hostile/text",
                                   "huge": "hostile/huge_result"})
    run = run_cli(["grade", "--roster", str(roster), "--out", "out", "--device", "cpu", "--jobs", "2", "-a", "softmax",
                   "-a", "vector_add", "--case", "1x1", "--case", "n=1", "--case", "n=127", "--dtype", "float16"], tmp_path)
    assert "Traceback (most recent call last)" not in run.stdout + run.stderr, run.stderr[-3000:]
    graded = {}
    for student in ("alice", "claims", "text", "huge"):
        folder = tmp_path / "out" / "students" / student
        text = (folder / "results.json").read_bytes().decode("utf-8")
        graded[student] = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {student}'s results.json"))
        page = (folder / "report.html").read_bytes().decode("utf-8")
        assert not RAW.search(text) and not RAW.search(page), student
        assert len(text) < 150_000 and len(page) < 150_000, student
        assert all(t["outcome"] != "infra_error" for t in graded[student]["tests"]), student
    assert all(t["outcome"] == "passed" for t in graded["alice"]["tests"] if "[float16]" in t["name"])
    lie = outcome(graded["claims"], "vector_add: n=127 [float16]")
    assert lie["outcome"] == "failed" and "the result's dtype is float32, expected float16" in lie["output"]
    assert "came back as float8_e4m3fn" in outcome(graded["claims"], "softmax: 1x1 [float16]")["output"]
    assert "field 'seconds' must be a finite number" in outcome(graded["text"], "vector_add: n=127 [float16]")["output"]
    assert outcome(graded["text"], "vector_add: n=1 [float16]")["outcome"] == "error"
    huge = outcome(graded["huge"], "vector_add: n=127 [float16]")
    assert huge["outcome"] == "failed" and "not read" in huge["output"]
