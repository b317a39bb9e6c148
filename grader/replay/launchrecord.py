"""A worker's launch record (grader.worker.launches), read as the hostile data it is.

Everything is checked before anything is loaded: the JSON's size and shape, counts, names,
dtypes, grids, warps, shared memory, each argument's role against the call's real inputs and
the record's own outputs and scratch, offsets inside their buffers, the signature's types, and
each compiled file (a regular file in the record's folder, not a link, bounded, its SHA-256 what
the record says, its metadata naming the same kernel with the same warps and shared memory).
A record that fails any check is refused with the reason (LaunchRecordError): the call is then timed
the fallback way, never on the record's word.

The standard library only: the judge imports this without torch's CUDA or Triton.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

MAX_RECORD_BYTES = 1 << 20
MAX_FILE_BYTES = 16 << 20
MAX_METADATA_BYTES = 256 << 10
MAX_LAUNCHES = 64
MAX_KERNELS = 16
MAX_ARGS = 64
MAX_SCRATCH = 32
MAX_SCRATCH_BYTES = 8 << 30
MAX_FILLS = 64
MAX_GRID = (2**31 - 1, 65535, 65535)
# streams a call's launches may name: replayed one after another on one stream, in the record's order (a
# multi-stream call's host order, which every wait between its streams respects), so the overlap is not credited
MAX_STREAMS = 8
MAX_SHARED = 232448  # bytes per block, an H100's opt-in limit
WARPS = (1, 2, 4, 8, 16, 32)
DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2, "int32": 4,
          "int64": 8, "bool": 1}
_ELEMENT = r"(fp8e4nv|fp8e5|fp8e4b15|fp16|bf16|fp32|fp64|i1|i8|i16|i32|i64|u1|u8|u16|u32|u64)"
TYPE = re.compile(rf"^(constexpr|\*?k?{_ELEMENT}|tensordesc<{_ELEMENT}\[\d{{1,5}}(, ?\d{{1,5}}){{0,4}}\]>)$")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
FILE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\.(json|cubin|ptx|ttir|ttgir|llir|source)$")
SHA = re.compile(r"^[0-9a-f]{64}$")
INT_RANGE = {"i1": (0, 1), "i8": (-2**7, 2**7 - 1), "i16": (-2**15, 2**15 - 1), "i32": (-2**31, 2**31 - 1),
             "i64": (-2**63, 2**63 - 1), "u1": (0, 1), "u8": (0, 255), "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1),
             "u64": (0, 2**64 - 1)}


class LaunchRecordError(ValueError):
    """Why a launch record is refused."""


@dataclass
class Kernel:
    hash: str
    name: str
    files: dict[str, Path]  # label (e.g. "add.cubin") -> the checked file in the record's folder
    signature: dict[str, str]
    constants: list  # [[path, value], ...] as Triton's CompiledKernel src keeps them
    arg_names: list[str]
    metadata: dict


@dataclass
class Arg:
    name: str
    kind: str  # "tensor" or "value"
    role: str = ""  # for a tensor or a descriptor's base: input, output, scratch
    ref: str | int = ""
    offset: int = 0
    value: object = None
    desc: dict | None = None  # a host TMA descriptor's dtype, shape, strides, block_shape, padding, round_f32_to_tf32


@dataclass
class RecordedLaunch:
    kernel: Kernel
    grid: tuple[int, int, int]
    args: list[Arg]


@dataclass
class Fill:
    role: str
    ref: str | int
    offset: int
    shape: list[int]
    stride: list[int]
    dtype: str
    value: float


@dataclass
class Copy:
    """A copy the wrapper made with torch (a layout or dtype change), replayed between our buffers."""

    to: Fill  # the destination view (its value unused)
    source: Fill  # the source view


@dataclass
class Output:
    dtype: str
    shape: list[int]
    stride: list[int]
    offset: int
    nbytes: int


@dataclass
class ReplayPlan:
    """A record that passed every check: what the replay does, in order."""

    steps: list  # Fill | RecordedLaunch, in the call's order
    outputs: list[Output]
    scratch: list[tuple[int, float | None]]  # (bytes, fill value or None)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    # what the call did in torch that is not replayed (the worker's words)
    torch_work: list[str] = field(default_factory=list)


def _need(cond: bool, why: str) -> None:
    if not cond:
        raise LaunchRecordError(why)


def _int(value: Any, lo: int, hi: int, what: str) -> int:
    _need(type(value) is int and lo <= value <= hi, f"{what} is not an integer in [{lo}, {hi}]")
    return value


def _list(value: Any, most: int, what: str) -> list:
    _need(isinstance(value, list) and len(value) <= most, f"{what} is not a list of at most {most}")
    return value


def _dict(value: Any, what: str) -> dict:
    _need(isinstance(value, dict), f"{what} is not an object")
    return value


def _bytes_of(shape: list[int], stride: list[int], dtype: str, offset: int) -> int:
    """The bytes a view's last element ends at, from its storage's start."""
    if any(s == 0 for s in shape):
        return offset
    return offset + (sum((n - 1) * st for n, st in zip(shape, stride)) + 1) * DTYPES[dtype]


def _view(d: dict, what: str) -> tuple[list[int], list[int], str, int]:
    dtype: Any = d.get("dtype")  # the record's JSON, checked next
    _need(dtype in DTYPES, f"{what}: dtype {str(dtype)[:40]!r} is not one the replay knows")
    shape = [_int(n, 0, 2**40, f"{what}: a dimension") for n in _list(d.get("shape"), 8, f"{what}: shape")]
    stride = [_int(n, 0, 2**40, f"{what}: a stride") for n in _list(d.get("stride"), 8, f"{what}: stride")]
    _need(len(shape) == len(stride), f"{what}: shape and stride differ in length")
    offset = _int(d.get("offset"), 0, 2**42, f"{what}: offset")
    return shape, stride, dtype, offset


def read_file(path: Path, limit: int) -> bytes:
    """A regular file's bytes, never through a link, never more than `limit`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise LaunchRecordError(f"{path.name}: cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        _need(stat.S_ISREG(st.st_mode), f"{path.name}: not a regular file")
        _need(st.st_size <= limit, f"{path.name}: over {limit} bytes")
        data = os.read(fd, limit + 1)
        _need(len(data) <= limit, f"{path.name}: over {limit} bytes")
        return data
    finally:
        os.close(fd)


