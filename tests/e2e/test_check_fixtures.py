"""End to end: the real CLI on fixture submissions, in Triton's CPU interpreter.

Each buggy fixture must fail for the right reason, the report must say that reason, and
the other assignment of the same submission must still be graded.
"""

from __future__ import annotations

import pytest

from tests.conftest import COURSE, FIXTURES, has_gpu
from grader import spec as specs

pytestmark = [pytest.mark.skipif(has_gpu(), reason="these expectations are for the CPU interpreter"), pytest.mark.slow]


def test_good_submission_passes_every_check(submission, cli):
    # the first two assignments in full; the others' good solutions are checked on a subset of
    # their cases in test_norms_and_dropout.py, to keep the suite fast in the interpreter
    run = cli(submission("good"), "--seed", "7", "-a", "vector_add", "-a", "softmax")
    assert run.returncode == 0, run.stdout + run.stderr
    outcomes = {t["outcome"] for t in run.results["tests"]}
    assert outcomes == {"passed", "skipped"}
    # bf16 and timing are skipped in the interpreter, with the reason
    skipped = [t for t in run.results["tests"] if t["outcome"] == "skipped"]
    assert all("bfloat16" in t["tags"] or "performance" in t["tags"] for t in skipped)
    assert any("bf16 arithmetic is wrong in Triton's CPU interpreter" in t["output"] for t in skipped)
    # both assignments ran; float32 and float16 earn about 2/3 of the correctness points here, and
    # each assignment is still out of its spec's whole total (bf16 and speed need a GPU)
    graded = run.results["extra_data"]["assignments"]
    assert set(graded) == {"vector_add", "softmax"}
    total = sum(COURSE.get(name).max_points for name in graded)
    assert run.results["max_score"] == total == 30
    expected = sum(t["max_score"] for t in run.results["tests"] if t["outcome"] == "passed")
    assert run.results["score"] == round(expected, 2)
    ran = sum(1 for t in run.results["tests"] if "correctness" in t["tags"])
    assert abs(expected - sum(COURSE.get(n).correctness_points * 2 / 3 for n in graded)) <= 0.01 * ran  # shares differ by a cent at most
    assert graded["softmax"]["skipped_points"] == round(graded["softmax"]["max_score"] - graded["softmax"]["score"], 2)
    assert abs(graded["softmax"]["skipped_points"] - 12) <= 0.1  # 8 speed points and a third of 12, to the cent
    env = run.results["extra_data"]["environment"]
    assert env["mode"] == "cpu-interpreter" and env["torch"] and env["triton"] and env["python"]
    assert run.results["extra_data"]["seed"] == 7
    assert f"Score: {run.results['score']:g} / {total:g}" in run.stdout
    # the report stands alone: no script, stylesheet or image from the network
    assert "http://" not in run.report.replace("http://www.w3.org/2000/svg", "") and "https://" not in run.report
    assert f"{run.results['score']:g} / {total:g} points" in run.report


