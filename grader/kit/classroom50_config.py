"""`grader release --classroom50 CLASSROOM`: the teacher's side of Classroom 50, written beside the kit.

In the teacher's `classroom50` config repository, CLASSROOM (the classroom's folder) gets:
- `autograders/<slug>/autograder.py` per assignment: it grades the student's checkout (its
  working directory) with `grader check --ci classroom50 -a NAME`, installing the grader first
  where the runner has none;
- an entry per assignment in `assignments.json` (runner labels from `--runs-on`, the report as a
  release asset); the file's other entries, and other keys of ours, are kept.

The autograders folder is published on GitHub Pages, so what is written is scanned like the kit
(`grader.kit.release.find_leaks`: reference files and lines, hidden case names, the secret) and
nothing is written where that scan finds anything. An autograder holds the public specs as
released and the sha256 of the kit's grader wheel: it grades with those, never with the copies
in the student's repository (which the student may have edited), and never imports a `grader`
from the checkout.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

from grader import __version__
from grader import spec as specs
from grader.kit.classroom50 import REPORT_ASSET, slug_of
from grader.kit.release import Kit, ReleaseError, find_leaks

LABEL = re.compile(r"[A-Za-z0-9_.-]{1,100}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
MAX_LABELS = 10
DEFAULT_RUNS_ON = ["ubuntu-latest"]
TIME_LIMIT_S = 13 * 60  # Classroom 50 gives the whole grade job 15 minutes: the install and the check share them

AUTOGRADER = '''#!/usr/bin/env python3
"""Classroom 50's autograder for {slug}: grades the student's checkout (the working directory)
with `grader check --ci classroom50`, which writes result.json, release-body.md, the commit
status and .grader/report.html there. Exit 0 when graded, 2 when the grader could not grade.

Made by `grader release --classroom50` (grader {version}); make it again rather than edit it.
This file is published: it holds the public specs alone (no reference kernel, hidden case or
course secret). It grades with the specs and the grader as released (the wheel's sha256 is
checked), never with the copies in the student's repository, and never imports from it.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ASSIGNMENTS = {assignments!r}
GRADER_VERSION = {version!r}
REQUIREMENT = {requirement!r}  # the kit's requirements-grader.txt
WHEEL_SHA256 = {wheel_sha256!r}  # of the wheel REQUIREMENT names in the kit, if it names one
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TIME_LIMIT_S = {time_limit}
COURSE = {course!r}  # the public course as released: grader-kit.toml and the specs
START = time.monotonic()


def fail(message):
    """Our own error: no result.json, a commit status that says why, exit 2."""
    line = " ".join(str(message).split())[:120]
    print(f"autograder: {{line}}", file=sys.stderr)
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as f:
            f.write(f"status=error\\nsummary=autograder: {{line}}\\n")
    sys.exit(2)


def environment(scratch):
    env = {{k: v for k, v in os.environ.items() if k not in ("GRADER_COURSE_SECRET", "PYTHONSTARTUP", "PYTHONINSPECT")}}
    env.update(GRADER_COURSE=str(scratch / "course"), GRADER_WARM_SECONDS="0", PYTHONSAFEPATH="1", PYTHONNOUSERSITE="1")
    return env


