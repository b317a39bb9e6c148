"""The worker: the only place student code is imported and run. UNTRUSTED once `load` ran.

Started inside the sandbox by its backend (grader.sandbox.namespaces, docker or plain), as a
fresh interpreter (`main(["RX", "TX"])`) or as a fork of the zygote (grader.sandbox.zygote calls
`serve`), it answers one request per line on a private pipe (`grader.protocol`): load modules,
run one call, time calls. Inputs and outputs travel as safetensors files; nothing it writes is unpickled.
Every verdict is made by the judge in the grading process, never here.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from grader import protocol
from grader.protocol import (
    BurstReady,
    BurstReply,
    Call,
    CallReply,
    Compare,
    CompareReply,
    CompiledKernel,
    Description,
    DropBurst,
    Failure,
    Load,
    Ok,
    Ping,
    PrepareBurst,
    Roofline,
    RooflineReply,
    Run,
    RunBurst,
    RunReply,
    Sample,
    Time,
    TimeReply,
    WarmBurst,
)
from grader.worker import (
    calling,  # the one path a contender's function is called by (bound here, as memcheck)
    memcheck,  # bound here, before any student module could replace it in sys.modules
)

if TYPE_CHECKING:
    from grader.worker import timing


def _setup_torch():
    """torch's global flags, set once for the whole worker and never changed around a call:
    torch's defaults (deterministic algorithms off, and so no filling of uninitialized memory;
    TF32 and matmul precision untouched), so that no call the grader makes can be told from
    another by them. An output allocated with torch.empty and never written is still caught:
    the untimed calls' dispatch mode poisons what they allocate uninitialized (`_OpRecorder`)."""
    import torch

    torch.use_deterministic_algorithms(False)
    # torch defines it as a property of the module's own class, which its stubs do not show
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    return torch


LAUNCHES: Counter[str] = Counter()
# the BLOCK* sizes a call's launches passed: where the report draws block boundaries
BLOCKS: dict[str, int] = {}
# on a GPU, what the compiler made of each kernel a call launched (protocol.CompiledKernel)
COMPILED: dict[str, dict] = {}


class Watch:
    """The recorder of the call being recorded, if any (grader.worker.launches.Recorder): held by
    the worker and the hooks it installs, never a name of a module, so that no flag a student's
    module can import says a call is recorded (what a process can still find of it, and why that
    gains nothing: docs/security.md, "Timing")."""

    __slots__ = ("recorder",)

    def __init__(self) -> None:
        self.recorder: Any = None


def _setup_triton(interpret: bool, watch: Watch) -> Watch:
    """Count kernel launches (evidence that a Triton kernel really ran), and in the CPU
    interpreter keep only the first config of @triton.autotune (it would time configs with
    do_bench, which needs a GPU). `watch`: the worker's (Worker.watch), which its hook reports
    recorded launches to; required, since hooks given another record nothing of its calls."""
    import triton
    from triton.runtime import autotuner
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    for cls in classes:
        original = cls.run

        def counted(self, *args, __original=original, **kwargs):
            name = getattr(self, "__name__", None) or self.fn.__name__
            if not kwargs.get("warmup", False):
                LAUNCHES[name] += 1
                for k, v in kwargs.items():
                    if k.upper().startswith("BLOCK") and type(v) is int and k not in BLOCKS:
                        BLOCKS[k] = v
            kernel = __original(self, *args, **kwargs)
            if watch.recorder is not None and not kwargs.get("warmup", False):
                watch.recorder.launch(self, kernel, args, kwargs)
            if not interpret and not kwargs.get("warmup", False) and name not in COMPILED and len(COMPILED) < 4:
                COMPILED[name] = _compiled(kernel, kwargs)
            return kernel

        cls.run = counted

    if interpret:
        original_autotune = autotuner.autotune

        def first_config_only(configs, *args, **kwargs):
            return original_autotune(list(configs)[:1], *args, **kwargs)

        triton.autotune = autotuner.autotune = first_config_only

        _index_one_element_arrays()
        memcheck.install()
    return watch


