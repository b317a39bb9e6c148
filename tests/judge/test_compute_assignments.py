"""matmul_relu, flash_attention, conv2d: the error model (TF32 allowed in float32, low
precision not), the hypotheses their explanations test, flags, and the FLOP accounting."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from grader import spec as specs
from grader.judge.verdict import judge_call
from grader.judge.mismatch import contiguous_reading
from grader.codec import storage_of
from grader.judge.plan import make_inputs
from tests.conftest import COURSE

COMPUTE = ["matmul_relu", "flash_attention", "conv2d"]


def _judge(name, case_name, dtype, out, seed=0):
    spec = COURSE.get(name)
    case = next(c for c in spec.cases if c.name == case_name)
    inputs = make_inputs(spec, case, dtype, seed)
    saved = {f"input.{k}": storage_of(v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    result = out(inputs)
    saved["output"] = result
    reply = {"device": "cpu", "dtype": str(result.dtype).removeprefix("torch."), "result_type": "Tensor"}
    return judge_call(spec, case, dtype, inputs, reply, saved, "cpu")


def tf32_round(t: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest to TF32 (what an explicit conversion does, vs tl.dot's truncation)."""
    bits = t.contiguous().view(torch.int32)
    return torch.bitwise_and(bits + (1 << 12), -(1 << 13)).view(torch.float32)


def tf32_trunc(t: torch.Tensor) -> torch.Tensor:
    return torch.bitwise_and(t.contiguous().view(torch.int32), -(1 << 13)).view(torch.float32)


# What a float32 kernel computes on the GPU with TF32 tensor cores (operands cut to 10 bits,
# float32 accumulation), what it computes if it rounds to TF32, and in bfloat16.
FP32_PROBLEMS = {
    "matmul_relu": ("long-K-64x48x2048", lambda i, cut: torch.relu(cut(i["a"]) @ cut(i["b"])),
                    lambda i: torch.relu(i["a"].bfloat16() @ i["b"].bfloat16()).float()),
    "conv2d": ("3x3-C=64-2x64x8x8-K=64", lambda i, cut: F.conv2d(cut(i["x"]), cut(i["w"])),
               lambda i: F.conv2d(i["x"].bfloat16(), i["w"].bfloat16()).float()),
    "flash_attention": ("causal-N=130-D=64",
                        lambda i, cut: cut(torch.softmax((cut(i["q"]) @ cut(i["k"]).transpose(-1, -2) / 8.0)
                                                         .masked_fill(torch.ones(130, 130, dtype=torch.bool).triu(1), float("-inf")), -1))
                        @ cut(i["v"]),
                        lambda i: F.scaled_dot_product_attention(i["q"].bfloat16(), i["k"].bfloat16(), i["v"].bfloat16(),
                                                                 is_causal=True).float()),
}


@pytest.mark.parametrize("name", COMPUTE)
@pytest.mark.parametrize("cut", [tf32_trunc, tf32_round], ids=["tf32-truncated", "tf32-rounded"])
def test_tf32_float32_result_passes(name, cut):
    case, tf32_result, _ = FP32_PROBLEMS[name]
    verdict = _judge(name, case, "float32", lambda i: tf32_result(i, cut))
    assert verdict.outcome == "passed", verdict.message


@pytest.mark.parametrize("name", COMPUTE)
def test_float32_problem_computed_in_bf16_fails(name):
    case, _, in_bf16 = FP32_PROBLEMS[name]
    verdict = _judge(name, case, "float32", in_bf16)
    assert verdict.outcome == "failed"
    assert verdict.details.max_abs_error > 2 * verdict.details.torch_abs_error
    assert "less precise than torch's in float32" in verdict.message
    assert "do not compute a float32 problem in float16 or bfloat16" in verdict.message


# What an honest kernel computes in every dtype: float32 arithmetic, rounded once to the dtype.
IN_FLOAT32 = {
    "matmul_relu": lambda i: torch.relu(i["a"].float() @ i["b"].float()).to(i["a"].dtype),
    "conv2d": lambda i: F.conv2d(i["x"].float(), i["w"].float()).to(i["x"].dtype),
    "flash_attention": lambda i: F.scaled_dot_product_attention(i["q"].float(), i["k"].float(), i["v"].float(),
                                                                is_causal=i["causal"], scale=i["sm_scale"]).to(i["q"].dtype),
}


