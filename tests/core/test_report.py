"""The report opens with the whole run: one line per assignment (points, state, the one-line cause),
what is missing said once, and a CPU-only score said to be no grade; the detail follows. The class
dashboard fits a 1400-pixel window: its wide table scrolls inside its own box. Student text stays
escaped in both. Layout is measured in headless Chromium where it is installed (skipped otherwise)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from grader.batch.classview import Cell, ClassView, Row, render_dashboard
from grader.payloads import SubmissionPayload
from grader.report import render
from grader.results import AssignmentResult, RunResult, TestResult

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
NINE = ["conv2d", "dropout", "flash_attention", "layernorm", "layernorm_backward", "matmul_relu", "rmsnorm", "softmax",
        "vector_add"]
HOSTILE = "<img src=x onerror=alert(1)>"


def _missing(name: str) -> AssignmentResult:
    """What grader.judge.grade gives an assignment whose module is not in the repo."""
    return AssignmentResult(name, name.title(), f"kernels/{name}.py:{name}()", [
        TestResult(name, "submission", "not submitted", "failed", f"kernels/{name}.py is not in the submission",
                   max_score=8, details=SubmissionPayload(not_submitted=True)),
        TestResult(name, "performance", "checks that need a GPU", "skipped", "not submitted", max_score=12)])


def _graded(name: str, message: str = "") -> AssignmentResult:
    tests = [TestResult(name, "correctness", f"n={i} [float32]", "passed", max_score=1, score=1, case=f"n={i}",
                        dtype="float32") for i in range(3)]
    if message:
        tests.append(TestResult(name, "correctness", "n=9 [float32]", "failed", message, max_score=1, case="n=9",
                                dtype="float32"))
    tests.append(TestResult(name, "performance", "speed", "skipped", "speed is measured on a GPU only", max_score=4))
    return AssignmentResult(name, name.title(), f"kernels/{name}.py:{name}()", tests)


def _two_of_nine() -> RunResult:
    chosen = {"softmax": _graded("softmax", f"wrong values {HOSTILE}"), "vector_add": _graded("vector_add")}
    return RunResult("sub", 3, {"mode": "cpu-interpreter"}, [chosen.get(n) or _missing(n) for n in NINE])


def test_the_report_opens_with_a_line_per_assignment_and_the_missing_ones_once():
    html = render(_two_of_nine())
    summary, detail = html.split('<h2 id="', 1)  # everything before the first assignment's section
    rows = re.findall(r"<tr><td><a href=\"#(\w+)\">", summary)
    assert rows == ["softmax", "vector_add"]  # a line per submitted assignment, in order
    assert summary.count("Not submitted (7 of 9)") == 1
    assert all(f"<code>kernels/{n}.py</code>" in summary for n in NINE if n not in ("softmax", "vector_add"))
    assert 'id="conv2d"' in summary  # the dashboard's link to report.html#conv2d still lands
    # the one-line cause: the first failure, escaped; what a GPU would add
    assert "n=9 [float32]: wrong values &lt;img src=x onerror=alert(1)&gt;" in summary and HOSTILE not in html
    assert "4 points need a GPU: not graded here" in summary
    assert summary.count("CPU only: 8 of these") == 1  # the run's GPU-only points, the missing ones' not counted
    # no section, table row or red box for a missing module: the detail is of what was submitted
    assert "is not in the submission" not in detail and detail.count("<h2 ") == 1


def test_a_flag_is_the_cause_its_line_gives():
    a = _graded("softmax", "wrong values")
    a.tests.append(TestResult("softmax", "integrity", "uses its own Triton kernel", "flagged",
                              f"torch.softmax computed the output {HOSTILE}", max_score=0, severity="conclusive"))
    html = render(RunResult("sub", 3, {}, [a])).split('<h2 id="', 1)[0]
    assert '<td class="badge flagged">flagged</td>' in html
    assert ("uses its own Triton kernel (conclusive): torch.softmax computed the output "
            "&lt;img src=x onerror=alert(1)&gt;") in html


def test_a_whole_run_has_no_cpu_line_and_no_missing_line():
    run = RunResult("sub", 3, {"mode": "cuda"}, [AssignmentResult("vector_add", "Vector", "kernels/vector_add.py", [
        TestResult("vector_add", "correctness", "n=1 [float32]", "passed", max_score=6, score=6),
        TestResult("vector_add", "performance", "speed", "passed", max_score=4, score=4)])])
    html = render(run)
    assert "CPU only" not in html and "Not submitted" not in html
    assert re.search(r'<td class="badge passed">passed</td><td class="cause">every check passed</td>', html)


def _class_of_nine() -> ClassView:
    rows = []
    for i, student in enumerate(["alice", "bob-with-a-rather-long-github-handle", HOSTILE]):
        cells = {a: Cell(a, "graded", 8.0, 20.0, outcomes=Counter({"passed": 33, "skipped": 17}), gpu_points=12.0,
                         link=f"r.html#{a}", note="graded at commit abc, the lock now pins def: not regraded yet")
                 for a in NINE}
        rows.append(Row(student, student, "fetched", name=f"Student {i}", commit="f" * 40, late=False, cells=cells,
                        report="r.html"))
    view = ClassView(rows, NINE, {a: a for a in NINE}, "2026-01-01T00:00:00+00:00", None, None, 3, [], [], {})
    view.similarity_meta = {"threshold": 0.6, "per_assignment": {}}
    return view


def test_the_dashboard_tags_cpu_only_cells_and_escapes_names():
    html = render_dashboard(_class_of_nine())
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert html.count('<span class="tag" title="CPU only: 12 of 20 points need a GPU, not graded">CPU only</span>') == 27
    assert '<div class="scroll">' in html


def _measured(html: str, script: str, tmp_path: Path) -> str:
    """What `script` (a JS expression) gives for the page in a 1400x1000 window, read back from the DOM."""
    page = tmp_path / "page.html"
    page.write_text(html.replace("</body>", f"<script>document.body.setAttribute('data-measured', {script});</script></body>"))
    dom = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'data-measured="([^"]*)"', dom)
    assert found, dom[-2000:]
    return found.group(1)


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_in_a_browser_the_dashboard_fits_1400_pixels_and_the_summary_is_on_the_first_screen(tmp_path):
    width = int(_measured(render_dashboard(_class_of_nine()), "document.documentElement.scrollWidth", tmp_path))
    assert width <= 1400, width  # the page itself never scrolls sideways; the table scrolls in its box
    top = _measured(render(_two_of_nine()), "[document.querySelector('table.summary').getBoundingClientRect().bottom, "
                                            "document.querySelector('.missing').getBoundingClientRect().bottom, "
                                            "document.querySelector('h2').getBoundingClientRect().top].join(' ')",
                    tmp_path)
    summary, missing, first_section = map(float, top.split())
    assert summary < missing < first_section and missing < 1000  # the whole run, on the first screen, before detail