def load(folder: Path, input_bytes: dict[str, int], arch: int | None = None) -> ReplayPlan:
    """The record in `folder` (launches.json and the files it names), checked against the call's
    inputs (name -> bytes of its storage, the grader's own figures); LaunchRecordError if refused, or
    if the record itself says why the call cannot be replayed."""
    folder = Path(folder)
    try:
        raw = json.loads(read_file(folder / "launches.json", MAX_RECORD_BYTES))
    except ValueError as exc:
        raise LaunchRecordError(f"the record is not JSON ({str(exc)[:80]})") from None
    return check(_dict(raw, "the record"), folder, input_bytes, arch)


def check(raw: dict, folder: Path, input_bytes: dict[str, int], arch: int | None = None) -> ReplayPlan:
    """`load`'s checks on an already parsed record."""
    why_not = _list(raw.get("why_not", []), 8, "why_not")
    if why_not:
        _need(all(isinstance(w, str) for w in why_not), "why_not holds a non-string")
        raise LaunchRecordError("not replayable: " + "; ".join(w[:200] for w in why_not))
    outputs = []
    for i, o in enumerate(_list(raw.get("outputs"), 8, "outputs")):
        shape, stride, dtype, offset = _view(_dict(o, f"output {i}"), f"output {i}")
        nbytes = _int(o.get("nbytes"), 1, MAX_SCRATCH_BYTES, f"output {i}: nbytes")
        _need(_bytes_of(shape, stride, dtype, offset) <= nbytes, f"output {i}: the view runs past its buffer")
        outputs.append(Output(dtype, shape, stride, offset, nbytes))
    _need(bool(outputs), "the record has no output")
    scratch = []
    for i, s in enumerate(_list(raw.get("scratch", []), MAX_SCRATCH, "scratch")):
        s = _dict(s, f"scratch {i}")
        init = s.get("init")
        _need(init is None or type(init) in (int, float), f"scratch {i}: init is not a number")
        scratch.append((_int(s.get("nbytes"), 1, MAX_SCRATCH_BYTES, f"scratch {i}: nbytes"),
                        None if init is None else float(init)))
    _need(sum(n for n, _ in scratch) + sum(o.nbytes for o in outputs) <= MAX_SCRATCH_BYTES,
          "the record's buffers are too large")
    sizes = {"input": dict(input_bytes), "output": {i: o.nbytes for i, o in enumerate(outputs)},
             "scratch": {i: n for i, (n, _) in enumerate(scratch)}}

    kernels = {}
    raw_kernels = _dict(raw.get("kernels"), "kernels")
    _need(len(raw_kernels) <= MAX_KERNELS, f"more than {MAX_KERNELS} kernels")
    for key, k in raw_kernels.items():
        kernels[key] = _kernel(key, _dict(k, f"kernel {key[:16]}"), folder, arch)

    launches = []
    for i, item in enumerate(_list(raw.get("launches"), MAX_LAUNCHES, "launches")):
        launches.append(_launch(_dict(item, f"launch {i}"), i, kernels, sizes))
    _need(bool(launches), "the record has no launch")
    steps: list[Fill | Copy | RecordedLaunch] = []
    seen = 0
    sequence = _list(raw.get("sequence"), MAX_LAUNCHES + MAX_FILLS, "sequence")
    _need(sum(1 for s in sequence if isinstance(s, dict) and "launch" not in s) <= MAX_FILLS,
          f"more than {MAX_FILLS} fills and copies")
    for j, step in enumerate(sequence):
        step = _dict(step, f"step {j}")
        _need(len(step) == 1 and next(iter(step)) in ("fill", "copy", "launch"),
              f"step {j} is not a fill, a copy or a launch")
        if "launch" in step:
            _need(step["launch"] == seen, f"step {j}: launches out of order")
            steps.append(launches[seen])
            seen += 1
        elif "copy" in step:
            steps.append(_copy(_dict(step["copy"], f"step {j}"), j, sizes))
        else:
            steps.append(_fill(_dict(step["fill"], f"step {j}"), j, sizes))
    _need(seen == len(launches), "the sequence does not hold every launch once")
    torch_work = _list(raw.get("torch_work", []), 8, "torch_work")
    _need(all(isinstance(w, str) for w in torch_work), "torch_work holds a non-string")
    return ReplayPlan(steps=steps, outputs=outputs, scratch=scratch, kernels=kernels,
                      torch_work=[w[:200] for w in torch_work])


