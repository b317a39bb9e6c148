"""Reference solution for conv2d (PRIVATE: never shipped to students).

A 'valid' (no padding), stride-1 convolution as an implicit GEMM on tensor cores: the
output pixels (n, p, q) are the GEMM's rows, the output channels its columns, and the
reduction runs over (r, s, c). The input is read channels-last (NHWC, made here with one
copy unless it already is), so that for one filter tap (r, s) a tile of the A operand is
BLOCK_M pixels x BLOCK_C contiguous channels: vectorised, pipelined loads, as in a plain
GEMM. The filter is reordered once to [(r, s, c), k]. Pixels past the last one wrap around
(modulo), so only the channel tail needs a mask; the result is stored straight into NCHW.
Autotuned over Hopper-friendly tiles; the first config is the one the CPU interpreter runs.
"""

import torch
import triton
import triton.language as tl


def _configs():
    shapes = [  # BLOCK_M, BLOCK_N, BLOCK_C, stages, warps
        (128, 64, 64, 4, 4),
        (128, 128, 64, 4, 8),
        (256, 64, 64, 3, 8),
        (128, 64, 32, 4, 4),
        (64, 64, 64, 4, 4),
        (128, 128, 32, 4, 4),
        (64, 128, 64, 4, 4),
        (256, 128, 64, 3, 8),
    ]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_C": c}, num_stages=s, num_warps=w)
            for m, n, c, s, w in shapes]


@triton.autotune(configs=_configs(), key=["C", "H", "W", "K", "R", "S"])
@triton.heuristics({"EVEN_C": lambda args: args["C"] % args["BLOCK_C"] == 0})
@triton.jit
def _conv2d_kernel(x_ptr, w_ptr, out_ptr, NB, C, H, W, K, P, Q,
                   R: tl.constexpr, S: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, EVEN_C: tl.constexpr):
    # out[n, k, p, q] = sum over r, s, c of x[n, p + r, q + s, c] * w[(r, s, c), k]   (x NHWC here)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    M = NB * P * Q
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M  # pixels past the end wrap (the store drops them)
    offs_k = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % K
    offs_c = tl.arange(0, BLOCK_C)
    n = offs_m // (P * Q)
    pq = offs_m % (P * Q)
    p = pq // Q
    q = pq % Q
    pix = ((n.to(tl.int64) * H + p) * W + q) * C  # x[n, p, q, 0]: the tap (0, 0) of each output pixel

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c_blocks = tl.cdiv(C, BLOCK_C)
    for step in range(0, R * S * c_blocks):
        rs = step // c_blocks
        c0 = (step % c_blocks) * BLOCK_C
        r = rs // S
        s = rs % S
        a_ptrs = x_ptr + pix[:, None] + ((r * W + s) * C + c0 + offs_c)[None, :]
        b_ptrs = w_ptr + (rs * C + c0 + offs_c)[:, None] * K + offs_k[None, :]
        if EVEN_C:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(c0 + offs_c)[None, :] < C, other=0.0)
            b = tl.load(b_ptrs, mask=(c0 + offs_c)[:, None] < C, other=0.0)
        acc = tl.dot(a, b, acc)

    # store into NCHW: out[n, k, p, q]
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n = rows // (P * Q)
    pq = rows % (P * Q)
    out_ptrs = out_ptr + (n.to(tl.int64) * K * P * Q + pq)[:, None] + cols[None, :].to(tl.int64) * P * Q
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < K))


def conv2d(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    NB, C, H, W = x.shape
    K, C2, R, S = w.shape
    assert C == C2, f"channels differ: x has {C}, w expects {C2}"
    assert R <= H and S <= W, "the filter is larger than the image"
    P, Q = H - R + 1, W - S + 1
    x_nhwc = x.permute(0, 2, 3, 1).contiguous()  # a view, no copy, when x is channels-last already
    w_rsck = w.permute(2, 3, 1, 0).contiguous()  # [R, S, C, K]: row (r, s, c), column k
    out = torch.empty((NB, K, P, Q), dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(NB * P * Q, meta["BLOCK_M"]), triton.cdiv(K, meta["BLOCK_N"]))
    _conv2d_kernel[grid](x_nhwc, w_rsck, out, NB, C, H, W, K, P, Q, R=R, S=S)
    return out
