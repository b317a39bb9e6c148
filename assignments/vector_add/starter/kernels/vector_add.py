"""vector_add: out[i] = x[i] + y[i] for 1-D tensors of the same length and dtype.

Fill in the TODOs, then run `grader check` from your repo's root. The handout is
README.md in the assignment's folder.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, stride_x, stride_y, BLOCK_SIZE: tl.constexpr):
    # TODO: this program handles elements [pid * BLOCK_SIZE, (pid + 1) * BLOCK_SIZE).
    # TODO: build the offsets and a mask (offsets < n) so the last block stays in bounds.
    # TODO: load x and y (x may be a strided view: element i is at x_ptr + i * stride_x),
    #       add them, and store the sum to out_ptr (which you allocate contiguous).
    pass


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = out.numel()
    # TODO: launch add_kernel on a grid of triton.cdiv(n, BLOCK_SIZE) programs.
    return out
