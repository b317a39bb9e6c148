"""Reference solution for vector_add (PRIVATE: never shipped to students).

One pass: each program loads BLOCK elements of x and y and stores their sum. The block size
and warps are autotuned on the grading GPU (the first config is the one the CPU interpreter
runs); which one wins depends on the GPU, and it is within a few percent of a device copy.
"""

import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((1024, 4), (1024, 8), (2048, 8), (4096, 8), (4096, 16), (8192, 16))],
    key=["n"],
)
@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, stride_x, stride_y, BLOCK: tl.constexpr):
    # out[i] = x[i * stride_x] + y[i * stride_y] for i < n; one program per BLOCK elements.
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets * stride_x, mask=mask)
    y = tl.load(y_ptr + offsets * stride_y, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = out.numel()
    assert n * max(x.stride(0), y.stride(0), 1) < 2**31, "offsets are 32-bit"
    _add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, x.stride(0), y.stride(0))
    return out
