"""The static scan: what it reports (file, line, code, why), what it follows, and that an
honest submission gets nothing."""

from pathlib import Path

import pytest
from tests.conftest import COURSE, FIXTURES

from grader.judge.integrity import scan_submission, summary


def _found(findings) -> set[tuple[str, int, str]]:
    return {(f.file, f.line, f.what) for f in findings}


@pytest.mark.parametrize("module", ["kernels/softmax.py", "kernels/vector_add.py"])
def test_an_honest_submission_has_no_findings(module):
    assert scan_submission(FIXTURES / "good", module) == []


def test_imports_calls_patches_and_strings_are_found_through_aliases(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text(
        "import os as o, subprocess as sp\n"          # 1
        "from os import environ, system\n"            # 2
        "import torch\n"                              # 3
        "from . import helper\n"                      # 4
        "def k(x):\n"                                 # 5
        "    torch.allclose = lambda *a: True\n"      # 6
        "    setattr(torch.testing, 'assert_close', None)\n"  # 7
        "    system('id')\n"                          # 8
        "    o.execv('/bin/sh', [])\n"                # 9
        "    seed = environ['SEED']\n"                # 10
        "    open('/proc/1/cmdline').read()\n"        # 11
        "    exec('x = 1')\n"                         # 12
        "    __import__('reference.softmax')\n"       # 13
        "    setattr(x, 'name', 1)\n"                 # 14: an attribute of a tensor: fine
    )
    (tmp_path / "kernels" / "helper.py").write_text("import ctypes\n")
    (tmp_path / "grader").mkdir()  # would shadow the grader's own package
    found = _found(scan_submission(tmp_path, "kernels/k.py"))
    expected = {
        ("kernels/k.py", 1, "starts other programs"),
        ("kernels/k.py", 6, "replaces torch.allclose (monkeypatching)"),
        ("kernels/k.py", 7, "sets an attribute of torch.testing by name (patching it?)"),
        ("kernels/k.py", 8, "starts other programs"),
        ("kernels/k.py", 9, "replaces the process with another program"),
        ("kernels/k.py", 10, "reads environment variables"),
        ("kernels/k.py", 11, "reads /proc (other processes, the grader's command line)"),
        ("kernels/k.py", 12, "runs code built at run time (the scan cannot see it)"),
        ("kernels/k.py", 13, "imports the reference solutions"),
        ("kernels/helper.py", 1, "calls native code directly (it can patch or crash the process)"),  # followed
        ("grader", 0, "shadows the module grader that the worker imports"),
    }
    assert expected <= found, expected - found
    assert not any(line == 14 for _, line, _ in found)
    text = summary(scan_submission(tmp_path, "kernels/k.py"))
    assert text.startswith("Static scan, for a TA to review (not a verdict, the score is unchanged): ") and "more" in text


@pytest.mark.parametrize("fixture,module,what", [
    ("proc", "kernels/softmax.py", "reads /proc (other processes, the grader's command line)"),
    ("proc", "kernels/vector_add.py", "reads environment variables"),
    ("escape", "kernels/vector_add.py", "imports the grader itself"),
    ("network", "kernels/vector_add.py", "opens network connections"),
    ("forge", "kernels/vector_add.py", "replaces torch.allclose (monkeypatching)"),
    ("crashes", "kernels/vector_add.py", "ends the worker process"),
])
def test_the_hostile_corpus_is_seen_for_what_it_is(fixture, module, what):
    assert what in {w for _, _, w in _found(scan_submission(FIXTURES / "hostile" / fixture, module))}


def test_a_syntax_error_is_left_to_the_worker(tmp_path):
    (tmp_path / "m.py").write_text("def broken(:\n")
    assert scan_submission(tmp_path, "m.py") == []
    assert scan_submission(tmp_path, "missing.py") == []
    assert Path(tmp_path / "m.py").exists()


# -- the grade-level check "uses its own Triton kernel" (grader.judge.integrity.OwnKernelCheck) -----------------

def _kernel_check(calls):
    """The check after these calls: (case, launches, aten ops, passed) each, in float32."""
    from grader import spec as specs
    from grader.judge.integrity import OwnKernelCheck
    from grader.judge.plan import PlannedCall
    from grader.spec import Case

    check = OwnKernelCheck(COURSE.get("softmax"))
    for case, launches, ops, passed in calls:
        check.observe(PlannedCall("softmax", Case(case, {}), "float32", 1), {"launches": launches, "ops": ops}, passed)
    result = check.test()
    # an integrity test of softmax, by the name the reports and the dashboard know it by (and no points of its own)
    assert (result.assignment, result.kind, result.name) == ("softmax", "integrity", "uses its own Triton kernel")
    return result


def test_a_kernel_that_did_the_work_passes():
    result = _kernel_check([("1x1", {"softmax_kernel": 1}, ["aten::empty_like"], True),
                            ("4x8191", {"softmax_kernel": 2, "max_kernel": 1}, ["aten::empty_like"], False)])
    assert (result.kind, result.outcome, result.severity) == ("integrity", "passed", "")
    assert result.message == "Triton kernels launched: softmax_kernel, max_kernel"
    assert result.details.to_json() == {"kernels_launched": {"softmax_kernel": 3, "max_kernel": 1}, "evidence": []}


def test_a_right_answer_without_a_kernel_is_for_review_and_costs_only_its_case():
    result = _kernel_check([("1x1", {"softmax_kernel": 1}, [], True), ("n=2", {}, [], True)])
    assert (result.outcome, result.severity) == ("flagged", "review")
    assert result.message == "no Triton kernel was launched in n=2/float32, yet the result was right"
    assert result.details.concerns == ["n=2 [float32]"]


def test_a_wrong_answer_without_a_kernel_is_only_wrong():
    """Returning early (an input, zeros) is a failure of that call, not evidence of a cheat."""
    result = _kernel_check([("1x1", {}, [], False), ("n=2", {"softmax_kernel": 1}, [], True)])
    assert result.outcome == "passed"


def test_torch_computing_the_result_is_conclusive_even_beside_a_kernel():
    result = _kernel_check([(f"c{i}", {"copy_kernel": 1}, ["aten::_softmax", "aten::empty_like"], True) for i in range(5)])
    assert (result.outcome, result.severity) == ("flagged", "conclusive")
    assert result.message == ("torch computed the result: aten::_softmax ran inside softmax() in c0/float32, c1/float32, "
                              "c2/float32 and 2 more")
    assert result.details.kernels_launched == {"copy_kernel": 5}


def test_nothing_observed_is_skipped_not_passed():
    result = _kernel_check([])
    assert result.outcome == "skipped" and result.message == "no call completed, so nothing to inspect"


def test_evidence_lists_at_most_three_calls():
    from grader.judge.integrity import few

    assert few(["a", "b", "c"]) == "a, b, c"
    assert few(["a", "b", "c", "d"]) == "a, b, c and 1 more"
    # torch's own op is the conclusive evidence: it stands alone
    result = _kernel_check([("a", {}, ["aten::_softmax"], True), ("b", {}, ["aten::_softmax"], True)])
    assert result.message == "torch computed the result: aten::_softmax ran inside softmax() in a/float32, b/float32"
    assert result.details.to_json() == {"kernels_launched": {}, "evidence": [result.message]}


def test_no_kernel_at_all_fails_the_check_without_accusing():
    result = _kernel_check([("a", {}, [], False)])
    assert (result.outcome, result.severity) == ("failed", "")
    assert result.message.startswith("no Triton kernel was launched in any call: softmax() must launch your kernel")


def test_findings_name_the_exact_line_and_follow_every_kind_of_import(tmp_path):
    long_call = "os.system('" + "x" * 130 + "')"
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text(
        "import http.client\n"                          # 1: a submodule of http
        "import os.path\n"                              # 2: binds os
        "import torch, numpy\n"                         # 3
        "from .helper import f\n"                       # 4: relative (kernels/helper.py), followed
        "from pkg import sub\n"                         # 5: a package's module, followed
        "import importlib\n"                            # 6
        "importlib.import_module('dyn')\n"              # 7: a name in plain sight, from the root, followed
        "torch.x += 1\n"                                # 8: augmented patch
        "torch.a, numpy.b = 1, 2\n"                     # 9: two patches in one
        "y = object(); y.attr = 1\n"                    # 10: not a module's attribute: fine
        "print(os.environ)\n"                           # 11
        f"{long_call}\n"                                # 12: the code is cut at 120 characters
        "from socket import create_connection\n"        # 13
        "import pkg.mod\n"                              # 14: a dotted module of the repo, followed
        "import broken, plain, plain\n"                 # 15: a syntax error, and a module named twice
    )
    (tmp_path / "kernels" / "helper.py").write_text("import socket\n")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("import ctypes\n")
    (tmp_path / "pkg" / "mod.py").write_text("import pty  # \xe9t\xe9\n".encode("latin-1").decode("latin-1"), encoding="latin-1")
    (tmp_path / "dyn.py").write_text("import signal\nimport kernels.k\n")  # and back: a cycle
    (tmp_path / "broken.py").write_text("def (:\n")
    (tmp_path / "plain.py").write_text("import gc\n")
    (tmp_path / "torch.py").write_text("")  # shadows torch: a file
    (tmp_path / "numpy").mkdir()  # shadows numpy: a folder
    found = {(f.file, f.line, f.code, f.what) for f in scan_submission(tmp_path, "kernels/k.py")}
    expected = {
        ("kernels/k.py", 1, "import http.client", "opens network connections"),
        ("kernels/k.py", 8, "torch.x += 1", "replaces torch.x (monkeypatching)"),
        ("kernels/k.py", 9, "torch.a, numpy.b = 1, 2", "replaces torch.a (monkeypatching)"),
        ("kernels/k.py", 9, "torch.a, numpy.b = 1, 2", "replaces numpy.b (monkeypatching)"),
        ("kernels/k.py", 11, "print(os.environ)", "reads environment variables"),
        ("kernels/k.py", 12, long_call[:120], "starts other programs"),
        ("kernels/k.py", 13, "from socket import create_connection", "opens network connections"),
        ("kernels/helper.py", 1, "import socket", "opens network connections"),
        ("pkg/sub/__init__.py", 1, "import ctypes", "calls native code directly (it can patch or crash the process)"),
        ("pkg/mod.py", 1, "import pty  # \ufffdt\ufffd", "starts processes"),  # not UTF-8: read all the same
        ("dyn.py", 1, "import signal", "handles signals (a timeout is a signal)"),
        ("plain.py", 1, "import gc", "walks the interpreter's objects (the worker's own included)"),
        ("torch.py", 0, "the file torch.py", "shadows the module torch that the worker imports"),
        ("numpy", 0, "the folder numpy", "shadows the module numpy that the worker imports"),
    }
    assert found == expected, (found - expected, expected - found)


def test_the_summary_shows_four_findings_and_counts_the_rest():
    from grader.judge.integrity import SourceFinding

    findings = [SourceFinding("k.py", i, f"line {i}", "starts other programs") for i in range(1, 6)]
    head = "Static scan, for a TA to review (not a verdict, the score is unchanged): "
    shown = "; ".join(f"k.py:{i}: line {i}: starts other programs" for i in range(1, 5))
    assert summary(findings) == head + shown + "; and 1 more"
    assert summary(findings[:4]) == head + shown


def test_a_relative_import_is_not_judged_as_a_top_level_module(tmp_path):
    (tmp_path / "k.py").write_text("from . import socket\nfrom .grader import x\n")  # the repo's own modules
    assert scan_submission(tmp_path, "k.py") == []


def test_a_submodule_imported_under_another_name_is_followed_to_its_calls(tmp_path):
    (tmp_path / "k.py").write_text("import torch.utils.cpp_extension as ext\next.load_inline('m', '')\n")
    found = {(f.line, f.what) for f in scan_submission(tmp_path, "k.py")}
    assert found == {(2, "compiles and loads native code")}


def test_a_finding_goes_into_results_json_whole():
    from grader.judge.integrity import SourceFinding

    assert SourceFinding("k.py", 3, "import socket", "opens network connections").to_dict() == \
        {"file": "k.py", "line": 3, "code": "import socket", "what": "opens network connections"}


def test_scans_of_assignments_graded_at_once_parse_one_at_a_time(tmp_path, monkeypatch):
    # Python 3.11/3.12 share the AST converter's depth between threads: two parses at once failed a
    # two-assignment check with "SystemError: AST constructor recursion depth mismatch"
    import ast
    import threading
    import time

    from grader import repofiles

    real, inside, most = ast.parse, [0], [0]
    lock = threading.Lock()

    def slow_parse(*args, **kwargs):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ast, "parse", slow_parse)
    for name in ("a", "b", "c", "d"):
        (tmp_path / f"{name}.py").write_text("import torch\n\ndef f(x):\n    return x + 1\n")
    threads = [threading.Thread(target=scan_submission, args=(tmp_path, f"{n}.py")) for n in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1  # never two parses at once
    assert isinstance(repofiles.parse_python("x = 1"), ast.Module)


def test_a_parse_the_converter_refuses_is_tried_again_then_said_unreadable(tmp_path, monkeypatch):
    import ast

    real, calls = ast.parse, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=30, after=25)")
        return real(*args, **kwargs)

    (tmp_path / "k.py").write_text("import subprocess\n")
    monkeypatch.setattr(ast, "parse", flaky)
    assert any("subprocess" in f.code for f in scan_submission(tmp_path, "k.py"))  # the retry read it: its finding

    def broken(*args, **kwargs):
        raise SystemError("AST constructor recursion depth mismatch")

    monkeypatch.setattr(ast, "parse", broken)
    found = scan_submission(tmp_path, "k.py")  # no crash: the scan says it could not read the file
    assert [f.what for f in found] == ["nested too deeply for the scan to read (the scan cannot see it)"]
