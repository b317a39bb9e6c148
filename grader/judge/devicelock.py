"""One timing phase per GPU at a time, across threads and processes.

Correctness calls of several jobs may share a GPU; a timing phase must have it alone, or
another job's kernels would run inside its measurements. Each GPU has a reader-writer lock
made of two lock files (flock, so separate grader processes on the host honour it too, and a
killed holder releases it with its last file descriptor):

- a correctness call holds the GPU's lock shared;
- a timing phase holds it exclusive, and first takes the turnstile, which new correctness
  calls pass through: once a timing phase waits, no new call starts on that GPU, the calls
  running finish, and the timing phase goes (a stream of calls cannot starve it).

The lock folder is $GRADER_LOCK_DIR, else <tmp>/grader-locks.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from grader.settings import current


def lock_dir() -> Path:
    folder = current().lock_dir or Path(tempfile.gettempdir()) / "grader-locks"
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            folder.chmod(0o1777)  # every user's grader on the host shares the GPUs
        except PermissionError:
            pass
    return folder


def device_id(gpu: str | None) -> str:
    """The GPU a worker started with CUDA_VISIBLE_DEVICES=gpu computes on (its first one)."""
    visible = gpu if gpu is not None else current().visible_gpus
    first = (visible or "0").split(",")[0].strip() or "0"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in first)


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # made by another user: a read-only descriptor locks as well
        return os.open(path, os.O_RDONLY)


@contextmanager
def gpu_phase(gpu: str | None, exclusive: bool, enabled: bool = True,
              waited: Callable[[float], None] | None = None) -> Iterator[None]:
    """Hold GPU `gpu` for a correctness call (shared) or a timing phase (exclusive).
    `enabled=False` (the CPU interpreter) holds nothing. `waited` is told the seconds it
    waited for the lock (what a job loses to other jobs' timing phases)."""
    if not enabled:
        yield
        return
    base = lock_dir() / f"gpu-{device_id(gpu)}"
    turnstile, main = _open(base.with_suffix(".turnstile")), _open(base.with_suffix(".lock"))
    began = time.monotonic()
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(main, fcntl.LOCK_EX)
        else:
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        if waited is not None:
            waited(time.monotonic() - began)
        yield
    finally:
        os.close(main)  # closing releases the locks
        os.close(turnstile)


def timing_lock(gpu: str | None, enabled: bool = True):
    """The GPU alone, for one timing phase."""
    return gpu_phase(gpu, exclusive=True, enabled=enabled)
