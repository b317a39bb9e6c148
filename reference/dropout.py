"""Reference solution for dropout (PRIVATE: never shipped to students).

After Triton's 04-low-memory-dropout tutorial: the mask comes from the seed and each
element's index (Philox, as torch's own dropout), so it is never stored, and one read of x
and one write of the result is all the memory traffic. tl.rand4x gives four random numbers
per Philox call: a block is four quarter-blocks, each contiguous (coalesced), and lane j of
quarter k uses the k-th number of call j. Keep when r > p; scale what is kept by 1/(1-p).
"""

import torch
import triton
import triton.language as tl

BLOCK = 4096  # elements per program: 16 per thread at 8 warps


@triton.jit
def _apply(x_ptr, out_ptr, offsets, n, r, p, scale):
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.where(r > p, x.to(tl.float32) * scale, 0.0)
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dropout_kernel(x_ptr, out_ptr, n, p, scale, seed, BLOCK: tl.constexpr):
    QUARTER: tl.constexpr = BLOCK // 4
    pid = tl.program_id(0)
    lane = tl.arange(0, QUARTER)
    # One Philox counter per lane, in int32: 64-bit counters would make Philox run in 64-bit
    # arithmetic, several times slower on a GPU. (Counters stay below n / 4 < 2^31.)
    r0, r1, r2, r3 = tl.rand4x(seed, pid * QUARTER + lane)
    base = pid.to(tl.int64) * BLOCK + lane  # memory offsets in int64: n may pass 2^31
    _apply(x_ptr, out_ptr, base, n, r0, p, scale)
    _apply(x_ptr, out_ptr, base + QUARTER, n, r1, p, scale)
    _apply(x_ptr, out_ptr, base + 2 * QUARTER, n, r2, p, scale)
    _apply(x_ptr, out_ptr, base + 3 * QUARTER, n, r3, p, scale)


def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    flat = x.contiguous().view(-1)  # a view's elements, in order (a copy only for non-contiguous x)
    out = torch.empty_like(flat)
    n = flat.numel()
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0  # p = 1 keeps nothing (r < 1 always)
    _dropout_kernel[(triton.cdiv(n, BLOCK),)](flat, out, n, p, scale, seed, BLOCK=BLOCK, num_warps=8)
    return out.view(x.shape)
