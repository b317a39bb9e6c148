"""GPU timing, run inside a worker: one method for student, reference and vendor alike.

Each timed call: a device-wide synchronize (work a call left on any stream ends there, inside
the loop's wall time), flush L2 by zeroing a buffer twice its size, a short GPU sleep, then
CUDA events around the call alone. The flush and the sleep keep the GPU busy while the host
runs the call's Python and launches its kernels, so the events time the GPU's work and not
the host's launch latency (without that shadow an idle GPU records the start event at once,
and every call is charged some 40-120 us of Python: a quarter of a 0.3 ms kernel). Compile and
autotune happen in the first call and the warm-up calls, outside the timing (the first call's
time is reported: TAs want it). A wall clock around the whole loop, closed by a device-wide
synchronize, is returned too: work hidden on another stream or thread shows up there but not
in the events.

Everything this module calls is bound when it is imported, before any student module is,
so a student who monkeypatches torch.cuda.Event or synchronize does not change what we
measure; `tampered()` reports such patches as evidence.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_synchronize = torch.cuda.synchronize
_sleep = torch.cuda._sleep
_clock = time.perf_counter

# GPU cycles of sleep before each timed call: about 1 ms at Hopper's clocks, which with the
# flush covers a call's host overhead (a plain Triton launch takes tens of us; an autotuned one
# that builds three TMA descriptors, over 100 us: a 50 us sleep still charged that to the kernel).
# 200 us sufficed for one grade alone; batch grading runs other jobs' workers on the same CPUs,
# where a wrapper's Python can take longer, so the margin is five times that. It costs 1 ms of
# GPU time per timed call, outside the events.
LAUNCH_SHADOW_CYCLES = 2_000_000

_WATCHED = {
    "torch.cuda.Event": (lambda: torch.cuda.Event, _Event),
    "torch.cuda.Event.record": (lambda: torch.cuda.Event.record, _record),
    "torch.cuda.Event.elapsed_time": (lambda: torch.cuda.Event.elapsed_time, _elapsed),
    "torch.cuda.synchronize": (lambda: torch.cuda.synchronize, _synchronize),
    "torch.cuda._sleep": (lambda: torch.cuda._sleep, _sleep),
    "time.perf_counter": (lambda: time.perf_counter, _clock),
}

_FLUSH: torch.Tensor | None = None


def tampered() -> list[str]:
    """Names of the timing functions that no longer are what they were at import."""
    return [name for name, (current, original) in _WATCHED.items() if current() is not original]


def _flush_buffer() -> torch.Tensor:
    global _FLUSH
    if _FLUSH is None:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
        _FLUSH = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device="cuda")
    return _FLUSH


def device_name() -> str:
    return torch.cuda.get_device_name(0)


def time_function(
    fn: Callable,
    arg_sets: Sequence[Sequence],
    reps: int,
    warmup: int = 3,
    on_timed_start: Callable[[], None] | None = None,
) -> dict:
    """Per-call times (ms) of fn over `reps` calls, rotating through arg_sets.

    Returns times_ms, wall_ms (the loop by the host clock, flushes and sleeps included), first_call_ms,
    and `outputs`: the result of the last timed call on each input set, for validation.
    """
    flush = _flush_buffer()
    _synchronize()
    t0 = _clock()
    fn(*arg_sets[0])
    _synchronize()
    first_call_ms = (_clock() - t0) * 1e3
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    _synchronize()

    starts = [_Event(enable_timing=True) for _ in range(reps)]
    ends = [_Event(enable_timing=True) for _ in range(reps)]
    outputs: list = [None] * len(arg_sets)
    if on_timed_start:
        on_timed_start()
    wall0 = _clock()
    for i in range(reps):
        _synchronize()
        flush.zero_()
        _sleep(LAUNCH_SHADOW_CYCLES)
        _record(starts[i])
        out = fn(*arg_sets[i % len(arg_sets)])
        _record(ends[i])
        outputs[i % len(arg_sets)] = out
    _synchronize()
    wall_ms = (_clock() - wall0) * 1e3
    times = [_elapsed(s, e) for s, e in zip(starts, ends)]
    return {"times_ms": times, "median_ms": statistics.median(times), "wall_ms": wall_ms,
            "first_call_ms": first_call_ms, "outputs": outputs}


def _median_ms(fn: Callable, reps: int) -> float:
    for _ in range(3):
        fn()
    _synchronize()
    times = []
    for _ in range(reps):
        s, e = _Event(enable_timing=True), _Event(enable_timing=True)
        _sleep(LAUNCH_SHADOW_CYCLES)  # the GPU is idle here (synchronized after the warm-up and each call)
        _record(s)
        fn()
        _record(e)
        _synchronize()
        times.append(_elapsed(s, e))
    return statistics.median(times)


def _copy_gbps(nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    return round(2 * nbytes / (_median_ms(lambda: dst.copy_(src), 20) * 1e-3) / 1e9, 1)


def _gemm_tflops(dtype: torch.dtype, n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    return round(2 * n**3 / (_median_ms(lambda: torch.matmul(a, b), 10) * 1e-3) / 1e12, 1)


def roofline() -> dict:
    """The grading GPU's ceilings, measured, not read off a datasheet: device-to-device copy
    bandwidth (bytes read + written) and a large cuBLAS GEMM's rate per dtype (random data:
    zeros run faster)."""
    result = {"gpu": device_name(), "copy_gbps": _copy_gbps(), "gemm_tflops": {}}
    for name, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        result["gemm_tflops"][name] = _gemm_tflops(dtype)
    torch.cuda.empty_cache()
    return result
