"""conv2d: out[n, k, p, q] = sum over c, r, s of x[n, c, p + r, q + s] * w[k, c, r, s]
for x of shape [N, C, H, W] and w of shape [K, C, R, S]; out is [N, K, H - R + 1, W - S + 1]
(stride 1, no padding, as torch.nn.functional.conv2d(x, w)).

Fill in the TODOs, then run `grader check` from your repo's root. The handout is
README.md in the assignment's folder.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def conv2d_kernel(x_ptr, w_ptr, out_ptr, NB, C, H, W, K, R, S, P, Q,
                  sxn, sxc, sxh, sxw, swk, swc, swr, sws, son, sok, sop, soq,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr):
    # An implicit GEMM: row i of the GEMM is output pixel i = (n, p, q) of NB * P * Q, column k an
    # output channel, and the reduction index j = (c, r, s) runs over C * R * S.
    # TODO: this program computes BLOCK_M pixels x BLOCK_N output channels; split the pixel index
    #       into n, p, q (p = (i // Q) % P, ...).
    # TODO: loop over j in steps of BLOCK_J: split j into c, r, s; load the [BLOCK_M, BLOCK_J] tile
    #       x[n, c, p + r, q + s] and the [BLOCK_J, BLOCK_N] tile w[k, c, r, s] (use all strides:
    #       x may be a view), masked past the ends, and accumulate tl.dot in float32.
    # TODO: store the tile into out[n, k, p, q] in out's dtype (masked).
    pass


def conv2d(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    NB, C, H, W = x.shape
    K, _, R, S = w.shape
    P, Q = H - R + 1, W - S + 1
    out = torch.empty((NB, K, P, Q), dtype=x.dtype, device=x.device)
    # TODO: launch conv2d_kernel on grid (triton.cdiv(NB * P * Q, BLOCK_M), triton.cdiv(K, BLOCK_N)),
    #       passing *x.stride(), *w.stride(), *out.stride().
    return out