# fixture, args, the test that must go wrong, its outcome, words its explanation must hold
BUGS = [
    ("missing_mask", ["-a", "vector_add", "--case", "n=127"], "vector_add", "n=127 [float32]", "failed",
     ["out-of-bounds load", "past the end of x_ptr", "mask"]),
    ("floor_grid", ["-a", "vector_add", "--case", "n=1048577"], "vector_add", "n=1048577 [float32]", "failed",
     ["only elements from index 1048576 on are wrong", "triton.cdiv", "NaN"]),
    ("row_stride", ["-a", "softmax", "--case", "sliced-97x300"], "softmax", "sliced-97x300 [float32]", "failed",
     ["reading x as if it were contiguous", "x.stride() == (337, 1)", "x.stride(0)"]),
    ("va_ignores_strides", ["-a", "vector_add", "--case", "strided-n=65537"], "vector_add", "strided-n=65537 [float32]",
     "failed", ["reading x as if it were contiguous", "x.stride() == (2,)", "the strides are the cause"]),
    ("short_row", ["-a", "softmax", "--case", "2x20000"], "softmax", "2x20000 [float32]", "failed",
     ["columns >= 1024 were never written", "loop over the row in blocks"]),
    ("wrong_dtype", ["-a", "softmax", "--case", "1x1", "--dtype", "float16"], "softmax", "1x1 [float16]", "failed",
     ["dtype is float32, expected float16"]),
    ("returns_input", ["-a", "vector_add", "--case", "n=129"], "vector_add", "n=129 [float32]", "failed",
     ["the result equals the input y", "return the input"]),
    ("writes_nothing", ["-a", "vector_add", "--case", "n=129"], "vector_add", "n=129 [float32]", "failed",
     ["never written", "NaN"]),
    ("raises", ["--case", "1x1", "--case", "n=1"], "softmax", "1x1 [float32]", "error",
     ["ValueError: softmax: unsupported shape (1, 1)"]),
    ("os_exit", ["--case", "1x1", "--case", "n=1"], "vector_add", "n=1 [float32]", "crashed",
     ["exited with status 3"]),
    ("hangs", ["--case", "1x1", "--case", "n=1", "--timeout", "4"], "softmax", "1x1 [float32]", "timeout",
     ["no answer within 4 s"]),
    ("syntax_error", ["--case", "1x1", "--case", "n=1"], "vector_add", "import", "error",
     ["SyntaxError", "importing kernels/vector_add.py failed"]),
    ("mm_fp16_acc", ["-a", "matmul_relu", "--case", "long-K-64x48x2048", "--dtype", "float16"], "matmul_relu",
     "long-K-64x48x2048 [float16]", "failed",
     ["less precise than torch's in float16", "Accumulate in float32", "float16 accumulator loses precision"]),
    ("mm_ignores_strides", ["-a", "matmul_relu", "--case", "a-transposed-96x80x72"], "matmul_relu",
     "a-transposed-96x80x72 [float32]", "failed",
     ["a.stride() == (1, 96)", "reading a with a contiguous layout", "pass a.stride(0) and a.stride(1)"]),
    ("attn_no_rescale", ["-a", "flash_attention", "--case", "causal-N=130-D=64"], "flash_attention",
     "causal-N=130-D=64 [float32]", "failed",
     ["without rescaling the accumulator when the running max grows", "exp(m_old - m_new)"]),
    ("attn_tail_keys", ["-a", "flash_attention", "--case", "N=130-D=64", "--dtype", "float16"], "flash_attention",
     "N=130-D=64 [float16]", "failed",
     ["runs past N = 130", "padding keys take part in the softmax", "scores must be -inf"]),
    ("conv_transposed_filter", ["-a", "conv2d", "--case", "3x3-2x3x11x13-K=5"], "conv2d", "3x3-2x3x11x13-K=5 [float32]",
     "failed", ["the filter is read transposed", "x[n, c, p + r, q + s]"]),
    ("conv_ignores_strides", ["-a", "conv2d", "--case", "channels-last-3x3-2x8x9x11-K=6"], "conv2d",
     "channels-last-3x3-2x8x9x11-K=6 [float32]", "failed",
     ["x.stride() == (792, 1, 88, 8)", "address x with its four strides", "channels-last in memory"]),
    ("layernorm_naive_variance", ["-a", "layernorm", "--case", "offset-16x4096"], "layernorm", "offset-16x4096 [float32]",
     "failed", ["every row has wrong elements", "mean(x^2) - mean(x)^2 cancels", "subtract the mean first"]),
    ("layernorm_short_row", ["-a", "layernorm", "--case", "wide-2x20000"], "layernorm", "wide-2x20000 [float32]", "failed",
     ["columns >= 1024 were never written", "loop over the row in blocks"]),
    ("layernorm_backward_dx", ["-a", "layernorm_backward", "--case", "one-row-1x1024"], "layernorm_backward",
     "one-row-1x1024 [float32]", "failed", ["dx (result 1 of 3) is wrong"]),
    ("rmsnorm_fp16_sum", ["-a", "rmsnorm", "--case", "large-values-16x4096", "--dtype", "float16"], "rmsnorm",
     "large-values-16x4096 [float16]", "failed", ["only rows 3, 11 are wrong", "accumulate the sum of squares in float32"]),
    ("rmsnorm_no_eps", ["-a", "rmsnorm", "--case", "zero-row-8x512"], "rmsnorm", "zero-row-8x512 [float32]", "failed",
     ["only rows 2 are wrong", "hold NaN", "finite only with eps"]),
    ("dropout_keeps_p", ["-a", "dropout", "--case", "n=65539-p=0.1"], "dropout", "n=65539-p=0.1 [float32]", "failed",
     ["each is kept with probability 1 - p = 0.9", "a correct kernel keeps between", "with probability p instead"]),
    ("dropout_no_scale", ["-a", "dropout", "--case", "n=1025-p=0.3"], "dropout", "n=1025-p=0.3 [float32]", "failed",
     ["the kept elements equal x, not x / (1 - p) = 1.429 * x"]),
    ("dropout_ignores_seed", ["-a", "dropout", "--case", "n=1025-p=0.3"], "dropout", "n=1025-p=0.3 [float32]", "failed",
     ["gave the same mask", "pass the seed argument to tl.rand(seed, offsets)"]),
    ("dropout_nan_at_p1", ["-a", "dropout", "--case", "p=1-n=4099"], "dropout", "p=1-n=4099 [float32]", "failed",
     ["with p = 1 every element is dropped", "4099 are NaN", "tl.where"]),
]


