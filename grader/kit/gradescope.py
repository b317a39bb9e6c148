"""`grader gradescope`: the course as a Gradescope autograder zip.

Gradescope's autograder specification: the zip holds `setup.sh` (run once, as root, when the
image is built; it installs the dependencies) and `run_autograder` (run for each submission in
/autograder, with the student's files in /autograder/submission; it must write
/autograder/results/results.json). Here the zip also holds the grader's wheel and, of the course,
only what grading its assignments needs: their specs, hidden cases and reference kernels. Never
the course secret: each submission is graded with a fresh seed, so the secret would keep nothing
from the student, and would only make a random case's reproducer draw another shape in their kit.
results.json is RunResult.to_gradescope(): hidden cases are `after_published`.

Gradescope runs the image as root in a Docker container whose default seccomp profile refuses new
namespaces: the sandbox then runs each worker as a dedicated uid without namespaces
(grader.sandbox.namespaces.degraded_user_switch). Before grading, `contain` closes the zip's
folder to every other user and refuses to grade (saying why, in results.json) where a worker could
still read it: not root and no namespaces.

GRADER_AUTOGRADER_ROOT stands for /autograder, so that a course can try the zip locally.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path

from grader import spec as specs
from grader.kit.release import TORCH, TORCH_CPU_INDEX, ReleaseError, build_wheel
from grader.settings import Settings

CPU_TORCH = TORCH_CPU_INDEX
CUDA_TORCH = "https://download.pytorch.org/whl/cu128"
SKIP = {"__pycache__", "starter"}

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, in /autograder/source, when it builds the autograder image.
set -euo pipefail
cd "$(dirname "${{BASH_SOURCE[0]}}")"
ROOT="${{GRADER_AUTOGRADER_ROOT:-/autograder}}"
apt-get update
# util-linux: unshare, for the grader's sandbox; gcc and the headers: Triton builds a launcher on a GPU
apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev util-linux
umask 022  # the venv is read by the workers' uid: it runs their Python
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/pip" install --upgrade pip
"$ROOT/venv/bin/pip" install "torch=={torch}" --index-url {torch_index}   # {torch_kind}
"$ROOT/venv/bin/pip" install ./{wheel}
# the course (hidden cases, reference kernels) is root's alone: no worker's uid reads it
chmod -R go-rwx .
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: it grades /autograder/submission and writes
# /autograder/results/results.json. GRADER_AUTOGRADER_ROOT stands for /autograder (a local trial).
ROOT="${{GRADER_AUTOGRADER_ROOT:-/autograder}}"
export GRADER_AUTOGRADER_ROOT="$ROOT"
PY="$ROOT/venv/bin/python"
[ -x "$PY" ] || PY=python3
export GRADER_COURSE="$ROOT/source/course"
export GRADER_CACHE_GB=0  # a fresh container per submission: nothing kept, nothing left running after it
umask 077  # what the grader writes is root's alone: no worker's uid reads it
mkdir -p "$ROOT/results"
cd "$ROOT/results"
# the course closed to workers and their sandbox checked (else results.json says why nothing is graded);
# files uploaded without their folders (kernels/x.py dragged in as x.py): found by name, named in grader.toml
"$PY" -I -m grader.kit.gradescope "$ROOT" "$ROOT/submission" {names} || exit 0
# from inside the submission (-I: nothing of it on the grader's path), so that every reproducer
# reads `grader check .`, as the student types it in their own clone
if cd "$ROOT/submission" 2>/dev/null; then REPO=.; else REPO="$ROOT/submission"; fi
"$PY" -I -m grader check "$REPO" {assignments} --device {device} --ci none \\
    --json "$ROOT/results/results.json" --html "$ROOT/results/report" 2>"$ROOT/results/grader-stderr.txt"
status=$?
cat "$ROOT/results/grader-stderr.txt" >&2
if [ ! -s "$ROOT/results/results.json" ]; then
    # no grade (no module found, or the grader failed): say why, in the file Gradescope reads
    "$PY" -I - "$ROOT/results/results.json" "$status" "$ROOT/results/grader-stderr.txt" <<'EOF'
import json, sys
why = open(sys.argv[3], errors="replace").read().strip().splitlines()[-5:]
json.dump({{"score": 0.0, "stdout_visibility": "visible", "tests": [],
           "output": "The autograder could not grade this submission (exit code " + sys.argv[2] + "):\\n"
                     + "\\n".join(why)}},
          open(sys.argv[1], "w"), indent=2)
EOF
fi
exit 0
"""


