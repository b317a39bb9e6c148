"""Reference solution for flash_attention (PRIVATE: never shipped to students).

The forward pass of FlashAttention-2, after Triton's tutorial 06 (fused attention): one
program per (block of BLOCK_M queries, batch x head). It streams over blocks of BLOCK_N keys
and values with the online softmax: a running row max m and row sum l, the accumulator
rescaled by exp(m_old - m_new) whenever m grows. Scores are kept in log2 units (sm_scale is
folded into log2(e)) so that every exponential is one exp2.

Causal attention runs in two stages: the key blocks wholly left of the diagonal need no mask
at all; only the BLOCK_M-wide band on the diagonal is masked. The heaviest query blocks (the
last ones) are scheduled first. A final stage masks the keys past N when N is not a multiple
of BLOCK_N, so the hot loop carries no masks. The first autotune config is the one the CPU
interpreter runs.

On Hopper and later, 16-bit q, k, v in the contiguous [B, H, N, D] layout with N a multiple of
128 take a leaner kernel (`_attn_fwd_tma`): q, k, v and the output are seen as [B*H*N, D] and
their tiles arrive through tensor-memory-accelerator descriptors, so the copy engine streams the
key and value blocks (pipelined num_stages deep) while the warps do the products; no block
runs past N, so no load or store carries a mask. The loop over key blocks can be warp
specialised (a producer warp group for the copies, consumers for the maths) where Triton
supports it; the autotune list says why no config asks for it. Every other input (the
interpreter, float32, strided views, odd N) takes the pointer kernel above.
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _attn_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, lo, hi, n_ctx, offs_m, offs_n, qk_scale,
                BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr, MASK_KEYS: tl.constexpr):
    """Keys [lo, hi) into (acc, l_i, m_i). DIAGONAL: apply the causal mask; MASK_KEYS: keys may
    run past n_ctx (loads masked, their scores -inf-like)."""
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if MASK_KEYS:
            k = tl.load(k_ptrs, mask=cols[:, None] < n_ctx, other=0.0)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k))
        if DIAGONAL or MASK_KEYS:
            keep = cols[None, :] < n_ctx
            if DIAGONAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASK_KEYS:
            v = tl.load(v_ptrs, mask=cols[:, None] < n_ctx, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


def _configs():
    shapes = [  # BLOCK_M, BLOCK_N, stages, warps
        (128, 64, 3, 4),
        (128, 64, 4, 4),
        (128, 128, 3, 8),
        (128, 32, 4, 4),
        (64, 64, 3, 4),
        (64, 64, 4, 4),
        (64, 32, 4, 4),
        (128, 128, 2, 8),
    ]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_stages=s, num_warps=w) for m, n, s, w in shapes]


@triton.autotune(configs=_configs(), key=["n_ctx", "HEAD_DIM", "CAUSAL"])
@triton.jit
def _attn_fwd(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale, n_ctx, H,
              stride_qb, stride_qh, stride_qn, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_on, stride_od,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    if CAUSAL:  # the last query blocks see the most keys: start them first
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = q_ptr + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    k_ptrs = k_ptr + off_b * stride_kb + off_h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_ptr + off_b * stride_vb + off_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # log2(e): exp(x) == exp2(x * log2(e))
    q = tl.load(q_ptrs, mask=offs_m[:, None] < n_ctx, other=0.0)

    if CAUSAL:
        # stage 1: key blocks left of the diagonal band, all visible, all inside n_ctx
        band = start_m * BLOCK_M
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, 0, band, n_ctx,
                                    offs_m, offs_n, qk_scale, BLOCK_N, False, False)
        # stage 2: the diagonal band, masked (and cut at n_ctx)
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, band,
                                    tl.minimum(band + BLOCK_M, n_ctx), n_ctx,
                                    offs_m, offs_n, qk_scale, BLOCK_N, True, True)
    else:
        full = (n_ctx // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, 0, full, n_ctx,
                                    offs_m, offs_n, qk_scale, BLOCK_N, False, False)
        # the last, partial key block (empty when BLOCK_N divides n_ctx)
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, full, n_ctx, n_ctx,
                                    offs_m, offs_n, qk_scale, BLOCK_N, False, True)

    out = acc / l_i[:, None]
    o_ptrs = o_ptr + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < n_ctx)


@triton.jit
def _attn_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, row0, lo, hi, offs_m, offs_n, qk_scale,
                    BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """Keys [lo, hi) of the head whose rows start at row0, through the descriptors."""
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([row0 + start_n, 0])
        qk = tl.dot(q, k.T)
        if DIAGONAL:
            qk = qk * qk_scale + tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([row0 + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


# BLOCK_M, BLOCK_N, stages, warps, warp specialised: the TMA kernel's autotune list. Triton 3.6's
# warp specialisation pass fails on this loop on Hopper (NVGPUWarpSpecialization, measured on an
# H100), so no config asks for it yet; the kernel keeps the switch for a Triton that can.
TMA_SHAPES = [  # the four fastest on an H100 (benchmarks/reference_variants.py): D=64 takes 128x64 or 128x128 tiles, D=128 128x128 on 8 warps
    (128, 64, 3, 8, False),
    (128, 128, 3, 4, False),
    (128, 64, 4, 4, False),
    (128, 128, 3, 8, False),
]


def _set_block_shapes(nargs):
    # a descriptor's block shape is part of the config being tried, so it is set per config
    bm, bn, d = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["HEAD_DIM"]
    nargs["desc_q"].block_shape = [bm, d]
    nargs["desc_o"].block_shape = [bm, d]
    nargs["desc_k"].block_shape = [bn, d]
    nargs["desc_v"].block_shape = [bn, d]


def _tma_configs(shapes=None):
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "WARP_SPECIALIZE": ws}, num_stages=s, num_warps=w,
                          pre_hook=_set_block_shapes) for m, n, s, w, ws in (shapes or TMA_SHAPES)]


@triton.autotune(configs=_tma_configs(), key=["n_ctx", "HEAD_DIM", "CAUSAL"])
@triton.jit
def _attn_fwd_tma(desc_q, desc_k, desc_v, desc_o, sm_scale, n_ctx,
                  HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  WARP_SPECIALIZE: tl.constexpr):
    if CAUSAL:  # the last query blocks see the most keys: start them first
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        start_m = tl.program_id(0)
    row0 = tl.program_id(1) * n_ctx  # the head's first row in [B*H*N, D]
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # log2(e): exp(x) == exp2(x * log2(e))
    q = desc_q.load([row0 + start_m * BLOCK_M, 0])
    if CAUSAL:
        band = start_m * BLOCK_M
        acc, l_i, m_i = _attn_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, row0, 0, band, offs_m, offs_n, qk_scale,
                                        BLOCK_N, False, WARP_SPECIALIZE)
        acc, l_i, m_i = _attn_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, row0, band, band + BLOCK_M, offs_m, offs_n,
                                        qk_scale, BLOCK_N, True, WARP_SPECIALIZE)
    else:
        acc, l_i, m_i = _attn_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, row0, 0, n_ctx, offs_m, offs_n, qk_scale,
                                        BLOCK_N, False, WARP_SPECIALIZE)
    out = acc / l_i[:, None]
    desc_o.store([row0 + start_m * BLOCK_M, 0], out.to(desc_o.dtype))


def _tma_ready(q, k, v, o) -> bool:
    """Hopper or later, 16-bit, contiguous [B, H, N, D], N a multiple of every BLOCK_M and BLOCK_N."""
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16) or torch.cuda.get_device_capability(q.device)[0] < 9:
        return False
    N, D = q.shape[-2], q.shape[-1]
    return (N % 128 == 0 and D in (64, 128) and k.dtype == v.dtype == q.dtype
            and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (q, k, v, o)))


def _flash_attention_tma(q, k, v, o, causal: bool, sm_scale: float, kernel=None) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    B, H, N, D = q.shape
    descs = [TensorDescriptor(t.view(B * H * N, D), [B * H * N, D], [D, 1], [1, 1]) for t in (q, k, v, o)]  # block shape: per config
    grid = lambda meta: (N // meta["BLOCK_M"], B * H)
    (kernel or _attn_fwd_tma)[grid](*descs, sm_scale, N, HEAD_DIM=D, CAUSAL=bool(causal))


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None) -> torch.Tensor:
    B, H, N, D = q.shape
    assert k.shape == v.shape == q.shape, "q, k and v must have the same shape [B, H, N, D]"
    assert D in (16, 32, 64, 128, 256), f"head dim {D} is not a power of two in [16, 256]"
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    o = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
    if N and B * H and _tma_ready(q, k, v, o):
        _flash_attention_tma(q, k, v, o, causal, sm_scale)
        return o
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_M"]), B * H)
    _attn_fwd[grid](q, k, v, o, sm_scale, N, H,
                    *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                    HEAD_DIM=D, CAUSAL=bool(causal))
    return o