@pytest.mark.parametrize("fixture,args,assignment,name,outcome,words", BUGS, ids=[b[0] for b in BUGS])
def test_buggy_submission_fails_for_the_right_reason(submission, cli, fixture, args, assignment, name, outcome, words):
    run = cli(submission(fixture), "--seed", "11", "--dtype", "float32", *args) if "--dtype" not in args else \
        cli(submission(fixture), "--seed", "11", *args)
    assert run.returncode == 1, run.stdout + run.stderr
    test = run.test(assignment, name)
    assert test["outcome"] == outcome, test
    assert test["status"] == "failed" and test["score"] == 0
    for w in words:
        assert w in test["output"], (w, test["output"])
        assert w.replace("'", "&#39;").replace(">", "&gt;") in run.report, w
    # the one-line reproducer names exactly this case, dtype and seed
    case, dtype = name.rsplit(" [", 1) if " [" in name else ("n=1", "float32]")  # an import failure: one result, any case reproduces it
    assert f"--case '{case}' --dtype {dtype[:-1]} --seed 11" in test["output"]
    # honest but wrong code is not accused: its own kernel check passes, or had no call to look at
    if name != "import":  # a module that does not import has one result, and nothing else to inspect
        own = run.test(assignment, "uses its own Triton kernel")
        assert own["outcome"] == "passed" or (own["outcome"] == "skipped" and "no call completed" in own["output"]), own
    # a broken assignment costs nothing elsewhere: the other assignment still passes
    others = [t for t in run.results["tests"] if t["tags"][0] != assignment and t["outcome"] != "skipped"]
    assert all(t["outcome"] == "passed" for t in others), others


def test_traceback_points_at_the_students_line(submission, cli):
    run = cli(submission("raises"), "--seed", "1", "-a", "softmax", "--case", "1x1", "--dtype", "float32")
    output = run.test("softmax", "1x1 [float32]")["output"]
    assert 'File "kernels/softmax.py", line 8, in _check' in output
    assert "raise ValueError" in output
    assert "grader/worker/server.py" not in output  # our frames are noise to a student


def test_out_of_bounds_traceback_names_the_kernel_line(submission, cli):
    run = cli(submission("missing_mask"), "--seed", "1", "-a", "vector_add", "--case", "n=1", "--dtype", "float32")
    output = run.test("vector_add", "n=1 [float32]")["output"]
    assert 'File "kernels/vector_add.py", line 11, in add_kernel' in output
    assert "x = tl.load(x_ptr + offsets * stride_x)" in output