def _compiled(kernel, kwargs: dict) -> dict:
    """Registers, spills, shared memory, warps and stages of a compiled kernel, and its launch's
    grid (evaluated again where it is a function of the launch's meta-parameters)."""
    meta = getattr(kernel, "metadata", None)
    grid: Any = kwargs.get("grid")  # the student's: a callable, a sequence, or anything at all
    try:
        grid = grid(kwargs) if callable(grid) else grid
        grid = [int(g) for g in grid][:3]
    except Exception:  # noqa: BLE001 - a grid of the student's own making: left out
        grid = []

    def number(value) -> int:
        return value if type(value) is int else 0

    return {"n_regs": number(getattr(kernel, "n_regs", 0)), "n_spills": number(getattr(kernel, "n_spills", 0)),
            "shared": number(getattr(meta, "shared", 0)), "num_warps": number(getattr(meta, "num_warps", 0)),
            "num_stages": number(getattr(meta, "num_stages", 0)), "grid": grid}


def _index_one_element_arrays() -> None:
    """Triton 3.6's interpreter turns a scalar argument into an index with int(array) on a
    one-element 1-D array, which numpy 2.5 refuses: every `range(0, n_cols, BLOCK)` in a
    student's kernel would fail. Later Triton squeezes the array first; so does this."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patched


class Worker:
    def __init__(self) -> None:
        self.functions: dict[str, Callable] = {}
        self.roots: list[str] = []
        self.retained: dict[tuple[str, str], object] = {}  # outputs of timed calls, by (contender, input set)
        self.input_cache: dict[str, dict] = {}
        self.bursts: dict[str, timing.Burst] = {}  # by contender
        self.torch = _setup_torch()
        self.watch = Watch()  # the recorder of a recorded call: the hooks' (_setup_triton), never a module's name

    # -- requests ---------------------------------------------------------------------
    def load(self, req: Load) -> Ok | Failure:
        """Import each contender's module and find its function."""
        for name, c in req.contenders.items():
            root = str(Path(c.root).resolve())
            if root not in sys.path:
                sys.path.insert(0, root)
            self.roots.append(root)
            module_path = Path(c.module)
            if not (Path(root) / module_path).is_file():
                outside = not os.path.realpath(Path(root) / module_path).startswith(root.rstrip("/") + "/")
                link = " (a link to a file outside the submission, which a worker cannot see)" if outside else ""
                return Failure("missing", f"{c.module} not found in the submission{link}")
            dotted = ".".join(module_path.with_suffix("").parts)
            module = importlib.import_module(dotted)
            fn = getattr(module, c.function, None)
            if not callable(fn):
                return Failure("missing", f"{c.module} defines no function {c.function}()")
            self.functions[name] = fn
        return Ok()

    def run(self, req: Run) -> RunReply:
        """Call one contender on one input file; save its result and the inputs as they are after."""
        from safetensors.torch import load_file, save_file

        from grader.codec import rebuild, storage_of

        torch = self.torch
        args = rebuild(load_file(req.inputs), req.layout, req.device)
        LAUNCHES.clear()
        BLOCKS.clear()
        ops: Counter[str] = Counter()
        fn = self.functions[req.contender]
        start = time.perf_counter()
        out = _called(fn, args, ops if req.record_ops else None)
        if req.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        reply = RunReply(seconds=seconds, launches=dict(LAUNCHES), blocks=dict(list(BLOCKS.items())[:8]),
                         ops=sorted(ops), result_type=type(out).__name__)
        tensors = {f"input.{k}": storage_of(v) for k, v in args.items() if isinstance(v, torch.Tensor)}
        if isinstance(out, torch.Tensor):
            d = _describe(out, args)
            reply.dtype, reply.shape, reply.stride = d.dtype, d.shape, d.stride
            reply.device, reply.aliases = d.device, d.aliases
            tensors["output"] = out.detach().to("cpu").contiguous()
        elif isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
            # several results (e.g. dx, dw, db): output.0, output.1, ..., each described in order
            reply.outputs = [_describe(o, args) for o in out]
            tensors.update({f"output.{i}": o.detach().to("cpu", copy=True).contiguous() for i, o in enumerate(out)})
        save_file(tensors, req.output)
        return reply

    def time(self, req: Time) -> TimeReply:
        """Time a contender on the GPU with grader.worker.timing (see there for the method); keep the
        output of the last timed call on each input set for the judge to sample."""
        from grader.worker import timing

        arg_sets = [list(self._load_cuda(p, req.layout, keep=True).values()) for p in req.inputs]
        fn = self.functions[req.contender]

        timed_launches = [0]

        def timed_loop_starts():
            LAUNCHES.clear()

        def timed_loop_ends():
            timed_launches[0] = sum(LAUNCHES.values())
        LAUNCHES.clear()
        result = timing.time_function(fn, arg_sets, reps=req.reps, warmup=req.warmup,
                                      on_timed_start=timed_loop_starts, on_timed_end=timed_loop_ends)
        launches = timed_launches[0]  # Triton launches in the timed loop alone
        outputs = result.pop("outputs")
        for i, out in enumerate(outputs):
            self.retained[(req.contender, f"set{i}")] = out
        return TimeReply(**result, launches=launches, tampered=timing.tampered(),
                         output_numel=outputs[0].numel() if hasattr(outputs[0], "numel") else None)

    def prepare_burst(self, req: PrepareBurst) -> BurstReady:
        """A contender's burst for the grading process's own clock (grader.worker.timing.Burst), on
        a private copy of an input set; captured in a CUDA graph where the function allows."""
        from grader.worker import timing

        began = time.perf_counter()
        args = list(self._load_cuda(req.inputs, req.layout, keep=True).values())
        loaded = time.perf_counter() - began
        began = time.perf_counter()
        burst = timing.Burst(self.functions[req.contender], args, req.calls, req.samples, req.graph,
                             queued=req.queued)
        made = time.perf_counter() - began
        eager = burst.prepare()
        self.bursts[req.contender] = burst
        return BurstReady(eager=eager, steps={"inputs": loaded, "buffers": made, **burst.steps})

    def warm_burst(self, req: WarmBurst) -> Ok:
        """The burst's own kernel compiled for the input set's floating-point dtypes, ahead of the
        exclusive hold (grader.protocol.WarmBurst); a name it does not know is passed over."""
        from grader.worker import timing

        torch = self.torch
        known = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                 "bfloat16": torch.bfloat16}
        timing.warm([known[d] for d in req.dtypes if d in known])
        return Ok()

    def burst(self, req: RunBurst) -> BurstReply | Failure:
        """Run a prepared burst on inputs drawn from the seed, told only now."""
        burst = self.bursts.get(req.contender)
        if burst is None:
            return Failure("error", f"no burst prepared for {req.contender}")
        values, queued_ms = burst.run(req.seed, req.gate_ms)
        if req.last:
            del self.bursts[req.contender], burst
            self.torch.cuda.empty_cache()
        return BurstReply(values=values, queued_ms=queued_ms)

    def drop_burst(self, req: DropBurst) -> Ok:
        """A prepared burst let go, not run again (its graph and memory freed)."""
        if self.bursts.pop(req.contender, None) is not None:
            self.torch.cuda.empty_cache()
        return Ok()

    def call(self, req: Call) -> CallReply:
        """One untimed call on the GPU at timing size, its output kept under `key`; with
        record_ops, the aten ops it dispatched (a vendor op used only at large sizes shows here);
        with record_launches (a folder), the launch record of that call written there
        (grader.worker.launches), after a first call that compiles and autotunes."""
        fn = self.functions[req.contender]
        keep = req.keep_inputs
        if req.record_launches and req.warm:
            _called(fn, self._load_cuda(req.inputs, req.layout, keep=keep), None)
            self.torch.cuda.synchronize()
        args = self._load_cuda(req.inputs, req.layout, keep=keep)
        ops: Counter[str] = Counter()
        LAUNCHES.clear()
        COMPILED.clear()
        out = _recorded(fn, args, ops if req.record_ops else None, req.record_launches, self.watch)
        self.torch.cuda.synchronize()
        self.retained[(req.contender, req.key)] = out
        return CallReply(ops=sorted(ops), launches=sum(LAUNCHES.values()),
                         kernels={k[:80]: CompiledKernel(**v) for k, v in COMPILED.items()},
                         numel=out.numel() if isinstance(out, self.torch.Tensor) else -1)

    def sample(self, req: Sample) -> Ok | Failure:
        """Write the kept outputs' elements at the judge's flat indices (chosen after the
        timing, so they cannot be anticipated) to a safetensors file."""
        from safetensors.torch import load_file

        from grader.codec import write_tensors

        torch = self.torch
        idx = load_file(req.indices)["idx"]
        samples = {}
        for key in req.keys:
            out = self.retained.get((req.contender, key))
            if not isinstance(out, torch.Tensor) or out.numel() <= int(idx.max()):
                return Failure("error", f"the result of the timed call on {key} is not a tensor of the expected size")
            samples[key] = out.detach().reshape(-1)[idx.to(out.device)]
            samples[f"numel.{key}"] = idx.new_tensor([out.numel()])  # int64, as the indices are
        write_tensors(samples, req.output)
        return Ok()

    def compare(self, req: Compare) -> CompareReply | Failure:
        """A result file written by another process, at the judge's indices, compared on the GPU
        with what this (trusted) worker keeps (grader.protocol.Compare): no byte of it reaches the
        judge."""
        from grader.codec import MAX_HEADER_BYTES, ResultFileError, ResultTooLarge, read_tensor

        truth = self._flat(req.truth)
        idx = self._indices(req.indices)
        limit = req.limit if req.limit > 0 else idx.numel() * 8  # 0: by the sample's size
        try:
            fd = _open_plain(req.file)
            try:
                got = read_tensor(fd, req.name, limit + 8 + MAX_HEADER_BYTES)
                numel = read_tensor(fd, f"numel.{req.name}", limit + 8 + MAX_HEADER_BYTES)
            finally:
                os.close(fd)
        except (OSError, ResultTooLarge) as exc:
            return Failure("error", f"the result cannot be read ({str(exc)[:160]})")
        except ResultFileError as exc:
            return Failure("error", f"the result is not a safetensors file of it: {str(exc)[:160]}")
        if not got.is_floating_point():
            return Failure("error", "the result is not one floating-point tensor")
        if numel.dtype != self.torch.int64 or numel.numel() != 1:
            return Failure("error", "the result's size is not one integer")
        try:
            return self._sampled(req, got, truth, idx, int(numel.reshape(-1)[0]))
        except Exception as exc:  # noqa: BLE001 - out of GPU memory, say: this (trusted) worker's failure, no one's result
            return CompareReply(numel=0, wrong=0, ours="the trusted worker could not compare the result: "
                                f"{type(exc).__name__}: {str(exc)[:200]}")

    def _indices(self, path: str):
        """The judge's flat indices (grader.judge.picks), from its own file."""
        from safetensors.torch import load_file

        return load_file(path)["idx"].reshape(-1).to(self.torch.int64)

    def _sampled(self, req: Compare, got, truth, idx, numel: int) -> CompareReply | Failure:
        """`got`: the result's elements at `idx`, of a result of `numel` elements, compared with the
        kept truth's elements there by the error model (its bound from the whole reference and truth)."""
        torch = self.torch
        reference = self._flat(req.reference)
        if truth is None or reference is None:
            return Failure("error", "the kept truth or reference result is missing")
        if numel != truth.numel():
            return CompareReply(numel=numel, wrong=max(numel, truth.numel()))
        if got.numel() != idx.numel():
            return Failure("error", f"the sample holds {got.numel()} elements where {idx.numel()} were asked for")
        if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < numel):
            return Failure("error", "the judge's indices lie outside the result")
        got = got.reshape(-1).to(truth.device)
        on = idx.to(truth.device)
        t = truth.float()
        d = (reference.float() - t).abs()
        normal = float(d[~torch.isnan(d)].max()) if d.numel() and not torch.isnan(d).all() else 0.0
        t, g = t[on], got.float()
        bad = ~((g - t).abs() <= 2 * normal + req.atol + req.rtol * t.abs() + 1e-2 * t.abs()) \
            & ~(torch.isnan(g) & torch.isnan(t))
        count = int(bad.sum())
        if not count:
            return CompareReply(numel=numel, wrong=0, sampled=idx.numel())
        first = int(bad.nonzero()[0])
        return CompareReply(numel=numel, wrong=count, first=int(on[first]), got=f"{float(g[first]):.6g}",
                            want=f"{float(t[first]):.6g}", sampled=idx.numel())

    def _flat(self, key: str):
        """A kept result of a call, under any contender, flattened."""
        for (_, k), out in self.retained.items():
            if k == key and isinstance(out, self.torch.Tensor):
                return out.detach().reshape(-1)
        return None

    def _load_cuda(self, path: str, layout: dict, keep: bool = False) -> dict:
        """Inputs on the GPU; with keep, timing's input sets stay loaded between rounds (a
        fresh copy of the storages each time, so a kernel that wrote its input is not helped)."""
        from safetensors.torch import load_file

        from grader.codec import rebuild

        if not keep:
            return rebuild(load_file(path), layout, "cuda")
        if path not in self.input_cache:  # the set's storages on the GPU, read from its file the first time only
            self.input_cache[path] = {k: v.to("cuda") for k, v in load_file(path).items()}
        return rebuild({k: v.clone() for k, v in self.input_cache[path].items()}, layout, "cuda")

    def ping(self, req: Ping) -> Ok:
        """Ready: torch and Triton are imported (before any student code)."""
        return Ok()

    def roofline(self, req: Roofline) -> RooflineReply:
        from grader.worker import timing

        return RooflineReply(**timing.roofline())

    def handlers(self) -> dict[type, Callable]:
        """The requests a worker answers, each by its own method: nothing else is callable
        through the pipe (exit ends the loop in `serve`)."""
        return {Ping: self.ping, Load: self.load, Run: self.run, Time: self.time, PrepareBurst: self.prepare_burst,
                WarmBurst: self.warm_burst, RunBurst: self.burst, DropBurst: self.drop_burst, Call: self.call,
                Sample: self.sample, Roofline: self.roofline, Compare: self.compare}