def build_autograder(out: Path, names: list[str] | None = None, *, cuda: bool = False, torch_index: str | None = None,
                     reference_dir: Path | None = None, catalogue: specs.Course | None = None,
                     points: dict | None = None) -> list[str]:
    """Write the zip of `catalogue`'s assignments (default: the course the default settings imply);
    returns its members. `reference_dir` (GRADER_REFERENCE_DIR): where the reference kernels
    come from, else the course's reference/. `points`: course.toml's points by assignment, shipped
    as course/grader-points.toml (grader.kit.points: results.json reports out of them); no
    deadline, extension or late policy goes in."""
    from grader.kit.points import POINTS_FILE, points_file

    catalogue = catalogue if catalogue is not None else specs.Course.find(Settings())
    chosen = [catalogue.get(n) for n in names] if names else list(catalogue.catalogue().values())
    out = Path(out)
    if out.suffix != ".zip":
        raise ReleaseError(f"--out {out}: Gradescope takes a .zip")
    with tempfile.TemporaryDirectory(prefix="grader-gradescope-") as tmp:
        wheel = build_wheel(Path(tmp))
        index = torch_index or (CUDA_TORCH if cuda else CPU_TORCH)
        files: dict[str, bytes] = {
            "setup.sh": SETUP_SH.format(torch=TORCH, torch_index=index, torch_kind="CUDA build" if cuda
                                        else "CPU build", wheel=wheel.name).encode(),
            "run_autograder": RUN_AUTOGRADER.format(assignments=" ".join(f"-a {s.name}" for s in chosen),
                                                    names=" ".join(s.name for s in chosen),
                                                    device="auto" if cuda else "cpu").encode(),
            wheel.name: wheel.read_bytes(),
        }
        for spec in chosen:
            for p in sorted(spec.folder.rglob("*")):
                rel = p.relative_to(spec.folder)
                if p.is_file() and not SKIP & set(rel.parts):
                    files[f"course/assignments/{spec.folder.name}/{rel.as_posix()}"] = p.read_bytes()
        shipped = points_file(points or {}, [s.name for s in chosen])
        if shipped:
            files[f"course/{POINTS_FILE}"] = shipped.encode()
        for spec in chosen:  # each assignment's own reference kernel, no other's; never the secret (above)
            kernel = spec.reference_module(reference_dir)
            if kernel.is_file():
                files[f"course/reference/{kernel.name}"] = kernel.read_bytes()
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in files.items():
                info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
                executable = name in ("setup.sh", "run_autograder")
                info.external_attr = ((stat.S_IFREG | (0o755 if executable else 0o644)) << 16)
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)
        shutil.move(partial, out)
    return sorted(files)


