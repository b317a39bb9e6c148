"""Classroom 50's published rules for the files the grader writes or reads, as this test suite
reads them (our own code, not the grader's): `classroom50/assignments/v1` (the classroom's
assignments.json), `classroom50/result/v1` (an autograder's result.json) and
`classroom50/scores/v1` (the scores.json its score collection writes).

Each `*_problems` function returns why Classroom 50 would refuse the document (empty: it
accepts it), structural rules and the cross-field ones its runner and collector enforce in
code (score at most max-score, unique test names and release asset names).

`run_autograder` runs an autograder as the runner's grade step does (`run_entrypoint`, then
`finalize_result`): `python3 autograder.py` in the student's checkout with the runner's
environment; a non-zero exit, a missing or refused result.json become the runner's own error
(status `error`, no release, "autograder exited N"), else the result is published with the
status the autograder wrote (or the one the runner derives).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ASSIGNMENTS = "classroom50/assignments/v1"
RESULT = "classroom50/result/v1"
SCORES = "classroom50/scores/v1"

SHORT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{1,38}")
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)")
UTC_SECONDS = re.compile(r"\d{4}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\dZ")
OFFSET = re.compile(r"[+-]([01]\d|2[0-3]):[0-5]\d")
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ASSET_BASENAME = re.compile(r"[A-Za-z0-9_-](?:[A-Za-z0-9._-]{0,253}[A-Za-z0-9_-])?")
RUNTIME_KEYS = {"runs-on", "container", "python", "node", "java", "go", "rust", "apt"}
DUE_META_KEYS = {"input", "zone", "offset", "source"}


def _points(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value, empty: bool = False) -> bool:
    return isinstance(value, str) and (empty or bool(value))


def _runtime(runtime, where: str) -> list[str]:
    if not isinstance(runtime, dict):
        return [f"{where}: runtime is not an object"]
    problems = [f"{where}: runtime has the unknown key {k!r} (runtime is closed)" for k in sorted(set(runtime) - RUNTIME_KEYS)]
    if "runs-on" in runtime:
        labels = runtime["runs-on"]
        if isinstance(labels, str):
            labels = [labels]
        elif not isinstance(labels, list) or not 1 <= len(labels) <= 10:
            return problems + [f"{where}: runs-on is not a label or a list of 1 to 10 labels"]
        problems += [f"{where}: runs-on label {x!r}" for x in labels if not isinstance(x, str) or not LABEL.fullmatch(x)]
    return problems


def _asset(path) -> bool:
    if not isinstance(path, str) or not path or path.startswith("/") or re.match(r"[A-Za-z]:", path):
        return False
    parts = path.split("/")
    if any(p in ("", ".", "..") or "\\" in p or any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in p) for p in parts):
        return False
    if parts[0].lower() == ".git" or ".." in parts[-1]:
        return False
    return parts[-1].lower() not in ("result.json", "release-body.md") and bool(ASSET_BASENAME.fullmatch(parts[-1]))


def assignment_problems(entry, where: str) -> list[str]:
    if not isinstance(entry, dict):
        return [f"{where}: not an object"]
    problems = [f"{where}: {k} is missing" for k in ("slug", "name", "mode", "autograder") if k not in entry]
    if "slug" in entry and not (isinstance(entry["slug"], str) and SHORT_NAME.fullmatch(entry["slug"])):
        problems.append(f"{where}: slug {entry['slug']!r} is not a short name")
    if "name" in entry and not _text(entry["name"]):
        problems.append(f"{where}: name is not a non-empty string")
    if "mode" in entry and entry["mode"] not in ("individual", "group"):
        problems.append(f"{where}: mode {entry['mode']!r}")
    if "autograder" in entry and not (isinstance(entry["autograder"], str) and SHORT_NAME.fullmatch(entry["autograder"])):
        problems.append(f"{where}: autograder {entry['autograder']!r} is not a short name")
    if entry.get("mode") == "group" and "max_group_size" not in entry:
        problems.append(f"{where}: a group assignment needs max_group_size")
    if entry.get("mode") != "group" and "max_group_size" in entry:
        problems.append(f"{where}: max_group_size is for group assignments only")
    if "due" in entry and not (isinstance(entry["due"], str) and RFC3339.fullmatch(entry["due"])):
        problems.append(f"{where}: due {entry['due']!r} is not an RFC 3339 date and time")
    if "due_meta" in entry:
        meta = entry["due_meta"]
        if not isinstance(meta, dict) or set(meta) - DUE_META_KEYS or not {"input", "offset", "source"} <= set(meta):
            problems.append(f"{where}: due_meta is not {{input, offset, source[, zone]}}")
        elif not (_text(meta["input"], True) and isinstance(meta["offset"], str) and OFFSET.fullmatch(meta["offset"])
                  and meta["source"] in ("explicit-offset", "auto-detected", "migrated")):
            problems.append(f"{where}: due_meta's values")
    if "runtime" in entry:
        problems += _runtime(entry["runtime"], where)
    if "release_assets" in entry:
        assets = entry["release_assets"]
        if not isinstance(assets, list) or len(assets) > 50:
            problems.append(f"{where}: release_assets is not a list of at most 50")
        else:
            problems += [f"{where}: release asset {a!r}" for a in assets if not _asset(a)]
            names = [a.rsplit("/", 1)[-1] for a in assets if isinstance(a, str)]
            if len(set(names)) != len(names):
                problems.append(f"{where}: release asset names are not unique")
    if "allowed_files" in entry:
        allowed = entry["allowed_files"]
        if not isinstance(allowed, list) or not all(isinstance(a, str) and a.strip() and "\n" not in a for a in allowed):
            problems.append(f"{where}: allowed_files is not a list of patterns")
    for key in ("feedback_pr", "empty_repo"):
        if key in entry and not isinstance(entry[key], bool):
            problems.append(f"{where}: {key} is not a boolean")
    return problems


def assignments_problems(data) -> list[str]:
    """Why a classroom's assignments.json is not `classroom50/assignments/v1`."""
    if not isinstance(data, dict):
        return ["not an object (a bare list is not v1)"]
    problems = [f"unknown top-level key {k!r}" for k in sorted(set(data) - {"schema", "assignments"})]
    if data.get("schema") != ASSIGNMENTS:
        problems.append(f"schema is {data.get('schema')!r}")
    entries = data.get("assignments")
    if not isinstance(entries, list):
        return problems + ["assignments is not a list"]
    for i, entry in enumerate(entries):
        problems += assignment_problems(entry, f"assignments[{i}]")
    return problems


