"""GPU timing, run inside a worker: one method for student, reference and vendor alike.

Each timed call: a device-wide synchronize, L2 flushed by zeroing a buffer twice its size, a
second synchronize, a short GPU sleep, then CUDA events around the call. The sleep keeps the GPU
busy while the host runs the call's Python and launches its kernels, so the events time the
GPU's work and not the host's launch latency. Compile and autotune happen in the first call and
the warm-up calls, outside the timing (the first call's time is reported: TAs want it).

The events see only the stream they are recorded on. So the whole loop also runs under the
profiler's GPU activity records (CUPTI), which list every kernel, copy and set of the process
with its start and end on the GPU, whatever stream or host thread launched it. The records come
back with the host's marks of each call (`marks`), and the grading process works out from them
how long each call kept the GPU busy (grader.judge.activity): work hidden on another stream or thread
is counted where it ran, and the time between launches (the host's) is not. After the timed loop a
few untimed "settle" calls run without the sleep, each followed at once by a marker kernel on the
caller's stream: work of the call still running after that marker means the function returned
before its result was computed. Those calls also give each call's host (wall) time: the latency a
caller sees, Python and launch included.

Everything this module calls is bound when it is imported, before any student module is,
so a student who monkeypatches torch.cuda.Event, synchronize or the profiler does not change
what we measure; `tampered()` reports such patches as evidence.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch
import torch.profiler
import triton
import triton.language as tl

from grader.worker import calling

_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_synchronize = torch.cuda.synchronize
_sleep = torch.cuda._sleep
_clock = time.perf_counter
_now_ns = time.time_ns  # the profiler's records are in this clock (ns since the epoch)
_Profile = torch.profiler.profile
_CUDA_ACTIVITY = torch.profiler.ProfilerActivity.CUDA

# GPU cycles of sleep before each timed call: about 1 ms at Hopper's clocks, which covers a call's
# host overhead (a plain Triton launch takes tens of us; an autotuned one that builds three TMA
# descriptors, over 100 us). It costs 1 ms of GPU time per timed call, outside the events.
LAUNCH_SHADOW_CYCLES = 2_000_000
GATE_CYCLES_PER_MS = 2_000_000  # a queued burst's gate (Burst.run): GPU cycles per ms at 2 GHz
SETTLE_CALLS = 3  # untimed calls after the loop: host wall time, and did the call return finished?

_WATCHED = {
    "torch.cuda.Event": (lambda: torch.cuda.Event, _Event),
    "torch.cuda.Event.record": (lambda: torch.cuda.Event.record, _record),
    "torch.cuda.Event.elapsed_time": (lambda: torch.cuda.Event.elapsed_time, _elapsed),
    "torch.cuda.synchronize": (lambda: torch.cuda.synchronize, _synchronize),
    "torch.cuda._sleep": (lambda: torch.cuda._sleep, _sleep),
    "torch.profiler.profile": (lambda: torch.profiler.profile, _Profile),
    "time.perf_counter": (lambda: time.perf_counter, _clock),
    "time.time_ns": (lambda: time.time_ns, _now_ns),
}


def tampered() -> list[str]:
    """Names of the timing functions that no longer are what they were at import."""
    return [name for name, (current, original) in _WATCHED.items() if current() is not original]


def _flush_buffer() -> torch.Tensor:
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    return torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device="cuda")


def _flush_window(flush: torch.Tensor) -> tuple[int, int]:
    """Flush L2 with the GPU idle before and after: the host's marks around it bound a window that
    holds our flush alone (grader.judge.activity)."""
    _synchronize()
    before = _now_ns()
    flush.zero_()
    _synchronize()
    return before, _now_ns()


def device_name() -> str:
    return torch.cuda.get_device_name(0)


def _device_records(prof) -> list[list]:
    """[name, stream, start_ns, end_ns] of every GPU activity (kernel, copy, set) the profiler saw."""
    records = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != torch.autograd.DeviceType.CUDA:
            continue
        start = int(e.start_ns())
        records.append([e.name(), int(e.device_resource_id()), start, start + int(e.duration_ns())])
    records.sort(key=lambda r: r[2])
    return records


def time_function(
    fn: Callable,
    arg_sets: Sequence[Sequence],
    reps: int,
    warmup: int = 3,
    on_timed_start: Callable[[], None] | None = None,
    on_timed_end: Callable[[], None] | None = None,
) -> dict:
    """Per-call times of fn over `reps` calls, rotating through arg_sets.

    Returns `event_ms` (per timed call, by the CUDA events), `marks` (per timed call: the host's
    ns before the flush, after it, and after the call returned), `settle_marks` and `host_ms` (per
    settle call), `activities` (the GPU records, or None with `activity_error`), `first_call_ms`,
    and `outputs`: the result of the last timed call on each input set, for validation.
    """
    call = calling.call  # the one path every call of the function takes (grader.worker.calling)
    flush = _flush_buffer()
    _synchronize()
    t0 = _clock()
    call(fn, arg_sets[0])
    _synchronize()
    first_call_ms = (_clock() - t0) * 1e3
    for i in range(warmup):
        call(fn, arg_sets[i % len(arg_sets)])
    _synchronize()

    starts = [_Event(enable_timing=True) for _ in range(reps)]
    ends = [_Event(enable_timing=True) for _ in range(reps)]
    outputs: list = [None] * len(arg_sets)
    marks, settle_marks, host_ms = [], [], []
    activities, activity_error = None, None
    try:
        prof = _Profile(activities=[_CUDA_ACTIVITY])
        prof.__enter__()
    except Exception as exc:  # noqa: BLE001 - no CUPTI here: the grading process decides what that costs
        prof, activity_error = None, f"{type(exc).__name__}: {exc}"
    try:
        if on_timed_start:
            on_timed_start()
        for i in range(reps):
            before, after = _flush_window(flush)
            _sleep(LAUNCH_SHADOW_CYCLES)
            _record(starts[i])
            out = call(fn, arg_sets[i % len(arg_sets)])
            _record(ends[i])
            marks.append([before, after, _now_ns()])
            outputs[i % len(arg_sets)] = out
        _synchronize()
        if on_timed_end:
            on_timed_end()
        for i in range(SETTLE_CALLS):
            before, after = _flush_window(flush)
            t0 = _clock()
            call(fn, arg_sets[i % len(arg_sets)])
            _sleep(1)  # the marker: runs on the caller's stream the moment that stream is done
            _synchronize()
            host_ms.append((_clock() - t0) * 1e3)
            settle_marks.append([before, after, _now_ns()])
    finally:
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
                activities = _device_records(prof)
            except Exception as exc:  # noqa: BLE001
                activity_error = f"{type(exc).__name__}: {exc}"
    event_ms = [_elapsed(s, e) for s, e in zip(starts, ends)]
    return {"event_ms": event_ms, "marks": marks, "settle_marks": settle_marks, "host_ms": host_ms,
            "activities": activities, "activity_error": activity_error,
            "first_call_ms": first_call_ms, "outputs": outputs}


@triton.jit(do_not_specialize=["n", "base"])
def _redraw(ptr, n, seed_ptr, base, BLOCK: tl.constexpr):
    """Fill n elements with normal numbers drawn from the seed in device memory (so a CUDA graph
    captured once draws new inputs each time the seed is changed), from offset `base` on."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    values = tl.randn(tl.load(seed_ptr), offs + base)
    tl.store(ptr + offs, values.to(ptr.dtype.element_ty), mask=offs < n)


