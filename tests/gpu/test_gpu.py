"""On a GPU: verdicts, performance figures, and timing cheats that must earn no speed credit.

Skipped, with the reason, where no CUDA GPU is visible (see conftest)."""

from __future__ import annotations

import json
import os

import pytest
from tests.conftest import build_submission

pytestmark = pytest.mark.gpu


def test_good_submission_passes_on_the_gpu_with_speed_figures(submission, cli):
    run = cli(submission("good"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "-a", "softmax")
    for assignment in ("vector_add", "softmax"):
        _log_confirmation(f"good/{assignment}", _perf(run, assignment)["extra_data"]["details"])
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
        # the same diagnosis as in the interpreter (tests/e2e/test_check_fixtures.py): the cause, not only the symptom
        assert t["outcome"] == "failed" and "reading x as if it were contiguous" in t["output"], t["output"]


def test_ten_percent_slower_is_measured_slower(submission, cli):
    run = cli(submission("gpu/slow10"), "--seed", "3", "--device", "cuda", "--case", "n=1", "--case", "1x1", "--dtype", "float32")
    for assignment in ("vector_add", "softmax"):
        perf = [t for t in run.tests_of(assignment) if t["tags"][1] == "performance"][0]
        assert perf["outcome"] == "passed", perf["output"]
        assert perf["extra_data"]["details"]["ratio_interval"][0] > 1.0, perf["output"]


# each cheat the replay (grader.judge.replay_stage) or its fallback catches: the severity it must get
# and words its evidence must contain
CHEATS = {
    "cheat_graph_replay": ("conclusive", "wrong results"),  # no Triton launch in its call: the fallback's checks
    "cheat_cache": ("conclusive", "wrong results"),
    # right for its first 40 calls: the recorded calls may fall among them, the grader's clock bursts come after
    "cheat_first_n": ("conclusive", "wrong"),
    "cheat_vendor_large": ("conclusive", "aten::add.Tensor ran inside vector_add()"),
    "cheat_sampled_at_scale": ("conclusive", "wrong results at the timing size"),
}


def _perf(run, assignment="vector_add") -> dict:
    assert run.results is not None, run.stdout[-2000:] + run.stderr[-2000:]
    found = [t for t in run.tests_of(assignment) if t["tags"][1] == "performance"]
    assert found, [(t["name"], t["outcome"], t["output"][:300]) for t in run.results["tests"]]
    return found[0]


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
    """The honest twins' ratios, graded once for the module; once for every worker of a pool where
    GRADER_SHARED_TWINS names a file for them (scripts/gpu_tests.py): the first worker grades them
    under its lock, the others read its figures."""
    import fcntl

    shared = os.environ.get("GRADER_SHARED_TWINS")
    if not shared:
        return _grade_twins(tmp_path_factory)
    with open(shared + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(shared):
            return json.loads(open(shared).read())
        ratios = _grade_twins(tmp_path_factory)
        with open(shared + ".tmp", "w") as f:
            json.dump(ratios, f)
        os.replace(shared + ".tmp", shared)
        return ratios


def _grade_twins(tmp_path_factory) -> dict[str, float]:
    from tests.conftest import build_submission, run_cli

    ratios = {}
    for name in ("good", "gpu/forged"):
        repo = build_submission(tmp_path_factory.mktemp("twin") / "repo", name)
        run = run_cli(["check", str(repo), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577",
                       "--json", str(repo.parent / "out" / "results.json")], repo.parent)
        perf = _perf(run)
        assert perf["extra_data"]["details"]["timed_by"] == "replay", perf["output"]
        assert "ratio_to_reference" in perf["extra_data"]["details"], perf["output"]  # scored, not held or flagged
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


def _held_on_a_busy_host(perf: dict, details: dict) -> bool:
    """A hold for a TA's review, no credit meanwhile, where the grader's clock measured nothing at
    all (grader.judge.timing.decision: "unclear"); a busy host no longer holds anything, it scores the
    slower reading (the GPU tests run side by side)."""
    c = details.get("confirmation") or {}
    return (perf["outcome"] == "flagged" and perf["extra_data"]["severity"] == "review" and perf["score"] == 0
            and c.get("verdict") == "unclear" and "held for a TA's review" in perf["output"])


def _log_confirmation(name: str, details: dict) -> None:
    """The grader's clock against the replay, per fixture, where GRADER_CONFIRMATION_LOG names a
    file (the honest spread docs/performance.md records)."""
    log = os.environ.get("GRADER_CONFIRMATION_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"fixture": name, "timed_by": details.get("timed_by"),
                                "confirmation": details.get("confirmation"), "replay": details.get("replay"),
                                "ratio": details.get("ratio_to_reference"), "witness": details.get("witness")}) + "\n")


HONEST = ["honest_two_streams", "honest_slow_wrapper", "honest_syncs", "honest_pipeline_scratch"]


