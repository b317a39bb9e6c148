"""On a GPU: verdicts, performance figures, and timing cheats that must earn no speed credit.

Skipped, with the reason, where no CUDA GPU is visible (see conftest)."""

from __future__ import annotations

import pytest

from conftest import build_submission

pytestmark = pytest.mark.gpu


def test_good_submission_passes_on_the_gpu_with_speed_figures(submission, cli):
    run = cli(submission("good"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "-a", "softmax")
    assert run.returncode == 0, run.stdout + run.stderr
    assert {t["outcome"] for t in run.results["tests"]} == {"passed"}, [t["output"] for t in run.results["tests"] if t["outcome"] != "passed"]
    for assignment in ("vector_add", "softmax"):
        perf = [t for t in run.tests_of(assignment) if t["tags"][1] == "performance"][0]
        figures = perf["extra_data"]["details"]["figures"]
        assert set(figures) == {"student", "reference", "torch"}
        assert all(f["gbps"] > 0 and 0 < f["roofline_pct"] < 120 for f in figures.values())
        lo, hi = perf["extra_data"]["details"]["ratio_interval"]
        assert lo <= perf["extra_data"]["details"]["ratio_to_reference"] <= hi
    assert run.results["extra_data"]["environment"]["roofline"]["copy_gbps"] > 500
    assert "<svg" in run.report


def test_buggy_submission_fails_on_the_gpu_too(submission, cli):
    run = cli(submission("row_stride"), "--seed", "3", "--device", "cuda", "-a", "softmax", "--case", "sliced-97x300")
    assert run.returncode == 1
    for dtype in ("float32", "float16", "bfloat16"):
        t = run.test("softmax", f"sliced-97x300 [{dtype}]")
        # the same diagnosis as in the interpreter (tests/test_cli_e2e.py): the cause, not only the symptom
        assert t["outcome"] == "failed" and "reading x as if it were contiguous" in t["output"], t["output"]


def test_ten_percent_slower_is_measured_slower(submission, cli):
    run = cli(submission("gpu/slow10"), "--seed", "3", "--device", "cuda", "--case", "n=1", "--case", "1x1", "--dtype", "float32")
    for assignment in ("vector_add", "softmax"):
        perf = [t for t in run.tests_of(assignment) if t["tags"][1] == "performance"][0]
        assert perf["outcome"] == "passed", perf["output"]
        assert perf["extra_data"]["details"]["ratio_interval"][0] > 1.0, perf["output"]


# each cheat, the severity it must get, and words its evidence must contain
CHEATS = {
    "cheat_side_stream": ("review", "returned before its GPU work was done"),
    "cheat_side_stream_waits_inputs": ("review", "returned before its GPU work was done"),
    "cheat_thread": ("review", "returned before its GPU work was done"),
    "cheat_graph_replay": ("conclusive", "wrong results on"),
    "cheat_cache": ("conclusive", "wrong results on input set"),
    "cheat_first_n": ("conclusive", "wrong results on"),
    "cheat_patch_elapsed": ("conclusive", "torch.cuda.Event.elapsed_time"),
    "cheat_patch_sync": ("conclusive", "torch.cuda.synchronize"),
    "cheat_vendor_large": ("conclusive", "aten::add.Tensor ran inside vector_add()"),
}


def _perf(run, assignment="vector_add") -> dict:
    return [t for t in run.tests_of(assignment) if t["tags"][1] == "performance"][0]


# cheats whose results race with their return: under load the race is lost often enough that a
# correctness check, or a check of their results, sees wrong values first; that is evidence too
RACY = {"cheat_side_stream", "cheat_side_stream_waits_inputs", "cheat_thread"}


@pytest.mark.parametrize("fixture", sorted(CHEATS))
def test_timing_cheats_earn_no_speed_credit_with_evidence(submission, cli, fixture):
    run = cli(submission(f"gpu/{fixture}"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577")
    perf = _perf(run)
    severity, words = CHEATS[fixture]
    correctness = [t for t in run.tests_of("vector_add") if t["tags"][1] == "correctness"]
    assert perf["score"] == 0 and run.returncode == 1
    if fixture in RACY and perf["outcome"] == "failed":  # a correctness case read its result unfinished
        assert "not timed" in perf["output"] and any(t["outcome"] == "failed" for t in correctness), perf["output"]
        return
    assert perf["outcome"] == "flagged", perf["output"]
    if fixture in RACY and perf["extra_data"]["severity"] == "conclusive":  # its results were read unfinished
        assert "wrong results" in perf["output"] or "are wrong" in perf["output"], perf["output"]
        severity = "conclusive"
    assert perf["extra_data"]["severity"] == severity, perf["output"]
    assert "no speed credit" in perf["output"] and words in perf["output"]
    if severity == "conclusive":
        assert run.results["score"] == 0
    else:  # a review finding costs the speed points only: the correct cases keep theirs
        assert run.results["score"] == sum(t["score"] for t in correctness) > 0


HONEST = ["honest_two_streams", "honest_slow_wrapper", "honest_syncs"]


@pytest.mark.parametrize("fixture", HONEST)
def test_honest_kernels_are_timed_whole_and_never_flagged(submission, cli, fixture):
    run = cli(submission(f"gpu/{fixture}"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577")
    perf = _perf(run)
    assert perf["outcome"] == "passed" and not perf["extra_data"]["severity"], perf["output"]
    assert not any(t["outcome"] == "flagged" for t in run.results["tests"])
    details = perf["extra_data"]["details"]
    figures = details["figures"]["student"]
    assert 0.8 < details["ratio_to_reference"] < 1.5, perf["output"]  # the same kernel as the reference's, all of it timed
    assert figures["median_ms"] >= details["floor_ms"] / 1.15
    if fixture == "honest_slow_wrapper":  # the wrapper's Python shows on the host's clock, not in the GPU time
        assert figures["host_median_ms"] > figures["median_ms"] + 0.5, figures
        assert perf["score"] > 0
    # the grader's own clock confirms the worker's figure (grader.judge.witness), by a CUDA graph
    # where the function can be captured, eagerly where it synchronizes
    seen = details["witness"]
    assert seen["graph"] == (fixture != "honest_syncs"), seen
    if fixture == "honest_syncs":  # timed eagerly, its synchronization on the grader's clock: never an accusation
        assert seen["confirmed"] or "could not be captured in a CUDA graph" in perf["output"], perf["output"]
        assert perf["score"] > 0
    else:
        assert seen["confirmed"] and "note" not in seen, seen


def _forged(tmp_path, forgery: str):
    """gpu/forged's honest slow kernel with one forgery of kernels/_forgeries.py applied at import."""
    sub = build_submission(tmp_path / "forged", "gpu/forged")
    name = forgery.split("(")[0]
    (sub / "kernels" / "vector_add.py").write_text(f"from kernels._forgeries import {name}\n\n{forgery}\n\n"
                                                   "from kernels._slow_add import vector_add  # noqa: E402,F401\n")
    return sub


# each forgery of the worker's figures, and words its evidence must contain
FORGERIES = {
    "collector(0.8)": "shorter than the grader's own clock",
    "reply(0.8)": "shorter than the grader's own clock",
    "stale_burst()": "the calls the grader timed by its own clock are wrong",
    "answer_ahead()": "wrote a reply before it was asked",
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_figures_forged_inside_the_worker_earn_no_speed_credit(tmp_path, cli, forgery):
    """A student who has read the grader's source rewrites, from inside its worker, what the
    worker reports: the activity collector and torch's C event class, the reply itself, the
    grader's own burst. The grader's clock is out of its reach: conclusive, with both figures."""
    run = cli(_forged(tmp_path, forgery), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577")
    perf = _perf(run)
    assert perf["outcome"] == "flagged" and perf["extra_data"]["severity"] == "conclusive", perf["output"]
    assert FORGERIES[forgery] in perf["output"] and perf["score"] == 0, perf["output"]
    assert run.results["score"] == 0


def test_a_forgery_within_the_noise_band_gains_nothing(submission, cli, tmp_path):
    """12% off every figure: past the honest spread, short of the forgery margin. The speed is
    scored on the grader's clock, so the forged kernel gets no better ratio than the honest one."""
    honest = _perf(cli(submission("gpu/forged"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577"))
    assert honest["outcome"] == "passed" and honest["extra_data"]["details"]["witness"]["confirmed"], honest["output"]
    honest_ratio = honest["extra_data"]["details"]["ratio_to_reference"]
    assert honest_ratio > 1.3, honest["output"]  # a slow kernel: a shorter figure would earn points
    forged = _perf(cli(_forged(tmp_path, "collector(0.88)"), "--seed", "3", "--device", "cuda", "-a", "vector_add",
                       "--case", "n=1048577"))
    if forged["outcome"] == "flagged":
        assert forged["extra_data"]["severity"] == "conclusive" and "shorter than the grader's own clock" in forged["output"]
    else:
        seen = forged["extra_data"]["details"]["witness"]
        assert not seen["confirmed"] and "scored on the grader's own clock" in forged["output"], forged["output"]
        assert forged["extra_data"]["details"]["ratio_to_reference"] > 0.95 * honest_ratio, (forged["output"], honest_ratio)


def test_missing_mask_is_caught_on_a_gpu_run_by_the_interpreter_bounds_check(submission, cli):
    run = cli(submission("missing_mask"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577", "--dtype", "float32")
    check = next(t for t in run.tests_of("vector_add") if t["name"].startswith("vector_add: memory safety"))
    assert check["outcome"] == "failed" and "out-of-bounds load" in check["output"]
    assert 'kernels/vector_add.py", line 11' in check["output"]
    perf = next(t for t in run.tests_of("vector_add") if t["tags"][1] == "performance")
    assert perf["score"] == 0 and "not timed" in perf["output"]
    assert run.returncode == 1


def test_a_second_check_reuses_the_kept_inputs_kernels_and_warm_zygote(submission, cli, tmp_path, monkeypatch):
    """What `grader check` keeps between runs on a machine: the second check makes no input set
    (the same files), compiles from the kept kernels, and gets the same verdict."""
    kept = tmp_path / "kept"
    monkeypatch.setenv("GRADER_CACHE_DIR", str(kept))
    monkeypatch.setenv("GRADER_WARM_SECONDS", "120")
    sub = submission("good")
    try:
        first = cli(sub, "--device", "cuda", "-a", "vector_add")
        assert first.returncode == 0, first.stdout + first.stderr
        sets = {p.name: p.stat().st_ino for p in (kept / "run").glob("inputs-*.safetensors")}
        assert len(sets) == 4  # three timed sets and the fresh one
        kernels = {p.name for p in (kept / "kernels").glob("*/*")}  # under this repository's identity
        assert kernels and list((kept / "warm").glob("*.sock"))
        second = cli(sub, "--device", "cuda", "-a", "vector_add")
        assert second.returncode == 0, second.stdout + second.stderr
        assert {p.name: p.stat().st_ino for p in (kept / "run").glob("inputs-*.safetensors")} == sets  # not made again
        assert kernels <= {p.name for p in (kept / "kernels").glob("*/*")}
        assert first.results["score"] == second.results["score"]
        phases = [_perf(r)["extra_data"]["details"]["phase_seconds"] for r in (first, second)]
        assert phases[1]["inputs"] < phases[0]["inputs"]
        assert "kept for the next check" in second.stdout
    finally:
        from grader.sandbox.zygote import stop_warm

        stop_warm(kept / "warm")  # the warm zygote it left


def test_a_correct_but_slow_kernel_is_told_why_in_its_own_terms(submission, cli):
    """16x16 tiles and one warp: correct, honest, slow; the performance result adds what the
    compiled kernel is (its registers, warps, grid against the SMs) and never flags it."""
    run = cli(submission("gpu/slow_matmul"), "--seed", "3", "--device", "cuda", "-a", "matmul_relu", "--case", "127x129x131")
    tests = run.tests_of("matmul_relu")
    assert all(t["outcome"] == "passed" for t in tests if t["tags"][1] == "correctness"), [t["output"] for t in tests]
    perf = next(t for t in tests if t["tags"][1] == "performance")
    assert perf["outcome"] in ("passed", "failed"), perf["output"]  # scored (few points), never flagged nor infra_error
    details = perf["extra_data"]["details"]
    kernel = details["compiled"]["matmul_relu_kernel"]
    assert kernel["num_warps"] == 1 and kernel["n_regs"] > 0 and kernel["grid"][:2] == [256, 256]
    assert details["why_slow"]["share"] < 0.7 and "Why it is slow" in perf["output"], perf["output"]
    assert "registers per thread" in perf["output"] and "1 warps" in perf["output"] and "SMs" in perf["output"]