@pytest.mark.parametrize("name", COMPUTE)
def test_float32_accumulation_rounded_once_passes_in_every_dtype(name):
    spec = COURSE.get(name)
    for dtype in ("float32", "float16", "bfloat16"):
        verdict = _judge(name, spec.cases[2].name, dtype, IN_FLOAT32[name])
        assert verdict.outcome == "passed", (dtype, verdict.message)


@pytest.mark.parametrize("name", COMPUTE)
def test_calling_torch_is_a_forbidden_op(name):
    """The vendor call (torch's own way to compute the answer) dispatches a flagged op."""
    from grader.worker.server import _OpRecorder

    spec = COURSE.get(name)
    inputs = make_inputs(spec, spec.cases[2], "float16", 0)
    ops: Counter = Counter()
    with _OpRecorder(ops):
        spec.baseline(*inputs.values())
    assert set(ops) & spec.forbidden_ops, sorted(ops)


def test_missing_relu_is_named():
    verdict = _judge("matmul_relu", "127x129x131", "float32", lambda i: i["a"] @ i["b"])
    assert verdict.outcome == "failed" and "negative values were kept: apply the ReLU" in verdict.message


def test_fp16_accumulator_is_named_as_precision_loss():
    def fp16_accumulator(i):
        acc = torch.zeros(64, 48, dtype=torch.float16)
        for k in range(0, 2048, 32):
            acc = acc + (i["a"][:, k : k + 32].float() @ i["b"][k : k + 32].float()).half()
        return torch.relu(acc)

    verdict = _judge("matmul_relu", "long-K-64x48x2048", "float16", fp16_accumulator)
    assert verdict.outcome == "failed" and "Accumulate in float32" in verdict.message


def test_sliced_operands_read_as_contiguous_are_named():
    def contiguous(i):
        return torch.relu(contiguous_reading(i["a"]) @ contiguous_reading(i["b"]))

    verdict = _judge("matmul_relu", "sliced-70x90x50", "float32", contiguous)
    assert verdict.outcome == "failed"
    assert "a and b are non-contiguous views here (strides (59, 1) and (99, 1))" in verdict.message


def test_one_operand_read_as_contiguous_is_named():
    """A kernel that ignores a's strides reads a's storage row-major: for a = t.t() (t contiguous,
    72x96), that is t's memory taken as 96x72. The same for b."""
    def a_ignored(i):
        return torch.relu(i["a"].t().contiguous().reshape(96, 72) @ i["b"])

    verdict = _judge("matmul_relu", "a-transposed-96x80x72", "float32", a_ignored)
    assert verdict.outcome == "failed"
    assert "a is a non-contiguous view here (a.stride() == (1, 96)), and the result is what reading a with a contiguous " \
           "layout gives: pass a.stride(0) and a.stride(1)" in verdict.message, verdict.message

    def b_ignored(i):
        return torch.relu(i["a"] @ i["b"].t().contiguous().reshape(72, 96))

    verdict = _judge("matmul_relu", "b-transposed-80x96x72", "float32", b_ignored)
    assert "b is a non-contiguous view here (b.stride() == (1, 72))" in verdict.message, verdict.message
    # the hypothesis is not claimed for another bug on the same case
    verdict = _judge("matmul_relu", "a-transposed-96x80x72", "float32", lambda i: torch.relu(i["a"] @ i["b"]) * 1.5)
    assert verdict.outcome == "failed" and "non-contiguous" not in verdict.message


