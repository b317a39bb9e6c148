"""The per-GPU lock: a timing phase has its GPU alone, across threads and processes, and a
stream of correctness calls cannot starve it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from grader.judge.devicelock import device_id, gpu_phase, timing_lock
from grader.settings import Settings, from_environment


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    """The settings the locks are given: the test's own lock folder (also in the environment, which
    a second process reads its settings from)."""
    monkeypatch.setenv("GRADER_LOCK_DIR", str(tmp_path / "locks"))
    return from_environment({"GRADER_LOCK_DIR": str(tmp_path / "locks")})


def test_device_id_is_the_first_visible_gpu():
    unset = from_environment({})
    assert device_id(None, unset) == "0" and device_id("3", unset) == "3" and device_id("2,3", unset) == "2"
    visible = from_environment({"CUDA_VISIBLE_DEVICES": "5,6"})
    assert device_id(None, visible) == "5" and device_id("3", visible) == "3"
    assert device_id("GPU-1b2c/../x", unset) == "GPU-1b2c____x"


def lock_file(gpu: str, part: str) -> Path:
    return Path(os.environ["GRADER_LOCK_DIR"]) / f"gpu-{gpu}.{part}"


def wait_until_blocked(path: Path, waiters: int = 1, pid: int | None = None) -> None:
    """Until `waiters` flock requests on `path` (of process `pid`, default this one) are queued,
    blocked, in the kernel's lock table: a condition, not a guess at how long a thread takes."""
    pid = pid or os.getpid()
    deadline = time.monotonic() + 120
    while True:
        ino = os.stat(path).st_ino if path.exists() else None
        blocked = [line for line in Path("/proc/locks").read_text().splitlines()
                   if ino is not None and " -> " in f" {line} " and line.split()[5] == str(pid) and line.split()[6].endswith(f":{ino}")]
        if len(blocked) >= waiters:
            return
        assert time.monotonic() < deadline, f"no {waiters} blocked lock request(s) on {path}: {Path('/proc/locks').read_text()}"
        time.sleep(0.01)


def test_correctness_calls_share_a_gpu_and_timing_waits_for_them(settings):
    events = []
    in_call = threading.Event()
    release = threading.Event()

    def call(name):
        with gpu_phase("0", False, settings):
            events.append(f"{name} in")
            in_call.set()
            release.wait()
            events.append(f"{name} out")

    def timing():
        with timing_lock("0", settings):
            events.append("timing")

    a = threading.Thread(target=call, args=("a",))
    a.start()
    assert in_call.wait(60)
    with gpu_phase("0", False, settings):  # a second call gets in beside the first
        events.append("b in")
    t = threading.Thread(target=timing)
    t.start()
    wait_until_blocked(lock_file("0", "lock"))  # the timing phase waits for call a ...
    assert "timing" not in events
    release.set()  # ... and goes once it is done
    a.join(60)
    t.join(60)
    assert events == ["a in", "b in", "a out", "timing"]


def test_waiting_timing_phase_holds_new_calls_back(settings):
    order = []
    first_in = threading.Event()
    release = threading.Event()

    def long_call():
        with gpu_phase("0", False, settings):
            first_in.set()
            release.wait()
        order.append("long call done")

    def timing():
        with timing_lock("0", settings):
            order.append("timing")

    def late_call():
        with gpu_phase("0", False, settings):
            order.append("late call")

    threads = [threading.Thread(target=long_call)]
    threads[0].start()
    assert first_in.wait(60)
    threads.append(threading.Thread(target=timing))
    threads[1].start()
    wait_until_blocked(lock_file("0", "lock"))  # the timing phase holds the turnstile, waits for the GPU
    threads.append(threading.Thread(target=late_call))
    threads[2].start()
    wait_until_blocked(lock_file("0", "turnstile"))  # the late call queues at the turnstile
    assert order == []
    release.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert order.index("timing") < order.index("late call")


def test_other_gpus_and_the_interpreter_are_not_held(settings):
    done = []

    def other_gpu():
        with timing_lock("1", settings):
            done.append("gpu 1")

    with timing_lock("0", settings):
        t = threading.Thread(target=other_gpu)
        t.start()
        t.join(60)  # not held: it goes at once (a wrong lock would keep it waiting until the end)
        assert not t.is_alive()
        with gpu_phase("0", True, settings, enabled=False):  # the CPU interpreter takes no lock
            done.append("interpreter")
    assert done == ["gpu 1", "interpreter"]


def test_a_timing_phase_in_another_process_excludes_this_one(tmp_path, settings):
    script = textwrap.dedent("""
        import sys
        from grader.judge.devicelock import timing_lock
        from grader.settings import current
        with timing_lock("0", current()):
            print("held", flush=True)
            sys.stdin.readline()  # held until told to let go
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "held"
        got = threading.Event()

        def take():
            with timing_lock("0", settings):
                got.set()

        t = threading.Thread(target=take)
        t.start()
        wait_until_blocked(lock_file("0", "turnstile"))  # the other process holds it: this one waits
        assert not got.is_set()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert got.wait(60)  # and goes once it is let go
        t.join(60)
    finally:
        proc.stdin.close()
        proc.wait(60)


def test_a_call_says_how_long_it_waited_behind_a_timing_phase(settings):
    """The job's record tells the calls' wait for the GPU apart from their own time."""
    waits: list[float] = []
    with gpu_phase("0", False, settings, waited=waits.append):
        pass
    assert len(waits) == 1 and waits[0] < 0.5  # nobody else: no wait
    timing_in = threading.Event()

    def timing():
        with timing_lock("0", settings):
            timing_in.set()
            time.sleep(0.6)

    holder = threading.Thread(target=timing)
    holder.start()
    assert timing_in.wait(60)
    with gpu_phase("0", False, settings, waited=waits.append):
        pass
    holder.join(60)
    assert waits[1] >= 0.4  # the call waited for the timing phase to end
    with gpu_phase("0", False, settings, enabled=False, waited=waits.append):
        pass
    assert len(waits) == 2  # the interpreter holds nothing and waits for nothing


def test_at_most_two_timing_phases_hold_set_up_buffers_per_gpu(settings):
    """Replays set up before their hold wait for a set-up slot: two per GPU at once (the one
    timing and the next), a third waits until one is left; another GPU's slots are its own."""
    from grader.judge.devicelock import setup_slot

    inside, most, lock = [0], [0], threading.Lock()
    other_gpu_entered = threading.Event()

    def phase(gpu: str) -> None:
        with setup_slot(gpu, settings, poll_s=0.005):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.3)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=phase, args=("0",)) for _ in range(5)]
    began = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(0.05)
    with setup_slot("1", settings):  # GPU 1's slots are free while GPU 0's are full
        other_gpu_entered.set()
    assert other_gpu_entered.is_set() and time.monotonic() - began < 0.3
    for t in threads:
        t.join()
    assert most[0] == 2, most
    assert time.monotonic() - began >= 0.3 * 3 - 0.05  # five phases, two at a time: three turns
    with setup_slot("0", settings, enabled=False), setup_slot("0", settings, enabled=False), \
            setup_slot("0", settings, enabled=False):  # the interpreter holds nothing
        pass
