"""The worker protocol: one dataclass per request and per reply, and `Failure`.

A message travels as one JSON object per line; a request names its kind in "op", a reply
says "ok" (false: a `Failure`). Both sides decode with validation: the worker answers a
request it cannot read with a failure, and the grading process turns a reply that is not
what its request expects (a field missing or of the wrong type, a failure kind the worker
may not claim) into a failure of that call, never a KeyError deep in the judge, because the
worker runs student code and its word is untrusted data.

Imported inside the sandbox: the standard library only, nothing else of the package.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union, cast


class ProtocolError(ValueError):
    """A message that is not valid JSON of the expected shape."""


# What a reply may carry, whatever the worker writes: every string valid UTF-8 (a lone surrogate
# or an invalid byte becomes U+FFFD) and at most TEXT_LIMIT characters (a key KEY_LIMIT), the rest
# cut and the cut said; every number finite (but where a field names itself in `nonfinite`: a
# sampled result may hold the NaN a kernel computed) and every integer within 64 bits.
TEXT_LIMIT = 16 << 10
KEY_LIMIT = 200
INT_LIMIT = 1 << 63
# and at most this many entries in an object (kernels by name) or a list of strings (aten ops):
# an honest call has a handful; more is a flood that would reach every result and page
ENTRIES_LIMIT = 1024


def clean_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """`text` as valid UTF-8 (surrogates and what cannot be encoded replaced by U+FFFD) and at most
    `limit` characters, saying how much was cut. For text from the worker: the trusted side's
    sinks then escape it for where it goes; this makes it writable and small enough to."""
    if not text.isascii():
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > limit:
        cut = len(text) - limit
        text = text[:limit] + f"\n[... {cut} more characters cut: the worker's text is bounded to {limit} characters]"
    return text


# -- failures -------------------------------------------------------------------------------

# what the worker may say of a request it failed: the student's code raised ("error"), the
# module or function is missing ("missing"), or the bounds check caught an access ("memory")
WORKER_KINDS = ("error", "missing", "memory")
# what only the grading process decides, on what it saw of the worker from outside
PROCESS_KINDS = ("timeout", "crashed", "infra_error")


@dataclass
class Failure:
    """A request that did not succeed, whoever saw it fail: the worker (a failure reply, kind in
    WORKER_KINDS) or the grading process (WorkerFailure, kind in PROCESS_KINDS). `output` is the
    worker's captured stdout and stderr, filled in on the trusted side only."""

    ok: ClassVar[bool] = False
    kind: str
    message: str
    traceback: str = ""
    output: str = ""


# -- requests ---------------------------------------------------------------------------------

@dataclass
class Contender:
    """A function to load: `module` is a path relative to `root`."""

    root: str
    module: str
    function: str


@dataclass
class Ok:
    """The request was done; nothing more to say."""

    ok: ClassVar[bool] = True


@dataclass
class Description:
    """What the judge checks of a tensor result without its values."""

    dtype: str
    shape: list[int]
    stride: list[int]
    device: str
    aliases: list[str]  # the inputs the result shares memory with


@dataclass
class RunReply:
    """One call done: its wall time, the Triton launches and the aten ops it made, and a
    description of its result (flat for one tensor, `outputs` for a tuple of tensors)."""

    ok: ClassVar[bool] = True
    seconds: float
    launches: dict[str, int]
    blocks: dict[str, int]  # the BLOCK* sizes its launches passed (for the report's picture)
    ops: list[str]
    result_type: str
    dtype: str | None = None
    shape: list[int] | None = None
    stride: list[int] | None = None
    device: str | None = None
    aliases: list[str] | None = None
    outputs: list[Description] | None = None

    def meta(self) -> dict:
        """As a plain dict, the form grader.judge.verdict reads."""
        return dataclasses.asdict(self)


@dataclass
class TimeReply:
    """A timed loop (grader.worker.timing.time_function, which documents the fields)."""

    ok: ClassVar[bool] = True
    event_ms: list[float]
    marks: list[tuple[int, int, int]]
    settle_marks: list[tuple[int, int, int]]
    host_ms: list[float]
    activities: list[tuple[str, int, int, int]] | None
    activity_error: str | None
    first_call_ms: float
    launches: int  # Triton launches in the timed loop alone
    tampered: list[str]
    output_numel: int | None


