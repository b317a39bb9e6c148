"""Integrity findings cost what they taint: a trivial result proves nothing, a vendor op is
conclusive, a right result with no launch is for a TA to review. Both directions: the honest
shortcut is never flagged."""

from __future__ import annotations

import pytest
import torch

from grader import spec as specs
from grader.judge.integrity import OwnKernelCheck, trivial_result
from grader.judge.plan import PlannedCall
from grader.spec import Case

from tests.conftest import COURSE, has_gpu


def _call(case: str, dtype: str = "float32") -> PlannedCall:
    return PlannedCall("test", Case(case, {}), dtype, 1)


def test_trivial_results_are_empty_zero_or_a_copy_of_an_input():
    x = torch.randn(64)
    assert trivial_result({"output": torch.zeros(64)}, {"x": x, "p": 1.0})
    assert trivial_result({"output": x.clone()}, {"x": x, "p": 0.0})
    assert trivial_result({"output": torch.empty(0)}, {"x": torch.empty(0)})
    assert trivial_result({"output.0": torch.zeros(3), "output.1": x.clone()}, {"x": x})
    assert not trivial_result({"output": x * 2}, {"x": x})
    assert not trivial_result({"output": x.to(torch.float16)}, {"x": x})  # same values, another dtype: computed
    assert not trivial_result({"output.0": torch.zeros(3), "output.1": x * 2}, {"x": x})
    assert not trivial_result({}, {"x": x})


def test_a_shortcut_without_a_launch_on_a_trivial_case_is_no_finding():
    integrity = OwnKernelCheck(COURSE.get("dropout"))
    integrity.observe(_call("p=1-n=4099"), {"launches": {}, "ops": ["aten::zeros_like"]}, passed=True, trivial=True)
    integrity.observe(_call("n=1025-p=0.3"), {"launches": {"dropout_kernel": 1}, "ops": []}, passed=True)
    t = integrity.test()
    assert t.outcome == "passed" and t.details.evidence == []


def test_a_right_result_without_a_launch_is_for_review_and_names_its_cases():
    integrity = OwnKernelCheck(COURSE.get("vector_add"))
    integrity.observe(_call("n=127"), {"launches": {}, "ops": ["aten::sub.Tensor"]}, passed=True)
    integrity.observe(_call("n=1"), {"launches": {"add_kernel": 1}, "ops": []}, passed=True)
    t = integrity.test()
    assert t.outcome == "flagged" and t.severity == "review"
    assert "no Triton kernel was launched in n=127" in t.message
    assert t.details.concerns == ["n=127 [float32]"]


def test_a_wrong_result_without_a_launch_is_just_wrong():
    integrity = OwnKernelCheck(COURSE.get("vector_add"))
    integrity.observe(_call("n=127"), {"launches": {}, "ops": []}, passed=False)
    t = integrity.test()
    assert t.outcome == "failed" and not t.severity  # nothing ran: a failed check, no accusation
    assert "no Triton kernel was launched in any call" in t.message


def test_only_trivial_results_and_no_launch_is_nothing_to_inspect():
    integrity = OwnKernelCheck(COURSE.get("dropout"))
    integrity.observe(_call("p=1-n=4099"), {"launches": {}, "ops": []}, passed=True, trivial=True)
    t = integrity.test()
    assert t.outcome == "skipped" and "trivial" in t.message


def test_a_forbidden_op_is_conclusive():
    integrity = OwnKernelCheck(COURSE.get("vector_add"))
    integrity.observe(_call("n=127"), {"launches": {}, "ops": ["aten::add.Tensor"]}, passed=True)
    t = integrity.test()
    assert t.outcome == "flagged" and t.severity == "conclusive"
    assert "torch computed the result: aten::add.Tensor ran inside vector_add() in n=127/float32" in t.message


