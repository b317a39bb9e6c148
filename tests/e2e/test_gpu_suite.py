"""scripts/gpu_tests.py, the GPU suite's one command, as far as a machine without a GPU can test
it: the phases it plans, and what it says of each file from pytest's own words, whole or cut."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location("gpu_tests", REPO_ROOT / "scripts" / "gpu_tests.py")
suite = importlib.util.module_from_spec(_spec)
sys.modules["gpu_tests"] = suite  # its dataclasses look their module up
_spec.loader.exec_module(suite)

FILES = ["tests/gpu/test_batch_gpu.py", "tests/gpu/test_gpu.py", "tests/gpu/test_profile_gpu.py",
         "tests/gpu/test_replay_gpu.py"]


def test_the_replays_run_alone_first_then_one_pool_longest_first():
    phases = suite.plan(FILES, 8)
    assert [(p.files, p.workers) for p in phases] == [
        (["tests/gpu/test_replay_gpu.py"], 0),
        (["tests/gpu/test_profile_gpu.py", "tests/gpu/test_batch_gpu.py", "tests/gpu/test_gpu.py"], 8)]


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.gpu.test_gpu" name="test_a[x]" time="12.5"/>
<testcase classname="tests.gpu.test_gpu" name="test_b" time="3.0"><failure message="assert 1 == 2">...</failure></testcase>
<testcase classname="tests.gpu.test_gpu" name="test_c" time="1.0"/>
<testcase classname="tests.gpu.test_gpu" name="test_c" time="0.5"><error message="teardown">...</error></testcase>
<testcase classname="tests.gpu.test_profile_gpu" name="test_p" time="0.0"><skipped message="no ncu here"/></testcase>
</testsuite></testsuites>"""


def test_each_file_says_its_outcomes_and_names_its_failures_and_what_did_not_run(tmp_path):
    xml = tmp_path / "pool.xml"
    xml.write_text(JUNIT)
    junit = suite.junit_results(xml)
    assert junit["tests/gpu/test_gpu.py::test_a[x]"] == ("PASSED", 12.5, "")
    assert junit["tests/gpu/test_gpu.py::test_c"][0] == "ERROR"  # passed, then its teardown failed
    ids = {"tests/gpu/test_gpu.py": [f"tests/gpu/test_gpu.py::{n}" for n in ("test_a[x]", "test_b", "test_c",
                                                                             "test_d", "test_e")],
           "tests/gpu/test_profile_gpu.py": ["tests/gpu/test_profile_gpu.py::test_p"]}
    # test_d finished after junit's file was written (a cut phase): its -v line says it; test_e never ran
    live = "[gw3] [ 80%] FAILED tests/gpu/test_gpu.py::test_d \ntests/gpu/test_gpu.py::test_a[x] PASSED [ 20%]\n"
    gpu, profile = suite.summarize(ids, live, junit)
    assert (gpu.passed, gpu.failed, gpu.errors, gpu.unrun) == (["test_a[x]"], ["test_b", "test_d"], ["test_c"],
                                                             ["test_e"])
    assert not gpu.ok and profile.ok
    assert gpu.line().splitlines() == [
        "FAIL tests/gpu/test_gpu.py: 1 passed, 2 failed, 1 errors, 1 not run (17 s of tests)",
        "       FAILED test_b", "       FAILED test_d", "       ERROR test_c", "       NOT RUN test_e"]
    assert profile.line() == "ok   tests/gpu/test_profile_gpu.py: 0 passed, 1 skipped (0 s of tests) skipped: no ncu here"


def test_a_file_that_collects_nothing_is_an_error_not_a_pass():
    (r,) = suite.summarize({"tests/gpu/test_broken.py": []}, "", {})
    assert not r.ok and r.errors == ["tests/gpu/test_broken.py (collected no test)"]


def test_without_a_gpu_the_command_runs_each_file_and_says_why_its_tests_were_skipped(tmp_path):
    summary = tmp_path / "summary.txt"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gpu_tests.py"), "tests/gpu/test_batch_gpu.py",
                           "--budget", "300", "--summary", str(summary)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = summary.read_text().splitlines()
    assert lines[0] == ("ok   tests/gpu/test_batch_gpu.py: 0 passed, 2 skipped (0 s of tests) skipped: needs a CUDA GPU; "
                        "none is visible on this machine"), lines
    assert lines[1].startswith("ok   the GPU suite: 0 passed, 0 failed, 0 errors, 2 skipped, 0 not run, in "), lines
