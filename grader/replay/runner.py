"""The replay itself, on the GPU, in a process that imports no student code: a checked ReplayPlan's
kernels loaded from their files, the launches made again on buffers of our own, timed with our
own CUDA events.

Each rep starts from the call's inputs restored from a pristine copy, the result and scratch
poisoned (NaN or all ones: a kernel gets nothing from a previous rep), the L2 flushed, and the
GPU kept busy with a short sleep while the host makes the launches: the events time the GPU's
work of exactly the recorded fills and launches. The last rep's result is handed back whole, for
the judge's side to compare with the truth (a kernel that computes only a sample, or leaves work
to the wrapper's torch, is wrong there), and every rep's result sums beside it (a rep that
computed something else, fast, differs there).

One process per contender: a compiled kernel runs in this process's CUDA context and can read
or write anything in it, so nothing else is kept here (the reference is replayed alike, in its own
process).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import triton

from grader.replay.launchrecord import DTYPES, Arg, Copy, Fill, RecordedLaunch, ReplayPlan

LAUNCH_SHADOW_CYCLES = 2_000_000  # as grader.worker.timing: about 1 ms on Hopper, covers the host's launches

_TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


def _allocator(size: int, alignment: int, stream: Any) -> torch.Tensor:
    """Triton's global scratch for kernels that ask for it, from torch's allocator."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's whole storage as bytes (offsets in a record count from the storage's start)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def load_kernels(plan: ReplayPlan) -> dict:
    """Each kernel's CompiledKernel, rebuilt from its checked files (copied under their labels
    into a private folder, the names Triton expects)."""
    from triton.compiler.compiler import CompiledKernel

    triton.set_allocator(_allocator)
    folder = Path(tempfile.mkdtemp(prefix="replay-"))
    compiled = {}
    for key, k in plan.kernels.items():
        group = {}
        for label, path in k.files.items():
            dest = folder / key / label
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
            group[label] = str(dest)
        constants = {tuple(p): v for p, v in k.constants}
        src = SimpleNamespace(signature=dict(k.signature), constants=constants,
                              fn=SimpleNamespace(arg_names=list(k.arg_names), launch_metadata=None))
        compiled[key] = CompiledKernel(src, group, key)
    return compiled