@pytest.mark.skipif(has_gpu(), reason="these expectations are for the CPU interpreter")
def test_dropouts_shortcuts_at_p_one_and_zero_are_not_flagged(submission, cli):
    run = cli(submission("dropout_shortcuts"), "-a", "dropout", "--case", "p=1-n=4099", "--case", "p=0-n=4099",
              "--case", "n=1025-p=0.3", "--dtype", "float32", "--seed", "5")
    assert run.returncode == 0, run.stdout + run.stderr
    integrity = run.test("dropout", "uses its own Triton kernel")
    assert integrity["outcome"] == "passed", integrity["output"]
    assert {t["outcome"] for t in run.tests_of("dropout") if t["tags"][1] == "correctness"} == {"passed"}
    dropout = run.results["extra_data"]["assignments"]["dropout"]
    # a partial run (3 of the cases): out of the spec's 10 + 6, the 3 cases' exact shares earned
    assert dropout["partial"]["assignment_points"] == 16 and dropout["skipped_points"] == 6
    shares = [t["max_score"] for t in run.tests_of("dropout") if t["tags"][1] == "correctness"]
    assert dropout["score"] == round(sum(shares), 2) and all(s in (0.30, 0.31) for s in shares), shares
    assert "/ 16 points (partial run" in run.stdout


def test_each_integrity_verdict_reads_exactly():
    from grader.results import TestResult

    name = "uses its own Triton kernel"
    integrity = OwnKernelCheck(COURSE.get("vector_add"))
    assert integrity.test() == TestResult("vector_add", "integrity", name, "skipped", "no call completed, so nothing to inspect")
    integrity.observe(_call("n=1"), {"launches": {"add_kernel": 2, "helper": 1}, "ops": []}, passed=True)
    integrity.observe(_call("n=2"), {"launches": {"add_kernel": 1}, "ops": []}, passed=True)
    assert integrity.test() == TestResult("vector_add", "integrity", name, "passed", "Triton kernels launched: add_kernel, helper",
                                          details={"kernels_launched": {"add_kernel": 3, "helper": 1}, "evidence": []})
    # five right results without a launch: three named, the rest counted
    for n in range(3, 8):
        integrity.observe(_call(f"n={n}"), {"launches": {}, "ops": []}, passed=True)
    text = "no Triton kernel was launched in n=3/float32, n=4/float32, n=5/float32 and 2 more, yet the result was right"
    assert integrity.test() == TestResult(
        "vector_add", "integrity", name, "flagged", text, severity="review",
        details={"kernels_launched": {"add_kernel": 3, "helper": 1}, "evidence": [text],
                 "concerns": [f"n={n} [float32]" for n in range(3, 8)]})
    # two forbidden ops, each with its calls: conclusive, whatever else was seen
    integrity.observe(_call("n=8"), {"launches": {}, "ops": ["aten::sum", "aten::add.Tensor"]}, passed=True)
    integrity.observe(_call("n=9", "float16"), {"launches": {}, "ops": ["aten::add.Tensor"]}, passed=False)
    evidence = ["torch computed the result: aten::add.Tensor ran inside vector_add() in n=8/float32, n=9/float16",
                "torch computed the result: aten::sum ran inside vector_add() in n=8/float32"]
    assert integrity.test() == TestResult("vector_add", "integrity", name, "flagged", "; ".join(evidence), severity="conclusive",
                                          details={"kernels_launched": {"add_kernel": 3, "helper": 1}, "evidence": evidence})


def test_no_launch_at_all_reads_exactly_as_a_failure_or_as_nothing_to_inspect():
    from grader.results import TestResult

    name = "uses its own Triton kernel"
    wrong = OwnKernelCheck(COURSE.get("vector_add"))
    wrong.observe(_call("n=127"), {"launches": {}, "ops": []}, passed=False)
    assert wrong.test() == TestResult("vector_add", "integrity", name, "failed",
                                      "no Triton kernel was launched in any call: vector_add() must launch your kernel "
                                      "(kernel[grid](...))", details={"kernels_launched": {}, "evidence": []})
    trivial = OwnKernelCheck(COURSE.get("dropout"))
    trivial.observe(_call("p=1-n=4099"), {"launches": {}, "ops": []}, passed=True, trivial=True)
    assert trivial.test() == TestResult("dropout", "integrity", name, "skipped",
                                        "every result here was trivial (zeros, empty, or a copy of an input): nothing to inspect",
                                        details={"kernels_launched": {}, "evidence": []})
