"""One timing phase per GPU at a time, across threads and processes.

Correctness calls of several jobs may share a GPU; a timing phase must have it alone, or
another job's kernels would run inside its measurements. Each GPU has a reader-writer lock
made of two lock files (flock, so separate grader processes on the host honour it too, and a
killed holder releases it with its last file descriptor):

- a correctness call holds the GPU's lock shared;
- a timing phase holds it exclusive, and first takes the turnstile, which new correctness
  calls pass through: once a timing phase waits, no new call starts on that GPU, the calls
  running finish, and the timing phase goes (a stream of calls cannot starve it).

A timing phase's replays set up on the GPU before its hold (grader.judge.replayed.arm), holding
it shared; `setup_slot` lets at most two timing phases per GPU hold their set-up buffers at once
(the one timing, the next one ready), so jobs side by side never fill the GPU's memory with
replays waiting for their turn.

The lock folder is $GRADER_LOCK_DIR, else <tmp>/grader-locks, as the session's settings say.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from grader.settings import Settings


def lock_dir(settings: Settings) -> Path:
    folder = settings.lock_dir or Path(tempfile.gettempdir()) / "grader-locks"
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            folder.chmod(0o1777)  # every user's grader on the host shares the GPUs
        except PermissionError:
            pass
    return folder


def device_id(gpu: str | None, settings: Settings) -> str:
    """The GPU a worker started with CUDA_VISIBLE_DEVICES=gpu computes on (its first one; with
    no `gpu`, the first this process may use)."""
    visible = gpu if gpu is not None else settings.visible_gpus
    first = (visible or "0").split(",")[0].strip() or "0"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in first)


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # made by another user: a read-only descriptor locks as well
        return os.open(path, os.O_RDONLY)


@contextmanager
def gpu_phase(gpu: str | None, exclusive: bool, settings: Settings, enabled: bool = True,
              waited: Callable[[float], None] | None = None) -> Iterator[None]:
    """Hold GPU `gpu` for a correctness call (shared) or a timing phase (exclusive).
    `enabled=False` (the CPU interpreter) holds nothing. `waited` is told the seconds it
    waited for the lock (what a job loses to other jobs' timing phases)."""
    if not enabled:
        yield
        return
    base = lock_dir(settings) / f"gpu-{device_id(gpu, settings)}"
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


def timing_lock(gpu: str | None, settings: Settings, enabled: bool = True):
    """The GPU alone, for one timing phase."""
    return gpu_phase(gpu, True, settings, enabled=enabled)


SETUP_SLOTS = 2


@contextmanager
def setup_slot(gpu: str | None, settings: Settings, enabled: bool = True, slots: int = SETUP_SLOTS,
               poll_s: float = 0.02) -> Iterator[None]:
    """One of `slots` places per GPU for a timing phase's set-up buffers, held from its replays'
    set-up to their end (flock files, as the GPU's lock, tried in turn)."""
    if not enabled:
        yield
        return
    base = lock_dir(settings) / f"gpu-{device_id(gpu, settings)}"
    fds = [_open(base.with_suffix(f".setup{i}")) for i in range(slots)]
    held = None
    try:
        while held is None:
            for fd in fds:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                held = fd
                break
            else:
                time.sleep(poll_s)
        yield
    finally:
        for fd in fds:
            os.close(fd)