def warm(dtypes: list[torch.dtype]) -> None:
    """`_redraw` compiled (or loaded from the Triton cache) for each dtype, on a few elements: its
    first launch in a process costs seconds, which a burst's preparation then does not."""
    seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    for dtype in dict.fromkeys(dtypes):
        buf = torch.empty(4096, dtype=dtype, device="cuda")
        _redraw[(1,)](buf, buf.numel(), seed, 1 << 40, BLOCK=4096)
    _synchronize()


class Burst:
    """The calls the grading process times by its own clock (grader.judge.witness): `calls`
    calls back to back, each on inputs drawn afresh (every floating-point argument's storage
    refilled in place from a seed told only when the burst starts), and `samples` elements of
    each result at indices told at the same time. Nothing here is measured: the grading process
    brackets the whole request, so whatever student code does to this class can lengthen the
    bracket or spoil the samples, never shorten the work the samples prove was done.

    Built once per contender (`prepare`, untimed): one call to warm up (the whole burst's
    numbers of elements are then known), then the whole burst
    captured in a CUDA graph, so that the function's host work (Python, launches) is not in the
    bracket and an honest wrapper is timed on its GPU work alone. A function that cannot be
    captured (it synchronizes, say) runs eagerly instead, its host work then in the bracket; the
    reference's burst is then eager too, synchronized after each call (`graph=False`), so that the
    burst's own host work between calls weighs on both alike.

    `queued`: eager and never synchronized between calls, as an ordinary loop calls a function,
    behind a gate (`run`'s gate_ms: a GPU sleep launched first): the function's Python runs at
    every call while the GPU still runs the gate, so the bracket holds the gate and the calls'
    GPU work, not their host work (the reference's burst holds the same gate: it cancels). A
    function that is fast only while captured is timed here at its ordinary speed."""

    def __init__(self, fn: Callable, args: list, calls: int, samples: int, graph: bool = True,
                 queued: bool = False) -> None:
        self.fn, self.args, self.calls, self.samples = fn, args, calls, samples
        # False: eager, synchronized after each call (the mirror of a burst that could not be captured)
        self.capture = graph
        self.queued = queued and not graph
        seen, self.buffers = set(), []
        for a in args:  # each storage once: a view's storage is refilled whole
            if isinstance(a, torch.Tensor) and a.is_floating_point() and a.untyped_storage().data_ptr() not in seen:
                seen.add(a.untyped_storage().data_ptr())
                flat = torch.empty(0, dtype=a.dtype, device=a.device).set_(a.untyped_storage())
                self.buffers.append(flat)
        self.seed = torch.zeros(1, dtype=torch.int64, device="cuda")
        self.idx = torch.zeros(samples, dtype=torch.int64, device="cuda")
        self.taken = torch.zeros(calls, samples, dtype=torch.float32, device="cuda")
        self.flush = _flush_buffer()
        self.numel = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.steps: dict[str, float] = {}

    def _body(self, calls: int | None = None) -> None:
        for i in range(self.calls if calls is None else calls):
            for j, buf in enumerate(self.buffers):
                n = buf.numel()
                _redraw[(triton.cdiv(n, 4096),)](buf, n, self.seed, (i * len(self.buffers) + j + 1) << 40, BLOCK=4096)
            # each call starts from the cache state of the timed loop's calls, not with its inputs in L2
            self.flush.zero_()
            out = calling.call(self.fn, self.args)  # the one path every call of the function takes
            if not self.capture and not self.queued:
                _synchronize()
            flat = torch.cat([o.reshape(-1) for o in out]) if isinstance(out, (tuple, list)) else out.reshape(-1)
            self.numel = flat.numel()
            self.taken[i].copy_(flat[self.idx % max(1, self.numel)].float())

    def prepare(self) -> str:
        """Warm up and capture; returns why the burst runs eagerly ("" if captured). `steps`: the
        seconds each step took (for the benchmarks' breakdown)."""
        began = time.perf_counter()
        self._body(1)  # compiles what the first call compiles
        _synchronize()
        self.steps["first call"] = time.perf_counter() - began
        if not self.capture:
            return "asked to run eagerly"
        why_eager = ""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            began = time.perf_counter()
            with torch.cuda.stream(side):  # a warm-up on a side stream first, as graph capture asks
                self._body(1)
            torch.cuda.current_stream().wait_stream(side)
            self.steps["side stream call"] = time.perf_counter() - began
            began = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._body()
            self.graph = graph
            self.steps["capture"] = time.perf_counter() - began
        except Exception as exc:  # noqa: BLE001 - whatever stops a capture, the burst runs eagerly
            why_eager = f"{type(exc).__name__}: {exc}"[:300]
        began = time.perf_counter()
        _synchronize()
        self.steps["synchronized"] = time.perf_counter() - began
        return why_eager

    def run(self, seed: int, gate_ms: float = 0.0) -> tuple[list[list[float]], float]:
        """The samples of each call, and (a queued burst) the ms its calls took to queue after
        the gate was launched: at or beyond the gate, the host work was not all hidden."""
        queued_ms = 0.0
        picks = torch.Generator().manual_seed(seed)
        self.seed.copy_(torch.tensor([seed & ((1 << 62) - 1)]))
        self.idx.copy_(torch.randint(0, max(1, self.numel), (self.samples,), generator=picks))
        if self.queued and gate_ms > 0:  # cycles at 2 GHz: at least gate_ms on any GPU clocked no faster
            _sleep(int(gate_ms * GATE_CYCLES_PER_MS))
        if self.graph is not None:
            self.graph.replay()
        else:
            began = time.perf_counter()
            self._body()
            queued_ms = (time.perf_counter() - began) * 1e3 if self.queued else 0.0
        _synchronize()
        return self.taken.cpu().tolist(), queued_ms


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
    zeros run faster). float32 is measured with TF32 allowed: Triton's tl.dot uses TF32 by
    default, so that is the ceiling a float32 kernel can reach."""
    gemm_tflops: dict[str, float] = {}
    result = {"gpu": device_name(), "copy_gbps": _copy_gbps(), "gemm_tflops": gemm_tflops}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        for name, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)):
            gemm_tflops[name] = _gemm_tflops(dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.cuda.empty_cache()
    return result