def test_padding_keys_in_the_softmax_are_named():
    """Keys past N = 130 in a last block of 64 loaded as zeros and left unmasked: 62 zero keys
    with score 0 join every row's softmax (and add 0 to the output)."""
    def padded(i):
        q, k, v = (i[n].double() for n in "qkv")
        s = q @ k.transpose(-1, -2) / 8.0  # 1/sqrt(64)
        s = torch.cat([s, torch.zeros(*s.shape[:-1], 62, dtype=s.dtype)], -1)
        return (torch.softmax(s, -1)[..., :130] @ v).float()

    verdict = _judge("flash_attention", "N=130-D=64", "float32", padded)
    assert verdict.outcome == "failed"
    assert "the last block of keys runs past N = 130, and its 62 padding keys take part in the softmax" in verdict.message
    # with the scores masked (-inf), the same padding is harmless
    def masked(i):
        q, k, v = (i[n].double() for n in "qkv")
        s = torch.cat([q @ k.transpose(-1, -2) / 8.0, torch.full((*q.shape[:-1], 62), float("-inf"), dtype=torch.float64)], -1)
        return (torch.softmax(s, -1)[..., :130] @ v).float()

    assert _judge("flash_attention", "N=130-D=64", "float32", masked).outcome == "passed"


def _sdpa(i, causal, scale=None):
    return F.scaled_dot_product_attention(i["q"], i["k"], i["v"], is_causal=causal, scale=scale)


@pytest.mark.parametrize("case,out,words", [
    ("causal-N=130-D=64", lambda i: _sdpa(i, False), "every query attends to every key"),
    ("N=130-D=64", lambda i: _sdpa(i, True), "causal=False, but the result is causal"),
    ("sm_scale=0.3-N=100-D=32", lambda i: _sdpa(i, False), "scaled by the default 1/sqrt(D), but sm_scale=0.3 was given"),
    ("N=64-D=64", lambda i: _sdpa(i, False, 1.0), "scaled by 1, but sm_scale=None means 1/sqrt(D)"),
])
def test_attention_hypotheses(case, out, words):
    verdict = _judge("flash_attention", case, "float32", out)
    assert verdict.outcome == "failed" and words in verdict.message, verdict.message


def test_attention_mask_that_hides_the_diagonal_is_named():
    def strict(i):
        s = (i["q"] @ i["k"].transpose(-1, -2)) / 8.0
        s = s.masked_fill(torch.ones(130, 130, dtype=torch.bool).triu(0), float("-inf"))
        return torch.softmax(s, -1) @ i["v"]  # row 0: all masked, NaN

    verdict = _judge("flash_attention", "causal-N=130-D=64", "float32", strict)
    assert verdict.outcome == "failed" and "the diagonal is masked too" in verdict.message, verdict.message


def test_attention_wrong_head_offset_is_located():
    def head_zero_everywhere(i):
        o = _sdpa(i, False)
        return o[:, :1].expand_as(o).contiguous()

    verdict = _judge("flash_attention", "N=64-D=64", "float32", head_zero_everywhere)
    assert "head 0 to 0 right, every head from 1 on wrong" in verdict.message


def test_flipped_filter_is_named():
    verdict = _judge("conv2d", "5x5-1x2x9x9-K=3", "float32", lambda i: F.conv2d(i["x"], i["w"].flip(-1, -2)))
    assert verdict.outcome == "failed" and "filter flipped" in verdict.message


def test_conv_wrong_batch_offset_is_located():
    def image_zero_everywhere(i):
        o = F.conv2d(i["x"], i["w"])
        return o[:1].expand_as(o).contiguous()

    verdict = _judge("conv2d", "3x3-2x3x11x13-K=5", "float32", image_zero_everywhere)
    assert "images 0 to 0 are right, every image from 1 on has wrong elements" in verdict.message


def test_contiguous_reading_of_views():
    base = torch.arange(12.0).view(3, 4)
    assert contiguous_reading(base) is None  # already contiguous: no other reading
    t = base.t()  # 4x3, strides (1, 4)
    assert contiguous_reading(t).equal(torch.arange(12.0).view(4, 3))
    sliced = torch.arange(20.0).view(4, 5)[:, 1:4]
    assert contiguous_reading(sliced).equal(torch.arange(1.0, 13.0).view(4, 3))
    assert contiguous_reading(sliced, keep_row_stride=True) is None  # rows keep stride 5, columns are unit already
    assert contiguous_reading(torch.arange(3.0).expand(4, 3)) is None  # 12 elements from a storage of 3: past its end