def _open_plain(path: str) -> int:
    """A file another process wrote, opened as grader.sandbox.files.read_worker_file opens one
    (the worker imports nothing of the sandbox): never through a link, never blocking, a regular
    file, or OSError saying why. The caller bounds what it reads (grader.codec.read_tensor)."""
    import errno
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{os.path.basename(path)} is not a regular file")
    return fd


THREAD_GRACE_S = 2.0


def _called(fn, args: dict, ops: Counter | None, watch: Watch | None = None):
    """The student's function called on `args` (an untimed call), every tensor it allocates
    uninitialized poisoned with our own NaN (grader.codec.POISON); with `ops`, counting the aten
    ops it dispatched; the threads it started given their grace before its result is taken."""
    calls = calling.caller()  # started before the threads are counted: it is the worker's, not the call's
    threads = set(threading.enumerate())
    out = calls.call(fn, list(args.values()), _OpRecorder(ops, watch))
    _join_new_threads(threads)
    return out


def _recorded(fn, args: dict, ops: Counter | None, folder: str, watch: Watch):
    """`_called`, with the call's launches recorded into `folder` when one is given."""
    if not folder:
        return _called(fn, args, ops)
    from grader.worker import launches

    recorder = launches.Recorder(args)
    watch.recorder = recorder
    try:
        out = _called(fn, args, ops, watch)
    finally:
        watch.recorder = None
    Path(folder).mkdir(parents=True, exist_ok=True)  # the judge names a new folder in the worker's outputs/
    launches.write(recorder.finish(out, folder), folder)
    return out


