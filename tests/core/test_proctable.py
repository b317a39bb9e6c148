"""grader.proctable, the one reader of the process table: a real process tree (a child that
started a grandchild) seen through each of its questions, and a process gone is no answer."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from grader import proctable

GRANDCHILD = "import time; time.sleep(60)"
CHILD = ("import subprocess, sys, time; "
         f"subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}]); time.sleep(60)")


def test_a_tree_its_owner_and_what_it_was_started_with():
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=dict(os.environ, PROCTABLE_MARK="here"))
    try:
        deadline = time.monotonic() + 30
        while not proctable.children_of(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (grandchild,) = proctable.children_of(child.pid)
        assert proctable.parent_of(grandchild) == child.pid and proctable.parent_of(child.pid) == os.getpid()
        assert proctable.tree(child.pid) == {child.pid, grandchild}
        assert child.pid in proctable.tree(os.getpid()) and grandchild in proctable.pids()
        assert {child.pid, grandchild} <= proctable.of_uid(os.getuid()) and os.geteuid() in proctable.uids_in_use()
        assert proctable.command_line(grandchild)[-2:] == [GRANDCHILD.encode(), b""]
        assert b"PROCTABLE_MARK=here" in (proctable.environment(child.pid) or [])
    finally:
        for pid in proctable.tree(child.pid):
            os.kill(pid, 9)
        child.wait()
    assert not proctable.exists(child.pid)
    assert (proctable.parent_of(child.pid), proctable.children_of(child.pid), proctable.command_line(child.pid),
            proctable.environment(child.pid)) == (None, [], None, None)


def test_the_hosts_run_queue_is_read_from_loadavg_and_counts_the_reader(monkeypatch, tmp_path):
    """/proc/loadavg's fourth field, "running/total": the reader itself is running, so at least 1;
    a file that cannot be read or parsed is no answer, never an error."""
    import builtins

    got = proctable.runnable()
    assert isinstance(got, int) and got >= 1
    real_open = builtins.open
    (tmp_path / "loadavg").write_text("0.52 0.58 0.59 7/1053 12345\n")
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(tmp_path / "loadavg" if path == "/proc/loadavg" else path, *a, **k))
    assert proctable.runnable() == 7
    (tmp_path / "loadavg").write_text("garbage\n")
    assert proctable.runnable() is None


def test_a_processs_own_share_of_the_run_queue_counts_its_spinning_threads_and_none_of_a_sleeper():
    """The student's own load is told from other jobs' (grader.judge.timing.decision.unsteady):
    a process spinning on three CPUs-worth of children is seen running; a sleeping one is not."""
    spin = "import os, time\nfor _ in range(2):\n    os.fork() or None\nend = time.time() + 20\nwhile time.time() < end: pass\n"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])
    try:
        deadline, seen = time.monotonic() + 10, 0
        while time.monotonic() < deadline and seen < 1:
            seen = proctable.running_threads(proctable.tree(busy.pid))
            time.sleep(0.05)
        assert seen >= 1  # two CPUs on this machine: at least one of the four spinners is on one at any moment
        time.sleep(0.5)
        assert proctable.running_threads({sleeper.pid}) == 0
        assert proctable.running_threads({2 ** 22 + 7}) == 0  # a process gone: no answer, never an error
    finally:
        for p in (busy, sleeper):
            for pid in sorted(proctable.tree(p.pid), reverse=True):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            p.wait()
