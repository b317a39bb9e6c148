"""Reference solution for layernorm and layernorm_backward (PRIVATE: never shipped to students).

Forward: one program per row (Triton's 05-layer-norm tutorial). A row of up to 8192 elements
is read once and kept in registers: mean, then the variance of (x - mean) (two passes over
registers, no cancellation), then the output; one read of x and one write of y. Longer rows
take three passes over column blocks. Accumulation in float32 whatever the input dtype.

Backward: dx row by row; dweight and dbias as float32 partial sums, one row of partials per
program over a group of rows, then summed over the groups by a second kernel (deterministic,
no atomics). Mean and 1/std are recomputed from x rather than saved by the forward pass.
"""

import torch
import triton
import triton.language as tl

MAX_SINGLE_BLOCK = 8192  # elements of a row held in registers (16 per thread at 16 warps)


@triton.jit
def _layer_norm_fwd(y_ptr, x_ptr, w_ptr, b_ptr, x_row_stride, y_row_stride, n_cols, eps,
                    BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    if SINGLE:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        xc = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            acc += tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=0) / n_cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            xc = tl.where(mask, x - mean, 0.0)
            acc += xc * xc
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, ((x - mean) * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_bwd_dx(dx_ptr, dw_part_ptr, db_part_ptr, dy_ptr, x_ptr, w_ptr,
                       dy_row_stride, x_row_stride, dx_row_stride, n_rows, n_cols, eps, rows_per_program,
                       BLOCK: tl.constexpr):
    # xhat = (x - mean) * rstd, wdy = w * dy
    # dx = rstd * (wdy - mean(xhat * wdy) * xhat - mean(wdy)); dw += dy * xhat; db += dy
    group = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    first = group.to(tl.int64) * rows_per_program  # int64 row offsets: rows * stride may pass 2^31
    for row in range(first, tl.minimum(first + rows_per_program, n_rows)):
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        xc = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
        xhat = xc * rstd
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + row * dx_row_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(dw_part_ptr + group * n_cols + cols, dw, mask=mask)
    tl.store(db_part_ptr + group * n_cols + cols, db, mask=mask)


@triton.jit
def _sum_groups(dw_ptr, db_ptr, dw_part_ptr, db_part_ptr, n_groups, n_cols, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    for g in range(0, n_groups):
        dw += tl.load(dw_part_ptr + g * n_cols + cols, mask=mask, other=0.0)
        db += tl.load(db_part_ptr + g * n_cols + cols, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, dw.to(dw_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as [rows, hidden] with a unit column stride: a view where the layout allows, else a copy."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    # at most 8 warps: at 8192 columns, 8 beat 16 by 6% on an H200 (docs/performance.md)
    hidden = x.shape[-1]
    rows = _rows(x)
    y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(hidden)
    single = block <= MAX_SINGLE_BLOCK
    block = block if single else 4096
    _layer_norm_fwd[(rows.shape[0],)](y, rows, weight.contiguous(), bias.contiguous(), rows.stride(0), y.stride(0),
                                      hidden, eps, BLOCK=block, SINGLE=single, num_warps=min(_warps(block), 8))
    return y.view(x.shape)


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5):
    """(dx, dweight, dbias) of layer_norm(x, weight, bias, eps) for the upstream gradient dy."""
    hidden = x.shape[-1]
    x_rows, dy_rows = _rows(x), _rows(dy)
    n_rows = x_rows.shape[0]
    dx = torch.empty(x_rows.shape, dtype=x.dtype, device=x.device)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 8
    groups = max(1, min(n_rows, 4 * sms))
    rows_per_program = triton.cdiv(n_rows, groups)
    groups = triton.cdiv(n_rows, rows_per_program)
    dw_part = torch.empty((groups, hidden), dtype=torch.float32, device=x.device)
    db_part = torch.empty((groups, hidden), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(hidden)
    _layer_norm_bwd_dx[(groups,)](dx, dw_part, db_part, dy_rows, x_rows, weight.contiguous(),
                                  dy_rows.stride(0), x_rows.stride(0), dx.stride(0), n_rows, hidden, eps, rows_per_program,
                                  BLOCK=block, num_warps=_warps(block))
    dw = torch.empty(hidden, dtype=weight.dtype, device=x.device)
    db = torch.empty(hidden, dtype=weight.dtype, device=x.device)
    _sum_groups[(triton.cdiv(hidden, 256),)](dw, db, dw_part, db_part, groups, hidden, BLOCK=256)
    return dx.view(x.shape), dw, db
