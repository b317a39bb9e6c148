"""Files between the grader and a worker: inputs shown to it one request at a time, the
folder it writes its outputs to, and reading those back bounded: no link followed, nothing
but a regular file, never blocking, never more than a limit."""

from __future__ import annotations

import os
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path

from grader.safefiles import UnsafeFileError, open_plain, read_plain
from grader.sandbox.isolation import Isolation


def private_folder(path: Path) -> Path:
    """`path`, made if needed, that only the grader's own user may enter (0700): a cache, a
    socket, what no worker's uid may read."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def place(source: Path, dest: Path, link: bool) -> None:
    """dest becomes source's content: a hard link if asked and possible, else a copy."""
    if link:
        try:
            os.link(source, dest)
            return
        except OSError:  # another file system, or links not allowed: copy
            pass
    shutil.copyfile(source, dest)


@contextmanager
def shown_to_worker(source: Path, workdir: Path, link: bool = False, prefix: str = ""):
    """Inputs are made outside the worker's view; each file is shown to it (a readable copy in
    the job's inputs/ folder, or a hard link where the worker cannot write it: see
    `worker_cannot_write`) only for the request that needs it, so no input can be read ahead,
    at import, and answered from a precomputed cache. `prefix`: the name's, for a stage that
    shows files beside another's at the same time (the bounds check beside the correctness calls)."""
    shown = workdir / "inputs" / f"{prefix}{source.name}"
    shown.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if stat.S_ISDIR(os.lstat(shown.parent).st_mode):  # 0755 whatever the umask (077 in a degraded sandbox)
        os.chmod(shown.parent, 0o755)
    place(source, shown, link)
    os.chmod(shown, 0o644)  # readable by the worker's uid, whatever the umask
    try:
        yield shown
    finally:
        shown.unlink(missing_ok=True)


def worker_cannot_write(isolation: Isolation) -> bool:
    """Whether a grader-owned 0644 file in a job folder is safe from that job's worker: it runs
    as another uid, or sees the job folder through a read-only mount. Then a file may be shared
    with other jobs by a hard link instead of copied."""
    return isolation.mode == "sandbox" and (isolation.user_switch or isolation.namespaces)


def output_path(workdir: Path, name: str) -> Path:
    """Where a worker may write: the job's outputs/ folder (read back without following links)."""
    path = workdir / "outputs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# a file a worker wrote that could not be read as one (a link, a FIFO, a device, a folder, too
# large, or gone): one line that says which, never a hang
WorkerFileError = UnsafeFileError

WORKER_FILE_LIMIT = 4 << 30  # the worker's own file size limit (launch.Limits.file_size)


def open_worker_file(path: Path, dir_fd: int | None = None) -> int:
    """A descriptor on a regular file a worker wrote (grader.safefiles.open_plain): never through
    a link, never blocking, never anything but a regular file; its folder opened the same way."""
    return open_plain(path, dir_fd=dir_fd)


def read_worker_file(path: Path, limit: int = WORKER_FILE_LIMIT) -> bytes:
    """The bytes of a file the worker wrote, at most `limit` of them (grader.safefiles.read_plain)."""
    return read_plain(path, limit)
