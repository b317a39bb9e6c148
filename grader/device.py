"""Where a grading runs its kernels: one small type, parsed once (grader.judge.context.resolve),
so a site asks `ctx.device == Device.CUDA` and a type checker knows every value there is."""

from __future__ import annotations

from enum import Enum


class Device(str, Enum):
    """A member is a `str` equal to its value (as `payloads.Kind` is), so the CLI's --device,
    results.json's environment and a batch's stored context keep the same string."""

    def __str__(self) -> str:  # the value, not "Device.CUDA", in messages, f-strings and JSON keys
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    CUDA = "cuda"  # the kernels run on the GPU
    CPU = "cpu"  # in Triton's interpreter: no timing, no bfloat16