@pytest.mark.parametrize("fixture", HONEST)
def test_honest_kernels_are_timed_whole_and_never_flagged(submission, cli, fixture):
    run = _check(submission, cli, fixture)
    perf = _perf(run)
    details = perf["extra_data"]["details"]
    _log_confirmation(fixture, details)
    # every one replayed and scored, the two-stream one too (its two launches one after another: it earns what
    # its one-stream twin earns), never flagged or held
    assert perf["outcome"] == "passed" and not perf["extra_data"]["severity"], perf["output"]
    assert not any(t["outcome"] == "flagged" for t in run.results["tests"])
    assert details["confirmation"]["verdict"] in (("agrees", "clock") if fixture == "honest_syncs" else ("agrees",))
    assert not details.get("held"), details
    if fixture == "honest_two_streams":
        assert "launches on 2 streams were replayed one after another" in perf["output"], perf["output"]
    figures = details["figures"]["student"]
    low = 1.5 if fixture == "honest_pipeline_scratch" else 0.8  # two passes over the data: about twice the bytes
    assert low * 0.8 < details["ratio_to_reference"] < low + 1.0, perf["output"]
    assert figures["median_ms"] >= details["floor_ms"] / 1.15
    assert details["timed_by"] == "replay", perf["output"]
    assert details["replay"]["student"]["reps"] >= 40 and len(details["replay"]["student"]["placements_ms"]) == 4
    assert details["replay"]["student"]["launches"] == (1 if fixture in ("honest_slow_wrapper", "honest_syncs") else 2), \
        details["replay"]


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
    assert perf["outcome"] in ("passed", "failed") and details.get("timed_by") == "replay", perf["output"]
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
        from grader.resident import stop_warm

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


# issue #51: a record that does not describe the function the student submitted. Each of these always
# runs a kernel about 3.3x the reference's (gpu/forged's _loop_add), and makes its record say otherwise:
# the grader's own clock on its calls disagrees with the replay (conclusive, both figures), or the
# record holds the binary that really ran (scored on it, no better than 3x: no points)
RECORD_CHEATS = ["cheat_record_rewritten", "cheat_binary_swapped", "cheat_slow_at_home", "cheat_fast_when_recorded"]


@pytest.mark.parametrize("fixture", RECORD_CHEATS)
def test_a_record_that_does_not_describe_the_function_earns_no_speed_credit(submission, cli, fixture):
    run = _check(submission, cli, fixture)
    perf = _perf(run)
    details = perf["extra_data"]["details"]
    _log_confirmation(fixture, details)
    assert perf["score"] == 0, perf["output"]
    if perf["outcome"] == "flagged" and not _held_on_a_busy_host(perf, details):
        assert perf["extra_data"]["severity"] == "conclusive", perf["output"]
        assert "than the kernels its record names" in perf["output"] and "by the grader's clock" in perf["output"]
    else:  # the record held what ran, or a busy host withheld the finding: scored at its true speed
        assert details["timed_by"] == "replay" and details["ratio_to_reference"] > 2.5, perf["output"]
        assert details["confirmation"]["verdict"] in ("agrees", "clock", "unsteady"), details["confirmation"]


# issue #51: opting out of the replay (a second stream, a device buffer kept at module level, the result's
# address as an integer, a grid that changes between calls) combined with forged figures, skipped work or
# torch doing the work unwatched: the fallback's figure is unverified, so it earns no points on its own
OPT_OUTS = {"cheat_optout_stream": "vector_add", "cheat_optout_counter": "vector_add",
            "cheat_optout_address": "vector_add", "cheat_optout_grid": "vector_add",
            "cheat_torch_unrecorded": "softmax"}


@pytest.mark.parametrize("fixture", sorted(OPT_OUTS))
def test_opting_out_of_the_replay_earns_no_speed_points_without_a_review(submission, cli, fixture):
    assignment = OPT_OUTS[fixture]
    case = "n=1048577" if assignment == "vector_add" else "sliced-97x300"
    run = cli(submission(f"gpu/{fixture}"), "--seed", "3", "--device", "cuda", "-a", assignment, "--case", case)
    perf = _perf(run, assignment)
    details = perf["extra_data"]["details"]
    _log_confirmation(fixture, details)
    assert perf["score"] == 0 and perf["outcome"] in ("flagged", "failed"), perf["output"]
    if perf["outcome"] == "flagged" and perf["extra_data"]["severity"] == "review":
        assert (details["timed_by"] == "fallback" and "held for a TA's review" in perf["output"]) \
            or _held_on_a_busy_host(perf, details), perf["output"]


# A function that can tell which of its calls are watched (recorded, captured in a CUDA graph, under a flag the
# worker toggled, or with the grader's frames on its stack) and is fast only there. Each is run once; its score may
# beat its true speed (the slow loop, about 3.3x the reference: no points) by no more than the honest spread, and a
# finding names both figures
TOLD_APART = ["cheat_fast_while_captured", "cheat_deterministic_flag", "cheat_cpu_hog"]


def _no_credit_beyond_the_spread(perf: dict, details: dict) -> None:
    from grader.judge.timing.decision import MARGINS

    assert perf["score"] == 0, perf["output"]
    if perf["outcome"] == "flagged":
        assert perf["extra_data"]["severity"] == "conclusive", perf["output"]
        assert "by the grader's clock" in perf["output"] and "ms for the kernels your function's record names" \
            in perf["output"], perf["output"]
    else:  # scored at the slow figure: the loop's true time, less at most the spread
        assert details["ratio_to_reference"] > 3.0 / (1 + MARGINS.spread), perf["output"]
        assert details["confirmation"]["verdict"] in ("clock", "unsteady"), details["confirmation"]


