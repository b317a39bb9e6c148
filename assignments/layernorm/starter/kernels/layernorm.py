"""layernorm: y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim, result in
x's dtype; and, as the optional second part, its backward pass layer_norm_backward.

Fill in the TODOs, then run `grader check -a layernorm` (and `-a layernorm_backward`) from
your repo's root. The handout is README.md in the assignment's folder.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def layer_norm_kernel(y_ptr, x_ptr, w_ptr, b_ptr, x_row_stride, y_row_stride, n_cols, eps, BLOCK: tl.constexpr):
    # TODO: one program per row: row = tl.program_id(0); the row starts at x_ptr + row * x_row_stride.
    # TODO: mean over the row, in float32, masking the columns past n_cols.
    # TODO: var = mean((x - mean)^2): subtract the mean first. mean(x^2) - mean(x)^2 cancels on rows
    #       of large values (+-1000 + noise) and gives garbage.
    # TODO: store (x - mean) / sqrt(var + eps) * weight + bias in y's dtype.
    # TODO: a row may be longer than BLOCK: loop over it in blocks.
    pass


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    n_cols = x.shape[-1]
    # TODO: x may be a view (x.stride(0) != n_cols) or 3-D: see it as [rows, n_cols] with x.reshape(-1, n_cols).
    y = torch.empty_like(x)
    # TODO: choose BLOCK (e.g. min(triton.next_power_of_2(n_cols), 4096)) and launch one program per row.
    return y


# ---- optional second part: graded as the assignment layernorm_backward --------------------------

def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5):
    """Returns (dx, dweight, dbias), the gradients of layer_norm(x, weight, bias, eps) for dy.

    With xhat = (x - mean) * rstd and wdy = weight * dy, per row:
        dx = rstd * (wdy - mean(xhat * wdy) * xhat - mean(wdy))
    and over all rows: dweight = sum(dy * xhat), dbias = sum(dy).
    """
    # TODO: a kernel for dx (one program per row, recomputing mean and rstd from x) that also
    #       writes partial sums of dy * xhat and dy; then a kernel that adds the partials up.
    raise NotImplementedError("layer_norm_backward is the optional second part")
