"""The judge's verdicts and explanations, on hand-made outputs (no worker needed)."""

import torch

from grader import spec as specs
from grader.judge.verdict import describe_mismatch, judge_call
from grader.codec import storage_of
from grader.judge.plan import make_inputs
from tests.conftest import COURSE


def _judge(name, case_name, dtype, out, mutate=None, seed=0):
    spec = COURSE.get(name)
    case = next(c for c in spec.cases if c.name == case_name)
    inputs = make_inputs(spec, case, dtype, seed)
    saved = {f"input.{k}": storage_of(v) for k, v in inputs.items()}
    if mutate:
        mutate(saved)
    out = out(inputs)
    saved["output"] = out
    reply = {"device": "cpu", "dtype": str(out.dtype).removeprefix("torch."), "result_type": "Tensor"}
    return judge_call(spec, case, dtype, inputs, reply, saved, "cpu"), inputs


def _softmax_in_float32(x):
    """What an honest kernel computes: float32 arithmetic (max subtracted), rounded once to x's dtype."""
    xf = x.float()
    e = (xf - xf.max(-1, keepdim=True).values).exp()
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def test_an_honest_float32_softmax_passes_in_every_dtype():
    for dtype in ("float32", "float16", "bfloat16"):
        verdict, _ = _judge("softmax", "1823x781", dtype, lambda i: _softmax_in_float32(i["x"]))
        assert verdict.outcome == "passed", verdict.message


def test_low_precision_accumulation_fails_an_fp32_problem():
    # computing an fp32 softmax in bf16 is far outside 2x torch's own error
    verdict, _ = _judge("softmax", "4x8191", "float32", lambda i: torch.softmax(i["x"].bfloat16(), -1).float())
    assert verdict.outcome == "failed"
    assert verdict.details.max_abs_error > 10 * verdict.details.torch_abs_error


def test_modified_input_fails():
    def scribble(saved):
        saved["input.x"][0] += 1

    verdict, _ = _judge("vector_add", "n=129", "float32", lambda i: i["x"] + i["y"], mutate=scribble)
    assert verdict.outcome == "failed" and "input x was modified in place" in verdict.message


def test_wrong_shape_is_named():
    verdict, _ = _judge("vector_add", "n=129", "float32", lambda i: (i["x"] + i["y"])[:128])
    assert verdict.outcome == "failed" and "shape (128,), expected (129,)" in verdict.message


def test_describe_tail_and_block_boundary():
    bad = torch.zeros(2000, dtype=torch.bool)
    bad[1024:] = True
    text = describe_mismatch(bad, torch.zeros(2000, dtype=torch.float64), {})
    assert "from index 1024 on" in text and "multiple of 1024" in text


def test_describe_scattered_and_rows():
    bad = torch.zeros(100, dtype=torch.bool)
    bad[[3, 50]] = True
    assert "scattered between index 3 and 50" in describe_mismatch(bad, torch.zeros(100, dtype=torch.float64), {})
    bad2 = torch.zeros(10, 10, dtype=torch.bool)
    bad2[3] = True
    assert "only rows 3 are wrong (1 of 10)" in describe_mismatch(bad2, torch.zeros(10, 10, dtype=torch.float64), {})


def test_nan_poison_means_never_written():
    got = torch.full((5,), float("nan"), dtype=torch.float64)
    assert "never written" in describe_mismatch(torch.ones(5, dtype=torch.bool), got, {})


def test_large_negative_row_without_max_subtraction_fails_with_nan_note():
    def naive(i):
        e = torch.exp(i["x"].float())
        return (e / e.sum(-1, keepdim=True)).to(i["x"].dtype)

    verdict, _ = _judge("softmax", "negative-row-8x1000", "float32", naive)
    assert verdict.outcome == "failed"
    assert "only rows 3 are wrong" in verdict.message and "NaN" in verdict.message