def _region(role: Any, ref: Any, sizes: dict, what: str) -> int:
    _need(role in ("input", "output", "scratch"),
          f"{what}: role {str(role)[:20]!r} is not input, output or scratch")
    _need((type(ref) is str if role == "input" else type(ref) is int) and ref in sizes[role],
          f"{what}: {role} {str(ref)[:40]!r} is not one of the call's")
    return sizes[role][ref]


def _fill(d: dict, j: int, sizes: dict) -> Fill:
    what = f"fill {j}"
    nbytes = _region(d.get("role"), d.get("ref"), sizes, what)
    _need(d.get("role") != "input", f"{what}: the call wrote an input")
    shape, stride, dtype, offset = _view(d, what)
    _need(_bytes_of(shape, stride, dtype, offset) <= nbytes, f"{what}: runs past its buffer")
    value: Any = d.get("value")  # the record's JSON, checked next
    _need(type(value) in (int, float) and abs(value) < 1e38 and value == value,
          f"{what}: value is not a finite number")
    return Fill(d["role"], d["ref"], offset, shape, stride, dtype, float(value))


def _copy(d: dict, j: int, sizes: dict) -> Copy:
    what = f"copy {j}"
    views = []
    for end in ("to", "from"):
        v = _dict(d.get(end), f"{what}: {end}")
        nbytes = _region(v.get("role"), v.get("ref"), sizes, f"{what}: {end}")
        shape, stride, dtype, offset = _view(v, f"{what}: {end}")
        _need(offset % DTYPES[dtype] == 0, f"{what}: {end} is not aligned to its dtype")
        _need(_bytes_of(shape, stride, dtype, offset) <= nbytes, f"{what}: {end} runs past its buffer")
        views.append(Fill(v["role"], v["ref"], offset, shape, stride, dtype, 0.0))
    _need(views[0].role != "input", f"{what}: the call wrote an input")
    _need(views[0].shape == views[1].shape, f"{what}: the shapes differ")
    return Copy(views[0], views[1])


