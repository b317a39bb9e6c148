"""flash_attention: softmax(q k^T * sm_scale [+ causal mask]) v in one pass over the keys,
with the online softmax; q, k, v of shape [B, H, N, D]."""

import math
import random

import torch
import torch.nn.functional as F

from grader.spec_api import Assignment, Case, Mismatch, Performance


def make_inputs(params: dict, dtype: torch.dtype, gen: torch.Generator) -> dict:
    b, h, n, d = params["B"], params["H"], params["N"], params["D"]
    scale = params.get("magnitude", 1.0)

    def one() -> torch.Tensor:
        if params.get("layout") == "bnhd":  # stored [B, N, H, D], seen as [B, H, N, D]: strides of a view
            return (scale * torch.randn(b, n, h, d, generator=gen)).to(dtype).transpose(1, 2)
        return (scale * torch.randn(b, h, n, d, generator=gen)).to(dtype)

    q, k, v = one(), one(), one()
    return {"q": q, "k": k, "v": v, "causal": params.get("causal", False), "sm_scale": params.get("sm_scale")}


def attention(q, k, causal: bool, sm_scale: float | None, diagonal: int = 1) -> torch.Tensor:
    """softmax(q k^T * scale), the attention weights. When causal, the keys j >= i + diagonal are
    masked: diagonal 1 lets row i see keys 0..i (top-left aligned, as torch's is_causal)."""
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(diagonal), float("-inf"))
    return torch.softmax(s, dim=-1)


def truth(q, k, v, causal=False, sm_scale=None) -> torch.Tensor:
    return attention(q, k, causal, sm_scale) @ v


def tf32(t: torch.Tensor) -> torch.Tensor:
    """t with each float32 mantissa cut to TF32's 10 bits, as tl.dot reads it on the GPU."""
    return torch.bitwise_and(t.contiguous().view(torch.int32), -(1 << 13)).view(torch.float32)


def baseline(q, k, v, causal=False, sm_scale=None) -> torch.Tensor:
    """torch in the working dtype: scaled_dot_product_attention (the vendor timing). In float32
    both products use TF32 operands, as tl.dot on the GPU does (TF32 is allowed)."""
    if q.dtype == torch.float32:
        return tf32(attention(tf32(q), tf32(k), causal, sm_scale)) @ tf32(v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=sm_scale)


def online_softmax(q, k, v, causal: bool, scale: float, block: int, rescale_acc: bool, rescale_sum: bool) -> torch.Tensor:
    """The online softmax over key blocks of `block`, in float64, optionally forgetting to
    rescale the accumulator or the running sum when the running max grows: a bug, emulated."""
    n = q.shape[-2]
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    m = torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros_like(q)
    for start in range(0, n, block):
        blk = s[..., start : start + block]
        m_new = torch.maximum(m, blk.amax(-1))
        alpha = torch.exp(m - m_new).nan_to_num(0.0)  # -inf - -inf: a row with nothing seen yet
        p = torch.exp(blk - m_new[..., None]).nan_to_num(0.0)
        l = (l * alpha if rescale_sum else l) + p.sum(-1)
        acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ v[..., start : start + block, :]
        m = m_new
    return acc / l[..., None]


def padded_keys(q, k, v, causal: bool, scale: float, block: int) -> torch.Tensor:
    """Attention where the keys that pad the last block to `block` are loaded as zeros and
    keep their score of 0 (no -inf mask): they add exp(0 - max) to every row's sum."""
    n, d = q.shape[-2], q.shape[-1]
    pad = -n % block
    zeros = torch.zeros(*q.shape[:-2], pad, d, dtype=q.dtype)
    kp, vp = torch.cat([k, zeros], -2), torch.cat([v, zeros], -2)
    s = q @ kp.transpose(-1, -2) * scale
    if causal:
        s[..., :n] = s[..., :n].masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ vp


def explain(mm: Mismatch) -> str | None:
    """This assignment's typical bugs, each tested as a hypothesis on the inputs."""
    if mm.got.isnan().all():
        return None  # the judge's words: the output was never written
    q, k, v = (mm.inputs[x].double() for x in "qkv")
    causal, sm_scale = bool(mm.inputs["causal"]), mm.inputs["sm_scale"]
    n, d = q.shape[-2], q.shape[-1]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    if causal and mm.matches(truth(q, k, v, False, sm_scale)):
        return "causal=True, but every query attends to every key: mask the scores of keys j > i with -inf"
    if not causal and mm.matches(truth(q, k, v, True, sm_scale)):
        return "causal=False, but the result is causal: apply the mask only when causal is True"
    if causal and n > 1:
        strict = attention(q, k, True, sm_scale, diagonal=0) @ v  # row i sees keys 0..i-1
        strict[..., 0, :] = mm.got[..., 0, :]  # row 0 sees no key at all: NaN or anything, depending on the mask
        if mm.matches(strict):
            return "the diagonal is masked too: query i must see keys 0 to i (mask the keys j > i, keep j == i)"
    for wrong, what in ((1.0 / math.sqrt(d), "the default 1/sqrt(D)"), (1.0, "1"), (1.0 / d, "1/D")):
        if not math.isclose(wrong, scale) and mm.matches(truth(q, k, v, causal, wrong)):
            given = f"sm_scale={sm_scale:g} was given" if sm_scale is not None else "sm_scale=None means 1/sqrt(D)"
            return f"the scores were scaled by {what}, but {given}"
    for block in (16, 32, 64, 128):
        if n % block and not causal and mm.matches(padded_keys(q, k, v, causal, scale, block)):
            return (f"the last block of keys runs past N = {n}, and its {-n % block} padding keys take part in the softmax: "
                    "loading them as 0 is not enough, their scores must be -inf (tl.where(offs_n < N, qk, float('-inf')))")
    for block in (16, 32, 64, 128):
        if block >= n:
            break
        for rescale_acc, rescale_sum, what in ((False, True, "the accumulator"), (True, False, "the running sum"),
                                                (False, False, "the accumulator and the running sum")):
            if mm.matches(online_softmax(q, k, v, causal, scale, block, rescale_acc, rescale_sum)):
                return (f"this is the online softmax over key blocks of {block} without rescaling {what} when the running "
                        "max grows: multiply acc and l by exp(m_old - m_new) before adding the new block")
    precision = mm.precision_loss()
    if precision:
        return precision
    for dim, what in ((0, "batch"), (1, "head")):
        first = mm.first_wrong_along(dim)
        if first is not None:
            return (f"{what} 0 to {first - 1} right, every {what} from {first} on wrong: check the {what} offset "
                    f"(use q.stride({dim}), k.stride({dim}), v.stride({dim}) and out.stride({dim}))")
    first = mm.first_wrong_along(2)
    if first is not None:
        return (f"queries 0 to {first - 1} are right, every query from {first} on has wrong elements: those rows see more than "
                "one block of keys; check how the running max, sum and accumulator carry over from one key block to the next")
    return None


