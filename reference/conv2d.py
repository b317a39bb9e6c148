"""Reference solution for conv2d (PRIVATE: never shipped to students).

A 'valid' (no padding), stride-1 convolution as an implicit GEMM on tensor cores: the
output pixels (p, q) of one image are the GEMM's rows, the output channels its columns, and
the reduction runs over (r, s, c). The filter is reordered once to [(r, s, c), k]; the input
is addressed through its own four strides. How a tile of the A operand (BLOCK_M pixels x
BLOCK_C channels for one filter tap) is read depends on where x keeps its channels
(`LAYOUT`, below): channels-last input is read as it lies, BLOCK_C contiguous channels a
pixel (vectorised loads, as in a plain GEMM); NCHW input is either read in place, the
threads walking along the pixels, or first turned channels-last. The programs of one image
own consecutive output pixels, so the result is stored straight into NCHW, coalesced. Pixels
past the image's last one wrap around (modulo) on the loads, and the store drops them.
Autotuned over Hopper-friendly tiles; the first config is the one the CPU interpreter runs.
"""

import torch
import triton
import triton.language as tl

# How NCHW input is read: "direct" (in place, through its strides), "triton_nhwc" (turned
# channels-last by the transpose kernel below first) or "torch_nhwc" (by torch's copy first).
LAYOUT = "direct"


def _configs():
    shapes = [  # BLOCK_M, BLOCK_N, BLOCK_C, stages, warps
        (128, 64, 64, 4, 4),
        (128, 64, 64, 3, 4),
        (128, 128, 64, 4, 8),
        (256, 64, 64, 3, 8),
        (64, 64, 64, 4, 4),
        (128, 64, 32, 4, 4),
        (256, 64, 32, 4, 8),
        (64, 128, 64, 4, 4),
    ]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_C": c}, num_stages=s, num_warps=w)
            for m, n, c, s, w in shapes]


@triton.autotune(configs=_configs(), key=["C", "H", "W", "K", "R", "S", "CHANNELS_FAST"])
@triton.heuristics({"EVEN_C": lambda args: args["C"] % args["BLOCK_C"] == 0})
@triton.jit
def _conv2d_kernel(x_ptr, w_ptr, out_ptr, C, H, W, K, P, Q, sxn, sxc, sxh, sxw,
                   R: tl.constexpr, S: tl.constexpr, CHANNELS_FAST: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, EVEN_C: tl.constexpr):
    # out[n, k, p, q] = sum over r, s, c of x[n, c, p + r, q + s] * w[(r, s, c), k]
    pid_m = tl.program_id(0)
    n = tl.program_id(1)
    pid_n = tl.program_id(2)
    PQ = P * Q
    pq = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % PQ  # pixels past the image's end wrap (the store drops them)
    offs_k = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % K
    offs_c = tl.arange(0, BLOCK_C)
    p = pq // Q
    q = pq % Q
    pix = n.to(tl.int64) * sxn + p * sxh + q * sxw  # x[n, 0, p, q]: the tap (0, 0) of each output pixel

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c_blocks = tl.cdiv(C, BLOCK_C)
    for step in range(0, R * S * c_blocks):
        rs = step // c_blocks
        c0 = (step % c_blocks) * BLOCK_C
        r = rs // S
        s = rs % S
        chans = c0 + offs_c
        tap = r * sxh + s * sxw
        if CHANNELS_FAST:  # [BLOCK_M, BLOCK_C], the channels of a pixel side by side
            a_ptrs = x_ptr + (pix + tap)[:, None] + (chans * sxc)[None, :]
            if EVEN_C:
                a = tl.load(a_ptrs)
            else:
                a = tl.load(a_ptrs, mask=chans[None, :] < C, other=0.0)
        else:  # [BLOCK_C, BLOCK_M], the threads along the pixels of a channel, then transposed
            a_ptrs = x_ptr + (pix + tap)[None, :] + (chans * sxc)[:, None]
            if EVEN_C:
                a = tl.trans(tl.load(a_ptrs))
            else:
                a = tl.trans(tl.load(a_ptrs, mask=chans[:, None] < C, other=0.0))
        b_ptrs = w_ptr + (rs * C + chans)[:, None] * K + offs_k[None, :]
        if EVEN_C:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=chans[:, None] < C, other=0.0)
        acc = tl.dot(a, b, acc)

    # store into NCHW: out[n, k, p, q], consecutive pixels side by side
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + n.to(tl.int64) * K * PQ + cols[None, :].to(tl.int64) * PQ + rows[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < PQ) & (cols[None, :] < K))


@triton.jit
def _nchw_to_nhwc(x_ptr, y_ptr, C, HW, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """y[n, hw, c] = x[n, c, hw] for a contiguous x: one [BLOCK_C, BLOCK_HW] tile a program."""
    hw = tl.program_id(0) * BLOCK_HW + tl.arange(0, BLOCK_HW)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    base = tl.program_id(2).to(tl.int64) * C * HW
    keep = (c[:, None] < C) & (hw[None, :] < HW)
    tile = tl.load(x_ptr + base + c[:, None] * HW + hw[None, :], mask=keep)
    tl.store(y_ptr + base + hw[:, None] * C + c[None, :], tl.trans(tile), mask=tl.trans(keep))


def _channels_last(x: torch.Tensor, how: str) -> torch.Tensor:
    """x as [N, C, H, W] with channels-last memory (x.stride(1) == 1)."""
    if x.stride(1) == 1 or how == "torch_nhwc" or not x.is_contiguous():
        return x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    NB, C, H, W = x.shape
    y = torch.empty((NB, H, W, C), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(H * W, 64), triton.cdiv(C, 64), NB)
    _nchw_to_nhwc[grid](x, y, C, H * W, BLOCK_C=64, BLOCK_HW=64)
    return y.permute(0, 3, 1, 2)


def conv2d(x: torch.Tensor, w: torch.Tensor, layout: str | None = None) -> torch.Tensor:
    NB, C, H, W = x.shape
    K, C2, R, S = w.shape
    assert C == C2, f"channels differ: x has {C}, w expects {C2}"
    assert R <= H and S <= W, "the filter is larger than the image"
    P, Q = H - R + 1, W - S + 1
    how = layout or LAYOUT
    if how != "direct" and x.stride(1) != 1:
        x = _channels_last(x, how)
    w_rsck = w.permute(2, 3, 1, 0).contiguous()  # [R, S, C, K]: row (r, s, c), column k
    out = torch.empty((NB, K, P, Q), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    grid = lambda meta: (triton.cdiv(P * Q, meta["BLOCK_M"]), NB, triton.cdiv(K, meta["BLOCK_N"]))
    _conv2d_kernel[grid](x, w_rsck, out, C, H, W, K, P, Q, *x.stride(), R=R, S=S,
                         CHANNELS_FAST=bool(x.stride(1) == 1))
    return out
