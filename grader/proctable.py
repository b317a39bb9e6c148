"""The process table, read in one place: which processes exist, their parents and children,
whose they are, what they were started with. Every module that looks at other processes
(/proc/<pid>/...) asks here; a process's own /proc/self stays its caller's.

Standard library only, at the bottom of the package: the sandbox's init imports it before it
gives up the host's files, and a process may end between two reads of it, so every reader
takes a vanished process as no answer, never as an error."""

from __future__ import annotations

import os


def runnable() -> int | None:
    """Threads ready to run on the host now (/proc/loadavg's fourth field, this reader included),
    None where it cannot be read: more of them than CPUs, and a clock on the host measures the
    scheduler's queue as much as the work it brackets."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def running_threads(processes: set[int]) -> int:
    """How many threads of `processes` are running or ready to run now (state R in each task's
    stat): a process's own share of the host's run queue (`runnable`)."""
    count = 0
    for pid in processes:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            count += state == "R"
    return count


def pids() -> list[int]:
    """Every process in this PID namespace's table now."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def exists(pid: int) -> bool:
    """Whether `pid` is in the table (a zombie still is)."""
    return os.path.exists(f"/proc/{pid}")


def parent_of(pid: int) -> int | None:
    """`pid`'s parent (its stat's fourth field, read after the command name, which may hold
    spaces and parentheses), or None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def children_of(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc/PID/task/*/children, else a scan of the table)."""
    kids: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(p) for p in f.read().split())
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{pid}/task"):
            return []
        kids = {p for p in pids() if parent_of(p) == pid}
    except OSError:
        return []
    return sorted(kids)


def tree(pid: int) -> set[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for p in pids():
        parent = parent_of(p)
        if parent is not None:
            children.setdefault(parent, []).append(p)
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(children.get(p, []))
    return found


def of_uid(uid: int) -> set[int]:
    """Every process whose real uid is `uid`."""
    found = set()
    for p in pids():
        try:
            with open(f"/proc/{p}/status") as f:
                line = next(x for x in f if x.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if int(line.split()[1]) == uid:
            found.add(p)
    return found


def uids_in_use() -> set[int]:
    """The uids that own a process now (the owner of its /proc entry: its effective uid)."""
    uids = set()
    for p in pids():
        try:
            uids.add(os.stat(f"/proc/{p}").st_uid)
        except OSError:
            pass
    return uids


def command_line(pid: int) -> list[bytes] | None:
    """`pid`'s arguments as it was started (None where it is gone or not readable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def environment(pid: int) -> list[bytes] | None:
    """`pid`'s environment as it was started, NAME=value each (None where it is not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None