@dataclass
class BurstReady:
    """A burst is prepared: captured in a CUDA graph, or run eagerly for the reason given."""

    ok: ClassVar[bool] = True
    eager: str
    # the seconds of each step of the preparation by the worker's own clock: its word, shown by
    # benchmarks/where_time_goes.py --requests and never used to judge anything
    steps: dict[str, float] = field(default_factory=dict)


@dataclass
class BurstReply:
    """The sampled elements of each call's result in a burst, one list per call
    (grader.worker.timing.Burst.run): the burst's time is the grading process's own measurement,
    not in here."""

    ok: ClassVar[bool] = True
    nonfinite: ClassVar[tuple[str, ...]] = ("values",)  # the kernel's own NaN or inf, sampled
    values: list[list[float]]
    # a queued burst's: the worker's own reading of how long its calls took to queue after the gate. Its word only,
    # used only to lengthen a gate its host work outran (then the round is redone): never scored, never an accusation
    queued_ms: float = 0.0


@dataclass
class CompiledKernel:
    """What the compiler made of one of the student's kernels (Triton's CompiledKernel and its
    metadata), and the grid of its first launch: why a correct kernel is slow, in its own terms.
    The worker's word: used for feedback only, never for a score."""

    n_regs: int
    n_spills: int
    shared: int  # bytes of shared memory per program
    num_warps: int
    num_stages: int
    grid: list[int]


@dataclass
class CallReply:
    ok: ClassVar[bool] = True
    ops: list[str]
    launches: int
    kernels: dict[str, CompiledKernel] = field(default_factory=dict)  # by kernel name (GPU only; a few at most)
    numel: int = -1  # the result's elements, where it is one tensor


@dataclass
class CompareReply:
    ok: ClassVar[bool] = True
    numel: int  # elements in the whole result (the size its file gives)
    wrong: int  # elements of the sample outside the error model (0: right)
    first: int = -1  # the first wrong element's flat index
    got: str = ""  # its value and the truth's there, in words ("nan" where memory was never written)
    want: str = ""
    sampled: int = 0  # how many elements were compared (Compare.indices)
    # the trusted worker's own failure while comparing (out of GPU memory, say): no verdict, and no one's fault but
    # ours (a worker may not report an infra_error Failure: a student's could claim one)
    ours: str = ""


@dataclass
class RooflineReply:
    ok: ClassVar[bool] = True
    gpu: str
    copy_gbps: float
    gemm_tflops: dict[str, float]


@dataclass
class Ping:
    """Ready? (torch and Triton are imported, no student code yet)."""

    op: ClassVar[str] = "ping"
    reply: ClassVar[type] = Ok


@dataclass
class Load:
    """Import each contender's module and find its function."""

    op: ClassVar[str] = "load"
    reply: ClassVar[type] = Ok
    contenders: dict[str, Contender]


@dataclass
class Run:
    """Call a contender once on an input file; write its result and the inputs as they are after."""

    op: ClassVar[str] = "run"
    reply: ClassVar[type] = RunReply
    contender: str
    inputs: str
    layout: dict[str, dict]  # grader.codec.write_inputs
    device: str
    output: str
    record_ops: bool = False


@dataclass
class Time:
    """Time a contender on the GPU over input sets; keep the last output on each set."""

    op: ClassVar[str] = "time"
    reply: ClassVar[type] = TimeReply
    contender: str
    inputs: list[str]
    layout: dict[str, dict]
    reps: int
    warmup: int = 3


@dataclass
class PrepareBurst:
    """Build a contender's burst (grader.worker.timing.Burst) on a copy of an input set (its
    values are redrawn in each call): warm up and capture it, untimed."""

    op: ClassVar[str] = "prepare_burst"
    reply: ClassVar[type] = BurstReady
    contender: str
    inputs: str
    layout: dict[str, dict]
    calls: int
    samples: int
    graph: bool = True  # False: eager, synchronized after each call
    # with graph False: eager and not synchronized per call, the calls queued as an ordinary loop
    # queues them, behind the gate RunBurst.gate_ms names (grader.worker.timing.Burst)
    queued: bool = False