def test_calling_torch_instead_of_a_kernel_is_flagged_and_earns_nothing(submission, cli):
    run = cli(submission("torch_softmax"), "--seed", "5", "-a", "softmax", "--case", "1x1", "--case", "4x8191", "--dtype", "float32")
    assert run.returncode == 1
    integrity = run.test("softmax", "uses its own Triton kernel")
    assert integrity["outcome"] == "flagged" and integrity["extra_data"]["severity"] == "conclusive"
    assert "aten::_softmax ran inside softmax()" in integrity["output"]
    # the values were right, but a conclusive finding takes every point of the assignment
    assert run.test("softmax", "1x1 [float32]")["outcome"] == "passed"
    assert run.results["score"] == 0
    assert "conclusive integrity finding" in run.stdout


def test_hang_is_killed_and_later_calls_are_not_waited_for(submission, cli):
    run = cli(submission("hangs"), "--seed", "2", "-a", "softmax", "--case", "1x1", "--case", "4x8191", "--case", "2x20000",
              "--dtype", "float32", "--timeout", "3")
    outcomes = [t["outcome"] for t in run.tests_of("softmax") if t["tags"][1] == "correctness"]
    assert outcomes == ["timeout", "timeout", "timeout"]
    assert "not run: the calls before this one timed out" in run.test("softmax", "2x20000 [float32]")["output"]


def test_grader_toml_maps_module_and_function(tmp_path, cli):
    repo = tmp_path / "renamed"
    (repo / "src").mkdir(parents=True)
    text = (FIXTURES / "good" / "kernels" / "vector_add.py").read_text().replace("def vector_add(", "def my_add(")
    (repo / "src" / "adder.py").write_text(text)
    (repo / "grader.toml").write_text('[assignments.vector_add]\nmodule = "src/adder.py"\nfunction = "my_add"\n')
    run = cli(repo, "--seed", "3", "--case", "n=129", "--dtype", "float32")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.test("vector_add", "n=129 [float32]")["outcome"] == "passed"
    assert [a for a in run.results["extra_data"]["assignments"]] == ["vector_add"]


@pytest.mark.parametrize("args,message", [
    (["does-not-exist"], "no such folder"),
    ([".", "-a", "nope"], "unknown assignment 'nope'"),
    ([".", "--device", "cuda"], "no CUDA GPU"),
    ([".", "--case", "no-such-case"], "--case no-such-case: no such case in"),
    ([".", "-a", "vector_add", "--dtype", "bfloat16", "--dtype", "float64"], "unknown dtype 'float64'"),
])
def test_usage_errors_exit_2_with_one_line(submission, cli, tmp_path, args, message):
    repo = submission("good")
    args = [str(repo) if a == "." else a for a in args]
    run = cli(*args)
    assert run.returncode == 2
    assert message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert "Traceback" not in run.stderr


def test_no_assignment_found_exits_2(tmp_path, cli):
    empty = tmp_path / "empty"
    empty.mkdir()
    run = cli(empty)
    assert run.returncode == 2 and "no assignment found" in run.stderr


def test_malformed_grader_toml_exits_2(submission, cli):
    repo = submission("good")
    (repo / "grader.toml").write_text("[assignments.vector_add\nmodule=")
    run = cli(repo)
    assert run.returncode == 2 and "grader.toml is not valid TOML" in run.stderr


def test_list_shows_assignments(cli):
    run = cli(command="list")
    assert run.returncode == 0
    assert "vector_add(x: Tensor, y: Tensor) -> Tensor" in run.stdout
    assert "kernels/softmax.py" in run.stdout


def test_piped_tables_keep_their_whole_case_names(submission, tmp_path):
    """Through a pipe (`| tee`, a CI log) with no COLUMNS, a table is never cut at rich's default
    80 columns: the longest case name and its shapes stay whole on their row."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES") and not k.startswith("GITHUB_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(submission("good")), "-a", "conv2d", "--case",
                           "5x5-whole-image-1x4x5x5-K=6", "--device", "cpu", "--json",
                           str(tmp_path / "r.json"), "--html", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if "5x5-whole" in line)
    # every dtype's column: wider than 80
    assert "│ 5x5-whole-image-1x4x5x5-K=6 │ x[1x4x5x5], w[6x4x5x5] │ passed  │ passed  │ skipped" in row, proc.stdout
