"""Dedicated uids for workers (when the grader is root): a uid no account owns and no process
runs as, lent to one job at a time, and the job folder handed to it."""

from __future__ import annotations

import fcntl
import os
import pwd
import stat
import tempfile
import threading
from pathlib import Path

from grader.proctable import uids_in_use
from grader.sandbox.isolation import SandboxError

# uids for workers: above login.defs' UID_MAX (60000), below systemd's dynamic users (61184)
UID_RANGE: str | None = None  # a test may pin it; else the session's GRADER_SANDBOX_UIDS (grader.settings)


def uid_range(configured: str) -> str:
    return UID_RANGE or configured


class UidLease:
    """A uid (and gid of the same number) from UID_RANGE that no account owns, no process
    runs as, and no other worker holds (an flock on a file per uid, across grader processes)."""

    def __init__(self, uids: str) -> None:
        first, last = (int(x) for x in uid_range(uids).split("-"))
        folder = (Path("/run/grader-sandbox") if os.access("/run", os.W_OK)
                  else Path(tempfile.gettempdir()) / "grader-sandbox-uids")
        folder.mkdir(mode=0o700, exist_ok=True)
        if folder.is_symlink() or folder.stat().st_uid != os.geteuid():
            raise SandboxError(f"{folder} is not the grader's own folder")
        busy = uids_in_use()
        for uid in range(first, last + 1):
            if uid in busy or _has_account(uid):
                continue
            fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self.fd = uid, fd
            return
        raise SandboxError(f"no free worker uid in {uid_range(uids)} (set GRADER_SANDBOX_UIDS=first-last)")

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class JobLease:
    """The uid of a job's workers, shared by every worker of that job alive at once. Each
    start hands the job folder to its worker's uid, so a second uid (the interpreter replay
    started beside the GPU worker) would lock the first worker out of its own outputs/."""

    _held: dict[str, list] = {}  # job folder -> [UidLease, workers using it]
    _lock = threading.Lock()

    def __init__(self, job: Path, uids: str) -> None:
        """`uids`: the range a new lease takes its uid from (Settings.sandbox_uids)."""
        self.key: str | None = str(Path(job).resolve())
        with self._lock:
            entry = self._held.get(self.key)
            if entry is None:
                entry = self._held[self.key] = [UidLease(uids), 0]
            entry[1] += 1
            self.uid = entry[0].uid

    def release(self) -> None:
        if self.key is None:
            return
        key, self.key = self.key, None
        with self._lock:
            entry = self._held[key]
            entry[1] -= 1
            if entry[1] == 0:
                entry[0].release()
                del self._held[key]


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def chown_tree(folder: Path, uid: int, gid: int) -> None:
    """Give the worker's uid its job folder. Never follows a link: a submission may hold a
    symlink to /etc/shadow, and chown through it would hand that file over. Never hands over a
    file with a second hard link either: it is shared beyond the job (the run's input sets,
    grader.judge.runcache), and its owner is who may write it."""
    os.chown(folder, uid, gid, follow_symlinks=False)
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(parent, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                continue
            os.chown(path, uid, gid, follow_symlinks=False)
