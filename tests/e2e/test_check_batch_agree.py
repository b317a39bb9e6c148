"""`grader check` and `grader grade` write the same results.json and report for the same
submission: a batch reads its records back through the one matched pair (results.to_json and
from_json), so it keeps all that a check shows, the static scan's warnings included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.classbuild import commit, make_repo, overlay
from tests.conftest import run_cli

SEED = "5"
ASSIGNMENTS = ["-a", "dropout", "-a", "softmax", "-a", "vector_add"]  # the catalogue's order, as a batch lists them

# What differs between the two by nature, and nothing else (each path in results.json, `*` any test):
EXCLUDED = {
    "execution_time",  # a duration: the check times its whole run; a batch's student file has no one run to time
    "extra_data.environment",  # the machine as each process described it (versions, isolation, its warnings)
    "extra_data.submission",  # a path: the check's folder as given, a batch's the roster's repo
    "tests.*.extra_data.details.seconds",  # a timing figure: the call's wall time in the worker
}
# each run's reproducers start with its own command: a check's names its argument and --device,
# a batch's is `grader check .` (run in the student's repository); the rest must match
CHECK_COMMAND, BATCH_COMMAND = "grader check . --device cpu", "grader check ."


def excluded(path: str) -> bool:
    parts = path.split(".")
    if parts[0] == "tests" and len(parts) > 1:
        parts[1] = "*"
    return ".".join(parts) in EXCLUDED


def differences(check, batch, path: str = "") -> list[str]:
    """Every field where the two differ, as a dotted path (lists by index), the EXCLUDED aside."""
    if path and excluded(path):
        return []
    if isinstance(check, dict) and isinstance(batch, dict):
        found = []
        for key in sorted(set(check) | set(batch), key=str):
            inner = f"{path}.{key}" if path else str(key)
            if key not in check or key not in batch:
                found += [] if excluded(inner) else [f"{inner}: only in {'check' if key in check else 'batch'}"]
            else:
                found += differences(check[key], batch[key], inner)
        return found
    if isinstance(check, list) and isinstance(batch, list):
        if len(check) != len(batch):
            return [f"{path}: {len(check)} items in the check, {len(batch)} in the batch"]
        return [d for i, (c, b) in enumerate(zip(check, batch)) for d in differences(c, b, f"{path}.{i}")]
    if isinstance(check, str) and path.startswith("tests.") and path.endswith(("reproducer", "output")):
        check = check.replace(CHECK_COMMAND, BATCH_COMMAND)
    return [] if check == batch and type(check) is type(batch) else [f"{path}: {check!r} (check) != {batch!r} (batch)"]


@pytest.mark.slow
def test_check_and_a_batch_of_one_write_the_same_results_and_warnings(tmp_path):
    # vector_add ends its own process (a static-scan warning, os._exit, and a crash), softmax hands
    # the work to torch (an integrity flag), dropout forgets to scale (wrong results: failed)
    repo = make_repo(tmp_path / "repos" / "alice", "os_exit")
    overlay(repo, "torch_softmax")
    overlay(repo, "dropout_no_scale")
    commit(repo, "submission", "2025-01-11T12:00:00+00:00")
    (tmp_path / "roster.csv").write_text("student,repo\nalice,repos/alice\n")

    check = run_cli(["check", ".", "--device", "cpu", "--seed", SEED, *ASSIGNMENTS,
                     "--json", str(tmp_path / "check" / "results.json"), "--html", str(tmp_path / "check")], repo)
    assert check.returncode == 1, check.stdout + check.stderr
    batch = run_cli(["grade", "--roster", "roster.csv", "--out", "out", "--device", "cpu", "--jobs", "1", "--seed", SEED,
                     *ASSIGNMENTS], tmp_path)
    assert batch.returncode == 0, batch.stdout + batch.stderr

    checked = json.loads((tmp_path / "check" / "results.json").read_text())
    graded = json.loads((tmp_path / "out" / "students" / "alice" / "results.json").read_text())
    # the submission is what it was built to be, in both: nothing below compares empty results
    for data in (checked, graded):
        outcomes = {t["outcome"] for t in data["tests"]}
        assert {"crashed", "flagged", "failed", "passed"} <= outcomes, outcomes
        warnings = data["extra_data"]["assignments"]["vector_add"]["integrity_warnings"]
        assert [(w["file"], w["code"]) for w in warnings] == [("kernels/vector_add.py", "os._exit(3)")], warnings
        assert data["extra_data"]["commit"] == commit_of(repo)
    assert "execution_time" in checked and "execution_time" not in graded  # excluded above, and why
    assert any(BATCH_COMMAND + " -a " in t["extra_data"]["reproducer"] for t in graded["tests"])
    assert differences(checked, graded) == []

    for page in ((tmp_path / "check" / "report.html").read_text(),
                 (tmp_path / "out" / "students" / "alice" / "report.html").read_text()):
        assert "static scan: 1 finding(s) for a TA to review" in page
        assert "<code>os._exit(3)</code>: ends the worker process" in page


def commit_of(repo: Path) -> str:
    from tests.classbuild import git

    return git(repo, "rev-parse", "HEAD")


def test_differences_names_every_field_that_differs_and_only_the_excluded_ones_pass():
    a = {"score": 1, "execution_time": 3, "extra_data": {"environment": {"x": 1}, "seed": 5},
         "tests": [{"extra_data": {"details": {"seconds": 0.1, "max_error": 0.5}, "reproducer": CHECK_COMMAND + " -a x"}}]}
    b = {"score": 1, "extra_data": {"environment": {"x": 2}, "seed": 5},
         "tests": [{"extra_data": {"details": {"seconds": 0.2, "max_error": 0.5}, "reproducer": BATCH_COMMAND + " -a x"}}]}
    assert differences(a, b) == []
    b["tests"][0]["extra_data"]["details"]["max_error"] = 0.25
    b["extra_data"]["seed"] = 6
    b["warnings"] = []
    assert differences(a, b) == ["extra_data.seed: 5 (check) != 6 (batch)",
                                 "tests.0.extra_data.details.max_error: 0.5 (check) != 0.25 (batch)",
                                 "warnings: only in batch"]
    assert differences({"n": 1}, {"n": 1.0}) == ["n: 1 (check) != 1.0 (batch)"]  # a type that changed is a difference
