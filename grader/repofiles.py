"""A student's repo read by the trusted side without ever being followed out of it.

Every byte of the repo is the student's: a link may point at a TA's file, a path in
`grader.toml` may climb out with `..`, a file the grader expects may be a FIFO (an open that
never returns), a device or 10 GB. So the trusted side reads the repo only through here:
a path is resolved (links and `..` included) and must land inside the repo's own real folder;
what is read must be a regular file, checked before it is opened and again on the open file,
and is read up to a limit. The worker's private copy is made here too, by a walk that needs
no recursion, recreates the repo's links only where they stay inside it, and leaves out
special files and whatever is past the limits (what it left out is counted, never followed).
"""

from __future__ import annotations

import ast
import os
import stat
import threading
from collections import Counter
from pathlib import Path
from typing import Callable

TEXT_LIMIT = 2 * 1024 * 1024  # a module or config the trusted side reads: larger is not read
COPY_MAX_DEPTH = 64  # folders deeper than this are not copied
COPY_MAX_FILES = 20_000
COPY_MAX_BYTES = 1 << 30
# CPython 3.11 and 3.12 count the AST converter's depth in state every thread shares: two
# ast.parse calls at once (assignments graded at once, each scanned) can fail with "SystemError:
# AST constructor recursion depth mismatch" (Python's own traceback formatting parses too). One
# parse at a time here, tried again where another thread's parse got in between.
_ONE_PARSE = threading.Lock()


class RepoFileError(Exception):
    """A file of the repo that the trusted side will not read (the message says why, in words
    a student can act on)."""


def real_root(root: Path | str) -> str:
    return os.path.realpath(root)


def inside(root: Path | str, path: Path | str) -> bool:
    """Whether `path` (already resolved) is `root` or lies under it."""
    root, path = os.fspath(root), os.fspath(path)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve(root: Path | str, relative: Path | str) -> Path:
    """The real path of `relative` (links and `..` resolved) under the repo `root`; raises
    RepoFileError where it leads outside the repo (or was absolute)."""
    base = real_root(root)
    text = os.fspath(relative)
    if "\0" in text:
        raise RepoFileError("has a null byte in its name")
    if os.path.isabs(text):
        raise RepoFileError("is an absolute path: it must be relative to the repository")
    real = os.path.realpath(os.path.join(base, text))
    if not inside(base, real):
        raise RepoFileError("leads outside the repository (through a link or ..); only files inside it are read")
    return Path(real)


def regular_file(root: Path | str, relative: Path | str) -> Path | None:
    """The real path of a regular file inside the repo; None where nothing is there; raises
    RepoFileError where the path leads outside or is not a regular file (a folder, a FIFO, a
    socket, a device)."""
    path = resolve(root, relative)
    try:
        st = os.stat(path, follow_symlinks=False)  # resolved: no link is left to follow
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RepoFileError(f"cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise RepoFileError(f"is not a regular file (a {_kind(st.st_mode)})")
    return path


def parse_python(source: str, filename: str = "<student>") -> ast.Module:
    """A student's source parsed (never run), one parse at a time in this process: SyntaxError,
    ValueError, RecursionError or MemoryError where it cannot be read."""
    with _ONE_PARSE:
        for _ in range(2):
            try:
                return ast.parse(source, filename=filename)
            except SystemError:  # the depth shared with another thread's parse (a traceback's): once more
                continue
        try:
            return ast.parse(source, filename=filename)
        except SystemError as exc:  # still: as unreadable to us as too deep a nesting
            raise RecursionError(str(exc)) from None


def read_bytes(root: Path | str, relative: Path | str, limit: int = TEXT_LIMIT) -> bytes:
    """At most `limit` bytes of a regular file inside the repo; FileNotFoundError where there
    is none, RepoFileError where it is not one to read (outside, not a regular file, larger
    than `limit`)."""
    path = regular_file(root, relative)
    if path is None:
        raise FileNotFoundError(os.fspath(relative))
    return _read_regular(path, limit)


def read_text(root: Path | str, relative: Path | str, limit: int = TEXT_LIMIT) -> str:
    """read_bytes as text; bytes that are not UTF-8 are replaced."""
    return read_bytes(root, relative, limit).decode("utf-8", errors="replace")


def _read_regular(path: Path, limit: int) -> bytes:
    try:  # O_NONBLOCK: a FIFO swapped in since the stat opens at once, and fstat refuses it
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise RepoFileError(f"cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RepoFileError(f"is not a regular file (a {_kind(st.st_mode)})")
        if st.st_size > limit:
            raise RepoFileError(f"is too large ({st.st_size} bytes; at most {limit} are read)")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise RepoFileError(f"is too large (more than {limit} bytes)")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISLNK, "link")):
        if test(mode):
            return word
    return "special file"