def _join_new_threads(before: set, grace: float = THREAD_GRACE_S) -> None:
    """Wait (a little) for threads the call started: a result a background thread is still
    computing is judged once that thread is done, so a race does not decide the verdict; the
    timing's settle calls show the function returned early (grader.worker.timing)."""
    deadline = time.monotonic() + grace
    for thread in set(threading.enumerate()) - before:
        thread.join(max(0.0, deadline - time.monotonic()))


def _describe(out, args: dict) -> Description:
    """What the judge checks of a result without its values: dtype, shape, layout, device."""
    import torch

    return Description(
        dtype=str(out.dtype).removeprefix("torch."),
        shape=list(out.shape),
        stride=list(out.stride()),
        device=out.device.type,
        aliases=[k for k, v in args.items() if isinstance(v, torch.Tensor) and _shares_memory(out, v)],
    )


def _shares_memory(a, b) -> bool:
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.numel() > 0
    except Exception:
        return False


UNINITIALIZED = ("aten::empty", "aten::new_empty")  # torch.empty, empty_like, empty_strided, new_empty, ...


class _OpRecorder:
    """Records which aten ops the student's call dispatched (e.g. aten::_softmax means torch
    did the work, not a kernel), when given a Counter; poisons what it allocates uninitialized,
    so that an element never written is told from a NaN computed. A TorchDispatchMode sees ops
    below autograd and Python."""

    def __init__(self, ops: Counter | None, watch: Watch | None = None) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        from grader.codec import poison_

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.name()
                if ops is not None:
                    ops[name] += 1
                out = func(*args, **(kwargs or {}))
                if name.startswith(UNINITIALIZED) and type(out) is torch.Tensor:
                    poison_(out)
                if watch is not None and watch.recorder is not None:
                    watch.recorder.op(func, args, kwargs or {}, out)
                return out

        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def _student_traceback(exc: BaseException, roots: list[str]) -> str:
    """The traceback cut down to the student's own frames, with paths relative to the
    submission, so it points at their file and line, not at our copy or Triton's insides."""
    chain, seen = [], set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    lines = []  # the outer exception's frames lead to the inner one's (Triton re-raises kernel errors)
    for e in chain:
        for f in traceback.extract_tb(e.__traceback__):
            if not any(f.filename.startswith(r + os.sep) for r in roots):
                continue
            path = f.filename
            for root in roots:
                path = path.removeprefix(root + os.sep)
            lines.append(f'  File "{path}", line {f.lineno}, in {f.name}')
            if f.line:
                lines.append(f"    {f.line.strip()}")
    inner = chain[-1]
    if isinstance(inner, SyntaxError):  # its file, line and a caret under the column, as Python prints them
        for line in traceback.format_exception_only(type(inner), inner):
            for root in roots:
                line = line.replace(f'"{root}{os.sep}', '"')
            lines.append(line.rstrip("\n"))
        return "\n".join(lines)
    lines.append(f"{type(inner).__name__}: {inner}")
    return "\n".join(lines)