def has_grader(python, scratch):
    """This Python imports torch and the released grader, from outside the checkout."""
    code = "import grader, torch; print(grader.__version__)"
    try:
        proc = subprocess.run([python, "-c", code], cwd=scratch, env=environment(scratch), capture_output=True,
                              text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.strip().splitlines()[-1:] == [GRADER_VERSION]


def verified_wheel(checkout, scratch):
    """The kit's wheel copied out of the checkout, if its sha256 is the released one's."""
    source = checkout / REQUIREMENT
    if source.is_symlink() or not source.is_file() or source.stat().st_size > 200 * 2**20:
        fail(f"{{REQUIREMENT}} is missing from the repository: restore it from the assignment's template")
    data = source.read_bytes()
    if hashlib.sha256(data).hexdigest() != WHEEL_SHA256:
        fail(f"{{REQUIREMENT}} is not the grader the course released (its sha256 differs): restore it from the template")
    copy = scratch / source.name
    copy.write_bytes(data)
    return copy


def install(checkout, scratch):
    """A venv beside the system's packages, with torch (CPU build without nvidia-smi) and the grader."""
    wheel = verified_wheel(checkout, scratch) if WHEEL_SHA256 else None
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    env = environment(scratch)
    if subprocess.run([python, "-c", "import torch"], cwd=scratch, env=env, capture_output=True).returncode != 0:
        cpu = [] if shutil.which("nvidia-smi") else ["--index-url", TORCH_CPU_INDEX]
        subprocess.run(pip + ["torch", *cpu], cwd=scratch, env=env, check=True)
    subprocess.run(pip + [str(wheel) if wheel else REQUIREMENT], cwd=scratch, env=env, check=True)
    if not has_grader(python, scratch):
        fail(f"the grader {{GRADER_VERSION}} does not import after its install")
    return python


def main():
    checkout = Path.cwd().resolve()
    scratch = Path(tempfile.mkdtemp(prefix="grader-autograder-", dir=os.environ.get("RUNNER_TEMP") or None))
    for rel, text in COURSE.items():
        path = scratch / "course" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    output = checkout / ".grader"
    if output.is_symlink() or (output.exists() and not output.is_dir()):  # the report goes there, nowhere else
        output.unlink()
    try:
        python = sys.executable if has_grader(sys.executable, scratch) else install(checkout, scratch)
    except subprocess.CalledProcessError as exc:
        fail(f"installing the grader failed: {{exc}}")
    command = [python, "-m", "grader", "check", str(checkout), "--ci", "classroom50", "--device", "auto",
               "--json", str(output / "results.json"), "--html", str(output)]
    for name in ASSIGNMENTS:
        command += ["-a", name]
    left = max(60.0, TIME_LIMIT_S - (time.monotonic() - START))
    try:
        proc = subprocess.run(command, cwd=scratch, env=environment(scratch), timeout=left)
    except subprocess.TimeoutExpired:
        fail(f"the grader did not finish in {{left:.0f}} s")
    shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(0 if proc.returncode == 0 else 2)


if __name__ == "__main__":
    main()
'''


def check_runs_on(labels: list[str] | None) -> list[str]:
    labels = list(labels or DEFAULT_RUNS_ON)
    if len(labels) > MAX_LABELS:
        raise ReleaseError(f"--runs-on: at most {MAX_LABELS} runner labels, not {len(labels)}")
    for label in labels:
        if not LABEL.fullmatch(label):
            raise ReleaseError(f"--runs-on {label!r}: a runner label is letters, digits, '-', '_' and '.'")
    return labels


def autograder(kit: Kit, names: list[str]) -> str:
    """The text of autograder.py for these assignments of the kit."""
    requirement = (kit.root / "requirements-grader.txt").read_text().strip()
    sha = None
    if requirement.startswith("./"):
        sha = hashlib.sha256((kit.root / requirement).read_bytes()).hexdigest()
    course = {specs.KIT_MANIFEST: (kit.root / specs.KIT_MANIFEST).read_text()}
    for path in sorted((kit.root / "assignments").rglob("*.py")):
        if "__pycache__" not in path.parts:
            course[path.relative_to(kit.root).as_posix()] = path.read_text()
    return AUTOGRADER.format(slug=", ".join(names), version=__version__, assignments=list(names), requirement=requirement,
                             wheel_sha256=sha, time_limit=TIME_LIMIT_S, course=course)


def _read_entries(path: Path) -> tuple[object, list]:
    """(the file's JSON, its list of entries): a list, or an object holding one under "assignments"."""
    if not path.exists():
        return None, []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ReleaseError(f"{path} is not valid JSON ({str(exc)[:200]}): fix or remove it first") from None
    entries = data.get("assignments") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ReleaseError(f"{path}: expected a list of assignment objects (or {{\"assignments\": [...]}})")
    return data, entries


def write_classroom(kit: Kit, classroom: Path, runs_on: list[str] | None = None) -> list[str]:
    """Write CLASSROOM/autograders/<slug>/autograder.py and CLASSROOM/assignments.json for the
    kit's assignments; scanned before anything is written. Returns the files written."""
    classroom = Path(classroom).resolve()
    if not NAME.fullmatch(classroom.name):
        raise ReleaseError(f"--classroom50 {classroom}: the classroom's folder name must be letters, digits, '-', '_' or '.'")
    course = specs.course_root().resolve()
    if classroom == course or classroom.is_relative_to(course) or course.is_relative_to(classroom):
        raise ReleaseError(f"--classroom50 {classroom} is inside the course (or holds it): use the classroom50 config repo")
    labels = check_runs_on(runs_on)
    data, entries = _read_entries(classroom / "assignments.json")
    by_slug = {e.get("slug"): e for e in entries}
    staging = Path(tempfile.mkdtemp(prefix=".classroom50-"))
    written = []
    try:
        for name in kit.assignments:
            spec, slug = specs.get(name), slug_of(name)
            target = staging / "autograders" / slug / "autograder.py"
            target.parent.mkdir(parents=True)
            target.write_text(autograder(kit, [name]))
            entry = by_slug.get(slug)
            if entry is None:
                entry = {"slug": slug}
                entries.append(entry)
            entry.update({"name": spec.title, "mode": entry.get("mode", "individual"),
                          "autograder": entry.get("autograder", "default"), "runtime": {**(entry.get("runtime") or {}),
                                                                                       "runs-on": labels},
                          "release_assets": [REPORT_ASSET]})
        if isinstance(data, dict):
            data["assignments"] = entries
        (staging / "assignments.json").write_text(json.dumps(data if isinstance(data, dict) else entries, indent=2) + "\n")
        leaks = find_leaks(staging)
        if leaks:
            raise ReleaseError("the Classroom 50 autograders would publish private material:\n  " + "\n  ".join(leaks[:20]))
        for part in sorted(staging.rglob("*")):
            if part.is_file():
                rel = part.relative_to(staging)
                dest = classroom / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(part, dest)
                if dest.name == "autograder.py":
                    dest.chmod(0o755)
                written.append(rel.as_posix())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written
