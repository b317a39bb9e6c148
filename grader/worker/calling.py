"""The one path by which a worker calls a contender's function.

A function that reads its own stack (`inspect`) could tell a call the grader times from one it
does not by the grader's frames above it: the burst's loop, the recorder, the correctness call.
So every such call is made on one thread of the worker's, from one frame (`Caller._serve`): the
frames above the function are the same for a correctness call, the recorded call and every call
of every burst, captured or queued. The grader's own work between calls (inputs redrawn, the cache
flushed, samples taken) stays on the worker's main thread, on the same CUDA stream, in order.

What that thread carries from the asking thread: its current CUDA stream (a capture's stream
during a CUDA graph capture, so the calls' launches and allocations are captured) and a context
to hold around the call (the untimed calls' dispatch mode, which torch keeps per thread). What a
function can still observe is in docs/security.md ("A function that cannot tell it is being
timed"); none of it changes its score.
"""

from __future__ import annotations

import queue
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Sequence


class _Job:
    __slots__ = ("fn", "args", "stream", "around", "done", "value", "error")

    def __init__(self, fn: Callable, args: Sequence, stream: Any, around: AbstractContextManager | None) -> None:
        self.fn, self.args, self.stream, self.around = fn, args, stream, around
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class Caller:
    """Calls functions on its own thread, one at a time, each from the same frame."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="calls", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def call(self, fn: Callable, args: Sequence, around: AbstractContextManager | None = None) -> Any:
        """`fn(*args)` on the calling thread's current CUDA stream (where CUDA is in use), inside
        `around`; its result, or what it raised, raised here."""
        job = _Job(fn, args, _current_stream(), around)
        self._jobs.put(job)
        job.done.wait()
        if job.error is not None:
            error, job.error = job.error, None
            raise error
        return job.value

    def _serve(self) -> None:
        """The only frame a contender's function is ever called from."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                with _on_stream(job.stream), job.around if job.around is not None else nullcontext():
                    job.value = job.fn(*job.args)
            except BaseException as exc:  # noqa: BLE001 - raised again in the asking thread
                job.error = exc
            job.done.set()

    def close(self) -> None:
        self._jobs.put(None)


def _current_stream() -> Any:
    """The asking thread's current CUDA stream, or None where CUDA is not initialized (the
    interpreter): torch keeps the current stream per thread."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_stream()


def _on_stream(stream: Any) -> AbstractContextManager:
    if stream is None:
        return nullcontext()
    import torch

    return torch.cuda.stream(stream)


_CALLER: Caller | None = None
_LOCK = threading.Lock()


def caller() -> Caller:
    """The worker's one Caller, started at its first call."""
    global _CALLER
    with _LOCK:
        if _CALLER is None:
            _CALLER = Caller()
        return _CALLER


def call(fn: Callable, args: Sequence, around: AbstractContextManager | None = None) -> Any:
    """A contender's function called the one way every call of it is made (Caller.call)."""
    return caller().call(fn, args, around)
