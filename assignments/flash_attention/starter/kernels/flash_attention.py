"""flash_attention: out = softmax(q @ k^T * sm_scale) @ v per (batch, head), with an optional
causal mask; q, k, v of shape [B, H, N, D]; out of the same shape and dtype.

Fill in the TODOs, then run `grader check` from your repo's root. The handout is
README.md in the assignment's folder.
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale, N, H,
                     stride_qb, stride_qh, stride_qn, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_ob, stride_oh, stride_on, stride_od,
                     CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # TODO: this program handles queries [pid_m * BLOCK_M, (pid_m + 1) * BLOCK_M) of one
    #       (batch, head): b = tl.program_id(1) // H, h = tl.program_id(1) % H. Use all four
    #       strides of each tensor: q, k, v may be views.
    # TODO: load the q block once (mask rows >= N). Keep per row, in float32: m (running max of the
    #       scores, start at -inf), l (running sum of exp(score - m), start at 0) and acc [BLOCK_M, D].
    # TODO: loop over key blocks of BLOCK_N (for causal, only up to the diagonal):
    #       s = tl.dot(q, k_block^T) * sm_scale; scores of keys >= N, and for causal of keys j > i,
    #       must be -inf; m_new = max(m, rowmax(s)); p = exp(s - m_new);
    #       l = l * exp(m - m_new) + rowsum(p); acc = acc * exp(m - m_new) + tl.dot(p.to(v's dtype), v_block).
    # TODO: store acc / l in out's dtype (mask rows >= N).
    pass


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None) -> torch.Tensor:
    B, H, N, D = q.shape
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    out = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
    # TODO: launch attention_kernel on grid (triton.cdiv(N, BLOCK_M), B * H), e.g. BLOCK_M = BLOCK_N = 64,
    #       passing *q.stride(), *k.stride(), *v.stride(), *out.stride().
    return out