def find(root: Path, name: str, skip: tuple[str, ...] = (".git",), max_depth: int = COPY_MAX_DEPTH,
         max_folders: int = 20_000) -> list[Path]:
    """Regular files called `name` in the repo (not through links, not in `skip` folders, at
    most `max_depth` deep), by an explicit walk: a tree 1,200 folders deep is no recursion."""
    found: list[Path] = []
    stack, seen = [(Path(real_root(root)), 0)], 0
    while stack and seen < max_folders:
        folder, depth = stack.pop()
        seen += 1
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and entry.name not in skip and depth < max_depth:
                stack.append((Path(entry.path), depth + 1))
            elif stat.S_ISREG(st.st_mode) and entry.name == name:
                found.append(Path(entry.path))
    return sorted(found)


def copy_tree(src: Path, dest: Path, ignore: Callable[[str, list[str]], set[str]] | None = None,
              max_depth: int = COPY_MAX_DEPTH, max_files: int = COPY_MAX_FILES,
              max_bytes: int = COPY_MAX_BYTES) -> Counter:
    """Copy the repo `src` to the new folder `dest` for a worker, and count what was left out.

    Folders and regular files are copied (modes kept); a link is recreated, relative, only where
    its target resolves inside `src` (a link to a file of the repo still works in the copy);
    a link out of the repo, a FIFO, a socket or a device is left out, as is what lies deeper
    than `max_depth` folders or past `max_files` files or `max_bytes` bytes. Nothing is followed:
    folders are walked by an explicit stack, files opened with O_NOFOLLOW and checked again."""
    base = real_root(src)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.mkdir(mode=0o755)  # a new folder: the copy is written into nothing that was there
    left_out: Counter = Counter()
    files = size = 0
    stack: list[tuple[str, Path, int]] = [(base, dest, 0)]
    while stack:
        folder, copy, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            left_out["folders that could not be read"] += 1
            continue
        skip = ignore(folder, [e.name for e in entries]) if ignore else set()
        for entry in entries:
            if entry.name in skip:
                continue
            target = copy / entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                left_out["files that could not be read"] += 1
                continue
            if stat.S_ISLNK(st.st_mode):
                real = os.path.realpath(entry.path)
                if not inside(base, real):
                    left_out["links that lead outside the repository"] += 1
                    continue
                mapped = dest / os.path.relpath(real, base)
                os.symlink(os.path.relpath(mapped, copy), target)
            elif stat.S_ISDIR(st.st_mode):
                if depth + 1 > max_depth:
                    left_out[f"folders deeper than {max_depth} levels"] += 1
                    continue
                target.mkdir(mode=0o755)
                stack.append((entry.path, target, depth + 1))
            elif stat.S_ISREG(st.st_mode):
                if files >= max_files or size + st.st_size > max_bytes:
                    left_out[f"files past the limit ({max_files} files, {max_bytes >> 20} MiB)"] += 1
                    continue
                if _copy_file(entry.path, target, max_bytes - size):
                    files += 1
                    size += st.st_size
                else:
                    left_out["files that could not be read"] += 1
            else:
                left_out["special files (FIFOs, sockets, devices)"] += 1
    return left_out


def _copy_file(src: str, dest: Path, limit: int) -> bool:
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return False
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      (st.st_mode & 0o777) | 0o600)
        try:
            left = st.st_size
            while left > 0:  # the size seen at the stat, no more: a file that grows is cut there
                sent = os.sendfile(out, fd, None, min(left, 1 << 24))
                if sent == 0:
                    break
                left -= sent
            os.fchmod(out, (st.st_mode & 0o777) | 0o600)  # as the repo's, without setuid bits
        finally:
            os.close(out)
        return True
    finally:
        os.close(fd)