@dataclass
class WarmBurst:
    """Compile the burst's own input-drawing kernel (grader.worker.timing.warm) for `dtypes` (an
    input set's floating-point ones, by name), on a few elements each, untimed and with no input
    loaded: a worker's first burst then runs no compiler inside the timing's exclusive hold, where
    the GPU would wait for it."""

    op: ClassVar[str] = "warm_burst"
    reply: ClassVar[type] = Ok
    dtypes: list[str]


@dataclass
class RunBurst:
    """Run a prepared burst on inputs drawn from `seed`, told only now, for the grading process
    to time from outside."""

    op: ClassVar[str] = "burst"
    reply: ClassVar[type] = BurstReply
    contender: str
    seed: int
    last: bool = False  # then let the burst go (its CUDA graph and memory) before the checks that follow
    gate_ms: float = 0.0  # a queued burst's gate: the GPU held at least this long before its calls run


@dataclass
class DropBurst:
    """Let a prepared burst go (its CUDA graph and memory) without running it again."""

    op: ClassVar[str] = "drop_burst"
    reply: ClassVar[type] = Ok
    contender: str


@dataclass
class Call:
    """One untimed call on the GPU; its output kept under `key`."""

    op: ClassVar[str] = "call"
    reply: ClassVar[type] = CallReply
    contender: str
    inputs: str
    layout: dict[str, dict]
    key: str
    record_ops: bool = False
    record_launches: str = ""  # a folder: write the call's launch record there (grader.worker.launches)
    warm: bool = True  # with record_launches: a first call before the recorded one (compiles, autotunes)
    keep_inputs: bool = False  # the input set stays on the GPU for later calls (read from disk once)


@dataclass
class Sample:
    """Write the kept outputs' elements at the flat indices in `indices` to `output` (each
    `key`, and its whole size as `numel.<key>`)."""

    op: ClassVar[str] = "sample"
    reply: ClassVar[type] = Ok
    contender: str
    keys: list[str]
    indices: str
    output: str


@dataclass
class Roofline:
    """Measure this GPU's copy bandwidth and GEMM rates."""

    op: ClassVar[str] = "roofline"
    reply: ClassVar[type] = RooflineReply


@dataclass
class Compare:
    """The trusted worker only: the elements of a result at the judge's flat indices (`indices`, a
    file of the judge's, never one a worker could write), from a result file written elsewhere (a
    student's worker, a replay process: read as theirs, never through a link, at most `limit`
    bytes): the tensor `name` holds those elements and `numel.<name>` the whole result's size. They
    are compared on the GPU with the kept `truth` there, by the error model (`atol`, `rtol`, twice
    how far the whole `reference` strays from the whole `truth`, 1% of the value);
    grader.judge.picks says why a sample is enough."""

    op: ClassVar[str] = "compare"
    reply: ClassVar[type] = CompareReply
    file: str
    name: str
    limit: int
    truth: str
    reference: str
    atol: float
    rtol: float
    indices: str


@dataclass
class Exit:
    """End the worker (no reply)."""

    op: ClassVar[str] = "exit"
    reply: ClassVar[type | None] = None


Request = Union[Ping, Load, Run, Time, PrepareBurst, WarmBurst, RunBurst, DropBurst, Call, Sample, Roofline,
                Compare, Exit]
Reply = Union[Ok, RunReply, TimeReply, BurstReady, BurstReply, CallReply, RooflineReply, CompareReply]
_REQUEST_CLASSES = (Ping, Load, Run, Time, PrepareBurst, WarmBurst, RunBurst, DropBurst, Call, Sample, Roofline,
                    Compare, Exit)
REQUESTS: dict[str, type] = {cls.op: cls for cls in _REQUEST_CLASSES}


# -- the wire -------------------------------------------------------------------------------

def encode(message: Request | Reply | Failure) -> str:
    """One line of JSON: a request with its "op", a reply with its "ok" (a Failure's `output`
    stays on the trusted side)."""
    body = dataclasses.asdict(message)
    if isinstance(message, Failure):
        body.pop("output")
    head: dict[str, object] = {"op": message.op} if isinstance(message, _REQUEST_CLASSES) else {"ok": message.ok}
    return json.dumps({**head, **body}) + "\n"


def decode_request(line: str | bytes) -> Request:
    """A request from its line; ProtocolError says what is wrong with it."""
    data = _json_object(line)
    op = data.pop("op", None)
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        known = ", ".join(REQUESTS)
        raise ProtocolError(f"unknown request op {op!r} (known: {known})")
    return _build(cls, data, op)


