"""rmsnorm: y = x / sqrt(mean(x^2) + eps) * weight over the last dim, result in x's dtype.

Fill in the TODOs, then run `grader check -a rmsnorm` from your repo's root. The handout is
README.md in the assignment's folder.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(y_ptr, x_ptr, w_ptr, x_row_stride, y_row_stride, n_cols, eps, BLOCK: tl.constexpr):
    # TODO: one program per row: row = tl.program_id(0); the row starts at x_ptr + row * x_row_stride.
    # TODO: mean of x^2 over the row's n_cols elements, accumulated in float32 (a float16 square of 300
    #       overflows), masking the columns past n_cols. A row may be longer than BLOCK: loop over it.
    # TODO: rstd = 1 / sqrt(mean + eps); store x * rstd * weight in y's dtype.
    pass


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    n_cols = x.shape[-1]
    # TODO: x is 2-D or 3-D and may be a view: see it as [rows, n_cols] (x.reshape(-1, n_cols));
    #       pass the row stride to the kernel (make a contiguous copy only if x.stride(-1) != 1).
    y = torch.empty_like(x)
    # TODO: choose BLOCK (e.g. min(triton.next_power_of_2(n_cols), 4096)) and launch one program per row.
    return y
