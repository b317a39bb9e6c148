"""The report as a student sees it: rendered in headless Chromium, with the picture of where a
failing case is wrong. Skipped, with the reason, where no Chromium is installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from grader import spec as specs
from grader.judge.verdict import judge_call
from grader.codec import storage_of
from grader.judge.plan import make_inputs
from grader.report import render
from grader.results import AssignmentResult, RunResult, TestResult
from tests.conftest import COURSE

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _failing(assignment: str, case_name: str, out, blocks: dict) -> TestResult:
    """A correctness test as the grader records it, for a hand-made wrong output."""
    spec = COURSE.get(assignment)
    case = next(c for c in spec.cases if c.name == case_name)
    inputs = make_inputs(spec, case, "float32", 0)
    saved = {f"input.{k}": storage_of(v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    saved["output"] = out(inputs)
    reply = {"device": "cpu", "dtype": "float32", "result_type": "Tensor"}
    verdict = judge_call(spec, case, "float32", inputs, reply, saved, "cpu")
    assert verdict.outcome == "failed"
    return TestResult(assignment, "correctness", f"{case_name} [float32]", "failed", verdict.message, max_score=1,
                      case=case_name, dtype="float32", details=dict(verdict.details.to_json(), blocks=blocks),
                      reproducer=f"grader check . -a {assignment} --case '{case_name}' --dtype float32 --seed 0")


def _tail_never_stored(inputs):
    out = inputs["x"] + inputs["y"]
    out[1048576:] = float("nan")  # a grid of n // BLOCK programs: the one-element tail is never written
    return out


def _columns_cut(inputs):
    out = torch.softmax(inputs["x"], -1)
    out[:, 1024:] = float("nan")  # one block of 1024 per row: the rest of each row never written
    return out


def report_with_failures() -> str:
    vector = _failing("vector_add", "n=1048577", _tail_never_stored, {"BLOCK_SIZE": 1024})
    rows = _failing("softmax", "2x20000", _columns_cut, {"BLOCK_SIZE": 1024})
    run = RunResult("/student/repo", 0, {"mode": "cpu-interpreter", "torch": "x", "triton": "y", "python": "z"})
    run.assignments = [AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()", [vector]),
                       AssignmentResult("softmax", "Row-wise softmax", "kernels/softmax.py:softmax()", [rows])]
    return render(run)


def test_failing_case_has_a_picture_with_its_block_boundaries():
    html = report_with_failures()
    assert html.count('class="wrongmap"') == 2
    assert "last block starts at 1048576" in html  # the 1-D strip marks the tail the grid missed
    assert "zoom: elements" in html
    assert "blocks of 1024 columns" in html  # the 2-D grid marks the row's block
    assert "1 element is NaN" in html and "20000 elements are NaN" not in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html


@pytest.mark.skipif(BROWSER is None, reason="no Chromium here (Debian: apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(report_with_failures())
    shot = tmp_path / "report.png"
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1200,1600",
                    "--hide-scrollbars", page.as_uri()], check=True, capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
    image = pytest.importorskip("PIL.Image", reason="Pillow is needed to look at the screenshot's pixels")
    pixels = {colour for _, colour in image.open(shot).convert("RGB").getcolors(maxcolors=1 << 24)}
    # the pictures were drawn: the colours of right cells and of never-written (NaN) cells are on the page
    assert (0xC6, 0xF6, 0xD5) in pixels
    assert (0x55, 0x3C, 0x9A) in pixels