def serve(rx: int, tx: int) -> None:
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    worker = Worker()
    _setup_triton(interpret, worker.watch)
    if not interpret:
        from grader.worker import timing

        timing.tampered()  # imported now, so it binds the timing functions before any student module can patch them
    handlers = worker.handlers()
    with os.fdopen(rx, "r") as requests, os.fdopen(tx, "w") as replies:
        for line in requests:
            if isinstance(reply := answer(handlers, line, worker.roots), protocol.Exit):
                break
            replies.write(protocol.encode(reply))
            replies.flush()


def answer(handlers: dict[type, Callable], line: str, roots: list[str]):
    """The reply to one request line: its handler's, or a Failure (a request that cannot be
    read, an op no handler answers, an exception, an access the bounds check caught);
    an Exit request comes back as itself."""
    try:
        req = protocol.decode_request(line)
    except protocol.ProtocolError as exc:
        return Failure("error", f"the worker cannot read this request: {exc}")
    if isinstance(req, protocol.Exit):
        return req
    handler = handlers.get(type(req))
    if handler is None:
        return Failure("error", f"the worker does not answer {req.op} requests")
    memcheck.LAST_VIOLATION = None
    try:
        reply = handler(req)
    except BaseException as exc:  # student code may raise anything, SystemExit included
        reply = Failure("error", f"{type(exc).__name__}: {exc}", _student_traceback(exc, roots))
    if memcheck.LAST_VIOLATION is not None:  # the bounds check fired (even if the student caught it)
        reply = Failure("memory", memcheck.LAST_VIOLATION["message"], getattr(reply, "traceback", ""))
    if isinstance(reply, Failure):  # a student's message of megabytes is cut here, not carried down the pipe
        reply = Failure(reply.kind, protocol.clean_text(reply.message), protocol.clean_text(reply.traceback))
    return reply


def main(channel: list[str]) -> None:
    """`RX TX`: inherited pipe ends (the sandbox), or paths of FIFOs (a container)."""
    rx, tx = channel
    if not rx.isdigit():
        rx, tx = str(os.open(rx, os.O_RDONLY)), str(os.open(tx, os.O_WRONLY))
    serve(int(rx), int(tx))


if __name__ == "__main__":
    main(sys.argv[1:3])
