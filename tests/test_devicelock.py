"""The per-GPU lock: a timing phase has its GPU alone, across threads and processes, and a
stream of correctness calls cannot starve it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import REPO_ROOT
from grader.devicelock import device_id, gpu_phase, timing_lock


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_LOCK_DIR", str(tmp_path / "locks"))


def test_device_id_is_the_first_visible_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device_id(None) == "0" and device_id("3") == "3" and device_id("2,3") == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    assert device_id(None) == "5"
    assert device_id("GPU-1b2c/../x") == "GPU-1b2c____x"


def test_correctness_calls_share_a_gpu_and_timing_waits_for_them():
    events = []
    in_call = threading.Event()
    release = threading.Event()

    def call(name):
        with gpu_phase("0", exclusive=False):
            events.append(f"{name} in")
            in_call.set()
            release.wait(5)
            events.append(f"{name} out")

    def timing():
        with timing_lock("0"):
            events.append("timing")

    a = threading.Thread(target=call, args=("a",))
    a.start()
    in_call.wait(5)
    with gpu_phase("0", exclusive=False):  # a second call gets in beside the first
        events.append("b in")
    t = threading.Thread(target=timing)
    t.start()
    time.sleep(0.3)
    assert "timing" not in events  # call a still runs on the GPU
    release.set()
    a.join(5)
    t.join(5)
    assert events == ["a in", "b in", "a out", "timing"]


def test_waiting_timing_phase_holds_new_calls_back():
    order = []
    first_in = threading.Event()
    release = threading.Event()

    def long_call():
        with gpu_phase("0", exclusive=False):
            first_in.set()
            release.wait(5)
        order.append("long call done")

    def timing():
        with timing_lock("0"):
            order.append("timing")

    def late_call():
        with gpu_phase("0", exclusive=False):
            order.append("late call")

    threads = [threading.Thread(target=long_call)]
    threads[0].start()
    first_in.wait(5)
    threads.append(threading.Thread(target=timing))
    threads[1].start()
    time.sleep(0.3)  # the timing phase now waits at the turnstile
    threads.append(threading.Thread(target=late_call))
    threads[2].start()
    time.sleep(0.3)
    assert order == []  # the late call queues behind the waiting timing phase
    release.set()
    for t in threads:
        t.join(5)
    assert order.index("timing") < order.index("late call")


def test_other_gpus_and_the_interpreter_are_not_held():
    done = []

    def other_gpu():
        with timing_lock("1"):
            done.append("gpu 1")

    with timing_lock("0"):
        t = threading.Thread(target=other_gpu)
        t.start()
        t.join(2)
        with gpu_phase("0", exclusive=True, enabled=False):  # the CPU interpreter takes no lock
            done.append("interpreter")
    assert done == ["gpu 1", "interpreter"]


def test_a_timing_phase_in_another_process_excludes_this_one(tmp_path):
    script = textwrap.dedent("""
        import sys, time
        from grader.devicelock import timing_lock
        with timing_lock("0"):
            print("held", flush=True)
            time.sleep(1.5)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    start = time.monotonic()
    with timing_lock("0"):
        waited = time.monotonic() - start
    proc.wait(10)
    assert waited > 0.8
