"""Assignment-specific explanations of a mismatch: what a spec's `explain` hook works with.

The judge's `describe_mismatch` knows the generic patterns (a wrong tail, a row offset). A
spec knows its own typical bugs (no causal mask, an fp16 accumulator, a transposed filter,
strides ignored) and tests them as hypotheses: it recomputes what the buggy kernel would
return and asks whether the student's result is exactly that, within the same tolerance.
Runs in the trusted grading process, on the judge's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Mismatch:
    bad: torch.Tensor  # bool: where the result is outside the tolerance
    got: torch.Tensor  # the student's result, float64
    truth: torch.Tensor  # the float64 truth (the spec's exact answer)
    inputs: dict  # the call's arguments as the student got them (tensors on the CPU, plain values)
    allowed: torch.Tensor  # the per-element tolerance the judge applied
    torch_error: float  # max abs error of torch in the same dtype
    dtype: str
    unwritten: torch.Tensor | None = None  # bool: where the worker's poison survives (never written); None: unknown

    def matches(self, candidate: torch.Tensor | None) -> bool:
        """True when the result equals `candidate` (the output of a hypothesised bug) within
        the judge's tolerance, NaN where it has NaN."""
        if candidate is None or tuple(candidate.shape) != tuple(self.got.shape):
            return False
        candidate = candidate.to(torch.float64)
        close = (self.got - candidate).abs() <= self.allowed
        close |= self.got.isnan() & candidate.isnan()
        return bool(close.all())

    def explains(self, candidate: torch.Tensor | None, share: float = 0.25) -> bool:
        """True when `candidate` (a hypothesised bug's output) accounts for the result: it matches
        within the tolerance, or the result is far closer to it than to the truth (its largest
        distance from it at most `share` of its largest error). For a bug whose exact rounding a
        reproduction cannot copy (an accumulator rounded in another order), never for a result
        with NaN or inf."""
        if self.matches(candidate):
            return True
        if candidate is None or tuple(candidate.shape) != tuple(self.got.shape) or not torch.isfinite(self.got).all():
            return False
        error = (self.got - self.truth).abs().max().item()
        return error > 0 and (self.got - candidate.to(torch.float64)).abs().max().item() <= share * error

    def precision_loss(self) -> str | None:
        """Words for a result that is nearly right everywhere, only less precise than torch's in
        the same dtype: the mark of an fp16/bf16 accumulator or of an fp32 problem computed in
        low precision. None when the errors are too large (or not finite) for that."""
        if not torch.isfinite(self.got).all():
            return None
        err = (self.got - self.truth).abs().max().item()
        scale = self.truth.abs().max().item()
        if scale == 0 or err > 0.03 * scale:
            return None
        times = f"{err / self.torch_error:.0f}x" if self.torch_error > 0 else "far above"
        return (f"the values are close but less precise than torch's in {self.dtype}: max error {err:.3g}, "
                f"{times} torch's own error ({self.torch_error:.3g}). Accumulate in float32 (tl.zeros(..., "
                f"dtype=tl.float32), tl.dot's default out_dtype) and round to {self.dtype} only when storing the result"
                + ("; do not compute a float32 problem in float16 or bfloat16" if self.dtype == "float32" else ""))

    def first_wrong_along(self, dim: int) -> int | None:
        """i when, along `dim`, every index before i is right and every index from i on holds a
        wrong element: the signature of a missed tail, a block boundary or an offset."""
        reduce = [d for d in range(self.bad.dim()) if d != dim]
        along = self.bad.any(dim=reduce[0], keepdim=True) if reduce else self.bad
        for d in reduce[1:]:
            along = along.any(dim=d, keepdim=True)
        along = along.flatten()
        idx = along.nonzero().flatten()
        if len(idx) and int(idx[0]) > 0 and len(idx) == along.numel() - int(idx[0]):
            return int(idx[0])
        return None


def contiguous_reading(t: torch.Tensor, keep_row_stride: bool = False) -> torch.Tensor | None:
    """What a kernel that ignores t's strides reads: t's storage from t's offset, as if t were
    contiguous (or, with keep_row_stride, as if only the last stride were 1). None when that
    reading would run past the storage, or when it equals t (t is already laid out so)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        return None
    size = list(t.shape)
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    strides = list(reversed(strides))
    if keep_row_stride:
        strides = list(t.stride()[:-1]) + [1]
    if strides == list(t.stride()):
        return None
    storage = torch.empty(0, dtype=t.dtype)
    storage.set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),), (1,))
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(size, strides)) if t.numel() else 0
    if last >= storage.numel():
        return None
    return storage.as_strided(size, strides, t.storage_offset())


def swapped_reading(t: torch.Tensor) -> torch.Tensor | None:
    """What a kernel that swaps a 2-D tensor's two strides reads (t.stride(1) for the rows,
    t.stride(0) for the columns): None when that reading runs past the storage or equals t."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.stride(0) == t.stride(1):
        return None
    strides = (t.stride(1), t.stride(0))
    storage = torch.empty(0, dtype=t.dtype)
    storage.set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),), (1,))
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, strides)) if t.numel() else 0
    if last >= storage.numel():
        return None
    return storage.as_strided(tuple(t.shape), strides, t.storage_offset())


def low_precision_sum(parts: torch.Tensor, dtype: torch.dtype, round_each: bool) -> torch.Tensor:
    """A sum accumulated in `dtype` (float16, bfloat16) over `parts` (float32 partial sums, one
    per step of the kernel's loop): each step's partial sum rounded to `dtype` before it is added
    (round_each), or added in float32 and the running sum rounded after each step."""
    acc = None
    for p in parts:
        p = p.float()
        if acc is None:
            acc = p.to(dtype)
        elif round_each:
            acc = acc + p.to(dtype)
        else:
            acc = (acc.float() + p).to(dtype)
    assert acc is not None, "no partial sums to add"
    return acc


def row_reading(t: torch.Tensor) -> torch.Tensor:
    """What a kernel that moves along a row of 2-D `t` by 1 reads: t's own row stride, a column
    stride of 1 (t itself where its column stride is 1)."""
    if t.stride(1) == 1:
        return t
    storage = torch.empty(0, dtype=t.dtype)
    storage.set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),), (1,))
    room = storage.numel() - t.storage_offset()
    rows, cols = t.shape
    flat = torch.full((rows, cols), float("nan"), dtype=torch.float64)
    index = torch.arange(rows)[:, None] * t.stride(0) + torch.arange(cols)[None, :]
    inside = index < room
    flat[inside] = storage[t.storage_offset():].to(torch.float64)[index[inside]]
    return flat


def strided_writing(values: torch.Tensor, stride: tuple[int, int], written: tuple[int, int]) -> torch.Tensor:
    """What reading a 2-D output of strides `stride` (offset 0, dense as empty_like makes it) gives
    after a kernel wrote `values` into it at (row * written[0] + col * written[1]), row after row
    (a later row's write wins; what lies past the storage is lost, what was never written is NaN)."""
    rows, cols = values.shape
    size = 1 + sum((n - 1) * s for n, s in zip(values.shape, stride)) if values.numel() else 0
    storage = torch.full((size,), float("nan"), dtype=torch.float64)
    for r in range(rows):
        index = r * written[0] + torch.arange(cols) * written[1]
        inside = (index >= 0) & (index < size)
        storage[index[inside]] = values[r][inside].to(torch.float64)
    return storage.as_strided(tuple(values.shape), stride)
