"""How this Python is started as a sandboxed process, at the bottom of the sandbox (it imports
nothing of it): where the grader's package lies, the isolated interpreter's command line, and
the one line read from stdin that leaves no path of the grader's on a command line a worker
can read, and what "the same code" is for a process kept warm (code_identity). The launch, the
zygote, the backends and the warm judge (grader.resident) all start processes with these."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import grader

PACKAGE_PARENT = str(Path(grader.__file__).resolve().parent.parent)
# The worker's entry point: -I keeps the current folder (where a student could plant a
# torch.py or a grader/ package) and PYTHON* variables out of sys.path; the worker's own code
# (`launch.copy_worker_code`, never the course's grader/) is put first.
BOOTSTRAP = "import sys; sys.path.insert(0, {path!r}); from grader.worker.server import main; main(sys.argv[1:])"


def isolated_python(boot: str, *args: str, path: str | None = None) -> list[str]:
    """This Python as a worker is started (isolated mode, no user site, no bytecode written),
    running `boot` (a template given `path`, by default this package's parent folder) with `args`."""
    return [sys.executable, "-I", "-u", "-B", "-c", boot.format(path=path or PACKAGE_PARENT), *args]


# What runs where a worker can read its command line (/proc/1/cmdline: the sandbox's init; a fork's
# own: the zygote it was forked from): one line of code read from stdin, so the command line holds
# no path of the grader's (the course folder, a cache's socket); what tells this checkout's processes
# apart from another's is a digest of its folder (CHECKOUT_TAG), which says nothing of where it is
CHECKOUT_TAG = "grader-" + hashlib.sha256(PACKAGE_PARENT.encode()).hexdigest()[:12]
FROM_STDIN = f"import sys; exec(sys.stdin.readline())  # {CHECKOUT_TAG}"


def unnamed_python() -> list[str]:
    """`isolated_python`, for code written to its stdin as one line (see FROM_STDIN)."""
    return [sys.executable, "-I", "-u", "-B", "-c", FROM_STDIN]


def code_identity(*more: Path, package: Path | None = None) -> str:
    """What "the same code" is for a process kept warm for the next command (a zygote, a judge):
    this Python (its path and version), every file of the grader's package (`package`, default
    this one) and of the folders in `more` (a course's specs) by name, size and change time, and
    the installs of what a worker imports (torch, Triton, numpy, safetensors) by where and when.
    A changed grader or course, or an upgraded torch, is another identity, so no process is kept
    serving stale code. Imports nothing it looks at."""
    import importlib.util

    digest = hashlib.sha256(f"{sys.executable}\n{sys.version}\n".encode())
    for folder in (package or Path(PACKAGE_PARENT) / "grader", *more):
        digest.update(f"{folder}\n".encode())
        for path in sorted(folder.rglob("*")):
            if "__pycache__" in path.parts or ".git" in path.parts:
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            digest.update(f"{path.relative_to(folder)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    for name in ("torch", "triton", "numpy", "safetensors"):
        found = importlib.util.find_spec(name)
        origin = found.origin if found is not None and found.origin else ""
        try:
            changed = os.stat(origin).st_mtime_ns if origin else 0
        except OSError:
            changed = 0
        digest.update(f"{name}={origin}:{changed}\n".encode())
    return digest.hexdigest()