def decode_reply(request: Request, line: str | bytes) -> Reply | Failure:
    """The reply to `request`, or the worker's Failure; ProtocolError if it is neither."""
    data = _json_object(line)
    ok = data.pop("ok", None)
    if ok is True:
        assert request.reply is not None  # only Exit has no reply, and it is never answered
        return _build(request.reply, data, f"the reply to {request.op}")
    if ok is False:
        # the captured output is the grading process's to attach, not the worker's to claim
        data.pop("output", None)
        failure = _build(Failure, data, f"the failure reply to {request.op}")
        if failure.kind not in WORKER_KINDS:
            raise ProtocolError(f"the failure reply to {request.op}: kind {failure.kind!r} "
                                f"is not one a worker may report ({', '.join(WORKER_KINDS)})")
        return failure
    raise ProtocolError(f"the reply to {request.op}: 'ok' must be true or false, not {ok!r}")


def _json_object(line: str | bytes) -> dict:
    try:
        data = json.loads(line)
    except RecursionError:
        raise ProtocolError("not JSON (nested too deep)") from None
    except ValueError as exc:
        raise ProtocolError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"not a JSON object but {_kind(data)}")
    return data


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type, required) of each field of a message class (ClassVars are not fields)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls))


def _build(cls: type, data: dict, what: str):
    known = {name for name, _, _ in _fields(cls)}
    extra = sorted(set(data) - known)
    if extra:
        raise ProtocolError(f"{what}: unexpected field {extra[0]!r}")
    values = {}
    for name, hint, required in _fields(cls):
        if name not in data:
            if required:
                raise ProtocolError(f"{what}: field {name!r} is missing")
            continue
        values[name] = _check(data[name], hint, f"{what}: field {name!r}", name in getattr(cls, "nonfinite", ()))
    return cls(**values)


def _check(value, hint, where: str, nonfinite: bool = False):
    """`value` as `hint` types it (lists become tuples where a tuple is typed, objects become
    dataclasses), its text cleaned and bounded (`clean_text`), its numbers finite unless
    `nonfinite`; or ProtocolError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _check(value, options[0], where, nonfinite)
        raise TypeError(f"unsupported union {hint}")  # not used by any message
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object, not {_kind(value)}")
        return _build(cast(type, hint), value, where)  # is_dataclass also admits instances; a hint is a class
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list, not {_kind(value)}")
        if args[0] is str and len(value) > ENTRIES_LIMIT:
            raise ProtocolError(f"{where} holds {len(value)} strings, more than the {ENTRIES_LIMIT} a reply may")
        return [_check(v, args[0], f"{where}[{i}]", nonfinite) for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, list) or len(value) != len(args):
            raise ProtocolError(f"{where} must be a list of {len(args)}, not {_kind(value)}")
        return tuple(_check(v, a, f"{where}[{i}]", nonfinite) for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object, not {_kind(value)}")
        if not args:
            return value
        if len(value) > ENTRIES_LIMIT:
            raise ProtocolError(f"{where} holds {len(value)} entries, more than the {ENTRIES_LIMIT} a reply may")
        return {clean_text(k, KEY_LIMIT): _check(v, args[1], f"{where}[{clean_text(k, 40)!r}]", nonfinite)
                for k, v in value.items()}
    if hint is float:
        if type(value) not in (int, float) or (type(value) is int and abs(value) >= INT_LIMIT):
            raise ProtocolError(f"{where} must be a number, not {_kind(value)}")
        if not nonfinite and not math.isfinite(value):
            raise ProtocolError(f"{where} must be a finite number, not {value}")
        return float(value)
    if hint in (int, str, bool):
        if type(value) is not hint:  # exact: True is no int here
            raise ProtocolError(f"{where} must be {_NAMES[hint]}, not {_kind(value)}")
        if hint is int and abs(value) >= INT_LIMIT:
            raise ProtocolError(f"{where} must be an integer within 64 bits")
        if hint is str:
            return clean_text(value)
        return value
    raise TypeError(f"unsupported field type {hint}")


_NAMES = {int: "an integer", str: "a string", bool: "true or false"}


def _kind(value) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)