@pytest.mark.parametrize("fixture", TOLD_APART)
def test_a_function_fast_only_while_watched_is_scored_at_its_ordinary_speed(submission, cli, fixture):
    run = _check(submission, cli, fixture)
    perf = _perf(run)
    details = perf["extra_data"]["details"]
    _log_confirmation(fixture, details)
    _no_credit_beyond_the_spread(perf, details)
    if fixture == "cheat_cpu_hog" and perf["outcome"] == "flagged":  # its own load excused nothing
        assert "unsteady" not in (details.get("confirmation") or {}), details["confirmation"]


def test_a_function_that_finds_the_graders_frames_on_its_stack_is_scored_at_its_ordinary_speed(submission, cli):
    """Every call of it has the same frames above it (grader.worker.calling): the recorded call,
    every burst's and the untimed ones alike, so it runs its slow loop in all of them, the record
    included, and is scored at that speed (no finding is needed: nothing differs)."""
    from grader.judge.timing.decision import MARGINS

    run = _check(submission, cli, "cheat_grader_frames")
    perf = _perf(run)
    details = perf["extra_data"]["details"]
    _log_confirmation("cheat_grader_frames", details)
    assert perf["score"] == 0, perf["output"]
    if perf["outcome"] == "flagged":
        assert perf["extra_data"]["severity"] == "conclusive", perf["output"]
    else:
        assert details["ratio_to_reference"] > 3.0 / (1 + MARGINS.spread), perf["output"]


@pytest.fixture(scope="module")
def many_launches(tmp_path_factory):
    """The margin-rider's honest twin (sixty launches, half an extra pass), graded once for the module."""
    from tests.conftest import build_submission, run_cli

    repo = build_submission(tmp_path_factory.mktemp("twin") / "repo", "gpu/honest_many_launches")
    run = run_cli(["check", str(repo), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577",
                   "--json", str(repo.parent / "out" / "results.json")], repo.parent)
    return _perf(run)


def test_an_honest_function_of_sixty_launches_is_scored_and_never_flagged(many_launches):
    details = many_launches["extra_data"]["details"]
    _log_confirmation("honest_many_launches", details)
    assert many_launches["outcome"] in ("passed", "failed") and not many_launches["extra_data"]["severity"], \
        many_launches["output"]
    assert details["timed_by"] == "replay" and details["replay"]["student"]["launches"] == 60, details["replay"]
    assert details["confirmation"]["verdict"] in ("agrees", "clock"), details["confirmation"]


def test_the_margin_rider_gains_no_more_than_the_honest_spread_over_its_twin(submission, cli, many_launches):
    from grader.judge.timing.decision import MARGINS

    run = _check(submission, cli, "cheat_margin_rider")
    perf = _perf(run)
    details = perf["extra_data"]["details"]
    _log_confirmation("cheat_margin_rider", details)
    twin = many_launches["extra_data"]["details"]["ratio_to_reference"]
    if perf["outcome"] == "flagged":
        assert perf["score"] == 0 and perf["extra_data"]["severity"] == "conclusive", perf["output"]
        return
    # the rule: scored at no less than its own slowest figure of its calls, less the spread
    c = details["confirmation"]
    slowest = max(f["ms"] for f in c["figures"])
    assert c["scored_ms"] >= slowest / (1 + MARGINS.spread), c
    # against its twin, graded in another check: each check's figures are within the spread of its calls' own
    # time (on an H200 the rider's queued burst read 1.105 ms per call, its twin's 1.121), so the two checks' spreads
    assert details["ratio_to_reference"] >= twin / (1 + MARGINS.spread) ** 2, (perf["output"], twin)
    assert perf["score"] <= many_launches["score"] * (1 + MARGINS.spread) ** 2 + 1e-9, (perf["output"], twin)


def test_a_persisting_l2_window_buys_no_speed(submission, cli, twins):
    from grader.judge.timing.decision import MARGINS

    run = _check(submission, cli, "cheat_l2_window")
    perf = _perf(run)
    details = perf["extra_data"]["details"]
    _log_confirmation("cheat_l2_window", details)
    if perf["outcome"] == "flagged":  # its bursts ran faster than its replay: conclusive, no credit
        assert perf["score"] == 0 and perf["extra_data"]["severity"] == "conclusive", perf["output"]
        return
    assert details["timed_by"] == "replay" and details["ratio_to_reference"] >= twins["good"] / (1 + MARGINS.spread)


def test_a_float32_assignment_computed_in_bfloat16_fails_its_tolerance(submission, cli):
    run = _check(submission, cli, "cheat_low_precision")
    t = run.test("vector_add", "n=1048577 [float32]")
    assert t["outcome"] == "failed" and "elements wrong" in t["output"] and "max abs error" not in t["output"], t["output"]
    assert run.returncode == 1