class Replay:
    """A ReplayPlan made ready on this GPU: kernels loaded, buffers allocated, inputs kept pristine."""

    def __init__(self, plan: ReplayPlan, inputs: dict[str, torch.Tensor], pad: int = 0,
                 kernels: dict | None = None) -> None:
        """`pad`: bytes allocated (and held) before the buffers, so each placement puts them at
        other addresses: the same kernel's time varies with where its data lies in memory."""
        self.plan = plan
        self.kernels = kernels if kernels is not None else load_kernels(plan)
        self.pad = torch.empty(pad, dtype=torch.uint8, device="cuda") if pad else None
        # each input's whole storage, as the call got it (on the GPU already: used as it is, never written)
        self.pristine = {k: _bytes(v) if v.is_cuda else _bytes(v).to("cuda", copy=True) for k, v in inputs.items()}
        # by role, then by the record's ref: an input's name, an output's or a scratch buffer's index
        self.storages: dict[str, dict[Any, torch.Tensor]] = {
            "input": {k: torch.empty_like(v) for k, v in self.pristine.items()},
            "output": {i: torch.empty(o.nbytes, dtype=torch.uint8, device="cuda") for i, o in enumerate(plan.outputs)},
            "scratch": {i: torch.empty(n, dtype=torch.uint8, device="cuda") for i, (n, _) in enumerate(plan.scratch)}}
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
        self.flush = torch.empty(max(2 * l2_bytes, 64 << 20) // 4, dtype=torch.int32, device="cuda")
        self.calls = [self._prepared(step) for step in plan.steps]

    def _view(self, v: Fill) -> torch.Tensor:
        buf = self.storages[v.role][v.ref]
        return torch.empty(0, dtype=_TORCH_DTYPES[v.dtype], device="cuda").set_(
            buf.untyped_storage(), v.offset // DTYPES[v.dtype], v.shape, v.stride)

    def _prepared(self, step: Fill | Copy | RecordedLaunch) -> Any:
        if isinstance(step, Fill):
            view = self._view(step)
            return lambda: view.fill_(step.value)
        if isinstance(step, Copy):
            dst, src = self._view(step.to), self._view(step.source)
            return lambda: dst.copy_(src)
        assert isinstance(step, RecordedLaunch)
        args: list[object] = []
        for a in step.args:
            if a.kind == "tensor":
                args.append(self.storages[a.role][a.ref][a.offset:])
            elif a.kind == "tensordesc":
                args.append(self._descriptor(a))
            else:
                args.append(a.value)
        launcher = self.kernels[step.kernel.hash][step.grid]
        return lambda: launcher(*args)

    def _descriptor(self, a: Arg) -> Any:
        """Our own host TMA descriptor, over our own buffer, with the record's checked numbers."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        d = a.desc
        assert d is not None  # a descriptor argument: the record's check made sure it has one
        size = DTYPES[d["dtype"]]
        buf = self.storages[a.role][a.ref]
        base = torch.empty(0, dtype=_TORCH_DTYPES[d["dtype"]], device="cuda").set_(
            buf.untyped_storage(), a.offset // size, ((buf.numel() - a.offset) // size,), (1,))
        extra = {"round_f32_to_tf32": True} if d["round_f32_to_tf32"] else {}  # a field Triton 3.6 does not have
        return TensorDescriptor(base, list(d["shape"]), list(d["strides"]), list(d["block_shape"]), d["padding"],
                                **extra)

    def reset(self) -> None:
        """Inputs as the call got them; result and scratch poisoned (0xFF bytes: NaN in floats)."""
        for k, buf in self.storages["input"].items():
            buf.copy_(self.pristine[k])
        for role in ("output", "scratch"):
            for buf in self.storages[role].values():
                buf.fill_(0xFF)  # the fills the call made are steps of the plan, timed as the call's

    def once(self) -> None:
        for call in self.calls:
            call()

    def views(self) -> list[torch.Tensor]:
        """The results as the record describes them, where they lie on the GPU."""
        result = []
        for i, o in enumerate(self.plan.outputs):
            buf = self.storages["output"][i]
            result.append(torch.empty(0, dtype=_TORCH_DTYPES[o.dtype], device="cuda").set_(
                buf.untyped_storage(), o.offset // DTYPES[o.dtype], o.shape, o.stride))
        return result

    def outputs(self) -> list[torch.Tensor]:
        return [view.to("cpu", copy=True).contiguous() for view in self.views()]

    def sums(self) -> list[list[float]]:
        """Per result: the sum of its finite elements, the sum of their magnitudes and its count
        of non-finite ones (in float64, outside the timed events): a rep whose result differs
        from the one handed back whole shows in them."""
        sums = []
        for i, o in enumerate(self.plan.outputs):
            buf = self.storages["output"][i]
            view = torch.empty(0, dtype=_TORCH_DTYPES[o.dtype], device="cuda").set_(
                buf.untyped_storage(), o.offset // DTYPES[o.dtype], o.shape, o.stride)
            sums.append(result_sums(view))
        return sums

    def time(self, reps: int, warmup: int = 3) -> dict:
        """Per-rep GPU times (ms) by our own events and each rep's result sums (`sums`); the last
        rep's result stays in the buffers (`outputs`)."""
        for _ in range(warmup):
            self.reset()
            self.once()
        torch.cuda.synchronize()
        times, sums = [], []
        for _ in range(reps):
            self.reset()
            torch.cuda.synchronize()
            self.flush.zero_()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(LAUNCH_SHADOW_CYCLES)
            start.record()
            self.once()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
            sums.append(self.sums())
        return {"ms": times, "sums": sums, "median_ms": statistics.median(times)}


def result_sums(view: torch.Tensor) -> list[float]:
    """The sum of a result's finite elements, the sum of their magnitudes (both in float64) and
    its count of non-finite ones; without copies of the whole result where all are finite."""
    finite = torch.isfinite(view)
    bad = int(finite.numel() - int(finite.sum()))
    if bad:
        view = torch.where(finite, view, torch.zeros((), dtype=view.dtype, device=view.device))
    return [float(view.sum(dtype=torch.float64)), float(view.abs().sum(dtype=torch.float64)), float(bad)]


PLACEMENT_STEP = (2 << 20) + 4096  # a new 2 MiB page and a shifted offset within the allocator's blocks


class Placements:
    """A ReplayPlan's kernels loaded and its first placement of buffers made (`Replay`), before the
    go: what is left for the timed reps is their own work and the later placements."""

    def __init__(self, plan: ReplayPlan, inputs: dict[str, torch.Tensor]) -> None:
        self.plan, self.inputs = plan, inputs
        self.kernels = load_kernels(plan)
        self.first: Replay | None = Replay(plan, inputs, pad=0, kernels=self.kernels)
        self.final: Replay | None = None

    def time(self, reps: int, placements: int) -> dict:
        """`reps` reps spread over `placements` fresh sets of buffers, each at other addresses:
        the per-placement times (the judge pairs them with the reference's, placement by
        placement) and every rep's result sums; the last rep's result stays on the GPU (`last`)."""
        per, sums = [], []
        for p in range(placements):
            replay = self.first if p == 0 and self.first is not None else \
                Replay(self.plan, self.inputs, pad=p * PLACEMENT_STEP, kernels=self.kernels)
            self.first = None
            timed = replay.time(max(1, reps // placements))
            per.append(timed["ms"])
            sums += timed["sums"]
            if p == placements - 1:
                self.final = replay  # its last rep's result is copied out after the times are answered
            del replay, timed
            if p < placements - 1:
                torch.cuda.empty_cache()
        times = [t for ms in per for t in ms]
        return {"ms": times, "placements": per, "sums": sums, "median_ms": statistics.median(times)}

    def last(self) -> list[torch.Tensor]:
        """The last rep's result, on the host (after `time`: outside the judge's hold)."""
        assert self.final is not None  # `time` ran
        return self.final.outputs()

    def picked(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The last rep's results' elements at the flat indices `idx` (the judge's, told after
        `time`), on the host: `output.<i>` and the whole result's size, `numel.output.<i>` (no
        elements where the result is smaller than the indices reach)."""
        assert self.final is not None  # `time` ran
        picked = {}
        for i, view in enumerate(self.final.views()):
            flat = view.reshape(-1)
            reach = int(idx.max()) + 1 if idx.numel() else 0
            values = flat[idx.to(flat.device)] if flat.numel() >= reach else flat[:0]
            picked[f"output.{i}"] = values.to("cpu")
            picked[f"numel.output.{i}"] = torch.tensor([flat.numel()], dtype=torch.int64)
        return picked

