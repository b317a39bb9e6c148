"""grader grade on a GPU: jobs overlap, each timing phase holds its GPU alone, and identical
correct submissions get the same speed verdict. Skipped where no CUDA GPU is visible."""

from __future__ import annotations

import json

import pytest

from classbuild import make_class
from conftest import run_cli

pytestmark = pytest.mark.gpu


def test_overlapping_jobs_on_the_gpu_keep_timing_clean(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_LOCK_DIR", str(tmp_path / "locks"))
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
    assert (tmp_path / "locks" / "gpu-0.lock").exists()  # the timing phases went through the GPU's lock
