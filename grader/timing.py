"""GPU timing, run inside a worker: one method for student, reference and vendor alike.

Each timed call: rotate to the next input set, flush L2 by writing a buffer twice its size,
record CUDA events around the call alone, then synchronize. Compile and autotune happen in
the warm-up calls, which are timed separately (first-call cost is reported, not scored).
A wall clock around the whole loop, closed by a device-wide synchronize, is returned too:
work hidden on another stream or thread shows up there but not in the events.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

_FLUSH: torch.Tensor | None = None


def _flush_buffer() -> torch.Tensor:
    global _FLUSH
    if _FLUSH is None:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
        _FLUSH = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device="cuda")
    return _FLUSH


def device_name() -> str:
    return torch.cuda.get_device_name(0)


def time_function(fn: Callable, arg_sets: Sequence[Sequence[torch.Tensor]], reps: int, warmup: int = 3) -> dict:
    """Median-ready per-call times (ms) of fn over `reps` calls, rotating through arg_sets."""
    flush = _flush_buffer()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*arg_sets[0])
    torch.cuda.synchronize()
    first_call_ms = (time.perf_counter() - t0) * 1e3
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    torch.cuda.synchronize()

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    flush_ms = 0.0
    wall0 = time.perf_counter()
    for i in range(reps):
        f0 = time.perf_counter()
        flush.zero_()
        torch.cuda.synchronize()
        flush_ms += time.perf_counter() - f0
        starts[i].record()
        fn(*arg_sets[i % len(arg_sets)])
        ends[i].record()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - wall0 - flush_ms) * 1e3
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return {"times_ms": times, "median_ms": statistics.median(times), "wall_ms": wall_ms, "first_call_ms": first_call_ms}


def copy_bandwidth_gbps(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """The roofline for memory-bound kernels: a device-to-device copy, bytes read + written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return 2 * nbytes / (statistics.median(times) * 1e-3) / 1e9