def _tests(tests, where: str) -> list[str]:
    if not isinstance(tests, list):
        return [f"{where}: tests is not a list"]
    problems = []
    for i, t in enumerate(tests):
        at = f"{where}: tests[{i}]"
        if not isinstance(t, dict):
            problems.append(f"{at} is not an object")
            continue
        if not _text(t.get("test-name")):
            problems.append(f"{at}: test-name")
        if not isinstance(t.get("passed"), bool):
            problems.append(f"{at}: passed is not a boolean")
        if not _points(t.get("score")) or not _points(t.get("max-score")):
            problems.append(f"{at}: score/max-score not non-negative integers")
        elif t["score"] > t["max-score"]:
            problems.append(f"{at}: score above max-score")
    return problems


def _submission(data, where: str, required: tuple[str, ...]) -> list[str]:
    problems = [f"{where}: {k} is missing" for k in required if k not in data]
    if data.get("schema") != RESULT:
        problems.append(f"{where}: schema is {data.get('schema')!r}")
    for key in ("classroom", "owner", "commit", "release", "review", "assignment"):
        if key in data and not _text(data[key]):
            problems.append(f"{where}: {key} is not a non-empty string")
    if "assignment_type" in data and data["assignment_type"] not in ("individual", "group"):
        problems.append(f"{where}: assignment_type {data['assignment_type']!r}")
    if "submission" in data and not (isinstance(data["submission"], str) and data["submission"].startswith("submit/")):
        problems.append(f"{where}: submission does not start with submit/")
    for key in ("datetime", "graded_at"):
        if key in data and not (isinstance(data[key], str) and UTC_SECONDS.fullmatch(data[key])):
            problems.append(f"{where}: {key} is not YYYY-MM-DDTHH:MM:SSZ")
    if not _points(data.get("score")) or not _points(data.get("max-score")):
        problems.append(f"{where}: score/max-score not non-negative integers")
    elif data["score"] > data["max-score"]:
        problems.append(f"{where}: score above max-score")
    if "submitted_by" in data:
        by = data["submitted_by"]
        if (not isinstance(by, dict) or set(by) - {"username", "id"} or not _text(by.get("username"))
                or not (by.get("id") is None or isinstance(by["id"], int) and not isinstance(by["id"], bool))):
            problems.append(f"{where}: submitted_by")
    return problems + _tests(data.get("tests"), where)


RESULT_KEYS = ("schema", "classroom", "assignment", "assignment_type", "owner", "submission", "commit", "release",
               "review", "datetime", "score", "max-score", "tests")


