"""The judge's evidence: the tensors a worker saved, read back and checked before anything is
believed of them.

The worker runs the student's code, so its output file is hostile bytes like the rest: a header
may name a dtype the judge cannot compare (float8), a tensor no call makes, or a shape of
gigabytes. So the file's safetensors header is read first and every entry checked against what
the case can produce (`Expected`: the float64 truth's shapes, the inputs' dtypes and sizes), and
only a file that passes is loaded: an output far larger than the case's is refused from its
header, before it costs memory. What the reply *says* of a result (dtype, shape) is never read
for a verdict: grader.judge.verdict reads the tensors, and holds the reply's description against
them (a disagreement is the student's failure, named).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Sequence

import torch
from safetensors.torch import load

from grader.sandbox.files import WORKER_FILE_LIMIT, WorkerFileError, open_worker_file

# the dtypes a result may come back in and still be compared (converted to float64); a result in
# another (float8, complex, unsigned wider than a byte) is refused from the header
READABLE: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
CODES = {dtype: code for code, dtype in READABLE.items()}
NAMED = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64", "U16": "uint16", "U32": "uint32",
         "U64": "uint64"}  # what torch calls the others, for the message
HEADER_LIMIT = 1 << 20  # a header of the few tensors a call saves is well under a kilobyte
# an output of up to 4x the expected elements (+4096) is read, to be named by its shape
SLACK, SLACK_ELEMENTS = 4, 1 << 12
MAX_PARTS = 64  # output.0 .. output.63: more results than any assignment returns are not read


class EvidenceError(Exception):
    """The worker's output file is not evidence the judge can read: the case fails with this
    reason (the student's, never the grader's)."""


@dataclass(frozen=True)
class Expected:
    """What one call can save: its results' shapes as the float64 truth makes them (None: a property
    check, where `most` bounds each result's elements), and each tensor input's dtype and storage size."""

    outputs: tuple[tuple[int, ...], ...] | None
    inputs: dict[str, tuple[torch.dtype, int]]
    most: int

    @classmethod
    def of(cls, inputs: dict, refs: Any) -> Expected:
        """From the trusted inputs and the float64 truth (None: a property check, no truth)."""
        tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        shapes: tuple[tuple[int, ...], ...] | None = None
        if isinstance(refs, torch.Tensor):
            shapes = (tuple(refs.shape),)
        elif isinstance(refs, (tuple, list)):
            shapes = tuple(tuple(r.shape) for r in refs)
        most = max((t.numel() for t in tensors.values()), default=0)
        # as codec.storage_of saves it
        storage = {k: t.untyped_storage().nbytes() // t.element_size() for k, t in tensors.items()}
        return cls(shapes, {k: (t.dtype, storage[k]) for k, t in tensors.items()}, most)

    def limit(self, name: str) -> int:
        """How many elements the saved tensor `name` may have and still be read."""
        if self.outputs is None:
            allowed = self.most
        else:
            index = 0 if name == "output" else int(name.split(".", 1)[1])
            shapes = self.outputs if index >= len(self.outputs) else (self.outputs[index],)
            allowed = max(_numel(s) for s in shapes) if shapes else 0
        return SLACK * allowed + SLACK_ELEMENTS


def read_saved(path: Path, expected: Expected) -> dict[str, torch.Tensor]:
    """The tensors of a worker's output file, each checked from the header before the file is
    read (see the module's docstring); EvidenceError says why the file is not evidence."""
    try:
        fd = open_worker_file(path)
    except WorkerFileError as exc:
        raise EvidenceError(f"the worker's output file could not be read: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size > WORKER_FILE_LIMIT:
            raise EvidenceError(f"the worker's output file is larger than {WORKER_FILE_LIMIT} bytes: not read")
        head = f.read(8)
        if len(head) < 8:
            raise EvidenceError("the worker's output file is not a safetensors file (shorter than its header)")
        n = int.from_bytes(head, "little")
        if n > HEADER_LIMIT or 8 + n > size:
            raise EvidenceError(f"the worker's output file has a header of {n} bytes (at most {HEADER_LIMIT} are "
                                f"read): not read")
        raw = f.read(n)
        end = _check_entries(_header(raw), expected, size - 8 - n)
        data = head + raw + f.read(end)
    try:
        return load(data)
    except Exception as exc:  # noqa: BLE001 - whatever the worker left there, it is not a result
        raise EvidenceError(f"the worker's output file could not be read: {_short(exc)}") from None


def _header(raw: bytes) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EvidenceError(f"the worker's output file has a header that is not JSON ({_short(exc)})") from None
    if not isinstance(header, dict):
        raise EvidenceError("the worker's output file has a header that is not a JSON object")
    header.pop("__metadata__", None)
    return header


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


_NAME = re.compile(r"output|output\.(\d{1,2})|input\.(.+)", re.S)


def _check_entries(entries: dict, expected: Expected, room: int) -> int:
    """Every entry one the call can have saved, of a readable dtype and a size the case allows;
    returns where the data ends (bytes after the header)."""
    end = 0
    for name, entry in entries.items():
        match = _NAME.fullmatch(name)
        shown = _shown(name)
        if not match or (match.group(1) is not None and int(match.group(1)) >= MAX_PARTS) \
                or (match.group(2) is not None and match.group(2) not in expected.inputs):
            raise EvidenceError(f"the worker's output file holds a tensor no call saves ({shown}): not read")
        if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str) or not _ints(entry.get("shape")) \
                or not _ints(entry.get("data_offsets")) or len(entry["data_offsets"]) != 2:
            raise EvidenceError(f"the worker's output file describes {shown} in a malformed header: not read")
        code, shape, (begin, stop) = entry["dtype"], entry["shape"], entry["data_offsets"]
        dtype = READABLE.get(code)
        numel = _numel(shape)
        if name.startswith("input."):
            want, elements = expected.inputs[name[len("input."):]]
            if dtype is not want or shape != [elements]:
                what = f"{_dtype_name(code)} of shape {tuple(shape)}"
                raise EvidenceError(f"the input {_shown(name[len('input.'):])} came back as {what}, not as it was "
                                    f"given ({str(want).removeprefix('torch.')} of shape ({elements},)): "
                                    "a kernel must only write its output")
        else:
            what = "the result" if name == "output" else f"result {int(match.group(1)) + 1}"
            if dtype is None:
                raise EvidenceError(f"{what}'s dtype is {_dtype_name(code)}, which no case expects (the judge compares "
                                    f"{', '.join(str(d).removeprefix('torch.') for d in CODES)}): not read")
            limit = expected.limit(name)
            if numel > limit:
                wanted = "" if expected.outputs is None else f", expected {_expected_shape(expected, name)}"
                raise EvidenceError(f"{what} has shape {tuple(shape)}{wanted}: {numel} elements, far more than the "
                                    f"{limit} the judge reads for this case; not read")
        if numel * dtype.itemsize != stop - begin or not 0 <= begin <= stop <= room:
            raise EvidenceError(f"the worker's output file describes {shown} with data that does not fit it: not read")
        end = max(end, stop)
    return end


def _expected_shape(expected: Expected, name: str) -> str:
    assert expected.outputs is not None  # asked only where the reference's shapes are known
    index = 0 if name == "output" else int(name.split(".", 1)[1])
    return str(expected.outputs[index]) if index < len(expected.outputs) else f"{len(expected.outputs)} results"


def _ints(value: object) -> bool:
    return isinstance(value, list) and all(type(v) is int and 0 <= v < 1 << 62 for v in value)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dtype_name(code: str) -> str:
    dtype = READABLE.get(code)
    return str(dtype).removeprefix("torch.") if dtype is not None else NAMED.get(code) or _shown(code)


def _shown(text: str, limit: int = 60) -> str:
    """The worker's name for something, quoted and cut (it is student text: the sinks escape it further)."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _short(exc: Exception, limit: int = 200) -> str:
    text = str(exc)
    return text[:limit] + ("..." if len(text) > limit else "")
