"""Feedback that names a failure's true cause and shows its smallest case.

Each cause has a buggy fixture (tests/fixtures/<name>/, overlaid on `good`) run through the real
CLI in the interpreter, or a result made by hand from what a kernel with that bug computes.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import COURSE, REPO_ROOT, has_gpu
from grader import spec as specs
from grader.settings import Settings

cpu_only = pytest.mark.skipif(has_gpu(), reason="these expectations are for the CPU interpreter")


# -- a module without its function, a module that does not import: one result each ----------

@cpu_only
@pytest.mark.slow
def test_a_missing_function_is_one_not_submitted_result_worth_its_points(submission, cli):
    run = cli(submission("layernorm_no_backward"), "-a", "layernorm_backward", "-a", "layernorm", "--case", "one-row-1x1024",
              "--seed", "3")
    assert run.returncode == 1, run.stdout + run.stderr
    shown = [t for t in run.tests_of("layernorm_backward") if t["outcome"] != "skipped" and "GPU" not in t["name"]]
    assert [t["name"] for t in shown] == ["layernorm_backward: not submitted"], shown
    (test,) = shown
    assert "kernels/layernorm.py defines no function layer_norm_backward()" in test["output"]
    spec = COURSE.get("layernorm_backward")
    planned = len(spec.dtypes) * (len(spec.cases) + 3)
    # the one case that ran (of the full run's), float32 and float16 here: its share of the points, nothing earned
    assert test["score"] == 0 and test["max_score"] > 0
    assert run.stdout.count("defines no function") <= 2, run.stdout  # its line, and once in what went wrong: not once per case
    # the forward pass in the same module is graded as usual
    assert run.test("layernorm", "one-row-1x1024 [float32]")["status"] == "passed"
    assert planned > 1


def test_a_missing_function_over_a_whole_run_is_worth_every_point(submission, tmp_path):
    from grader.judge.context import GradingContext
    from grader.judge.session import open_session
    from grader.submission import open_submission

    spec = COURSE.get("layernorm_backward")
    sub = open_submission(submission("layernorm_no_backward"))
    result = open_session(GradingContext("cpu", 1), Settings()).grade(sub, [spec]).assignments[0]
    bad = [t for t in result.tests if t.outcome != "skipped"]
    assert [t.name for t in bad] == ["not submitted"]  # not 24 errors, one per case
    assert bad[0].details.missing_function == "layer_norm_backward"
    assert result.max_score == spec.max_points and result.score == 0


@cpu_only
@pytest.mark.slow
def test_a_module_that_does_not_import_is_one_error_with_the_students_lines(submission, cli):
    run = cli(submission("import_name_error"), "-a", "softmax", "--seed", "3", "--dtype", "float32")
    assert run.returncode == 1, run.stdout + run.stderr
    shown = [t for t in run.tests_of("softmax") if t["outcome"] != "skipped" and "GPU" not in t["name"]]
    assert [t["name"] for t in shown] == ["softmax: import"], [t["name"] for t in shown]
    out = shown[0]["output"]
    assert "importing kernels/softmax.py failed" in out and "NameError" in out and "BLOKC_SIZE" in out
    assert 'File "kernels/softmax.py", line 7' in out  # the student's line, not the worker's frames
    assert "grader/worker" not in out and "importlib" not in out
    assert run.stdout.count("NameError") <= 3, run.stdout  # its line, what went wrong and its traceback: not once per case


# -- a NaN the kernel computed is not memory it never wrote -------------------------------------

def _judge(name: str, case_name: str, dtype: str, out, source: str = ""):
    from grader.codec import storage_of
    from grader.judge.plan import make_inputs
    from grader.judge.verdict import judge_call

    spec = COURSE.get(name)
    case = next(c for c in spec.cases if c.name == case_name)
    inputs = make_inputs(spec, case, dtype, 0)
    saved = {f"input.{k}": storage_of(v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    saved["output"] = out(inputs)
    reply = {"device": "cpu", "dtype": dtype, "result_type": "Tensor"}
    return judge_call(spec, case, dtype, inputs, reply, saved, "cpu", kernel_source=source)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_poison_is_never_written_and_a_computed_nan_is_computed(dtype):
    from grader.codec import poison_

    never = _judge("vector_add", "n=127", dtype, lambda i: poison_(torch.empty_like(i["y"])))
    assert "the output was never written" in never.message and never.details.unwritten_elements == 127
    computed = _judge("vector_add", "n=127", dtype, lambda i: (i["x"] - i["x"]) / (i["x"] - i["x"]))  # 0/0, as a CPU computes it
    assert "was never written" not in computed.message and "fully masked" not in computed.message, computed.message
    assert "computed by your kernel" in computed.message and computed.details.unwritten_elements is None
    assert computed.details.computed_nonfinite["nan"] == 127
    assert "the first computed NaN is at index (0,)" in computed.message and "x = " in computed.message
    # torch's own NaN (float("nan"), torch.full): not our payload either, so computed too
    constant = _judge("vector_add", "n=127", dtype, lambda i: torch.full_like(i["y"], float("nan")))
    assert "computed by your kernel" in constant.message


def test_a_gpus_canonical_nan_and_every_payload_bit_count():
    from grader.codec import POISON, poisoned

    canonical = torch.tensor([0x7FFFFFFF, -0x00400000], dtype=torch.int32).view(torch.float32)  # GPU, then x86 (0xFFC00000)
    assert canonical.isnan().all() and not poisoned(canonical).any()
    for dtype, (as_int, bits) in POISON.items():
        one = torch.tensor([bits], dtype=as_int).view(dtype)
        assert one.isnan().all() and poisoned(one).all(), dtype
        # arithmetic on the poison gives a NaN, but on a GPU (and often a CPU) not the poison: the payload is ours alone
        assert not poisoned(torch.tensor([float("nan")], dtype=dtype)).any()


def test_a_partly_computed_nan_names_the_kernels_operations():
    source = (REPO_ROOT / "tests" / "fixtures" / "va_computes_nan" / "kernels" / "vector_add.py").read_text()

    def some_nan(i):
        out = i["x"] + i["y"]
        out[100:] = (i["x"][100:] - i["x"][100:]) / 0.0
        return out

    verdict = _judge("vector_add", "n=127", "float32", some_nan, source)
    assert "only elements from index 100 on are wrong" in verdict.message
    assert "hold NaN computed by your kernel" in verdict.message
    assert "the division at line 16 (0/0 or inf/inf)" in verdict.details.pattern
    assert "the first computed NaN is at index (100,)" in verdict.message


def test_the_static_reading_finds_each_operation_only_inside_kernels():
    from grader.judge.nonfinite import culprits, kernel_operations

    source = '''
import triton, triton.language as tl
def host(a, b):
    return a / b                      # not a kernel
@triton.jit
def k(x_ptr, n, BLOCK: tl.constexpr):
    x = tl.load(x_ptr)
    y = tl.exp(x - 1)
    z = tl.log(y) + tl.sqrt(x) * tl.math.rsqrt(x)
    w = x ** 0.5
    x /= 2
'''
    ops = kernel_operations(source)
    assert ops == [("exp", 8), ("log", 9), ("rsqrt", 9), ("sqrt", 9), ("power", 10), ("division", 11)]
    words = culprits({"nan": 0, "inf": 3}, ops)
    assert "the exp at line 8" in words and "what can compute inf" in words and "sqrt of a negative" not in words
    assert kernel_operations("def broken(:\n") == [] and culprits({"nan": 1, "inf": 0}, []) == ""


def test_the_starter_headline_needs_the_poison_itself():
    from grader.judge.feedback import stores_nothing
    from grader.results import TestResult

    def failed(**details):
        return TestResult("vector_add", "correctness", "n=1 [float32]", "failed", "x", details=dict(elements=4, **details))

    assert stores_nothing(failed(nan_elements=4, unwritten_elements=4))
    assert not stores_nothing(failed(nan_elements=4))  # every element NaN, all computed: the kernel did store


@cpu_only
@pytest.mark.slow
def test_a_kernel_that_stores_nan_is_told_it_computed_it(submission, cli):
    run = cli(submission("va_computes_nan"), "-a", "vector_add", "--case", "n=129", "--dtype", "float32", "--seed", "2")
    assert run.returncode == 1, run.stdout + run.stderr
    test = run.test("vector_add", "n=129 [float32]")
    assert "was never written" not in test["output"] and "missing or fully masked" not in test["output"]
    assert "computed by your kernel" in test["output"]
    assert "the division at line 16 (0/0 or inf/inf)" in test["output"]
    assert run.results["extra_data"]["assignments"]["vector_add"].get("headline", "") == ""


# -- the smallest failing case ----------------------------------------------------------------------

def test_every_named_case_has_a_shape_name_that_rebuilds_it():
    from grader.judge.shrink import shape_case, shape_name

    for spec in COURSE.catalogue().values():
        for case in spec.cases:
            name = shape_name(spec, case.params)
            assert name and name.startswith("shape="), (spec.name, case.name)
            assert shape_case(spec, name).params == case.params, (spec.name, case.name, name)
    softmax = COURSE.get("softmax")
    assert shape_case(softmax, "shape=1x17").params == {"rows": 1, "cols": 17}
    assert shape_case(softmax, "shape=3x5,layout=sliced").params == {"rows": 3, "cols": 5, "layout": "sliced"}
    assert shape_case(COURSE.get("rmsnorm"), "shape=16x40,large_rows=[3,11]").params["large_rows"] == [3, 11]
    for bad in ("shape=1x", "shape=0x5", "shape=1x2x3", "shape=axb", "shape=1x2,=3", "1x17"):
        assert shape_case(softmax, bad) is None, bad


def test_the_search_keeps_the_kind_and_finds_the_boundary():
    import time

    from grader.judge.shrink import INVALID, ladder, search

    softmax = COURSE.get("softmax")
    big = next(c for c in softmax.cases if c.name == "2x20000")
    tried = []

    def cut_at_1024(case):  # a row longer than one block of 1024 is cut short
        tried.append(case)
        return case.params["cols"] > 1024

    found = search(softmax, big, cut_at_1024, time.monotonic() + 5)
    assert found.smallest.name == "shape=1x1025" and found.passing.name == "shape=1x1024"
    assert found.runs == len(tried) <= 16
    # a case that exists for its layout keeps it; one not a multiple of 16 is never shrunk to a multiple of 16
    sliced = next(c for c in softmax.cases if c.name == "sliced-97x300")
    seen = []
    found = search(softmax, sliced, lambda c: seen.append(c) or c.params["rows"] > 2, time.monotonic() + 5)
    assert all(c.params["layout"] == "sliced" for c in seen) and found.smallest.name == "shape=3x1,layout=sliced"
    assert 16 not in ladder(781, 781) and 17 in ladder(781, 781) and 16 in ladder(4096, 4096)
    # a size the assignment cannot make is neither a pass nor a failure; the deadline stops the search
    negative = next(c for c in softmax.cases if c.name == "negative-row-8x1000")
    found = search(softmax, negative, lambda c: INVALID if c.params["rows"] <= 3 else True, time.monotonic() + 5)
    assert found.smallest.params["rows"] == 4 and found.passing is None
    assert search(softmax, big, cut_at_1024, time.monotonic() - 1).smallest is None


@cpu_only
@pytest.mark.slow
def test_a_large_failure_is_shrunk_to_its_smallest_case_which_reproduces(submission, cli):
    repo = submission("short_row")  # softmax cut at 1024 columns
    run = cli(repo, "-a", "softmax", "--case", "2x20000", "--dtype", "float32", "--seed", "1")
    assert run.returncode == 1, run.stdout + run.stderr
    test = run.test("softmax", "2x20000 [float32]")
    small = test["extra_data"]["details"]["smallest_failing"]
    assert small["case"] == "shape=1x1025" and test["extra_data"]["details"]["largest_passing"]["case"] == "shape=1x1024"
    assert "the smallest failing case found: shape=1x1025 (x[1x1025]); shape=1x1024 passes" in run.stdout
    assert "--case 'shape=1x1025' --dtype float32 --seed 1" in small["reproducer"]
    assert "shape=1x1025" in run.report
    # shrunk cases are no tests and earn nothing: the score is the planned case's alone
    assert not [t for t in run.results["tests"] if "shape=" in t["name"]]
    assert run.results["score"] == 0
    again = cli(repo, "-a", "softmax", "--case", "shape=1x1025", "--dtype", "float32", "--seed", "1")
    assert again.returncode == 1
    replay = again.test("softmax", "shape=1x1025 [float32]")
    assert replay["status"] == "failed" and "columns >= 1024 were never written" in replay["output"]
    assert replay["score"] == 0  # a case outside the plan is worth nothing


# -- matmul, conv and layernorm causes, each reproduced from the student's inputs ---------------------

@cpu_only
@pytest.mark.slow
@pytest.mark.parametrize("fixture,assignment,case,dtype,words", [
    ("mm_k_tail_skipped", "matmul_relu", "127x129x131", "float32",
     ["the last, partial step along K is skipped", "only the first 128 of K = 131 were summed", "offs_k < K - k0"]),
    ("mm_k_tail_skipped", "matmul_relu", "K=1-65x67", "float32", ["K = 1 is less than one step", "the loop over K never ran"]),
    ("mm_strides_swapped", "matmul_relu", "sliced-70x90x50", "float32",
     ["reading a with its two strides swapped", "a.stride() == (59, 1)"]),
    ("mm_fp16_acc", "matmul_relu", "long-K-64x48x2048", "float16",
     ["exactly as a float16 accumulator gives, rounded at every step of 32 along K", "Accumulate in float32"]),
    ("conv_reduction_tail", "conv2d", "3x3-C=37-1x37x10x12-K=20", "float32",
     ["the last, partial step of the reduction is skipped", "only the first 320 of C x R x S = 333 terms"]),
    ("conv_fp16_acc", "conv2d", "shape=1x256x6x6x8,R=3", "float16",
     ["exactly as a float16 accumulator gives, rounded at steps of 32 through (c, r, s)"]),
    ("layernorm_no_bias", "layernorm", "hidden=213-64x213", "float32", ["the bias is missing", "y = x_hat * weight + bias"]),
])
def test_each_cause_is_named_from_the_students_own_inputs(submission, cli, fixture, assignment, case, dtype, words):
    run = cli(submission(fixture), "-a", assignment, "--case", case, "--dtype", dtype, "--seed", "4")
    assert run.returncode == 1, run.stdout + run.stderr
    test = run.test(assignment, f"{case} [{dtype}]")
    assert test["status"] == "failed"
    for w in words:
        assert w in test["output"], (w, test["output"])
    for wrong in ("every row has wrong elements", "the grid is one program"):
        assert wrong not in test["extra_data"]["details"]["pattern"], test["output"]


def test_an_honest_result_is_never_explained_as_a_bug():
    """The hypotheses only explain what they reproduce: a right result passes, and a wrong result of
    another kind (the values scrambled) is not blamed on the K tail, the strides or the accumulator."""
    def scrambled(i):
        out = torch.relu(i["a"].double() @ i["b"].double())
        return out.flip(0).to(i["a"].dtype)

    for case in ("127x129x131", "sliced-70x90x50", "long-K-64x48x2048"):
        for dtype in ("float32", "float16"):
            right = _judge("matmul_relu", case, dtype, lambda i: torch.relu(i["a"].float() @ i["b"].float()).to(i["a"].dtype))
            assert right.outcome == "passed", right.message
            wrong = _judge("matmul_relu", case, dtype, scrambled)
            for cause in ("partial step along K", "strides swapped", "accumulator gives"):
                assert cause not in wrong.message, wrong.message


# -- why a correct kernel is slow, from what the compiler made of it ----------------------------------
# Figures as Triton 3.x reports them on an H100 (132 SMs) for kernels of these shapes.

RECORDED = {
    # a vector add with one program of 2^20 elements per... far too few programs, and spills from a huge block
    "add_kernel": {"n_regs": 255, "n_spills": 412, "shared": 0, "num_warps": 4, "num_stages": 3, "grid": [8, 1, 1]},
    # a tiled GEMM with 128x128x64 fp16 tiles and no pipelining
    "matmul_kernel": {"n_regs": 168, "n_spills": 0, "shared": 131072, "num_warps": 8, "num_stages": 1, "grid": [32, 32, 1]},
    # a well-shaped copy kernel
    "copy_kernel": {"n_regs": 24, "n_spills": 0, "shared": 0, "num_warps": 4, "num_stages": 3, "grid": [65536, 1, 1]},
}


def test_a_slow_memory_bound_kernel_is_told_its_spills_and_its_empty_sms():
    from grader.judge.slowness import why_slow, words

    why = why_slow({"add_kernel": RECORDED["add_kernel"]}, 132, "measured copy bandwidth", 0.12)
    text = words(why)
    assert why["kind"] == "memory" and "reaches 12% of the roofline" in text
    assert "add_kernel: 255 registers per thread, 412 spilled to local memory, 0 KB of shared memory, 4 warps, 3 stages, " \
           "a grid of 8 programs for 132 SMs" in text
    assert "412 registers spill to local memory" in text and "124 SMs have nothing to do" in text
    assert "leave room for 8 warps per SM" in text
    assert "memory-bound kernel like this one" in text


def test_a_slow_gemm_is_told_its_stages_and_shared_memory():
    from grader.judge.slowness import why_slow, words

    text = words(why_slow({"matmul_kernel": RECORDED["matmul_kernel"]}, 132, "cuBLAS GEMM peak", 0.3))
    assert "1 pipeline stage" in text and "num_stages=3 or 4" in text
    assert "128 KB of shared memory per program: at most 1 programs fit" in text
    assert "SMs have nothing to do" not in text  # 1024 programs fill 132 SMs
    assert "compute-bound kernel like this one" in text


def test_a_fast_or_unknown_kernel_gets_no_why():
    from grader.judge.slowness import findings, why_slow

    assert why_slow({"copy_kernel": RECORDED["copy_kernel"]}, 132, "measured copy bandwidth", 0.85) is None
    assert why_slow({}, 132, "measured copy bandwidth", 0.1) is None
    assert findings(RECORDED["copy_kernel"], 132, "memory") == []  # a well-shaped kernel: nothing stands out
    # without the SM count the grid is still said, without the comparison
    why = why_slow({"add_kernel": RECORDED["add_kernel"]}, None, "measured copy bandwidth", 0.1)
    assert "a grid of 8 programs," not in why["facts"][0] and "a grid of 8 programs" in why["facts"][0]
    assert not any("SMs have nothing" in f for f in why["findings"])


def test_the_compiled_figures_cross_the_protocol_typed():
    from grader.protocol import Call, CallReply, CompiledKernel, ProtocolError, decode_reply, encode

    reply = CallReply(ops=[], launches=1, kernels={"add_kernel": CompiledKernel(**RECORDED["add_kernel"])})
    back = decode_reply(Call("student", "x", {}, "fresh"), encode(reply))
    assert back == reply
    forged = encode(reply).replace('"n_regs": 255', '"n_regs": "lots"')
    with pytest.raises(ProtocolError, match="n_regs"):
        decode_reply(Call("student", "x", {}, "fresh"), forged)
    # an older worker's reply without them still reads
    assert decode_reply(Call("student", "x", {}, "fresh"), '{"ok": true, "ops": [], "launches": 0}').kernels == {}


def test_the_interpreter_says_these_come_on_a_gpu():
    from grader.judge.context import GradingContext
    from grader.judge.perf import measure
    from grader.judge.session import open_session
    from grader.results import AssignmentResult

    spec = COURSE.get("vector_add")
    test = measure(open_session(GradingContext("cpu", 1), Settings()), spec, AssignmentResult("vector_add", "t", "m"), None, None, 1.0)
    assert test.outcome == "skipped" and "registers, spills, shared memory" in test.message and "roofline" in test.message


# -- a stride that differs between input and output, or from the one the kernel assumes ----------

def _judge_with(name: str, case_name: str, dtype: str, out, reply_extra: dict):
    """The judge's verdict on `out(inputs)`, with the worker's word on the result's strides and the
    launch's blocks (`reply_extra`) as a real call's reply carries them."""
    from grader.codec import storage_of
    from grader.judge.plan import make_inputs
    from grader.judge.verdict import judge_call

    spec = COURSE.get(name)
    case = next(c for c in spec.cases if c.name == case_name)
    inputs = make_inputs(spec, case, dtype, 0)
    saved = {f"input.{k}": storage_of(v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    result = out(inputs)
    saved["output"] = result
    reply = {"device": "cpu", "dtype": dtype, "result_type": "Tensor", "stride": list(result.stride()), **reply_extra}
    return judge_call(spec, case, dtype, inputs, reply, saved, "cpu")


def _row_kernel(x: torch.Tensor, y: torch.Tensor, f, x_row: int, y_row: int) -> torch.Tensor:
    """What a one-program-per-row kernel that steps along each row by 1 does: row r read from x's storage
    at r * x_row + c, f of it written into y's storage at r * y_row + c (what falls past y's end dropped)."""
    xs = x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)
    ys = y.as_strided((y.untyped_storage().nbytes() // y.element_size(),), (1,), 0)
    cols = x.shape[-1]
    for r in range(x.shape[0]):
        start = x.storage_offset() + r * x_row
        row = f(xs[start:start + cols].double())
        end = min(r * y_row + cols, ys.numel())
        if end > r * y_row:
            ys[r * y_row:end] = row[:end - r * y_row].to(y.dtype)
    return y


def test_a_softmax_that_assumes_a_column_stride_of_one_is_told_so_not_its_block():
    """Triton's fused-softmax tutorial on a transposed x: its output, from empty_like, has x's strides,
    and both are addressed with a column stride of 1. The block (next_power_of_2(n_cols)) is long enough."""
    def tutorial(inputs):
        x = inputs["x"]
        y = torch.full_like(x, float("nan"))  # empty_like's strides, never-written elements NaN
        return _row_kernel(x, y, lambda r: torch.softmax(r, 0), x.stride(0), y.stride(0))

    verdict = _judge_with("softmax", "transposed-300x129", "float32", tutorial, {"blocks": {"BLOCK_SIZE": 256}})
    assert verdict.outcome == "failed"
    pattern = verdict.details.pattern
    assert "steps along each row by 1 (a column stride of 1)" in pattern, pattern
    assert "x.stride() == (1, 300)" in pattern and "the output's is (1, 300)" in pattern
    assert "cut short" not in pattern and "mask this" not in pattern


def test_a_layernorm_that_moves_y_by_xs_row_stride_is_told_so():
    """Triton's layer-norm tutorial on a sliced x (a GPU run: the store past y's end is not caught by the
    interpreter's bounds check): y is contiguous, both pointers move by x.stride(0)."""
    def tutorial(inputs):
        x, w, b, eps = inputs["x"], inputs["weight"], inputs["bias"], inputs["eps"]
        y = torch.full(x.shape, float("nan"), dtype=x.dtype)
        norm = lambda r: (r - r.mean()) * torch.rsqrt(r.var(unbiased=False) + eps) * w.double() + b.double()  # noqa: E731
        return _row_kernel(x, y, norm, x.stride(0), x.stride(0))

    verdict = _judge_with("layernorm", "sliced-97x300", "float32", tutorial, {"blocks": {"BLOCK_SIZE": 512}})
    assert verdict.outcome == "failed"
    pattern = verdict.details.pattern
    assert "moving the output by x's row stride" in pattern and "x.stride(0) == 337" in pattern, pattern
    assert "the output's is 300" in pattern and "mask" not in pattern.split("not a mask")[0]


