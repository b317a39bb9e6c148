"""The judge's error model and delivery checks at their boundaries, on hand-made inputs.

Every expected verdict here comes from the documented rule, not from the judge: a result
passes when, elementwise, |out - ref| <= k x torch's max error + atol + rtol x |ref|, with
k = 2 and per-dtype floors (float32: atol 1e-6, rtol 1e-5; float16: 1e-3, 1e-3; bfloat16:
8e-3, 1e-2). Each test puts one error just inside and just outside one term of that sum,
with the other terms zero or computed here in float64, so a judge that loosens or tightens
any term (a larger k, a larger floor, a max instead of elementwise) fails a test.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from grader import spec as specs
from grader.judge.verdict import judge_call, judge_runs
from grader.codec import storage_of
from grader.judge.plan import make_inputs
from grader.spec import Case, Tolerance
from tests.conftest import COURSE

CASE = Case("hand-made", {})
X = torch.tensor([1.0, -2.0, 0.5, 10.0, 0.0])
Y = torch.tensor([0.25, 4.0, -0.5, 10.0, 0.0])
REF = (X.double() + Y.double())  # exact in float64: [1.25, 2, 0, 20, 0]


def synthetic(k: float, atol: float, rtol: float, torch_error: float):
    """vector_add's interface with a chosen tolerance, and a 'torch' whose max error is exactly
    `torch_error` (on element 0), so each term of the rule can be set apart."""
    def baseline(x, y):
        out = x.double() + y.double()
        out[0] += torch_error
        return out

    tol = Tolerance(k=k, atol={"float32": atol}, rtol={"float32": rtol})
    return replace(COURSE.get("vector_add"), truth=lambda x, y: x + y, baseline=baseline, tolerance=tol, explain=None)


def judge(spec, out: torch.Tensor, dtype: str = "float32", reply: dict | None = None, expected_device: str = "cpu",
          x: torch.Tensor = X, y: torch.Tensor = Y, case: Case = CASE):
    """The judge on a result placed in float64 (so an error is placed exactly), saved and described
    as `dtype` (or as the reply's dtype, where a test gives one: the judge reads the tensor)."""
    inputs = {"x": x, "y": y}
    meta = {"device": "cpu", "dtype": dtype, "result_type": "Tensor", **(reply or {})}
    out = out.to(getattr(torch, meta["dtype"]))
    meta.setdefault("shape", list(out.shape))
    saved = {"input.x": storage_of(x), "input.y": storage_of(y), "output": out}
    return judge_call(spec, case, dtype, inputs, meta, saved, expected_device)


def off_by(error: float, at: int = 2) -> torch.Tensor:
    out = REF.clone()
    out[at] += error
    return out


def test_the_factor_on_torchs_error_is_applied_once():
    spec = synthetic(k=2.0, atol=0.0, rtol=0.0, torch_error=1e-2)  # allowed: 2 x 1e-2 = 0.02 everywhere
    assert judge(spec, off_by(0.0195)).outcome == "passed"
    verdict = judge(spec, off_by(0.0205))
    assert verdict.outcome == "failed" and verdict.details.bad_elements == 1
    assert verdict.details.torch_abs_error == pytest.approx(1e-2, rel=1e-12)
    assert verdict.details.first_bad_index == [2]


def test_the_absolute_floor_is_the_dtypes_atol():
    spec = synthetic(k=2.0, atol=1e-3, rtol=0.0, torch_error=0.0)  # allowed: 1e-3 (ref is 0 at index 2)
    assert judge(spec, off_by(0.95e-3)).outcome == "passed"
    assert judge(spec, off_by(1.05e-3)).outcome == "failed"
    assert judge(spec, off_by(-1.05e-3)).outcome == "failed"  # either sign


def test_the_relative_floor_is_elementwise():
    spec = synthetic(k=2.0, atol=0.0, rtol=1e-2, torch_error=0.0)
    # index 3: ref 20, allowed 0.2; index 0: ref 1.25, allowed 0.0125 (not the largest |ref|'s 0.2)
    assert judge(spec, off_by(0.19, at=3)).outcome == "passed"
    assert judge(spec, off_by(0.21, at=3)).outcome == "failed"
    assert judge(spec, off_by(0.012, at=0)).outcome == "passed"
    assert judge(spec, off_by(0.013, at=0)).outcome == "failed"
    # ref 0: only atol remains, and it is 0 here
    assert judge(spec, off_by(1e-12, at=2)).outcome == "failed"


def test_the_terms_add_up():
    spec = synthetic(k=2.0, atol=1e-3, rtol=1e-2, torch_error=1e-2)  # at index 3: 0.02 + 0.001 + 0.2 = 0.221
    assert judge(spec, off_by(0.2205, at=3)).outcome == "passed"
    assert judge(spec, off_by(0.2215, at=3)).outcome == "failed"


def test_nan_is_wrong_unless_the_reference_is_nan_there():
    spec = synthetic(k=2.0, atol=1.0, rtol=1.0, torch_error=0.0)
    verdict = judge(spec, off_by(float("nan")))
    assert verdict.outcome == "failed" and verdict.details.bad_elements == 1
    assert judge(spec, off_by(float("inf"))).outcome == "failed"


@pytest.mark.parametrize("dtype,atol,rtol", [("float32", 1e-6, 1e-5), ("float16", 1e-3, 1e-3), ("bfloat16", 8e-3, 1e-2)])
def test_every_assignment_uses_the_documented_floors(dtype, atol, rtol):
    """The real vector_add spec: torch's error computed here in float64, the bound from the
    documented k and floors; 1% inside passes, 1% outside fails."""
    spec = COURSE.get("vector_add")
    assert all(s.tolerance == Tolerance() for s in COURSE.catalogue().values())  # no assignment overrides the rule
    case = next(c for c in spec.cases if c.name == "n=129")
    inputs = make_inputs(spec, case, dtype, 0)
    x, y = inputs["x"], inputs["y"]
    ref = x.double() + y.double()
    torch_error = float(((x + y).double() - ref).abs().max())
    bound = 2 * torch_error + atol + rtol * ref.abs()
    i = int(bound.argmin())
    for scale, outcome in ((0.99, "passed"), (1.01, "failed")):
        out = ref.clone()
        out[i] += scale * bound[i]
        verdict = judge(spec, out, dtype=dtype, x=x, y=y, case=case)
        assert verdict.outcome == outcome, (scale, verdict.message)


def test_a_result_that_is_not_a_tensor_fails():
    spec = COURSE.get("vector_add")
    saved = {"input.x": storage_of(X), "input.y": storage_of(Y)}  # the worker saved no output
    reply = {"device": "cpu", "dtype": None, "result_type": "NoneType"}
    verdict = judge_call(spec, CASE, "float32", {"x": X, "y": Y}, reply, saved, "cpu")
    assert verdict.outcome == "failed" and verdict.message == "vector_add() returned NoneType, not a torch.Tensor"


def test_a_tuple_assignment_given_one_tensor_fails():
    spec = COURSE.get("layernorm_backward")
    case = spec.cases[0]
    inputs = make_inputs(spec, case, "float32", 0)
    saved = {f"input.{k}": storage_of(v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    saved["output"] = inputs["x"].clone()
    reply = {"device": "cpu", "dtype": "float32", "result_type": "Tensor"}
    verdict = judge_call(spec, case, "float32", inputs, reply, saved, "cpu")
    assert verdict.outcome == "failed" and "returned Tensor, expected a tuple of 3 tensors (dx, dweight, dbias)" in verdict.message


def test_a_property_checked_assignment_fails_a_call_that_returned_no_tensor():
    spec = COURSE.get("dropout")
    case = next(c for c in spec.cases if c.name == "n=1025-p=0.3")
    inputs = make_inputs(spec, case, "float32", 0)
    saved = {"input.x": storage_of(inputs["x"])}
    runs = [(inputs, {"device": "cpu", "dtype": None, "result_type": "list"}, saved)] * 3
    verdict = judge_runs(spec, case, "float32", runs, "cpu")
    assert verdict.outcome == "failed" and "dropout() returned list, not a torch.Tensor" in verdict.message


def test_a_result_on_the_wrong_device_fails_and_says_where():
    spec = synthetic(k=2.0, atol=1.0, rtol=1.0, torch_error=0.0)
    verdict = judge(spec, REF.clone(), reply={"device": "cpu"}, expected_device="cuda")
    assert verdict.outcome == "failed" and verdict.message == "the result is on cpu, but the inputs were on cuda"
    assert judge(spec, REF.clone(), reply={"device": "cuda"}, expected_device="cuda").outcome == "passed"


def test_a_result_of_another_dtype_fails():
    spec = synthetic(k=2.0, atol=1.0, rtol=1.0, torch_error=0.0)
    verdict = judge(spec, REF.clone(), reply={"dtype": "float64"})
    assert verdict.outcome == "failed" and verdict.message == "the result's dtype is float64, expected float32 (the input's dtype)"


def test_an_input_changed_in_place_fails_even_when_the_result_is_right():
    spec = synthetic(k=2.0, atol=1.0, rtol=1.0, torch_error=0.0)
    inputs = {"x": X, "y": Y}
    scribbled = Y.clone()
    scribbled[4] = 1.0
    saved = {"input.x": storage_of(X), "input.y": scribbled, "output": REF.float()}
    reply = {"device": "cpu", "dtype": "float32", "shape": [5], "result_type": "Tensor"}
    verdict = judge_call(spec, CASE, "float32", inputs, reply, saved, "cpu")
    assert verdict.outcome == "failed" and "the input y was modified in place" in verdict.message
    saved["input.y"] = storage_of(Y)
    assert judge_call(spec, CASE, "float32", inputs, reply, saved, "cpu").outcome == "passed"


# -- tuple results and several calls, on synthetic specs -------------------------------------------

def tuple_spec(names=("total", "difference")):
    """A function returning (x + y, x - y): each part judged on its own, in its own error model."""
    return replace(COURSE.get("vector_add"), truth=lambda x, y: (x + y, x - y),
                   baseline=lambda x, y: (x.double() + y.double(), x.double() - y.double()),
                   tolerance=Tolerance(k=2.0, atol={"float32": 1e-3}, rtol={"float32": 0.0}), explain=None, output_names=names)


def judge_tuple(spec, parts, metas=None, expected_device="cpu"):
    metas = metas or [{"device": "cpu", "dtype": "float32"} for _ in parts]
    parts = [p.to(getattr(torch, m["dtype"])) for p, m in zip(parts, metas)]  # saved as described (the judge reads the tensor)
    metas = [{"shape": list(p.shape), **m} for p, m in zip(parts, metas)]
    saved = {"input.x": storage_of(X), "input.y": storage_of(Y), **{f"output.{i}": p for i, p in enumerate(parts)}}
    reply = {"device": "cpu", "result_type": "tuple", "outputs": metas}
    return judge_call(spec, CASE, "float32", {"x": X, "y": Y}, reply, saved, expected_device)


def test_each_part_of_a_tuple_is_judged_and_named():
    spec = tuple_spec()
    right = [X.double() + Y.double(), X.double() - Y.double()]
    verdict = judge_tuple(spec, right)
    assert verdict.outcome == "passed" and set(verdict.details.parts) == {"total", "difference"}
    assert verdict.details.parts["difference"].max_abs_error == 0.0 and verdict.details.parts["total"].elements == 5
    assert set(verdict.details.to_json()) == {"total", "difference"}  # each part under its name, as results.json has it
    assert verdict.message.startswith("total: max abs error 0") and "; difference: max abs error 0" in verdict.message
    wrong = [right[0], right[1].clone()]
    wrong[1][3] += 2e-3  # over the 1e-3 floor, in the second part only
    verdict = judge_tuple(spec, wrong)
    assert verdict.outcome == "failed" and verdict.message.startswith("difference (result 2 of 2) is wrong: 1 of 5 elements wrong")
    assert verdict.details.wrong_output == "difference" and verdict.details.first_bad_index == [3]
    wrong[1][3] -= 1.5e-3  # 5e-4 off: inside
    assert judge_tuple(spec, wrong).outcome == "passed"


def test_a_tuple_part_delivered_wrong_is_named():
    spec = tuple_spec()
    right = [X.double() + Y.double(), X.double() - Y.double()]
    verdict = judge_tuple(spec, right, [{"device": "cpu", "dtype": "float32"}, {"device": "cpu", "dtype": "float16"}])
    assert verdict.outcome == "failed"
    assert verdict.message == "difference (result 2 of 2)'s dtype is float16, expected float32 (the input's dtype)"
    verdict = judge_tuple(spec, right, [{"device": "cuda", "dtype": "float32"}, {"device": "cuda", "dtype": "float32"}],
                          expected_device="cuda")
    assert verdict.outcome == "passed"
    verdict = judge_tuple(spec, [right[0], right[1][:4]])
    assert verdict.message == "difference (result 2 of 2) has shape (4,), expected (5,)"
    verdict = judge_tuple(spec, right[:1], [{"device": "cpu", "dtype": "float32"}])
    assert verdict.message == "vector_add() returned 1 tensors, expected a tuple of 2 tensors (total, difference)"


def test_parts_without_names_are_numbered():
    spec = tuple_spec(names=())
    right = [X.double() + Y.double(), X.double() - Y.double()]
    assert set(judge_tuple(spec, right).details.parts) == {"output 0", "output 1"}
    wrong = [right[0] + 1, right[1]]
    assert judge_tuple(spec, wrong).message.startswith("output 0 (result 1 of 2) is wrong: ")


def calls_spec():
    """vector_add called twice per case (the second time with x and y swapped), no property check:
    each call is compared with the reference on its own arguments."""
    return replace(synthetic(k=2.0, atol=1e-3, rtol=0.0, torch_error=0.0),
                   calls=lambda i: [i, {"x": i["y"], "y": i["x"]}])


def run_of(out: torch.Tensor, x=X, y=Y, meta=None):
    meta = {"device": "cpu", "dtype": "float32", "result_type": "Tensor", **(meta or {})}
    out = out.to(getattr(torch, meta["dtype"]))  # saved as described: the judge reads the tensor
    return ({"x": x, "y": y}, {"shape": list(out.shape), **meta},
            {"input.x": storage_of(x), "input.y": storage_of(y), "output": out})


def test_several_calls_each_compared_and_the_wrong_one_named():
    spec, case = calls_spec(), Case("twice", {}, "x and y swapped")
    right = run_of(REF.clone())
    verdict = judge_runs(spec, case, "float32", [right, run_of(REF.clone(), Y, X)], "cpu")
    assert verdict.outcome == "passed" and verdict.details.bad_elements == 0
    verdict = judge_runs(spec, case, "float32", [right, run_of(off_by(0.5), Y, X)], "cpu")
    assert verdict.outcome == "failed" and verdict.message.startswith("call 2 of 2: 1 of 5 elements wrong")
    assert verdict.message.endswith("(this case: x and y swapped)")
    verdict = judge_runs(spec, case, "float32", [run_of(off_by(0.5)), right], "cpu")
    assert verdict.message.startswith("call 1 of 2: ")
    verdict = judge_runs(spec, case, "float32", [right, run_of(REF.clone(), Y, X, {"device": "cuda"})], "cpu")
    assert verdict.message == "call 2 of 2: the result is on cuda, but the inputs were on cpu"


def test_a_property_check_gets_every_call_and_its_verdict_names_the_case():
    from grader.judge.verdict import Verdict

    seen = []

    def check(args, outputs, dtype):
        seen.append((args, outputs, dtype))
        return Verdict("failed" if outputs[0][0] != 0 else "passed", "first element")

    spec = replace(synthetic(k=2.0, atol=1.0, rtol=1.0, torch_error=0.0), check=check, truth=None)
    case = Case("prop", {}, "a property")
    zero = REF.clone()
    zero[0] = 0
    verdict = judge_runs(spec, case, "float32", [run_of(zero), run_of(REF.clone(), Y, X)], "cpu")
    assert verdict.outcome == "passed" and verdict.message == "first element"  # no case note on a pass
    (args, outputs, dtype), = seen
    assert [a["x"] is X for a in args] == [True, False] and outputs[0] is not None and dtype == "float32"
    assert torch.equal(outputs[1], REF)
    verdict = judge_runs(spec, case, "float32", [run_of(REF.clone()), run_of(REF.clone())], "cpu")
    assert verdict.outcome == "failed" and verdict.message == "first element (this case: a property)"
    bad = run_of(REF.clone(), meta={"dtype": "float16"})
    verdict = judge_runs(spec, case, "float32", [run_of(zero), bad], "cpu")
    assert verdict.message == "the result's dtype is float16, expected float32 (the input's dtype)" and len(seen) == 2
    scribbled = run_of(REF.clone())
    scribbled[2]["input.y"] = Y + 1
    verdict = judge_runs(spec, case, "float32", [run_of(zero), scribbled], "cpu")
    assert verdict.outcome == "failed" and "the input y was modified in place" in verdict.message


def test_a_failure_reports_every_figure():
    spec = synthetic(k=2.0, atol=1e-3, rtol=0.0, torch_error=1e-2)
    verdict = judge(spec, off_by(0.5, at=3))
    stored = verdict.details.to_json()
    where = stored.pop("wrong_map")  # the report's picture of where it is wrong: only element 3 of 5
    assert (where["shape"], where["rows"], where["cols"]) == ([5], 1, 5)
    assert stored == {
        "max_abs_error": 0.5, "max_rel_error": pytest.approx(0.5 / 20), "torch_abs_error": pytest.approx(1e-2),
        "allowed_abs_error": "2 x torch's error + 0.001 + 0 x |ref|", "bad_elements": 1, "elements": 5,
        "first_bad_index": [3], "first_bad_value": "got 20.5, expected 20",
        "pattern": "1 elements wrong, scattered between index 3 and 3"}
    assert verdict.message == "1 of 5 elements wrong; 1 elements wrong, scattered between index 3 and 3"
    assert judge(spec, REF.clone()).details.max_rel_error == 0.0


def test_the_assignments_own_words_come_first_and_a_broken_explanation_costs_nothing():
    seen = []

    def explain(mm):
        seen.append(mm)
        return "your own words"

    spec = replace(synthetic(k=2.0, atol=1e-3, rtol=0.0, torch_error=0.0), explain=explain)
    verdict = judge(spec, off_by(0.5, at=3))
    assert verdict.message == "1 of 5 elements wrong; your own words"
    (mm,) = seen
    assert mm.bad.tolist() == [False, False, False, True, False] and mm.got[3] == 20.5 and mm.truth[3] == 20
    assert mm.inputs["x"] is X and float(mm.allowed[0]) == pytest.approx(1e-3) and mm.torch_error == 0.0 and mm.dtype == "float32"

    def broken(mm):
        raise ZeroDivisionError

    verdict = judge(replace(spec, explain=broken), off_by(0.5, at=3))
    assert verdict.message == "1 of 5 elements wrong; 1 elements wrong, scattered between index 3 and 3"


def test_returning_an_input_is_named():
    spec = synthetic(k=2.0, atol=1e-3, rtol=0.0, torch_error=0.0)
    verdict = judge(spec, X.clone())  # a float32 tensor, as a worker returns it
    assert "the result equals the input x: did you return the input instead of the output?" in verdict.message


def test_an_empty_result_passes_with_zero_errors():
    empty = torch.zeros(0)
    spec = synthetic(k=2.0, atol=1e-3, rtol=0.0, torch_error=0.0)
    spec = replace(spec, baseline=lambda x, y: x.double() + y.double())
    verdict = judge(spec, empty.double(), x=empty, y=empty)
    assert verdict.outcome == "passed" and verdict.details.max_abs_error == 0.0 and verdict.details.torch_abs_error == 0.0


def test_inputs_are_checked_whatever_comes_first_and_a_missing_copy_counts_as_modified():
    spec = replace(synthetic(k=2.0, atol=1.0, rtol=1.0, torch_error=0.0), truth=lambda n, x, y: x + y,
                   baseline=lambda n, x, y: x.double() + y.double())
    inputs = {"n": 5, "x": X, "y": Y}  # a plain argument first
    reply = {"device": "cpu", "dtype": "float32", "shape": [5], "result_type": "Tensor"}
    saved = {"input.x": storage_of(X), "input.y": Y + 1, "output": REF.float()}
    assert "the input y was modified in place" in judge_call(spec, CASE, "float32", inputs, reply, saved, "cpu").message
    del saved["input.y"]
    assert "the input y was modified in place" in judge_call(spec, CASE, "float32", inputs, reply, saved, "cpu").message
    saved["input.y"] = storage_of(Y)
    assert judge_call(spec, CASE, "float32", inputs, reply, saved, "cpu").outcome == "passed"


@pytest.mark.parametrize("assignment", ["vector_add", "softmax"])
def test_a_float32_result_computed_in_bfloat16_fails_its_tolerance(assignment):
    """The field's lower-precision class: a float32 assignment whose kernel computes in bfloat16
    (inputs and arithmetic rounded to 8 bits of mantissa) is not within float32's error model
    (GPU: tests/fixtures/gpu/cheat_low_precision)."""
    spec = COURSE.get(assignment)
    for case in spec.cases:  # the first with a thousand elements or more (a 1x1 softmax is exact in any precision)
        inputs = make_inputs(spec, case, "float32", seed=5)
        if next(iter(inputs.values())).numel() >= 1000:
            break
    low = spec.baseline(*[t.bfloat16() if isinstance(t, torch.Tensor) else t for t in inputs.values()]).float()
    saved = {**{f"input.{k}": storage_of(v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}, "output": low}
    meta = {"device": "cpu", "dtype": "float32", "shape": list(low.shape), "result_type": "Tensor"}
    verdict = judge_call(spec, case, "float32", inputs, meta, saved, "cpu")
    assert verdict.outcome == "failed" and "elements wrong" in verdict.message, verdict.message
    assert verdict.details.max_abs_error > verdict.details.torch_abs_error
