"""The red-team corpus: hostile submissions (tests/fixtures/hostile) against the default
sandbox, graded in Triton's CPU interpreter.

Each fixture attacks in one assignment, or in both with outcomes that stay distinct. For
every one: grading goes on, the other assignment is graded, the outcome is timeout, crashed,
error, failed or flagged with the evidence in the report (never a score the code did not
earn), no process of the worker is left, and no file outside the sandbox changed.
Most run in-process (a grading session's grade(), as the CLI and the batch call it); the attack on
the grader's command line and results file runs the real CLI, since that is its target.
All run in the interpreter (`--device cpu`), on a GPU machine too; the `gpu` ones use the GPU.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import secrets
import select
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from markupsafe import escape

from tests.conftest import SANDBOX, COURSE, REPO_ROOT, assert_nothing_left, build_submission, run_cli
from grader.settings import Settings
from grader.sandbox.launch import worker_env
from grader.sandbox.process import detect
from grader import spec as specs
from grader.judge.context import GradingContext
from grader.judge.session import open_session
from grader.report import render
from grader.submission import open_submission
from grader.settings import Settings

ISOLATION = detect("sandbox", settings=Settings(), sandbox=SANDBOX)
needs_namespaces = pytest.mark.skipif(not ISOLATION.namespaces, reason=f"no namespaces here: {ISOLATION.warnings}")
MARKS = ("pwned-by-escape",)
pytestmark = pytest.mark.slow  # each grades hostile code in sandboxed workers


@dataclass
class Graded:
    run: object
    results: dict
    report: str
    seconds: float

    def test(self, assignment: str, name: str) -> dict:
        return next(t for t in self.results["tests"] if t["name"] == f"{assignment}: {name}")

    def score(self, assignment: str) -> float:
        return self.results["extra_data"]["assignments"][assignment]["score"]

    def warnings(self, assignment: str) -> list[str]:
        return [w["what"] for w in self.results["extra_data"]["assignments"][assignment]["integrity_warnings"]]


def outside_state(repo: Path) -> dict:
    """What a submission must not change: its own folder, the grader, the references, torch,
    and the places an escape would write to."""
    state = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(repo.rglob("*")) if p.is_file()}
    for folder in (REPO_ROOT / "grader", REPO_ROOT / "reference", REPO_ROOT / "assignments", Path(torch.__file__).parent):
        for p in sorted(folder.glob("*")):
            if p.is_file():
                st = p.stat()
                state[str(p)] = (st.st_mtime_ns, st.st_size)
    for folder in ("/tmp", "/var/tmp", "/dev/shm", "/root", "/etc", str(REPO_ROOT)):
        state[folder + " marks"] = sorted(n for n in os.listdir(folder) if any(m in n for m in MARKS))
    return state


def grade(tmp_path: Path, fixture: str, cases: list[str], timeout: float = 10, import_timeout: float | None = None,
          extra_files: dict[str, str] | None = None, device: str = "cpu") -> Graded:
    repo = build_submission(tmp_path / "submissions" / fixture, f"hostile/{fixture}")
    for name, text in (extra_files or {}).items():
        (repo / name).write_text(text)
    before = outside_state(repo)
    opts = GradingContext(device, 424242, tuple(cases) if cases else None, ("float32",), timeout, import_timeout=import_timeout)
    start = time.monotonic()
    run = open_session(opts, Settings()).grade(open_submission(repo), [COURSE.get("softmax"), COURSE.get("vector_add")])
    seconds = time.monotonic() - start
    assert outside_state(repo) == before
    return Graded(run, run.to_gradescope(), render(run), seconds)


def assert_outcome(g: Graded, assignment: str, name: str, outcome: str, *words: str) -> dict:
    test = g.test(assignment, name)
    assert test["outcome"] == outcome, test
    assert test["score"] == 0 or outcome == "passed"
    for w in words:
        assert w in test["output"], (w, test["output"])
        assert str(escape(w)) in g.report, w
    return test


def test_endless_import_times_out_and_the_other_assignment_is_graded(tmp_path):
    g = grade(tmp_path, "import_loop", ["1x1", "n=1"], import_timeout=6)
    assert_outcome(g, "softmax", "import", "timeout", "importing kernels/softmax.py failed", "no answer within 6 s")
    assert_outcome(g, "vector_add", "n=1 [float32]", "passed")
    assert g.score("softmax") == 0 and g.score("vector_add") == 6  # the endless import was cut off, not waited out
    assert_nothing_left()


def test_each_way_of_dying_is_told_apart_and_the_rest_still_graded(tmp_path):
    g = grade(tmp_path, "crashes", ["1x1", "n=1", "n=127", "n=128", "n=129", "n=98432"], timeout=5)
    assert_outcome(g, "vector_add", "n=1 [float32]", "error", "SystemExit: 3")
    assert_outcome(g, "vector_add", "n=127 [float32]", "crashed", "killed by signal SIGABRT (abort)")
    assert_outcome(g, "vector_add", "n=128 [float32]", "crashed", "killed by signal SIGSEGV (segmentation fault)")
    assert_outcome(g, "vector_add", "n=129 [float32]", "crashed", "exited with status 5")
    assert_outcome(g, "vector_add", "n=98432 [float32]", "passed")  # a fresh worker after three deaths
    assert g.score("vector_add") == pytest.approx(6 / 5)
    # spinning in the call with SIGTERM ignored: killed all the same
    assert_outcome(g, "softmax", "1x1 [float32]", "timeout", "no answer within 5 s")
    assert "starts other programs" not in g.warnings("vector_add")
    assert "calls native code directly (it can patch or crash the process)" in g.warnings("vector_add")
    assert "handles signals (a timeout is a signal)" in g.warnings("softmax")
    assert_nothing_left()


def test_kernel_that_raises_is_an_error_and_a_flood_of_output_costs_nothing(tmp_path):
    g = grade(tmp_path, "triton_raise", ["1x1", "n=1"])
    assert_outcome(g, "vector_add", "n=1 [float32]", "error", "BLOCK_SIZE must be a multiple of 3", 'File "kernels/vector_add.py"')
    # 100 MB printed: neither blocked the worker nor reached the results; the right answer earns its points
    assert_outcome(g, "softmax", "1x1 [float32]", "passed")
    assert len(json.dumps(g.results)) < 200_000 and len(g.report) < 200_000


@needs_namespaces
def test_writes_outside_the_repo_copy_change_nothing(tmp_path):
    g = grade(tmp_path, "escape", ["1x1", "n=1"])
    test = assert_outcome(g, "vector_add", "n=1 [float32]", "error", "escape report:")
    report = dict(item.split(": ", 1) for item in test["output"].split("escape report: ", 1)[1].splitlines()[0].split("; "))
    scratch = {Path(d) for d in ("/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir())}
    checkout_in_scratch = any(d in REPO_ROOT.resolve().parents for d in scratch)
    for target, what in report.items():
        if Path(target).parent in scratch:  # a private tmpfs in the worker: written there, gone with the worker
            assert what == "written" and not Path(target).exists(), (target, what)
        elif checkout_in_scratch and Path(target) == REPO_ROOT.resolve() / "pwned-by-escape":
            # a checkout under /tmp: in the worker its folder is a mount point on the private /tmp
            assert what != "touched" and not Path(target).exists(), (target, what)
        else:
            assert what != "written" and what != "touched", (target, what)
            # read-only, not ours, or not even there (a folder under a private /tmp is blank in the worker)
            assert any(w in what for w in ("Read-only file system", "Permission denied", "No such file or directory")) \
                or what.startswith("OSError"), (target, what)
    assert_outcome(g, "softmax", "1x1 [float32]", "passed")
    assert_nothing_left()


@needs_namespaces
def test_no_network_and_no_process_outlives_the_worker(tmp_path):
    marker = str(secrets.randbelow(10**9))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        g = grade(tmp_path, "network", ["1x1", "n=1"], extra_files={"port.txt": str(port), "marker.txt": marker})
        ready, _, _ = select.select([listener], [], [], 0.5)
        assert not ready, "a connection reached the listener on 127.0.0.1"
    assert_outcome(g, "vector_add", "n=1 [float32]", "error", "network report: OSError", "Network is unreachable")
    assert "opens network connections" in g.warnings("vector_add")
    # 50 children, detached or orphaned: the answer was right, and none of them is left
    assert_outcome(g, "softmax", "1x1 [float32]", "passed")
    assert "starts processes" in g.warnings("softmax") and "detaches from its process group" in g.warnings("softmax")
    assert_nothing_left(marker=f"3600.{marker}")


def test_forged_replies_results_and_patched_comparisons_earn_nothing(tmp_path):
    g = grade(tmp_path, "forge", ["1x1", "n=1"])
    assert_outcome(g, "softmax", "1x1 [float32]", "failed", "every element is wrong")
    assert_outcome(g, "vector_add", "n=1 [float32]", "failed", "every element is wrong")
    assert g.results["score"] == 0 and "999" not in json.dumps(g.results)
    assert "replaces torch.allclose (monkeypatching)" in g.warnings("vector_add")
    assert "names the results file" in g.warnings("softmax")
    assert "Static scan, for a TA to review (not a verdict, the score is unchanged)" in g.report


def test_precomputed_answers_and_torch_behind_a_kernel_earn_nothing(tmp_path):
    g = grade(tmp_path, "precompute", ["1x1", "n=127"])
    # inputs are shown one call at a time: nothing was there to read ahead at import
    assert_outcome(g, "vector_add", "n=127 [float32]", "failed", "never written")
    # torch did the work and a copy kernel was launched for show: flagged, no points
    assert_outcome(g, "softmax", "uses its own Triton kernel", "flagged", "aten::_softmax ran inside softmax()")
    assert g.score("softmax") == 0
    assert g.results["score"] == 0


def test_inputs_modified_in_place_or_returned_as_a_view_fail(tmp_path):
    g = grade(tmp_path, "inputs", ["1x1", "n=129"])
    assert_outcome(g, "vector_add", "n=129 [float32]", "failed", "the input y was modified in place")
    assert_outcome(g, "softmax", "1x1 [float32]", "failed", "the result equals the input x")


@needs_namespaces
def test_grader_command_line_seed_results_file_and_reference_are_out_of_reach(tmp_path):
    repo = build_submission(tmp_path / "submissions" / "proc", "hostile/proc")
    before = outside_state(repo)
    run = run_cli(["check", str(repo), "--device", "cpu", "--seed", "987654321", "--case", "1x1", "--case", "n=1", "--dtype", "float32",
                   "--timeout", "20", "--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out")], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    written = (tmp_path / "out" / "results.json").read_text()
    softmax = run.test("softmax", "1x1 [float32]")
    assert softmax["outcome"] == "error"
    assert "proc report: grader command lines found: 0; results files written: []" in softmax["output"]
    output = run.test("vector_add", "n=1 [float32]")["output"]
    secrets_report = output.split("secrets report: ", 1)[1].splitlines()[0]  # its words, not our reproducer's
    assert "987654321" not in secrets_report and "seed-like: {}" in secrets_report
    assert "reference: unreadable" in secrets_report
    assert "folder lists []" in secrets_report or "folder lists nothing" in secrets_report  # blank, or absent from its view
    seen = set(ast.literal_eval(secrets_report.split("environment variables seen: ", 1)[1].split("]", 1)[0] + "]"))
    assert {k for k in seen if not k.startswith(("TORCH", "TRITON"))} <= set(worker_env(Path("/x"), True, None))
    # the detached process it tried to leave behind is gone (it would rewrite the file for 20 s),
    # so the file is final: nothing can change it any more
    assert_nothing_left()
    assert (tmp_path / "out" / "results.json").read_text() == written
    assert run.results["score"] == 0 and "forged" not in written
    assert run.results["extra_data"]["environment"]["isolation"]["mode"] == "sandbox"
    assert outside_state(repo) == before
    assert_nothing_left()


def test_an_output_file_replaced_by_a_fifo_or_a_link_fails_that_call_at_once(tmp_path):
    """The worker's save replaced: a FIFO no one writes (a blocking read waits forever), links to
    /dev/zero and /etc/passwd, a folder. Each call fails with what it found, within the run's
    time, and the next case passes."""
    import threading

    box: list = []
    thread = threading.Thread(target=lambda: box.append(grade(tmp_path, "outputs", ["1x1", "n=1", "n=127", "n=128", "n=129", "n=98432"])),
                              daemon=True)
    thread.start()
    thread.join(300)
    assert not thread.is_alive(), "grading blocked on a file the worker left"
    g = box[0]
    for case, words in (("n=1", "is a FIFO, not a regular file"), ("n=127", "cannot be read: a symbolic link"),
                        ("n=128", "cannot be read: a symbolic link"), ("n=129", "is a folder, not a regular file")):
        assert_outcome(g, "vector_add", f"{case} [float32]", "failed", "the worker's output file could not be read", words)
    assert_outcome(g, "vector_add", "n=98432 [float32]", "passed")
    assert_outcome(g, "softmax", "1x1 [float32]", "passed")
    assert "root:" not in json.dumps(g.results)  # /etc/passwd was not read
    assert_nothing_left()


@pytest.mark.gpu
def test_gpu_sandboxed_worker_grades_on_the_gpu_and_an_illegal_address_costs_only_its_call(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its workers' folders: told apart from parallel tests'
    g = grade(tmp_path, "cuda_fault", ["1x1", "n=1", "n=127"], timeout=120, device="cuda")
    assert g.run.environment["isolation"]["mode"] == "sandbox"
    assert_outcome(g, "vector_add", "n=1 [float32]", "passed")  # the GPU is reachable from the sandbox
    fault = g.test("vector_add", "n=127 [float32]")
    assert fault["outcome"] in ("error", "crashed") and "illegal memory access" in fault["output"], fault
    assert_outcome(g, "softmax", "1x1 [float32]", "passed")
    assert_nothing_left(within=tmp_path)