def locate_modules(submission: Path, names: list[str], catalogue: specs.Course | None = None) -> list[str]:
    """Gradescope's upload keeps no folders when a student drags files in: where an assignment's
    module (kernels/x.py) of `catalogue` (default: the course the default settings imply) is
    missing but exactly one file of that name is in the submission, a grader.toml entry points at
    it. A student's own grader.toml entries are kept. Returns what it did."""
    from grader import repofiles
    from grader.results import write_text_atomic
    from grader.submission import CONFIG, SubmissionError, read_config

    try:  # read as grader check reads it: inside the submission, a regular file, bounded, checked
        entries = read_config(submission)
    except SubmissionError:
        return []  # grader check says what is wrong with it
    catalogue = catalogue if catalogue is not None else specs.Course.find(Settings())
    done = []
    for name in names:
        try:
            spec = catalogue.get(name)
        except specs.UnknownAssignment:
            continue
        try:
            if name in entries or repofiles.regular_file(submission, spec.module) is not None:
                continue
        except repofiles.RepoFileError:
            continue  # there, but not gradable (a link out, a FIFO): grader check says why
        found = repofiles.find(submission, Path(spec.module).name)
        if len(found) == 1:
            rel = found[0].relative_to(repofiles.real_root(submission)).as_posix()
            entries[name] = {"module": rel}
            done.append(f"{name}: {spec.module} not found; grading {rel}")
    if done:
        lines = []
        for name, entry in entries.items():
            if isinstance(entry, dict):
                lines += [f"[assignments.{json.dumps(str(name))}]",
                          *[f"{k} = {json.dumps(str(v))}" for k, v in entry.items()], ""]
        write_text_atomic("\n".join(lines), submission / CONFIG)  # a link there is replaced, never written through
    return done


class NotContained(Exception):
    """A worker could read the course here: nothing is graded, and results.json says why."""


def contain(autograder: Path, settings: Settings) -> str:
    """Close the zip's folder (`autograder`/source: the specs, hidden cases and reference kernels)
    and the results folder to every user but root, and check that the sandbox keeps them from a
    worker here: namespaces (a view without them), or root's dedicated worker uid (which the modes
    then keep out). Returns how workers are contained (one line); NotContained where neither can be
    had (not root and no namespaces), as grading there would hand the course to the submission."""
    from grader.sandbox.process import detect
    from grader.sandbox.zygote import SandboxState

    isolation = detect("sandbox", settings, SandboxState())  # as the check's own (its uid range, say)
    if not (isolation.namespaces or isolation.user_switch):
        raise NotContained("the autograder's machine, not your code, stopped this check: nothing was graded. Course "
                           "staff: run the autograder as root (Gradescope's default, where the grader runs the "
                           "submission as a user of its own) or where namespaces are allowed. Do not resubmit for "
                           "this: every submission stops the same way until the staff fix it. The sandbox can "
                           "neither make namespaces nor run the submission as another user here "
                           f"({'; '.join(isolation.warnings) or isolation.mode}), so the submission's code could read "
                           "the course's hidden cases and reference kernels.")
    for folder in (autograder / "source", autograder / "results"):
        if folder.is_dir() and not folder.is_symlink():
            _close(folder)
    describe = isolation.describe()
    return f"sandbox: files: {describe['files']}; user: {describe['user']}; network: {describe['network']}"


def _close(folder: Path) -> None:
    """`folder` and all it holds: no access for group or others (never through a link)."""
    os.chmod(folder, stat.S_IMODE(os.lstat(folder).st_mode) & 0o700)
    for parent, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(parent, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


def _refuse(results: Path, why: str) -> None:
    """results.json for a submission not graded here: score 0 and the reason, which the student sees."""
    from grader.results import write_json_atomic

    write_json_atomic({"score": 0.0, "stdout_visibility": "visible", "tests": [],
                       "output": f"The autograder did not grade this submission: {why}"}, results / "results.json")


def main(argv: list[str], settings: Settings) -> int:
    """run_autograder's first step: `python -I -m grader.kit.gradescope ROOT SUBMISSION NAME...`
    (ROOT: /autograder, or where a local trial put it). Exit 0: go on and grade; 3: not graded here
    (results.json says why)."""
    import sys

    from grader.sanitize import one_line

    autograder, argv = Path(argv[0]), argv[1:]
    try:
        print(contain(autograder, settings))
    except NotContained as exc:
        print(f"error: {exc}", file=sys.stderr)
        (autograder / "results").mkdir(parents=True, exist_ok=True)
        _refuse(autograder / "results", str(exc))
        return 3
    if argv and Path(argv[0]).is_dir():
        for line in locate_modules(Path(argv[0]), argv[1:], specs.Course.find(settings)):
            print(one_line(line))  # it names a student's file
    return 0


if __name__ == "__main__":
    import sys

    from grader.settings import current

    sys.exit(main(sys.argv[1:], current()))