def _launch(d: dict, i: int, kernels: dict, sizes: dict) -> RecordedLaunch:
    what = f"launch {i}"
    key = d.get("kernel")
    _need(type(key) is str and key in kernels, f"{what}: its kernel is not in the record")
    kernel = kernels[key]
    raw_grid = _list(d.get("grid"), 3, f"{what}: grid")
    _need(len(raw_grid) == 3, f"{what}: grid is not three numbers")
    grid = cast("tuple[int, int, int]",  # three, checked above
                tuple(_int(g, 1, hi, f"{what}: grid") for g, hi in zip(raw_grid, MAX_GRID)))
    _int(d.get("stream"), 0, MAX_STREAMS - 1, f"{what}: stream")
    _need(d.get("num_warps") == kernel.metadata.get("num_warps") and d.get("shared") == kernel.metadata.get("shared"),
          f"{what}: warps or shared memory differ from its compiled kernel's")
    args = _list(d.get("args"), MAX_ARGS, f"{what}: args")
    _need([a.get("name") if isinstance(a, dict) else None for a in args] == kernel.arg_names,
          f"{what}: its arguments are not its kernel's parameters")
    out = []
    for a in args:
        name, kind, sig = a["name"], a.get("kind"), kernel.signature.get(a["name"])
        if kind == "tensor":
            _need(isinstance(sig, str) and sig.startswith("*"),
                  f"{what}: {name} is a tensor where the kernel takes {sig}")
            nbytes = _region(a.get("role"), a.get("ref"), sizes, f"{what}: {name}")
            offset = _int(a.get("offset"), 0, nbytes - 1, f"{what}: {name}'s offset")
            out.append(Arg(name, "tensor", a["role"], a["ref"], offset))
        elif kind == "tensordesc":
            _need(isinstance(sig, str) and sig.startswith("tensordesc<"),
                  f"{what}: {name} is a descriptor where the kernel takes {sig}")
            out.append(_descriptor(a, f"{what}: {name}", sizes))
        elif kind == "value":
            value = a.get("value")
            _need(value is None or type(value) in (bool, int, float, str), f"{what}: {name} is not a plain value")
            _need(type(value) is not str or len(value) <= 64, f"{what}: {name} is too long")
            if sig in INT_RANGE:
                lo, hi = INT_RANGE[sig]
                _need(type(value) in (int, bool) and lo <= value <= hi, f"{what}: {name} does not fit {sig}")
            elif sig in ("fp16", "bf16", "fp32", "fp64"):
                _need(type(value) in (int, float), f"{what}: {name} is not a number")
            elif sig != "constexpr":
                _need(False, f"{what}: {name} is a value where the kernel takes {sig}")
            out.append(Arg(name, "value", value=value))
        else:
            _need(False, f"{what}: {name} is neither a tensor nor a value")
    return RecordedLaunch(kernel, grid, out)


def _descriptor(a: dict, what: str, sizes: dict) -> Arg:
    """A host TMA descriptor: its numbers bounded, and everything it lets the kernel reach inside
    its base's buffer (the hardware clips the kernel's accesses to the descriptor's shape)."""
    nbytes = _region(a.get("role"), a.get("ref"), sizes, what)
    dtype: Any = a.get("dtype")  # the record's JSON, checked next
    _need(dtype in DTYPES, f"{what}: dtype {str(dtype)[:40]!r} is not one the replay knows")
    offset = _int(a.get("offset"), 0, nbytes - 1, f"{what}: offset")
    _need(offset % 16 == 0, f"{what}: the base is not 16-byte aligned")
    shape = [_int(n, 1, 2**31, f"{what}: shape") for n in _list(a.get("shape"), 5, f"{what}: shape")]
    strides = [_int(n, 0, 2**40, f"{what}: strides") for n in _list(a.get("strides"), 5, f"{what}: strides")]
    block = [_int(n, 1, 256, f"{what}: block_shape") for n in _list(a.get("block_shape"), 5, f"{what}: block_shape")]
    _need(len(shape) == len(strides) == len(block) >= 1 and strides[-1] == 1,
          f"{what}: shape, strides and block shape disagree")
    _need(_bytes_of(shape, strides, dtype, offset) <= nbytes, f"{what}: the descriptor reaches past its buffer")
    _need(a.get("padding") in ("zero", "nan") and type(a.get("round_f32_to_tf32")) is bool, f"{what}: padding refused")
    return Arg(a["name"], "tensordesc", a["role"], a["ref"], offset,
               desc={"dtype": dtype, "shape": shape, "strides": strides, "block_shape": block, "padding": a["padding"],
                     "round_f32_to_tf32": a["round_f32_to_tf32"]})


