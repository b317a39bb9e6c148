"""The codec both sides of the trust line share: tensors and their layouts in and out.

Inputs travel as safetensors files the worker loads without unpickling anything, and keep
their layout: a strided view travels as the whole storage it views plus (size, stride,
offset), so the student sees the same non-contiguous tensor the spec made, and a write
outside the view's elements is seen too. Imported by the worker: it must stay small and
import nothing else of the package.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

# The worker fills every tensor the student's call allocates uninitialized (torch.empty and its
# kin) with a NaN of our own: a quiet NaN whose payload no arithmetic produces (a CPU computes
# 0xFFC00000, an NVIDIA GPU the canonical 0x7FFFFFFF, torch's own fill and float("nan") give
# 0x7FC00000), one per float dtype, as fp16 and bf16 have fewer payload bits. The judge checks
# the bits of each NaN it finds: only where this payload survives was an element never written;
# any other NaN the kernel computed.
POISON: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float32: (torch.int32, 0x7FE1DEAD),
    torch.float16: (torch.int16, 0x7F5A),
    torch.bfloat16: (torch.int16, 0x7FE5),
    torch.float64: (torch.int64, 0x7FFDEADBEEF1A5E5),
}


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill a float tensor with its dtype's poison NaN, bit for bit (other dtypes are left)."""
    if t.dtype in POISON and t.numel():
        as_int, bits = POISON[t.dtype]
        t.view(as_int).fill_(bits)
    return t


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """Where `t` still holds the poison, bit for bit (False everywhere for other dtypes)."""
    if t.dtype not in POISON:
        return torch.zeros(t.shape, dtype=torch.bool)
    as_int, bits = POISON[t.dtype]
    return t.detach().cpu().contiguous().view(as_int) == bits


def storage_of(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind `t` as a flat tensor of t's dtype, on the CPU: what a view
    can read or write, so a write outside the view's elements is seen too."""
    flat = torch.empty(0, dtype=t.dtype, device=t.device)
    flat.set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),), (1,))
    return flat.detach().to("cpu").clone()


def write_inputs(inputs: dict, path: Path) -> dict:
    """Save inputs (views kept as storage + strides); returns the layout the worker rebuilds
    from. Plain arguments (causal=True, eps=1e-5, a seed) travel in the layout as JSON values."""
    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, dict] = {}
    for name, t in inputs.items():
        if isinstance(t, torch.Tensor):
            tensors[name] = storage_of(t)
            layout[name] = {"size": list(t.shape), "stride": list(t.stride()), "offset": t.storage_offset()}
        elif t is None or isinstance(t, (bool, int, float, str)):
            layout[name] = {"value": t}
        else:
            raise TypeError(f"input {name!r}: a spec's inputs are tensors or plain values, not {type(t).__name__}")
    save_file(tensors, str(path))
    return layout


def rebuild(storages: dict[str, torch.Tensor], layout: dict, device: str = "cpu") -> dict:
    """Inverse of write_inputs: the same views over the same storages, in argument order."""
    return {
        name: spec["value"] if "value" in spec
        else storages[name].to(device).as_strided(spec["size"], spec["stride"], spec["offset"])
        for name, spec in layout.items()
    }


# Results of a gigabyte (a whole result at the timing size) cross a process as a safetensors file
# written and read here without the intermediate copies of safetensors' own save and load (each
# a full copy of the bytes in host memory): the tensor's bytes go to the file from where they
# lie, and come back into one buffer the size the header says, bounded and checked.
_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL"}
_FROM_ST = {v: k for k, v in _ST_DTYPES.items()}
MAX_HEADER_BYTES = 64 << 10


class ResultFileError(ValueError):
    """A result file that is not what it must be: not safetensors, not the tensor asked for."""


class ResultTooLarge(ResultFileError):
    """A result file larger than its reader allows: not read at all."""


def write_tensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """`tensors` (on any device) as one safetensors file, each tensor's bytes written from a
    contiguous host copy of it, never copied again."""
    import json

    host = {k: t.detach().reshape(-1).to("cpu").contiguous() for k, t in tensors.items()}
    header: dict[str, object] = {}
    offset = 0
    for k, t in host.items():
        n = t.numel() * t.element_size()
        header[k] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(tensors[k].shape),
                     "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for t in host.values():
            if t.numel():
                f.write(t.view(torch.uint8).numpy().data)


def read_header(fd: int) -> tuple[dict, int]:
    """The safetensors header of the file open at `fd` (read as data: at most 64 KiB of JSON, an
    object) and its length in bytes; ResultFileError where it is not one."""
    import json
    import os

    size = os.fstat(fd).st_size
    head = os.pread(fd, 8, 0)
    length = int.from_bytes(head, "little") if len(head) == 8 else -1
    if not 0 < length <= MAX_HEADER_BYTES or 8 + length > size:
        raise ResultFileError("the file is not safetensors (its header's length)")
    try:
        header = json.loads(os.pread(fd, length, 8))
    except (ValueError, RecursionError):  # RecursionError: brackets nested past the parser's depth
        raise ResultFileError("the file is not safetensors (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ResultFileError("the file is not safetensors (its header is not an object)")
    return header, length


def floating_dtypes(path: str | Path) -> list[str]:
    """The floating-point dtypes ("float32", ...) of the tensors in a safetensors file of the
    grader's own (an input set), from its header alone: a set of gigabytes is not read for them."""
    import os

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        header, _ = read_header(fd)
    finally:
        os.close(fd)
    dtypes = [_FROM_ST.get(str(e.get("dtype"))) for e in header.values() if isinstance(e, dict)]
    return sorted({str(d).removeprefix("torch.") for d in dtypes if d is not None and d.is_floating_point})


def read_tensor(fd: int, name: str, limit: int) -> torch.Tensor:
    """Tensor `name` of the safetensors file open at `fd` (another process wrote it: read as
    data), on the host: at most `limit` bytes of it read, straight into the tensor's own buffer;
    ResultFileError where the file is larger, its header malformed or longer than 64 KiB, or the
    tensor missing, of another size than its header says, or cut short."""
    import os

    size = os.fstat(fd).st_size
    if size > limit:
        raise ResultTooLarge(f"the file is larger than {limit} bytes")
    header, length = read_header(fd)
    entry = header.get(name)
    if not isinstance(entry, dict):
        raise ResultFileError(f"the file holds no tensor {name!r}")
    dtype, shape, offsets = _FROM_ST.get(str(entry.get("dtype"))), entry.get("shape"), entry.get("data_offsets")
    if dtype is None or not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) \
            or not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise ResultFileError(f"the tensor {name!r} is not described as safetensors describes one")
    numel = 1
    for d in shape:
        numel *= d
    start, end = offsets
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if not 0 <= start <= end or end - start != numel * itemsize or 8 + length + end > size:
        raise ResultFileError(f"the tensor {name!r} does not fit its header")
    buf = torch.empty(end - start, dtype=torch.uint8)
    view, done = buf.numpy().data, 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], 8 + length + start + done)
        if got <= 0:
            raise ResultFileError(f"the tensor {name!r} is cut short")
        done += got
    return buf.view(dtype).reshape(shape)
