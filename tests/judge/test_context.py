"""The grading context: one resolve() for check and grade, frozen, carried whole by a batch job."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.conftest import COURSE, REPO_ROOT, has_gpu
from grader import spec as specs
from grader.batch.jobs import Job
from grader.device import Device
from grader.environment import describe
from grader.judge.durations import key_of
from grader.judge.context import ContextError, GradingContext, resolve


def test_resolve_checks_every_option_in_one_line():
    with pytest.raises(ContextError, match="--device must be auto, cuda or cpu, not 'gpu'"):
        resolve("gpu")
    with pytest.raises(ContextError, match="unknown dtype 'float64'"):
        resolve("cpu", dtypes=["float64"])
    with pytest.raises(ContextError, match="--isolation must be one of sandbox, docker, none, not 'chroot'"):
        resolve("cpu", isolation="chroot")
    with pytest.raises(ContextError, match="--timeout must be a positive"):
        resolve("cpu", timeout=0)
    with pytest.raises(ContextError, match="--reference-dir /nonexistent/refs: no such folder"):
        resolve("cpu", reference_dir=Path("/nonexistent/refs"))


@pytest.mark.skipif(has_gpu(), reason="the CPU machine's answer")
def test_cuda_without_a_gpu_is_refused_unless_the_gpus_are_a_clusters():
    with pytest.raises(ContextError, match="no CUDA GPU is visible here"):
        resolve("cuda")
    assert resolve("auto").device == "cpu"
    assert resolve("cuda", remote_gpu=True).device == "cuda"  # grader grade --executor ray: the nodes have them


def test_the_context_is_frozen_and_a_seed_is_drawn_once():
    ctx = resolve("cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.seed = 1  # type: ignore[misc]
    assert 0 <= ctx.seed < 2**31 and resolve("cpu", seed=7).seed == 7


def test_the_references_and_the_given_folders_are_hidden_from_workers(tmp_path):
    refs = tmp_path / "refs"
    refs.mkdir()
    out = tmp_path / "out"
    ctx = resolve("cpu", hide=[out], reference_dir=refs)
    assert ctx.hide == (str(out.resolve()), str(refs.resolve()))
    assert ctx.reference_module(COURSE.get("softmax")) == refs.resolve() / "softmax.py"
    default = resolve("cpu")  # the course's own reference/ when no folder is given
    assert default.reference_module(COURSE.get("softmax")) == COURSE.root / "reference" / "softmax.py"
    assert str((REPO_ROOT / "reference").resolve()) in default.hide


def test_timeouts_and_plans_come_from_the_context_then_the_spec():
    spec = COURSE.get("vector_add")
    plain = GradingContext("cpu", 5)
    assert plain.call_timeout_for(spec) == spec.call_timeout_s and plain.import_timeout_for(spec) == spec.import_timeout_s
    short = GradingContext("cpu", 5, call_timeout=3.0, import_timeout=4.0)
    assert (short.call_timeout_for(spec), short.import_timeout_for(spec)) == (3.0, 4.0)
    one = GradingContext("cpu", 5, cases=("n=1",), dtypes=("float32",))
    assert [c.test_name for c in one.calls(spec)] == ["n=1 [float32]"]
    assert not one.partial and dataclasses.replace(one, partial_points=True).partial
    full = [c.test_name for c in one.full_plan(spec)]
    assert "n=1 [float32]" in full and len(full) > len(spec.dtypes)  # every case and dtype, random ones included


def test_a_job_carries_the_context_whole_and_adds_only_its_slot(tmp_path):
    ctx = GradingContext("cpu", 11, ("n=1",), ("float32",), 9.0, isolation="none", hide=("/x",), reference_dir="/refs")
    job = Job("alice", "alice", "vector_add", "/repo", None, "c1", {}, str(tmp_path), ctx.to_json(), gpu="3", cache="/cache")
    wire = json.loads(json.dumps(dataclasses.asdict(job)))  # as the pool sends it to a job process
    again = Job(**wire).grading_context()
    assert again == dataclasses.replace(ctx, gpu="3", cache="/cache")
    assert (Job(**wire).device, Job(**wire).seed) == ("cpu", 11)


def test_the_device_is_parsed_once_into_its_type_and_written_as_the_same_string(tmp_path):
    ctx = resolve("cpu")
    assert ctx.device is Device.CPU and ctx.interpret
    assert GradingContext("cuda", 1).device is Device.CUDA  # a stored context's string, or a test's, is read as the type
    with pytest.raises(ValueError):
        GradingContext("gpu", 1)
    stored = json.loads(json.dumps(ctx.to_json()))
    assert stored["device"] == "cpu" and GradingContext.from_json(stored).device is Device.CPU
    assert json.dumps(ctx.key()).startswith('{"device": "cpu"')
    assert f"{Device.CUDA} {Device.CPU:>4}" == "cuda  cpu" and str(Device.CUDA) == "cuda"
    assert type(describe(Device.CPU)["device"]) is str and describe(Device.CPU)["mode"] == "cpu-interpreter"
    assert key_of(ctx)("vector_add").startswith("cpu:vector_add:")  # the kept durations' keys are unchanged


def test_the_reuse_key_names_every_option_that_changes_a_grade():
    ctx = GradingContext("cpu", 11, ("n=1",), None, 9.0, isolation="docker")
    assert ctx.key() == {"device": "cpu", "cases": ["n=1"], "dtypes": None, "timeout": 9.0, "seed": 11, "isolation": "docker"}
    # where a job runs and what a report prints do not change the grade: not in the key
    assert dataclasses.replace(ctx, gpu="1", cache="/c", reproducer="x", hide=("/h",)).key() == ctx.key()


def test_a_check_keeps_its_inputs_and_kernels_in_a_folder_no_worker_sees(tmp_path):
    ctx = resolve("cpu", seed=9, hide=[tmp_path / "out"])
    kept = ctx.kept_between_checks(tmp_path / "cache", 1 << 30, seed_given=False, own_uid=True, kernels_of="abc")
    assert kept.cache == str(tmp_path / "cache" / "run") and kept.cache_limit == 1 << 30
    assert kept.kept_kernels == str(tmp_path / "cache" / "kernels" / "abc")  # this repository's alone
    assert ctx.kept_between_checks(tmp_path / "cache", 1, seed_given=False, own_uid=True).kept_kernels is None  # a CI runner's
    assert kept.scratch_root == str(tmp_path / "cache" / "jobs")  # job folders beside it: input sets are linked
    assert str((tmp_path / "cache").resolve()) in kept.hide and str((tmp_path / "out").resolve()) in kept.hide
    # without --seed the performance inputs are the same every check (so they are kept); the cases are new
    from grader.judge.context import CHECK_PERF_SEED

    assert kept.performance_seed == CHECK_PERF_SEED and kept.seed == 9
    assert ctx.kept_between_checks(tmp_path / "c", 1, seed_given=True, own_uid=True).performance_seed == 9
    assert ctx.performance_seed == 9 and ctx.cache is None and ctx.kept_kernels is None  # a batch's: the run's seed
    # workers of another uid cannot reach a job folder inside the grader's 0700 cache: theirs stay in the temp folder
    assert ctx.kept_between_checks(tmp_path / "c", 1, seed_given=False, own_uid=False).scratch_root is None


def test_each_repository_keeps_its_own_kernels(tmp_path):
    """A machine that checks several students' repositories (a TA's, a shared CI runner) never
    seeds one student's worker with another's compiled kernels: they are kept per repository."""
    import git

    from grader.submission import open_submission

    repos = {}
    for name in ("alice", "bob"):
        repo = git.Repo.init(tmp_path / name)
        repo.create_remote("origin", f"https://example.org/class/{name}.git")
        repos[name] = open_submission(tmp_path / name)
    ids = {name: sub.identity() for name, sub in repos.items()}
    assert ids["alice"] != ids["bob"]
    assert ids["alice"] == open_submission(tmp_path / "alice").identity()  # the same one, check after check
    git.Repo(tmp_path / "alice").remotes.origin.set_url("https://example.org/class/bob.git")
    assert open_submission(tmp_path / "alice").identity() not in ids.values()  # the folder and the origin, both
    (tmp_path / "plain").mkdir()
    assert len(open_submission(tmp_path / "plain").identity()) == 16  # not a git repository: its folder alone
