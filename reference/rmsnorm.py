"""Reference solution for rmsnorm (PRIVATE: never shipped to students).

One program per row. A row of up to 8192 elements is read once and kept in registers
(sum of squares, then scale, from the same values): one read of x and one write of y,
the least memory traffic there is. Longer rows take two passes over column blocks.
Accumulation is in float32 whatever the input dtype.
"""

import torch
import triton
import triton.language as tl

MAX_SINGLE_BLOCK = 8192  # elements of a row held in registers (16 per thread at 16 warps)


@triton.jit
def _rms_norm_kernel(y_ptr, x_ptr, w_ptr, x_row_stride, y_row_stride, n_cols, eps,
                     BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    if SINGLE:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)  # 1 / sqrt(mean(x^2) + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def launch_config(n_cols: int) -> tuple[int, bool, int]:
    """(block, whole row in one block?, num_warps): more warps for longer rows, so each
    thread holds at most 16 values and the loads stay wide."""
    block = triton.next_power_of_2(n_cols)
    single = block <= MAX_SINGLE_BLOCK
    block = block if single else 4096
    warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
    return block, single, warps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    hidden = x.shape[-1]
    rows = x.reshape(-1, hidden)  # a view where the layout allows (a 2-D slice keeps its row stride), else a copy
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    weight = weight.contiguous()
    y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    block, single, warps = launch_config(hidden)
    _rms_norm_kernel[(rows.shape[0],)](y, rows, weight, rows.stride(0), y.stride(0), hidden, eps,
                                       BLOCK=block, SINGLE=single, num_warps=warps)
    return y.view(x.shape)