def test_the_block_hint_only_where_the_block_is_shorter_than_the_row():
    """A row cut at column 100 of 129: with BLOCK = 64 the block is the cause; with BLOCK = 256 it is not,
    and the words say so instead of sending the student to next_power_of_2."""
    def cut(inputs):
        y = torch.softmax(inputs["x"].double(), -1).float()
        y[:, 100:] = 0.5
        return y.contiguous()

    short = _judge_with("softmax", "transposed-300x129", "float32", cut, {"blocks": {"BLOCK": 64}, "stride": None})
    assert "a row longer than your block is cut short" in short.details.pattern, short.details.pattern
    covered = _judge_with("softmax", "transposed-300x129", "float32", cut, {"blocks": {"BLOCK": 256}, "stride": None})
    assert "cut short" not in covered.details.pattern
    assert "your BLOCK = 256 covers these columns" in covered.details.pattern, covered.details.pattern


@cpu_only
@pytest.mark.slow
def test_the_tutorials_stride_bugs_are_named_by_the_real_check(submission, cli):
    """The two tutorials' kernels graded in the interpreter: the softmax's transposed cases name the column
    strides (not the block); the layernorm's sliced case names y moved by x's row stride at its masked store
    (the interpreter's bounds check catches the store past y's end), never 'mask this store'."""
    run = cli(submission("softmax_col_stride"), "-a", "softmax", "--case", "transposed-300x129", "--dtype", "float32",
              "--seed", "3")
    assert run.returncode == 1, run.stdout + run.stderr
    out = run.test("softmax", "transposed-300x129 [float32]")["output"]
    assert "a column stride of 1" in out and "x.stride() == (1, 300)" in out and "cut short" not in out, out
    run = cli(submission("layernorm_x_stride_for_y"), "-a", "layernorm", "--case", "sliced-97x300", "--dtype", "float32",
              "--seed", "3")
    assert run.returncode == 1, run.stdout + run.stderr
    out = run.test("layernorm", "sliced-97x300 [float32]")["output"]
    assert "the store is masked, and these lanes pass its mask" in out, out
    assert "Y is moved by 337 per row, X's row stride (the argument stride), but its own row stride is 300" in out
    assert "mask this store" not in out and 'line 35' in out
    # a store with no mask at all still gets the mask's fix
    run = cli(submission("missing_mask"), "-a", "vector_add", "--case", "n=127", "--dtype", "float32", "--seed", "3")
    assert "mask this load (e.g. mask=offsets < n)" in run.test("vector_add", "n=127 [float32]")["output"]
