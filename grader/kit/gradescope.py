"""`grader gradescope`: the course as a Gradescope autograder zip.

Gradescope's autograder specification: the zip holds `setup.sh` (run once, as root, when the
image is built; it installs the dependencies) and `run_autograder` (run for each submission in
/autograder, with the student's files in /autograder/submission; it must write
/autograder/results/results.json). Here the zip also holds the grader's wheel and the course:
specs, hidden cases, reference kernels and the secret, all of which stay on Gradescope's side.
results.json is RunResult.to_gradescope(): hidden cases are `after_published`.

GRADER_AUTOGRADER_ROOT stands for /autograder, so that a course can try the zip locally.
"""

from __future__ import annotations

import json
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
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/pip" install --upgrade pip
"$ROOT/venv/bin/pip" install "torch=={torch}" --index-url {torch_index}   # {torch_kind}
"$ROOT/venv/bin/pip" install ./{wheel}
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: it grades /autograder/submission and writes
# /autograder/results/results.json. GRADER_AUTOGRADER_ROOT stands for /autograder (a local trial).
ROOT="${{GRADER_AUTOGRADER_ROOT:-/autograder}}"
PY="$ROOT/venv/bin/python"
[ -x "$PY" ] || PY=python3
export GRADER_COURSE="$ROOT/source/course"
mkdir -p "$ROOT/results"
cd "$ROOT/results"
# files uploaded without their folders (kernels/x.py dragged in as x.py): found by name, named in grader.toml
"$PY" -m grader.kit.gradescope "$ROOT/submission" {names}
"$PY" -m grader check "$ROOT/submission" {assignments} --device {device} --ci none \\
    --json "$ROOT/results/results.json" --html "$ROOT/results/report" 2>"$ROOT/results/grader-stderr.txt"
status=$?
cat "$ROOT/results/grader-stderr.txt" >&2
if [ ! -s "$ROOT/results/results.json" ]; then
    # no grade (no module found, or the grader failed): say why, in the file Gradescope reads
    "$PY" - "$ROOT/results/results.json" "$status" "$ROOT/results/grader-stderr.txt" <<'EOF'
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
                     reference_dir: Path | None = None, catalogue: specs.Course | None = None) -> list[str]:
    """Write the zip of `catalogue`'s assignments (default: the course the default settings imply);
    returns its members. `reference_dir` (GRADER_REFERENCE_DIR): where the reference kernels
    come from, else the course's reference/."""
    catalogue = catalogue if catalogue is not None else specs.Course.find(Settings())
    chosen = [catalogue.get(n) for n in names] if names else list(catalogue.catalogue().values())
    course = catalogue.root
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
        reference = reference_dir or course / "reference"
        for p in sorted(reference.rglob("*.py")) if reference.is_dir() else []:
            if "__pycache__" not in p.parts:
                files[f"course/reference/{p.relative_to(reference).as_posix()}"] = p.read_bytes()
        secret = catalogue.secret()
        if secret:
            files[f"course/{specs.SECRET_FILE}"] = (secret + "\n").encode()
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


if __name__ == "__main__":  # run_autograder: python -m grader.kit.gradescope SUBMISSION NAME...
    import sys

    if len(sys.argv) >= 2 and Path(sys.argv[1]).is_dir():
        from grader.sanitize import one_line
        from grader.settings import current

        for line in locate_modules(Path(sys.argv[1]), sys.argv[2:], specs.Course.find(current())):
            print(one_line(line))  # it names a student's file
