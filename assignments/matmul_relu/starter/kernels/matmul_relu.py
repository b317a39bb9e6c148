"""matmul_relu: c = relu(a @ b) for a of shape [M, K] and b of shape [K, N], in a's dtype.

Fill in the TODOs, then run `grader check` from your repo's root. The handout is
README.md in the assignment's folder.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def matmul_relu_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                       stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # TODO: this program computes the tile c[pid_m * BLOCK_M : ..., pid_n * BLOCK_N : ...].
    # TODO: element (i, j) of a is at a_ptr + i * stride_am + j * stride_ak (a may be a transposed
    #       or sliced view: use both strides; the same for b).
    # TODO: accumulate in float32: acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), then
    #       walk K in steps of BLOCK_K: load a tile of a and a tile of b, acc = tl.dot(a_tile, b_tile, acc).
    #       M, N and K need not be multiples of the blocks: mask the loads (other=0.0) and the store.
    # TODO: apply the ReLU to acc (tl.maximum(acc, 0.0)), cast to c's dtype and store the tile.
    pass


def matmul_relu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    M, K = a.shape
    K2, N = b.shape
    assert K == K2, "the inner dimensions of a and b must agree"
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    # TODO: choose the blocks (e.g. 64 x 64 x 32; tl.dot needs each of them >= 16) and launch one
    #       program per tile of c: grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N)).
    return c
