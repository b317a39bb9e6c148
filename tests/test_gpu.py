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


# each cheat the replay (grader.judge.replaying) or its fallback catches: the severity it must get
# and words its evidence must contain
CHEATS = {
    "cheat_graph_replay": ("conclusive", "wrong results"),  # no Triton launch in its call: the fallback's checks
    "cheat_cache": ("conclusive", "wrong results"),
    "cheat_first_n": ("conclusive", "wrong results"),
    "cheat_vendor_large": ("conclusive", "aten::add.Tensor ran inside vector_add()"),
    "cheat_sampled_at_scale": ("conclusive", "wrong results at the timing size"),
}


def _perf(run, assignment="vector_add") -> dict:
    return [t for t in run.tests_of(assignment) if t["tags"][1] == "performance"][0]


def _check(submission, cli, fixture):
    return cli(submission(f"gpu/{fixture}"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577")


@pytest.mark.parametrize("fixture", sorted(CHEATS))
def test_timing_cheats_earn_no_speed_credit_with_evidence(submission, cli, fixture):
    run = _check(submission, cli, fixture)
    perf = _perf(run)
    severity, words = CHEATS[fixture]
    assert perf["score"] == 0 and run.returncode == 1
    assert perf["outcome"] == "flagged", perf["output"]
    assert perf["extra_data"]["severity"] == severity, perf["output"]
    assert "no speed credit" in perf["output"] and words in perf["output"], perf["output"]
    assert run.results["score"] == 0


# cheats against the worker's own timing: timed by replay, with the worker gone, each is scored on
# the true time of the kernels it launched, no better than its honest twin (the slow kernel of
# gpu/forged, about 1.6x the reference) or the plain reference-like kernel
AGAINST_THE_WORKER = {
    "cheat_side_stream": "good", "cheat_side_stream_waits_inputs": "good", "cheat_thread": "good",
    "cheat_patch_elapsed": "good", "cheat_patch_sync": "good",
    "cheat_unwatched_vendor": "gpu/forged", "cheat_gpu_load": "gpu/forged", "cheat_gpu_load_child": "gpu/forged",
}


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The honest twins' ratios, graded once for the module."""
    from conftest import build_submission, run_cli

    ratios = {}
    for name in ("good", "gpu/forged"):
        repo = build_submission(tmp_path_factory.mktemp("twin") / "repo", name)
        run = run_cli(["check", str(repo), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577",
                       "--json", str(repo.parent / "out" / "results.json")], repo.parent)
        perf = _perf(run)
        assert perf["extra_data"]["details"]["timed_by"] == "replay", perf["output"]
        ratios[name] = perf["extra_data"]["details"]["ratio_to_reference"]
    return ratios


@pytest.mark.parametrize("fixture", sorted(AGAINST_THE_WORKER))
def test_cheats_against_the_workers_timing_gain_nothing_over_their_honest_twin(submission, cli, fixture, twins):
    run = _check(submission, cli, fixture)
    perf = _perf(run)
    details = perf["extra_data"]["details"]
    twin = twins[AGAINST_THE_WORKER[fixture]]
    if perf["outcome"] in ("flagged", "infra_error") or (perf["outcome"] == "failed" and "not timed" in perf["output"]):
        assert perf["score"] == 0, perf["output"]  # caught another way (a race read unfinished, a process left behind)
        return
    assert details["timed_by"] == "replay", perf["output"]
    assert details["ratio_to_reference"] > 0.95 * twin, (perf["output"], twin)


HONEST = ["honest_two_streams", "honest_slow_wrapper", "honest_syncs", "honest_pipeline_scratch"]


@pytest.mark.parametrize("fixture", HONEST)
def test_honest_kernels_are_timed_whole_and_never_flagged(submission, cli, fixture):
    run = _check(submission, cli, fixture)
    perf = _perf(run)
    assert perf["outcome"] == "passed" and not perf["extra_data"]["severity"], perf["output"]
    assert not any(t["outcome"] == "flagged" for t in run.results["tests"])
    details = perf["extra_data"]["details"]
    figures = details["figures"]["student"]
    low = 1.5 if fixture == "honest_pipeline_scratch" else 0.8  # two passes over the data: about twice the bytes
    assert low * 0.8 < details["ratio_to_reference"] < low + 1.0, perf["output"]
    assert figures["median_ms"] >= details["floor_ms"] / 1.15
    if fixture == "honest_two_streams":  # launches on two streams: the fallback times it, and says why
        assert details["timed_by"] == "fallback" and "launches on 2 streams" in details["replay_refused"], details
        assert details["witness"]["confirmed"], details["witness"]
    else:
        assert details["timed_by"] == "replay", perf["output"]
        assert details["replay"]["student"]["reps"] >= 40 and len(details["replay"]["student"]["placements_ms"]) == 4
        assert details["replay"]["student"]["launches"] == (2 if fixture == "honest_pipeline_scratch" else 1), details["replay"]


def _forged(tmp_path, forgery: str):
    """gpu/forged's honest slow kernel with one forgery of kernels/_forgeries.py applied at import."""
    sub = build_submission(tmp_path / "forged", "gpu/forged")
    name = forgery.split("(")[0]
    (sub / "kernels" / "vector_add.py").write_text(f"from kernels._forgeries import {name}\n\n{forgery}\n\n"
                                                   "from kernels._slow_add import vector_add  # noqa: E402,F401\n")
    return sub


FORGERIES = ["collector(0.8)", "reply(0.8)", "stale_burst()", "answer_ahead()", "collector(0.93)"]


@pytest.mark.parametrize("forgery", FORGERIES)
def test_figures_forged_inside_the_worker_earn_no_speed_credit(tmp_path, cli, forgery, twins):
    """A student who has read the grader's source rewrites, from inside its worker, what the
    worker reports (the activity collector and torch's C event class, the reply, the grader's
    own burst), by any amount. The replay times its kernels with the worker gone: no figure of the
    worker's is read, so the forged kernel is scored as its honest twin."""
    run = cli(_forged(tmp_path, forgery), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577")
    perf = _perf(run)
    if perf["outcome"] == "flagged":
        assert perf["score"] == 0, perf["output"]
        return
    details = perf["extra_data"]["details"]
    assert details["timed_by"] == "replay", perf["output"]
    assert details["ratio_to_reference"] > 0.95 * twins["gpu/forged"], (perf["output"], twins)


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