def _kernel(key: str, k: dict, folder: Path, arch: int | None) -> Kernel:
    what = f"kernel {key[:16]}"
    _need(type(key) is str and SHA.match(key) is not None, f"{what}: its hash is not 64 hex digits")
    name: Any = k.get("name")  # the record's JSON, checked next
    _need(type(name) is str and NAME.match(name) is not None, f"{what}: its name is not an identifier")
    signature = _dict(k.get("signature"), f"{what}: signature")
    _need(len(signature) <= MAX_ARGS and all(type(n) is str and NAME.match(n) and type(t) is str and TYPE.match(t)
                                             for n, t in signature.items()),
          f"{what}: its signature has a type the replay refuses")
    arg_names = _list(k.get("arg_names"), MAX_ARGS, f"{what}: arg_names")
    _need(arg_names == list(signature), f"{what}: arg_names are not its signature's")
    constants = _list(k.get("constants"), MAX_ARGS, f"{what}: constants")
    for c in constants:
        _need(isinstance(c, list) and len(c) == 2 and isinstance(c[0], list) and len(c[0]) <= 4
              and all(type(p) is int and 0 <= p < MAX_ARGS for p in c[0])
              and (c[1] is None or type(c[1]) in (bool, int, float) or type(c[1]) is str and len(c[1]) <= 64),
              f"{what}: a constant is not a (path, plain value) pair")
    files = {}
    raw_files = _dict(k.get("files"), f"{what}: files")
    _need(len(raw_files) <= 8, f"{what}: too many files")
    for label, digest in raw_files.items():
        _need(type(label) is str and FILE.match(label) is not None, f"{what}: file name {str(label)[:40]!r} refused")
        _need(type(digest) is str and SHA.match(digest) is not None, f"{what}: {label}'s hash is not 64 hex digits")
        data = read_file(folder / digest, MAX_FILE_BYTES)
        _need(hashlib.sha256(data).hexdigest() == digest, f"{what}: {label} is not the file its hash names")
        files[label] = folder / digest
    metas = [lb for lb in files if lb.endswith(".json")]
    _need(f"{name}.json" in metas and f"{name}.cubin" in files, f"{what}: no metadata and binary named {name}")
    try:
        metadata = json.loads(read_file(files[f"{name}.json"], MAX_METADATA_BYTES))
    except ValueError:
        raise LaunchRecordError(f"{what}: its metadata is not JSON") from None
    metadata = _dict(metadata, f"{what}: metadata")
    _need(len(metadata) <= 128 and all(type(m) is str and NAME.match(m) for m in metadata),
          f"{what}: its metadata has a key that is not an identifier")
    _need(metadata.get("name") == name, f"{what}: its metadata names another kernel")
    target = _dict(metadata.get("target"), f"{what}: target")
    _need(target.get("backend") == "cuda", f"{what}: not a CUDA kernel")
    if arch is not None:
        _need(target.get("arch") == arch, f"{what}: built for sm_{str(target.get('arch'))[:8]}, this GPU is sm_{arch}")
    _need(metadata.get("num_warps") in WARPS, f"{what}: num_warps refused")
    _int(metadata.get("shared"), 0, MAX_SHARED, f"{what}: shared memory")
    _int(metadata.get("num_ctas", 1), 1, 1, f"{what}: clusters of CTAs")
    for scratch_key in ("global_scratch_size", "profile_scratch_size"):
        _int(metadata.get(scratch_key, 0), 0, 1 << 30, f"{what}: {scratch_key}")
    return Kernel(key, name, files, dict(signature), constants, list(arg_names), metadata)
