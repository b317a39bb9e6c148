"""The launch record, made inside a worker: every Triton launch one call of the student's
function makes, described so that a process with none of the student's code can make the same
launches again (grader.replay).

Each launch is kept with its compiled kernel (the cache files Triton wrote for it, as bytes,
each named by its SHA-256), its grid, warps and shared memory, and every argument with its
role: a byte offset into one of the call's input tensors, into its result, or into a scratch
buffer the call allocated (its size and how it was filled), a scalar, or a constexpr. The torch
ops that only fill a buffer (zeros, ones, full, zero_, fill_) are kept in order between the
launches, because a kernel that accumulates needs them. Anything else the call did with torch is
not replayed: it is noted, and where it touches what a launch reads or the result, the record
says why it cannot be replayed (`why_not`).

This is the worker's word, hostile data once it leaves: the trusted side validates all of it
(grader.replay.launchrecord) and never scores a figure on it without re-running the launches itself.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import torch

# a call that launches more than this is not replayed (the record would be as large as the work)
MAX_LAUNCHES = 64
MAX_FILE_BYTES = 16 << 20

# ops whose only effect on their result is a constant fill: a buffer they make or touch keeps a
# known content. Any other op that writes a buffer a launch reads makes the call unreplayable.
CREATE_EMPTY = ("aten::empty", "aten::new_empty", "aten::empty_like", "aten::empty_strided")
CREATE_FILLED = {"aten::zeros": 0.0, "aten::new_zeros": 0.0, "aten::zeros_like": 0.0, "aten::ones": 1.0,
                 "aten::new_ones": 1.0, "aten::ones_like": 1.0}
CREATE_FULL = ("aten::full", "aten::new_full", "aten::full_like")
FILL_IN_PLACE = ("aten::zero_", "aten::fill_")
# ops the schema marks as writing that change no data (a stream annotation for the allocator)
NOT_WRITES = ("aten::record_stream",)
# streams a replayable call may launch on: the replay runs every launch on one stream, in the order the call made
# them (an order the call's own stream waits respect), so work split over streams is replayed whole, its overlap
# not credited (grader.replay.launchrecord.MAX_STREAMS, the same)
MAX_STREAMS = 8
# ops that only copy (a layout or dtype change): replayed as copies between our own buffers
COPY_CREATE = ("aten::clone", "aten::_to_copy")


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _const(value):
    """A scalar or constexpr value as JSON keeps it, or raises TypeError."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if hasattr(value, "value") and type(value.value) in (bool, int, float, str):  # tl.constexpr
        return value.value
    if type(value).__name__ == "dtype" and "triton" in type(value).__module__:
        return str(value)
    raise TypeError(type(value).__name__)


