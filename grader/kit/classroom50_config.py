"""`grader release --classroom50 CLASSROOM`: the teacher's side of Classroom 50, written beside the kit.

In the teacher's `classroom50` config repository, CLASSROOM (the classroom's folder) gets:
- `autograders/<slug>/autograder.py` per assignment: it grades the student's checkout (its
  working directory) with `grader check --ci classroom50 -a NAME`, installing the grader first
  where the runner has none, and on a GitHub-hosted runner lifting ubuntu-24.04's AppArmor
  restriction on user namespaces first (the check stops rather than grade without its sandbox);
- an entry per assignment in `assignments.json`, Classroom 50's `classroom50/assignments/v1`
  object (runner labels from `--runs-on`, the report as a release asset, `due` from course.toml's
  deadline in UTC); read, changed and written back: the file's other entries, and the fields of
  our entries that the grader does not write, are kept.

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
from datetime import datetime, timedelta, timezone
from pathlib import Path

from grader import __version__
from grader import spec as specs
from grader.kit.classroom50 import REPORT_ASSET, slug_of
from grader.kit.release import Kit, ReleaseError, find_leaks
from grader.settings import Settings

ASSIGNMENTS_SCHEMA = "classroom50/assignments/v1"
LABEL = re.compile(r"[A-Za-z0-9_.-]{1,100}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
MAX_LABELS = 10
DEFAULT_RUNS_ON = ["ubuntu-latest"]
TIME_LIMIT_S = 13 * 60  # Classroom 50 gives the whole grade job 15 minutes: the install and the check share them

AUTOGRADER = '''#!/usr/bin/env python3
"""Classroom 50's autograder for {slug}: grades the student's checkout (the working directory)
with `grader check --ci classroom50`, which writes result.json, release-body.md, the commit
status and .grader/report.html there. Exit 0 when graded, 2 when the grader could not grade.
On a GitHub-hosted runner that refuses user namespaces (ubuntu-24.04's AppArmor) it first lets
the grader's sandbox use them (sudo sysctl), as the kit's own workflow does; the check never
grades with a weaker sandbox.

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
USERNS_SYSCTL = "kernel.apparmor_restrict_unprivileged_userns"
START = time.monotonic()


def fail(message):
    """Our own failure: no result.json, exit 2. The runner then writes its own result.json and
    release body ("autograder exited 2") and releases nothing, so the reason goes where it
    survives: an annotation on the run's page (the commit status links there) and the job summary."""
    line = " ".join(str(message).split())[:300]
    clean = line.replace("%", "%25").replace("\\r", "%0D").replace("\\n", "%0A")
    print(f"::error title=The grader could not run::{{clean}}", flush=True)
    print(f"autograder: {{line}}", file=sys.stderr)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write("## Triton kernels: the grader could not run\\n\\n" + line.replace("<", "&lt;")
                    + "\\n\\nThis is the grader's failure, not a grade of your work: nothing was scored. Push again "
                    "(a new submission), and if it happens again tell the course staff, with a link to this "
                    "page.\\n\\n")
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as f:
            f.write(f"status=error\\nsummary=autograder: {{line[:120]}}\\n")
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
    """The released wheel, its sha256 checked: the copy published beside this file (Classroom 50
    bundles the assignment's autograders folder), else the kit's copy in the checkout (which an
    assignment's allowed_files may have removed)."""
    name = Path(REQUIREMENT).name
    for source in (Path(__file__).resolve().parent / name, checkout / REQUIREMENT):
        if source.is_symlink() or not source.is_file() or source.stat().st_size > 200 * 2**20:
            continue
        data = source.read_bytes()
        if hashlib.sha256(data).hexdigest() == WHEEL_SHA256:
            copy = scratch / name
            copy.write_bytes(data)
            return copy
    fail(f"the grader's wheel {{name}} (sha256 {{WHEEL_SHA256[:12]}}...) is neither beside this autograder nor in the "
         f"repository: publish the autograders folder again with `grader release --classroom50`")


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


def namespaces_allowed():
    """An unprivileged user namespace can be made here: what the grader's sandbox is built of."""
    try:
        made = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return made.returncode == 0


def allow_namespaces():
    """GitHub's hosted ubuntu-24.04 runners refuse unprivileged user namespaces (AppArmor), and a
    Classroom 50 check stops rather than grade without its sandbox (a submission's process could
    outlive its worker and rewrite result.json): on a GitHub-hosted runner, whose job may use sudo
    without a password, lift that as the kit's own workflow does. A self-hosted runner is the
    course's machine: nothing of it is changed here (the README says what to set there once)."""
    if namespaces_allowed():
        return
    if os.environ.get("RUNNER_ENVIRONMENT") != "github-hosted" or not shutil.which("sudo"):
        print(f"::warning title=The grader's sandbox::this runner refuses user namespaces; the course staff can allow "
              f"them once (sysctl {{USERNS_SYSCTL}}=0 on Ubuntu 23.10 and later)", flush=True)
        return
    try:
        lifted = subprocess.run(["sudo", "-n", "sysctl", "-w", f"{{USERNS_SYSCTL}}=0"], capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        lifted = subprocess.CompletedProcess([], 1, "", str(exc))
    if lifted.returncode == 0 and namespaces_allowed():
        print(f"autograder: set {{USERNS_SYSCTL}}=0 (sudo) so the grader's sandbox can use namespaces", flush=True)
    else:
        said = " ".join((lifted.stderr or "").split())[:200]
        print(f"::warning title=The grader's sandbox::user namespaces stay refused on this runner "
              f"(sudo sysctl {{USERNS_SYSCTL}}=0: {{said or 'no effect'}})", flush=True)


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
    allow_namespaces()
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
    if proc.returncode not in (0, 2):  # 2: the check said why itself; anything else stopped it unexpectedly
        fail(f"the grader stopped unexpectedly (exit {{proc.returncode}}): its output is in the log above")
    sys.exit(proc.returncode)


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
    return AUTOGRADER.format(slug=", ".join(names), version=__version__, assignments=list(names),
                             requirement=requirement,
                             wheel_sha256=sha, time_limit=TIME_LIMIT_S, course=course)


def _read_entries(path: Path) -> dict:
    """The file as Classroom 50's v1 object (`{"schema": "classroom50/assignments/v1",
    "assignments": [...]}`): a new one where there is none, an old bare list of ours wrapped.
    Keys and entries that are not ours are kept as they are."""
    if not path.exists():
        return {"schema": ASSIGNMENTS_SCHEMA, "assignments": []}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ReleaseError(f"{path} is not valid JSON ({str(exc)[:200]}): fix or remove it first") from None
    if isinstance(data, list):  # written by an earlier grader: the entries alone
        data = {"schema": ASSIGNMENTS_SCHEMA, "assignments": data}
    if not isinstance(data, dict):
        raise ReleaseError(f"{path}: expected Classroom 50's {{\"schema\": \"{ASSIGNMENTS_SCHEMA}\", \"assignments\": "
                           f"[...]}}")
    if data.setdefault("schema", ASSIGNMENTS_SCHEMA) != ASSIGNMENTS_SCHEMA:
        raise ReleaseError(f"{path}: schema {str(data['schema'])[:80]!r} is not {ASSIGNMENTS_SCHEMA!r}, the one this "
                           f"grader writes")
    entries = data.setdefault("assignments", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ReleaseError(f"{path}: expected a list of assignment objects under \"assignments\"")
    return data


def due(deadline: datetime) -> tuple[str, dict]:
    """(`due`, `due_meta`) of a course.toml deadline: the UTC instant in RFC 3339 (what
    Classroom 50 compares each submission's date with to mark it late), and where it came from."""
    offset = deadline.utcoffset() or timedelta(0)
    sign, rest = ("-", -offset) if offset < timedelta(0) else ("+", offset)
    hours, minutes = divmod(int(rest.total_seconds()) // 60, 60)
    instant = deadline.astimezone(timezone.utc).replace(microsecond=0)
    return instant.strftime("%Y-%m-%dT%H:%M:%SZ"), {"input": deadline.isoformat(),
                                                    "offset": f"{sign}{hours:02d}:{minutes:02d}",
                                                    "source": "explicit-offset"}


def write_classroom(kit: Kit, classroom: Path, runs_on: list[str] | None = None,
                    deadlines: dict[str, datetime] | None = None, catalogue: specs.Course | None = None) -> list[str]:
    """Write CLASSROOM/autograders/<slug>/autograder.py and CLASSROOM/assignments.json for the
    kit's assignments (of `catalogue`, the course released; default: the one the default settings
    imply); scanned before anything is written. `deadlines` (course.toml's, by assignment) become
    each entry's `due`. Returns the files written."""
    catalogue = catalogue if catalogue is not None else specs.Course.find(Settings())
    classroom = Path(classroom).resolve()
    if not NAME.fullmatch(classroom.name):
        raise ReleaseError(f"--classroom50 {classroom}: the classroom's folder name must be letters, digits, "
                           "'-', '_' or '.'")
    course = catalogue.root.resolve()
    if classroom == course or classroom.is_relative_to(course) or course.is_relative_to(classroom):
        raise ReleaseError(f"--classroom50 {classroom} is inside the course (or holds it): use the classroom50 config "
                           f"repo")
    labels = check_runs_on(runs_on)
    data = _read_entries(classroom / "assignments.json")
    entries = data["assignments"]
    by_slug = {e.get("slug"): e for e in entries}
    staging = Path(tempfile.mkdtemp(prefix=".classroom50-"))
    written = []
    try:
        for name in kit.assignments:
            spec, slug = catalogue.get(name), slug_of(name)
            target = staging / "autograders" / slug / "autograder.py"
            target.parent.mkdir(parents=True)
            target.write_text(autograder(kit, [name]))
            wheel = kit.root / (kit.root / "requirements-grader.txt").read_text().strip()
            if wheel.suffix == ".whl" and wheel.is_file():  # published beside it: no need of the student's copy
                shutil.copyfile(wheel, target.parent / wheel.name)
            entry = by_slug.get(slug)
            if entry is None:
                entry = {"slug": slug}
                entries.append(entry)
            entry.update({"name": spec.title, "mode": entry.get("mode", "individual"),
                          "autograder": entry.get("autograder") or "default",
                          "runtime": {**(entry.get("runtime") or {}), "runs-on": labels},
                          "release_assets": [REPORT_ASSET]})
            when = (deadlines or {}).get(name)
            if when is not None:
                entry["due"], entry["due_meta"] = due(when)
        (staging / "assignments.json").write_text(json.dumps(data, indent=2) + "\n")
        leaks = find_leaks(staging, catalogue)
        if leaks:
            raise ReleaseError("the Classroom 50 autograders would publish private material:\n  "
                               + "\n  ".join(leaks[:20]))
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
