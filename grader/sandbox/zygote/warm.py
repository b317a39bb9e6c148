"""The zygote a `grader check` leaves warm for the next check: its name (the code and the
environment it was started from, so no worker is forked from stale code) and stopping it (how
long it waits is the command's Settings.warm.keep_seconds)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def warm_name(env: dict[str, str]) -> str:
    """The warm zygote's name: its environment and the code it has imported (this grader's
    files, this Python, torch's and Triton's installs), so a changed grader or an upgraded
    torch starts a new one and no worker is forked from stale code."""
    import hashlib
    import importlib.util

    from grader.sandbox.launch import PACKAGE_PARENT

    digest = hashlib.sha256(json.dumps([sorted(env.items()), sys.executable, sys.version]).encode())
    for source in sorted(Path(PACKAGE_PARENT, "grader").rglob("*.py")):
        digest.update(str(source).encode() + source.read_bytes())
    for package in ("torch", "triton", "numpy", "safetensors"):
        found = importlib.util.find_spec(package)
        origin = found.origin if found is not None and found.origin else ""
        digest.update(f"{package}={origin}:{os.stat(origin).st_mtime_ns if origin else 0}".encode())
    return digest.hexdigest()[:16]



def stop_warm(folder: Path) -> int:
    """Stop the warm zygotes serving from `folder` now (a zygote's command line names no path, see
    launch.FROM_STDIN: its HOME, a folder of its own there, tells it); returns how many. A test's
    or a benchmark's cleanup: they end by themselves when idle."""
    from grader.sandbox.launch import FROM_STDIN

    stopped = 0
    home = b"HOME=" + os.fsencode(Path(folder)) + b"/"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if FROM_STDIN.encode() in argv else []
        except OSError:
            continue
        if any(e.startswith(home) for e in env):
            try:
                os.kill(int(pid), signal.SIGKILL)
                stopped += 1
            except OSError:
                pass
    return stopped