def result_problems(data, classroom: str | None = None, assignment: str | None = None) -> list[str]:
    """Why a result.json is not `classroom50/result/v1` (and, given them, not this classroom's
    and assignment's, which the runner checks against the repository)."""
    if not isinstance(data, dict):
        return ["not an object"]
    problems = [f"unknown top-level key {k!r}" for k in sorted(set(data) - set(RESULT_KEYS) - {"graded_at", "submitted_by"})]
    problems += _submission(data, "result", RESULT_KEYS)
    if classroom is not None and data.get("classroom") != classroom:
        problems.append("classroom differs from the runner's")
    if assignment is not None and data.get("assignment") != assignment:
        problems.append("assignment differs from the runner's")
    return problems


def scores_problems(data) -> list[str]:
    """Why a scores.json is not `classroom50/scores/v1`."""
    if not isinstance(data, dict):
        return ["not an object"]
    problems = [f"unknown top-level key {k!r}" for k in sorted(set(data) - {"schema", "assignments"})]
    if data.get("schema") != SCORES:
        problems.append(f"schema is {data.get('schema')!r}")
    buckets = data.get("assignments")
    if not isinstance(buckets, dict):
        return problems + ["assignments is not an object"]
    for slug, bucket in buckets.items():
        if not SHORT_NAME.fullmatch(slug):
            problems.append(f"slug {slug!r} is not a short name")
        if not isinstance(bucket, dict) or set(bucket) != {"type", "entries"}:
            problems.append(f"{slug}: not {{type, entries}}")
            continue
        if bucket["type"] not in ("individual", "group"):
            problems.append(f"{slug}: type {bucket['type']!r}")
        if not isinstance(bucket["entries"], list):
            problems.append(f"{slug}: entries is not a list")
            continue
        for i, entry in enumerate(bucket["entries"]):
            where = f"{slug}.entries[{i}]"
            if not isinstance(entry, dict):
                problems.append(f"{where}: not an object")
                continue
            if not _text(entry.get("owner")):
                problems.append(f"{where}: owner")
            if "override" in entry and not isinstance(entry["override"], bool):
                problems.append(f"{where}: override is not a boolean")
            subs = entry.get("submissions")
            if not isinstance(subs, list) or not subs:
                problems.append(f"{where}: submissions is not a non-empty list")
                continue
            for j, sub in enumerate(subs):
                if not isinstance(sub, dict):
                    problems.append(f"{where}.submissions[{j}]: not an object")
                    continue
                if "late" in sub and not isinstance(sub["late"], bool):
                    problems.append(f"{where}.submissions[{j}]: late is not a boolean")
                problems += _submission(sub, f"{where}.submissions[{j}]", tuple(k for k in RESULT_KEYS if k != "assignment"))
    return problems


# -- the runner's grade step -----------------------------------------------------------------------

@dataclass
class Graded:
    """What a submission's run leaves: the commit status, its line, the result.json released
    (None: the runner's error, no release) and its body, and the autograder's log."""

    status: str
    summary: str
    result: dict | None
    body: str
    log: str


def _outputs(path: str | None) -> dict[str, str]:
    if not path or not Path(path).is_file():
        return {}
    return dict(line.split("=", 1) for line in Path(path).read_text().splitlines() if "=" in line)


def run_autograder(autograder: Path, workspace: Path, env: dict, timeout: float = 900) -> Graded:
    """`autograder` graded as Classroom 50's runner runs it, in `workspace` with `env`."""
    for stale in ("result.json", "release-body.md"):  # the runner clears them before each run
        (workspace / stale).unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, str(autograder)], cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=timeout)
    log = proc.stdout + proc.stderr

    def error(message: str) -> Graded:
        return Graded("error", f"classroom50 autograde: {message}", None, "", log)

    if proc.returncode != 0:
        return error(f"autograder exited {proc.returncode}")
    path = workspace / "result.json"
    if not path.is_file():
        return error("autograder did not produce result.json")
    try:
        result = json.loads(path.read_text())
    except ValueError as exc:
        return error(f"result.json is not valid JSON: {exc}")
    problems = result_problems(result, env.get("CLASSROOM"), env.get("ASSIGNMENT"))
    if problems:
        return error("; ".join(problems))
    body = (workspace / "release-body.md").read_text() if (workspace / "release-body.md").is_file() else ""
    said = _outputs(env.get("GITHUB_OUTPUT"))
    if "status" in said:
        return Graded(said["status"], said.get("summary", ""), result, body, log)
    passed = all(t.get("passed") for t in result["tests"])
    return Graded("success" if passed else "failure", f"classroom50 autograde: {result['score']}/{result['max-score']}",
                  result, body, log)