def random_cases(rng: random.Random) -> list[Case]:
    cases = []
    for i in range(2):
        n, d, causal = rng.randint(2, 160), rng.choice([32, 64, 128]), rng.random() < 0.5
        name = f"random-{i}-{'causal-' if causal else ''}N={n}-D={d}"
        cases.append(Case(name, {"B": 1, "H": 2, "N": n, "D": d, "causal": causal}, "a shape drawn from the run's seed"))
    return cases


def _attention_flops(p: dict, dt) -> int:
    """Two products of 2*N*N*D each per (batch, head); causal does half of them."""
    full = 4 * p["B"] * p["H"] * p["N"] * p["N"] * p["D"]
    return full // 2 if p.get("causal") else full


SPEC = Assignment(
    name="flash_attention",
    title="Flash attention (forward)",
    function="flash_attention",
    module="kernels/flash_attention.py",
    signature="flash_attention(q, k, v, causal=False, sm_scale=None) -> Tensor  # q, k, v: [B, H, N, D]",
    make_inputs=make_inputs,
    truth=truth,
    baseline=baseline,
    explain=explain,
    cases=(
        Case("N=1-D=32", {"B": 1, "H": 1, "N": 1, "D": 32}, "one query and one key: the output is v"),
        Case("N=64-D=64", {"B": 1, "H": 2, "N": 64, "D": 64}, "exactly one block of 64 keys"),
        Case("N=130-D=64", {"B": 2, "H": 2, "N": 130, "D": 64},
             "N = 130 is a multiple of no block: the keys past N in the last block must not count (score -inf)"),
        Case("causal-N=130-D=64", {"B": 1, "H": 2, "N": 130, "D": 64, "causal": True},
             "causal: query i sees keys 0 to i; N is a multiple of no block"),
        Case("causal-N=97-D=128", {"B": 1, "H": 2, "N": 97, "D": 128, "causal": True}, "causal, head dim 128, odd N"),
        Case("sm_scale=0.3-N=100-D=32", {"B": 1, "H": 2, "N": 100, "D": 32, "sm_scale": 0.3},
             "sm_scale given: it replaces 1/sqrt(D)"),
        Case("bnhd-view-causal-N=80-D=64", {"B": 2, "H": 2, "N": 80, "D": 64, "causal": True, "layout": "bnhd"},
             "q, k, v are [B, N, H, D] tensors seen as [B, H, N, D] (transpose(1, 2)): use all four strides of each"),
        Case("large-scores-N=120-D=32", {"B": 1, "H": 2, "N": 120, "D": 32, "magnitude": 6.0},
             "scores in the hundreds: exp overflows unless the running max is subtracted"),
    ),
    random_cases=random_cases,
    correctness_points=12,
    performance=Performance(
        case=Case("causal-B=4-H=32-N=4096-D=64", {"B": 4, "H": 32, "N": 4096, "D": 64, "causal": True}),
        dtype="float16",
        bytes_moved=lambda p, dt: 4 * p["B"] * p["H"] * p["N"] * p["D"] * torch.finfo(dt).bits // 8,
        flops=_attention_flops,
        full_at=1.10,
        zero_at=4.0,
        # SDPA's kernels (cuDNN's and FlashAttention's) can stay ahead of the Triton reference on
        # Hopper: full points never go to code slower than what torch already does
        against="faster",
    ),
    performance_points=8,
    benchmark_cases=tuple((Case(f"{'causal-' if causal else ''}B=4-H=32-N=4096-D={d}",
                                {"B": 4, "H": 32, "N": 4096, "D": d, **({"causal": True} if causal else {})}), dtype)
                          for d in (64, 128) for causal in (True, False) for dtype in ("float16", "bfloat16")
                          if (d, causal, dtype) != (64, True, "float16")),  # the scoring case is measured anyway
    forbidden_ops=frozenset({
        "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math",
        "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_fused_attention_overrideable", "aten::_flash_attention_forward",
        "aten::_efficient_attention_forward", "aten::_fused_sdp_choice",
        "aten::mm", "aten::bmm", "aten::matmul", "aten::baddbmm", "aten::einsum",
        "aten::_softmax", "aten::softmax.int", "aten::_safe_softmax",
    }),
)
