"""Every call of a contender's function has the same frames above it (grader.worker.calling):
a function that reads its stack, as tests/fixtures/gpu/cheat_grader_frames does, learns nothing
from it about which call is timed. The burst's own loop needs CUDA (its GPU test is
tests/gpu/test_gpu.py, the frames fixture); here its call site is called as it calls."""

from __future__ import annotations

import inspect
import threading
from collections import Counter

import pytest
import torch

from grader.worker import calling, server


def _above() -> list[tuple[str, str]]:
    """The frames above the caller, as a student's code reads them (inspect)."""
    return [(f.filename, f.function) for f in inspect.stack(0)[2:]]


def test_the_frames_above_a_function_are_the_same_for_every_kind_of_call(tmp_path):
    seen: list[list[tuple[str, str]]] = []

    def student(x, y):
        seen.append(_above())
        return x + y

    args = {"x": torch.ones(4), "y": torch.ones(4)}
    server._called(student, args, Counter())  # a correctness call, its ops counted
    server._called(student, args, None)  # a call whose ops are not counted

    def burst_loop():  # the burst's loop (grader.worker.timing.Burst._body) calls it this way, from its own frame
        return calling.call(student, list(args.values()))

    burst_loop()
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2], seen
    grader_frames = {name for path, name in seen[0] if "/grader/" in path.replace("\\", "/")}
    assert grader_frames == {"_serve"}, seen[0]  # nothing of the call site: not _called, not _body, not the loop


def test_what_the_function_raises_is_raised_in_the_asking_thread_with_its_frames():
    def student():
        raise ValueError("x and y differ")

    with pytest.raises(ValueError, match="differ") as got:
        calling.call(student, [])
    assert any(tb.name == "student" for tb in got.traceback)
    assert calling.call(lambda: 7, []) == 7  # the caller still serves after a call that raised


def test_the_context_is_held_around_the_call_on_the_callers_thread():
    held_on: list[str] = []

    class Around:
        def __enter__(self):
            held_on.append(threading.current_thread().name)

        def __exit__(self, *exc):
            held_on.append("out")

    calling.call(lambda: held_on.append("called"), [], Around())
    assert held_on == ["calls", "called", "out"]  # torch's dispatch modes are per thread: entered where the call runs


def test_the_callers_thread_is_not_taken_for_a_thread_the_call_started(monkeypatch):
    """`_called` waits (up to THREAD_GRACE_S) for threads a call started; the caller's own thread,
    started at the worker's first call, is the worker's: that call does not wait for it."""
    import time

    monkeypatch.setattr(calling, "_CALLER", None)  # this is the worker's first call
    began = time.monotonic()
    server._called(lambda x: x, {"x": torch.ones(2)}, None)
    assert time.monotonic() - began < server.THREAD_GRACE_S / 2 and calling.caller().thread.is_alive()
    started: list[threading.Thread] = []

    def student(x):
        t = threading.Thread(target=lambda: time.sleep(0.2))
        t.start()
        started.append(t)
        return x

    server._called(student, {"x": torch.ones(2)}, None)
    assert started and not started[0].is_alive()  # a thread of the call's own is still waited for
