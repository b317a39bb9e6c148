"""grader grade on a GPU: jobs overlap, each timing phase holds its GPU alone, and identical
correct submissions get the same speed verdict. Skipped where no CUDA GPU is visible."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.classbuild import make_class
from tests.conftest import run_cli

pytestmark = pytest.mark.gpu


def _lock_dir(tmp_path, monkeypatch) -> Path:
    """The GPU locks' folder: the suite's own where scripts/gpu_tests.py runs this beside other
    files' checks (the jobs' timing then holds the GPU alone against theirs too), else the test's."""
    if not os.environ.get("GRADER_LOCK_DIR"):
        monkeypatch.setenv("GRADER_LOCK_DIR", str(tmp_path / "locks"))
    return Path(os.environ["GRADER_LOCK_DIR"])


def test_overlapping_jobs_on_the_gpu_keep_timing_clean(tmp_path, monkeypatch):
    locks = _lock_dir(tmp_path, monkeypatch)
    roster = make_class(tmp_path, {"a": "good", "b": "good", "c": "slow", "d": "missing_mask"})
    run = run_cli(["grade", "--roster", str(roster), "--out", "out", "--device", "cuda", "--gpus", "0", "--jobs", "3",
                   "-a", "vector_add", "-a", "softmax", "--case", "n=1", "--case", "1x1", "--dtype", "float32", "--seed", "4"],
                  tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr

    def perf(student: str, assignment: str) -> dict:
        record = json.loads((tmp_path / "out" / "students" / student / "jobs" / f"{assignment}.json").read_text())
        return next(t for t in record["result"]["tests"] if t["kind"] == "performance")

    for assignment in ("vector_add", "softmax"):
        a, b, c = perf("a", assignment), perf("b", assignment), perf("c", assignment)
        assert a["outcome"] == b["outcome"] == "passed", (a["message"], b["message"])
        ra, rb, rc = (t["details"]["ratio_to_reference"] for t in (a, b, c))
        assert abs(ra / rb - 1) < 0.05, (ra, rb)  # the same code, timed while other jobs ran: the same ratio
        assert rc > max(ra, rb), (rc, ra)  # the slow one is measured slower
    assert "not timed" in perf("d", "vector_add")["message"]
    assert (locks / "gpu-0.lock").exists()  # the timing phases went through the GPU's lock


def test_a_replayed_figure_is_re_timed_by_grader_verify_and_a_changed_one_does_not_hold(tmp_path, monkeypatch):
    _lock_dir(tmp_path, monkeypatch)
    roster = make_class(tmp_path, {"a": "good"})
    run = run_cli(["grade", "--roster", str(roster), "--out", "out", "--device", "cuda", "--gpus", "0",
                   "-a", "vector_add", "--case", "n=1", "--dtype", "float32", "--seed", "4"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    path = tmp_path / "out" / "students" / "a" / "jobs" / "vector_add.json"
    record = json.loads(path.read_text())
    perf = next(t for t in record["result"]["tests"] if t["kind"] == "performance")
    assert perf["details"]["timed_by"] == "replay", perf["message"]
    for digest in perf["details"]["replay"]["kept"].values():
        assert (tmp_path / "out" / "replay" / digest / "launches.json").is_file()
    verified = run_cli(["verify", "out", "a", "vector_add"], tmp_path)
    assert verified.returncode == 0 and "the figure holds" in verified.stdout, verified.stdout + verified.stderr
    perf["details"]["ratio_to_reference"] *= 1.5  # a figure edited after the grade
    path.write_text(json.dumps(record))
    changed = run_cli(["verify", "out", "a", "vector_add"], tmp_path)
    assert changed.returncode == 1 and "does not hold" in changed.stdout, changed.stdout + changed.stderr