def test_flops_are_reported_for_the_compute_bound_assignments():
    mm, attn, conv = (COURSE.get(n).performance for n in COMPUTE)
    assert mm.flops(mm.case.params, torch.float16) == 2 * 4096**3
    p = attn.case.params
    assert p["causal"] and attn.flops(p, torch.float16) == 4 * 4 * 32 * 4096 * 4096 * 64 // 2
    assert conv.flops(conv.case.params, torch.float16) == 2 * 128 * 64 * 54 * 54 * 64 * 9  # a batch of 128 (a batch of 32 is launch-bound on an H100)
    # every timed assignment states its bytes and its FLOPs; with an H100-like roofline (3000 GB/s,
    # 750 TFLOP/s) the memory-bound ones are held back by bandwidth, the compute-bound ones by the GEMM peak
    from grader.judge.perf import floor_ms

    for name, s in COURSE.catalogue().items():
        perf = s.performance
        if perf is None:
            continue
        dt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[perf.dtype]
        assert perf.flops is not None, name
        _, bound = floor_ms(perf.bytes_moved(perf.case.params, dt), perf.flops(perf.case.params, dt), 3000.0, 750.0)
        assert bound == ("cuBLAS GEMM peak" if name in COMPUTE else "copy bandwidth"), name


def test_perf_chart_uses_tflops_when_flops_are_given():
    from grader.payloads import PerformancePayload
    from grader.report import perf_chart

    figures = {"student": {"gbps": 40.0, "tflops": 300.0, "median_ms": 0.458, "q1_ms": 0.45, "q3_ms": 0.47},
               "reference": {"gbps": 80.0, "tflops": 600.0, "median_ms": 0.229, "q1_ms": 0.22, "q3_ms": 0.24}}
    svg = perf_chart(PerformancePayload.from_json({"figures": figures, "flops": 2 * 4096**3, "gemm_tflops": 700.0, "bytes": 1,
                                                   "copy_gbps": 3000.0}))
    assert "300 TFLOP/s" in svg and "cuBLAS GEMM peak 700 TFLOP/s" in svg and "GB/s" not in svg
    assert "40 GB/s" in perf_chart(PerformancePayload.from_json({"figures": figures, "bytes": 1, "copy_gbps": 3000.0}))


def test_references_import_and_export_the_student_function():
    import importlib.util

    for name in COMPUTE:
        spec = COURSE.get(name)
        loader = importlib.util.spec_from_file_location(f"reference_{name}", spec.reference_module())
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        assert callable(getattr(module, spec.function))


@pytest.mark.gpu
@pytest.mark.parametrize("name,case", [("matmul_relu", "127x129x131"), ("flash_attention", "causal-N=130-D=64"),
                                       ("conv2d", "3x3-C=64-2x64x8x8-K=64")])
def test_gpu_reference_is_correct_and_reported_in_tflops(tmp_path, cli, name, case):
    """On a GPU: the reference kernel, graded as a student, passes every dtype (bf16 and TF32
    included) and its speed is reported in TFLOP/s against the measured GEMM peak. Run with -s
    to see the figures (student = the reference here, so its ratio is about 1)."""
    import shutil

    spec = COURSE.get(name)
    repo = tmp_path / "ref"
    (repo / "kernels").mkdir(parents=True)
    shutil.copy(spec.reference_module(), repo / "kernels" / f"{name}.py")
    run = cli(repo, "-a", name, "--case", case, "--seed", "1", "--device", "cuda")
    tests = run.tests_of(name)
    correctness = [t for t in tests if t["tags"][1] == "correctness"]
    assert {t["tags"][2] for t in correctness} == {"float32", "float16", "bfloat16"}
    assert all(t["outcome"] == "passed" for t in correctness), [t["output"] for t in correctness]
    perf = next(t for t in tests if t["tags"][1] == "performance")
    details = perf["extra_data"]["details"]
    print(name, perf["output"])
    assert perf["outcome"] == "passed", perf["output"]
    assert "TFLOP/s" in perf["output"] and details["gemm_tflops"] > 0
    assert all(f["tflops"] > 0 for f in details["figures"].values())
    assert 0.5 < details["ratio_to_reference"] < 2.0