class Recorder:
    """Collects one call's launches and fills; `finish` turns them into the record."""

    def __init__(self, inputs: dict) -> None:
        self.inputs = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        self.known = {_storage(v)[0]: ("input", k) for k, v in self.inputs.items()}
        self.allocated: dict[int, dict] = {}  # storage ptr -> {"nbytes", "op", "init"}
        self.events: list[tuple] = []  # ("fill", ptr, geometry, value) | ("launch", raw) | ("torch", ptr, op)
        # id(CompiledKernel) -> (its key: SHA-256 of its files' digests, its description)
        self.kernels: dict[int, tuple[str, dict]] = {}
        # id(CompiledKernel) -> its files' bytes, taken at its first launch in the call (`_snapshot`)
        self.binaries: dict[int, dict[str, bytes]] = {}
        self.why_not: list[str] = []
        self.torch_work: list[str] = []  # what torch did that the launches do not reproduce (not replayed)
        self.streams: list[int] = []
        self.sizes = {_storage(v)[0]: _storage(v)[1] for v in self.inputs.values()}  # storage ptr -> bytes

    # -- from the dispatch mode (grader.worker.server._OpRecorder) ---------------------------
    def op(self, func, args, kwargs, out) -> None:
        """One aten op the call dispatched: a new buffer, a fill, or a write by torch."""
        name = func.name()
        if name in NOT_WRITES:
            return
        schema = func._schema
        written = []
        values = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args):]]
        for arg, value in zip(schema.arguments, values):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
                written.append(value)
        if name.startswith(FILL_IN_PLACE) and written \
                and (name == "aten::zero_" or len(args) > 1 and not isinstance(args[1], torch.Tensor)):
            t = written[0]
            value = 0.0 if name == "aten::zero_" else float(args[1])
            self.events.append(("fill", _storage(t)[0], self._geometry(t), value))
            return
        if name.startswith("aten::copy_") and written and len(args) > 1 and isinstance(args[1], torch.Tensor) \
                and args[1].device == written[0].device and list(args[1].shape) == list(written[0].shape):
            self.events.append(("copy", _storage(written[0])[0], self._geometry(written[0]),
                                _storage(args[1])[0], self._geometry(args[1])))
            return
        for t in written:
            self.events.append(("torch", _storage(t)[0], name))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            ptr, nbytes = _storage(t)
            if ptr in self.known or ptr in self.allocated or nbytes == 0 or any(w is t for w in written):
                continue
            init: float | str | None
            if name.startswith(CREATE_EMPTY):
                init = None
            elif name in CREATE_FILLED:
                init = CREATE_FILLED[name]
            elif name.startswith(CREATE_FULL) and len(args) > 1 and type(args[1]) in (int, float, bool):
                init = float(args[1])
            elif name.startswith(COPY_CREATE) and args and isinstance(args[0], torch.Tensor) \
                    and args[0].device == t.device and list(args[0].shape) == list(t.shape):
                init = "copy"
                self.events.append(("copy", ptr, self._geometry(t), _storage(args[0])[0], self._geometry(args[0])))
            else:
                init = "torch"  # computed by torch: its content is not the launches'
            self.allocated[ptr] = {"nbytes": nbytes, "op": name, "init": init}
            if type(init) is float:
                self.events.append(("fill", ptr, self._geometry(t), init))

    @staticmethod
    def _geometry(t: torch.Tensor) -> dict:
        return {"offset": t.storage_offset() * t.element_size(), "shape": list(t.shape), "stride": list(t.stride()),
                "dtype": str(t.dtype).removeprefix("torch.")}

    # -- from the launch hook (grader.worker.server._setup_triton) ---------------------------
    def launch(self, fn, kernel, args: tuple, kwargs: dict) -> None:
        """One launch of a @triton.jit function: its compiled kernel and its bound arguments."""
        if len([e for e in self.events if e[0] == "launch"]) >= MAX_LAUNCHES:
            self._not(f"more than {MAX_LAUNCHES} launches in one call")
            return
        try:
            params = inspect.signature(fn.fn).parameters
            bound = inspect.signature(fn.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in params})
            bound.apply_defaults()
            values = dict(bound.arguments)
        except Exception as exc:  # noqa: BLE001
            self._not(f"the arguments of a launch of {getattr(fn, '__name__', '?')} could not be bound "
                      f"({type(exc).__name__})")
            return
        grid: Any = kwargs.get("grid")  # the caller's: a callable, a sequence, or anything at all
        try:
            grid = grid(values) if callable(grid) else grid
            grid = [int(g) for g in grid] + [1] * (3 - len(grid))
        except Exception as exc:  # noqa: BLE001
            self._not(f"the grid of a launch could not be read ({type(exc).__name__})")
            return
        if kernel is not None and hasattr(kernel, "metadata_group") and id(kernel) not in self.binaries:
            self.binaries[id(kernel)] = _snapshot(kernel)
        stream = torch.cuda.current_stream().cuda_stream if torch.cuda.is_available() else 0
        if stream not in self.streams:
            self.streams.append(stream)
        self.events.append(("launch", {"fn": fn, "kernel": kernel, "values": values, "grid": grid[:3],
                                       "stream": self.streams.index(stream)}))

    def _torch(self, what: str) -> None:
        if what not in self.torch_work and len(self.torch_work) < 8:
            self.torch_work.append(what)

    def _not(self, why: str) -> None:
        if why not in self.why_not and len(self.why_not) < 8:
            self.why_not.append(why)

    # -- the record ----------------------------------------------------------------------
    def finish(self, out, folder: str | None) -> dict:
        """The record of the call whose result is `out`: JSON-ready, the kernels' files written
        to `folder` (named by their SHA-256) when a folder is given."""
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        for i, o in enumerate(outputs):
            if not isinstance(o, torch.Tensor):
                self._not(f"result {i} is not a tensor")
                continue
            ptr = _storage(o)[0]
            if ptr in self.known:
                self._not(f"result {i} is an input's memory")
            self.known.setdefault(ptr, ("output", i))
            self.sizes.setdefault(ptr, _storage(o)[1])
        regions = {}  # ptr -> (role, ref)
        for ptr, (role, ref) in self.known.items():
            regions[ptr] = (role, ref)
        scratch_ids: dict[int, int] = {}
        launches: list[dict] = []
        sequence: list[dict] = []
        kernels: dict[str, dict] = {}
        used: set[int] = set()
        for event in self.events:
            if event[0] != "launch":
                continue
            raw = event[1]
            described = self._launch(raw, regions, scratch_ids, kernels, used, folder)
            if described is not None:
                launches.append(described)
        # the copies into what a launch reads or the result: their sources become part of the record
        copies = [e for e in self.events if e[0] == "copy"]
        for _ in range(len(copies)):
            grew = False
            for event in copies:
                dst, src = event[1], event[3]
                if (dst in used or dst in regions) and src not in used and src not in regions:
                    if src in self.allocated:
                        scratch_ids.setdefault(src, len(scratch_ids))
                    used.add(src)
                    grew = True
            if not grew:
                break
        for event in copies:
            if (event[1] in used or event[1] in regions) and event[3] not in regions and event[3] not in scratch_ids:
                self._not(f"a copy into {self._name(event[1], regions, scratch_ids)} reads a buffer from elsewhere")
        for ptr in list(used):
            if ptr in self.allocated and ptr not in regions:
                scratch_ids.setdefault(ptr, len(scratch_ids))
        self._note_torch_work(used, regions, scratch_ids)
        if len(self.streams) > MAX_STREAMS:  # the replay runs the launches of up to MAX_STREAMS one after another
            self._not(f"launches on {len(self.streams)} streams")
        for event in self.events:  # fills and launches, in the order the call made them
            if event[0] == "fill" and event[1] in regions | {p: None for p in scratch_ids}:
                target = self._target(event[1], regions, scratch_ids)
                if target is not None:
                    sequence.append({"fill": {**target, **event[2], "value": event[3]}})
            elif event[0] == "copy" and (event[1] in regions or event[1] in scratch_ids) \
                    and (event[3] in regions or event[3] in scratch_ids):
                sequence.append({"copy": {"to": {**self._target(event[1], regions, scratch_ids), **event[2]},
                                          "from": {**self._target(event[3], regions, scratch_ids), **event[4]}}})
            elif event[0] == "launch":
                sequence.append({"launch": sum(1 for s in sequence if "launch" in s)})
        sequence = [s for s in sequence if "launch" not in s or s["launch"] < len(launches)]
        outputs_desc = [{"dtype": str(o.dtype).removeprefix("torch."), "shape": list(o.shape),
                         "stride": list(o.stride()), "offset": o.storage_offset() * o.element_size(),
                         "nbytes": _storage(o)[1]}
                        for o in outputs if isinstance(o, torch.Tensor)]
        scratch = [{"nbytes": self.allocated[p]["nbytes"],
                    "init": self.allocated[p]["init"] if type(self.allocated[p]["init"]) is float else None}
                   for p, _ in sorted(scratch_ids.items(), key=lambda kv: kv[1])]
        return {"kernels": kernels, "launches": launches, "sequence": sequence, "scratch": scratch,
                "outputs": outputs_desc, "why_not": list(self.why_not),
                "torch_work": list(self.torch_work)}

    def _note_torch_work(self, used: set, regions: dict, scratch_ids: dict) -> None:
        """What torch did to a buffer a launch reads or to the result: not replayed (the replay
        poisons those bytes), so a result that needs it comes out wrong there; named here so the
        judge's finding can say what it was."""
        for event in self.events:
            if event[0] == "torch" and event[1] in used | {p for p, (r, _) in self.known.items() if r == "output"}:
                what = self._name(event[1], regions, scratch_ids)
                self._torch(f"torch wrote {what} ({event[2]})")
        for ptr, (role, ref) in self.known.items():
            if role == "output" and ptr in self.allocated and self.allocated[ptr]["init"] == "torch":
                self._torch(f"result {ref} was computed by torch ({self.allocated[ptr]['op']})")
            # a result no launch writes and torch did not compute (a result kept from an earlier
            # call) is not noted: the replay leaves it poisoned, and wrong is the evidence
        for ptr, i in scratch_ids.items():
            if self.allocated[ptr]["init"] == "torch":
                self._torch(f"scratch buffer {i} a launch reads was computed by torch ({self.allocated[ptr]['op']})")

    def _target(self, ptr: int, regions: dict, scratch_ids: dict) -> dict:
        if ptr in scratch_ids:
            return {"role": "scratch", "ref": scratch_ids[ptr]}
        role, ref = regions[ptr]
        return {"role": role, "ref": ref}

    def _name(self, ptr, regions, scratch_ids) -> str:
        t = self._target(ptr, regions, scratch_ids) if ptr in regions or ptr in scratch_ids else None
        return "a buffer" if t is None else f"{t['role']} {t['ref']}"

    def _launch(self, raw: dict, regions: dict, scratch_ids: dict, kernels: dict, used: set,
                folder: str | None) -> dict | None:
        kernel = raw["kernel"]
        name = getattr(raw["fn"], "__name__", "") or getattr(getattr(raw["fn"], "fn", None), "__name__", "?")
        args = []
        for pname, value in raw["values"].items():
            if isinstance(value, torch.Tensor):
                placed = self._place(value, regions, scratch_ids, used)
                if placed is None:
                    self._not(f"argument {pname} of {name} is a tensor from elsewhere "
                              "(not an input, the result, or a buffer the call allocated)")
                    return None
                args.append({"name": pname, "kind": "tensor", **placed})
            elif type(value).__name__ == "TensorDescriptor" and isinstance(getattr(value, "base", None), torch.Tensor):
                desc = self._descriptor(value, pname, name, regions, scratch_ids, used)
                if desc is None:
                    return None
                args.append(desc)
            elif type(value).__name__ in ("TensorDescriptor", "TmaDescKernelParam") \
                    or hasattr(value, "tma_desc_cpu_ptr"):
                self._not(f"argument {pname} of {name} is a host-side TMA descriptor the replay cannot rebuild")
                return None
            elif type(value) is int and self._address(value):
                self._not(f"argument {pname} of {name} is an integer that holds a device address")
                return None
            else:
                try:
                    args.append({"name": pname, "kind": "value", "value": _const(value)})
                except TypeError as exc:
                    self._not(f"argument {pname} of {name} is a {exc}")
                    return None
        entry = {"name": name, "grid": raw["grid"], "stream": raw["stream"], "args": args}
        if kernel is None or not hasattr(kernel, "metadata_group"):
            self._not("no compiled kernel (Triton's CPU interpreter)")
            entry["kernel"] = None
            return entry
        if id(kernel) not in self.kernels:
            described = self._kernel(kernel, folder)
            key = hashlib.sha256("".join(sorted(described["files"].values())).encode()).hexdigest()
            self.kernels[id(kernel)] = (key, described)
        key, described = self.kernels[id(kernel)]
        kernels[key] = described
        md = kernel.metadata
        entry.update(kernel=key, num_warps=int(getattr(md, "num_warps", 0)), num_ctas=int(getattr(md, "num_ctas", 1)),
                     shared=int(getattr(md, "shared", 0)))
        return entry

    def _place(self, tensor: torch.Tensor, regions: dict, scratch_ids: dict, used: set) -> dict | None:
        """Where a tensor argument (or a descriptor's base) lies: its role and byte offset, a buffer
        the call allocated numbered as scratch; None for a tensor from elsewhere."""
        found = self._locate(tensor)
        if found is None:
            return None
        ptr, offset = found
        used.add(ptr)
        if ptr in self.allocated and ptr not in regions:
            scratch_ids.setdefault(ptr, len(scratch_ids))
        return {**self._target(ptr, regions, scratch_ids), "offset": offset}

    def _descriptor(self, value, pname: str, name: str, regions: dict, scratch_ids: dict, used: set) -> dict | None:
        """A host-side TMA descriptor (triton.tools.tensor_descriptor.TensorDescriptor): its base
        located like a tensor argument, its shape, strides and block shape kept as numbers (the
        replay builds its own descriptor over its own buffer)."""
        base = value.base
        placed = self._place(base, regions, scratch_ids, used)
        if placed is None:
            self._not(f"the base of descriptor {pname} of {name} is a tensor from elsewhere")
            return None
        try:
            numbers = {"shape": [int(n) for n in value.shape], "strides": [int(n) for n in value.strides],
                       "block_shape": [int(n) for n in value.block_shape]}
        except (TypeError, ValueError):
            self._not(f"descriptor {pname} of {name} has a shape that is not numbers")
            return None
        return {"name": pname, "kind": "tensordesc", **placed,
                "dtype": str(base.dtype).removeprefix("torch."), **numbers,
                "padding": str(getattr(value, "padding", "zero")),
                "round_f32_to_tf32": bool(getattr(value, "round_f32_to_tf32", False))}

    def _address(self, value: int) -> bool:
        """Whether an integer argument points into memory the call can reach: a pointer handed
        over as a number, which a replay would launch with into its own, other memory."""
        if value < 1 << 16:
            return False
        for ptr in list(self.known) + list(self.allocated):
            if ptr <= value < ptr + max(1, _storage_size(self, ptr)):
                return True
        if torch.cuda.is_available():
            try:
                segments = torch.cuda.memory_snapshot()
            except Exception:  # noqa: BLE001 - no snapshot: the known buffers above decide
                return False
            return any(seg["address"] <= value < seg["address"] + seg["total_size"] for seg in segments)
        return False

    def _locate(self, t: torch.Tensor) -> tuple[int, int] | None:
        """(storage ptr, byte offset) of the region t points into, among the known ones."""
        p = t.data_ptr()
        for ptr, info in [(k, _storage_size(self, k)) for k in list(self.known) + list(self.allocated)]:
            if ptr <= p < ptr + max(1, info):
                return ptr, p - ptr
        return None

    def _kernel(self, kernel, folder: str | None) -> dict:
        src = kernel.src
        files = {}
        taken = self.binaries.get(id(kernel))
        if taken is None:  # launched before the recorder was set (a launch hook always snapshots first)
            taken = _snapshot(kernel)
        for label, data in sorted(taken.items()):
            if len(data) > MAX_FILE_BYTES:
                self._not(f"a compiled file of {kernel.name} is over {MAX_FILE_BYTES >> 20} MiB")
                continue
            digest = hashlib.sha256(data).hexdigest()
            files[Path(label).name] = digest
            if folder:
                (Path(folder) / digest).write_bytes(data)
        constants = []
        for key, value in getattr(src, "constants", {}).items():
            try:
                constants.append([list(key) if isinstance(key, tuple) else key, _const(value)])
            except TypeError:
                self._not(f"a constant of {kernel.name} is not a plain value")
        return {"name": kernel.name, "files": files,
                "signature": {str(k): str(v) for k, v in getattr(src, "signature", {}).items()},
                "constants": constants, "arg_names": list(getattr(getattr(src, "fn", None), "arg_names", []))}


def _snapshot(kernel) -> dict[str, bytes]:
    """A compiled kernel's files as they are at its launch, before any code of the caller's runs
    again: the binary the driver loaded (`kernel.kernel`, the bytes Triton read when it made the
    kernel), never the cache file again, which the worker can overwrite after the launch; the
    other files (the metadata, the IR) read now."""
    binary = getattr(kernel, "kernel", None)
    taken = {}
    for label, path in (getattr(kernel, "metadata_group", None) or {}).items():
        ext = Path(label).suffix[1:]
        if isinstance(binary, bytes) and ext in ("cubin", "hsaco"):
            taken[label] = binary
            continue
        try:
            taken[label] = Path(path).read_bytes()
        except OSError:
            continue
    return taken


def _storage_size(rec: Recorder, ptr: int) -> int:
    if ptr in rec.allocated:
        return rec.allocated[ptr]["nbytes"]
    return rec.sizes.get(ptr, 0)


def write(record: dict, folder: str) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)  # the judge names a folder in the worker's outputs/
    (Path(folder) / "launches.json").write_text(json.dumps(record))
