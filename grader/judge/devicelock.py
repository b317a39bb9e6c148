"""One timing phase per GPU at a time, across threads and processes.

Correctness calls of several jobs may share a GPU; a timing phase must have it alone, or
another job's kernels would run inside its measurements. Each GPU has a reader-writer lock
made of two lock files (flock, so separate grader processes on the host honour it too, and a
killed holder releases it with its last file descriptor):

- a correctness call holds the GPU's lock shared;
- a timing phase holds it exclusive, and first takes the turnstile, which new correctness
  calls pass through: once a timing phase waits, no new call starts on that GPU, the calls
  running finish, and the timing phase goes (a stream of calls cannot starve it).

A timing phase's replays set up on the GPU before its hold (grader.judge.replay_process.arm), holding
it shared; `setup_slot` lets at most two timing phases per GPU hold their set-up buffers at once
(the one timing, the next one ready), so jobs side by side never fill the GPU's memory with
replays waiting for their turn.

The lock folder is, by default, this user's own (`Settings.own_lock_dir`: in $XDG_RUNTIME_DIR,
else beside the user's cache), a `trusted_folder` of kind PRIVATE: no other user can make it
first (a folder in /tmp anyone may make, and so refuse every GPU run until an admin removes it).
Sharing the GPUs with other users' graders is opt-in: $GRADER_LOCK_DIR names a folder every user's
grader on the host shares, root's included (docs/security.md), made by root (mkdir -m 1777): a
`trusted_folder` of kind SHARED (root's or ours, sticky where others may write, no other user's
folder on its way). Each lock file is opened relative to it, never through a link, never
blocking, and only as a regular file of root's or ours with no other name: a lock file another
user made could be removed and made again under a timing phase (two would hold the GPU), a link
or a FIFO would make the grader open what it should not or stall. Those are refused
(UnsafeFolderError) with the reason and the fix.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, ContextManager, Iterable, Iterator

from grader.safefiles import PRIVATE, SHARED, UnsafeFolderError, trusted_folder
from grader.settings import Settings

OWN_FIX = ("set XDG_RUNTIME_DIR or XDG_CACHE_HOME to a folder of yours, or GRADER_LOCK_DIR to the folder of "
           "locks every user's grader on the host shares (made by root: mkdir -m 1777)")
FIX = ("set GRADER_LOCK_DIR to a folder only root or you may change (root's sticky folder for every user's "
       "grader on the host: mkdir -m 1777 as root), and remove the lock files another user made")


def lock_dir(settings: Settings) -> Path:
    return settings.lock_dir or settings.own_lock_dir


def _lock_folder(settings: Settings) -> int:
    """A descriptor on the lock folder, or UnsafeFolderError: GRADER_LOCK_DIR's, shared by every
    user's grader on the host (made 1777 where missing); else this user's own (0700)."""
    if settings.lock_dir is None:
        return trusted_folder(settings.own_lock_dir, "GPU lock folder", OWN_FIX, kind=PRIVATE)
    return trusted_folder(settings.lock_dir, "GPU lock folder (GRADER_LOCK_DIR)", FIX, kind=SHARED)


def _open(folder: int, name: str) -> int:
    """Lock file `name` in `folder`, made where missing (0666: other users' graders lock it too);
    never through a link, never blocking; only a regular file of root's or ours with one name."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | flags, 0o666, dir_fd=folder)
        except PermissionError:  # made by root: a read-only descriptor locks as well
            fd = os.open(name, os.O_RDONLY | flags, dir_fd=folder)
    except OSError as exc:
        why = "is a link" if exc.errno == errno.ELOOP else f"cannot be opened ({os.strerror(exc.errno or 0)})"
        raise UnsafeFolderError(f"the GPU lock file {_shown(folder, name)} {why} ({FIX})") from None
    st = os.fstat(fd)
    why = ("is not a regular file" if not stat.S_ISREG(st.st_mode)
           else f"belongs to uid {st.st_uid}: that user may remove it and make another while a timing phase holds it"
           if st.st_uid not in (0, os.getuid())
           else "has another name (a hard link)" if st.st_nlink != 1 else "")
    if why:
        os.close(fd)
        raise UnsafeFolderError(f"the GPU lock file {_shown(folder, name)} {why} ({FIX})")
    return fd


def _shown(folder: int, name: str) -> str:
    try:
        return os.path.join(os.readlink(f"/proc/self/fd/{folder}"), name)
    except OSError:
        return name


def refuse_unsafe_locks(gpus: Iterable[str | None], settings: Settings) -> None:
    """The lock folder and the lock files of `gpus`, checked as each hold will check them
    (UnsafeFolderError): a GPU check or class run is refused before it grades anything."""
    for gpu in set(gpus):
        base = f"gpu-{device_id(gpu, settings)}"
        parts = ["turnstile", "lock", *(f"setup{i}" for i in range(SETUP_SLOTS))]
        try:
            fds = _open_all(settings, [f"{base}.{part}" for part in parts])
        except OSError as exc:  # no right to make it, a read-only file system: one line too
            raise UnsafeFolderError(f"the GPU lock folder {lock_dir(settings)} cannot be used "
                                    f"({exc.strerror or exc}): {FIX}") from None
        for fd in fds:
            os.close(fd)


def _open_all(settings: Settings, names: list[str]) -> list[int]:
    folder = _lock_folder(settings)
    fds: list[int] = []
    try:
        for name in names:
            fds.append(_open(folder, name))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        os.close(folder)
    return fds


def device_id(gpu: str | None, settings: Settings) -> str:
    """The GPU a worker started with CUDA_VISIBLE_DEVICES=gpu computes on (its first one; with
    no `gpu`, the first this process may use)."""
    visible = gpu if gpu is not None else settings.visible_gpus
    first = (visible or "0").split(",")[0].strip() or "0"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in first)


@contextmanager
def gpu_phase(gpu: str | None, exclusive: bool, settings: Settings, enabled: bool = True,
              waited: Callable[[float], None] | None = None) -> Iterator[None]:
    """Hold GPU `gpu` for a correctness call (shared) or a timing phase (exclusive).
    `enabled=False` (the CPU interpreter) holds nothing. `waited` is told the seconds it
    waited for the lock (what a job loses to other jobs' timing phases)."""
    if not enabled:
        yield
        return
    base = f"gpu-{device_id(gpu, settings)}"
    turnstile, main = _open_all(settings, [f"{base}.turnstile", f"{base}.lock"])
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


def timing_lock(gpu: str | None, settings: Settings, enabled: bool = True) -> ContextManager[None]:
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
    base = f"gpu-{device_id(gpu, settings)}"
    fds = _open_all(settings, [f"{base}.setup{i}" for i in range(slots)])
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
