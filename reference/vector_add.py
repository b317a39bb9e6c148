"""Reference solution for vector_add (PRIVATE: never shipped to students)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, stride_x, stride_y, BLOCK: tl.constexpr):
    # out[i] = x[i * stride_x] + y[i * stride_y] for i < n; one program per BLOCK elements.
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets * stride_x, mask=mask)
    y = tl.load(y_ptr + offsets * stride_y, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = out.numel()
    block = 4096
    _add_kernel[(triton.cdiv(n, block),)](x, y, out, n, x.stride(0), y.stride(0), BLOCK=block, num_warps=8)
    return out
