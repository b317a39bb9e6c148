"""conv2d: a 'valid' (no padding), stride-1 2-D convolution of NCHW images with OIHW filters,
as torch.nn.functional.conv2d computes it (cross-correlation: the filter is not flipped)."""

import random

import torch
import torch.nn.functional as F

from grader.spec_api import Assignment, Case, Mismatch, Performance, contiguous_reading, low_precision_sum


def make_inputs(params: dict, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    n, c, h, w, k, r = (params[x] for x in ("N", "C", "H", "W", "K", "R"))
    layout = params.get("layout", "contiguous")
    if layout == "cropped":  # a crop of larger images: x.stride(2) == W + 3, offset into the storage
        x = torch.randn(n, c, h + 2, w + 3, generator=gen).to(dtype)[:, :, 1 : 1 + h, 2 : 2 + w]
    else:
        x = torch.randn(n, c, h, w, generator=gen).to(dtype)
        if layout == "channels_last":  # NCHW shape, NHWC memory: x.stride(1) == 1
            x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(k, c, r, r, generator=gen).to(dtype)
    return {"x": x, "w": weight}


def truth(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, w)


def tf32(t: torch.Tensor) -> torch.Tensor:
    """t with each float32 mantissa cut to TF32's 10 bits, as tl.dot reads it on the GPU."""
    return torch.bitwise_and(t.contiguous().view(torch.int32), -(1 << 13)).view(torch.float32)


def baseline(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """torch in the working dtype: the error model's yardstick and the vendor timing (cuDNN).
    In float32 it convolves TF32 operands, as tl.dot on the GPU (and cuDNN by default) do."""
    if x.dtype == torch.float32:
        return F.conv2d(tf32(x), tf32(w))
    return F.conv2d(x, w)


def explain(mm: Mismatch) -> str | None:
    """This assignment's typical bugs, each tested as a hypothesis on the inputs."""
    if mm.got.isnan().all():
        return None  # the judge's words: the output was never written
    x, w = mm.inputs["x"], mm.inputs["w"]
    xd, wd = x.double(), w.double()
    if w.shape[-1] > 1 and mm.matches(F.conv2d(xd, wd.transpose(-1, -2))):
        return ("the filter is read transposed: w[k, c, r, s] has r along the height (rows) and s along the width; "
                "the input pixel for tap (r, s) is x[n, c, p + r, q + s]")
    if w.shape[-1] > 1 and mm.matches(F.conv2d(xd, wd.flip(-1, -2))):
        return ("this is a convolution with the filter flipped; compute what torch.nn.functional.conv2d does "
                "(cross-correlation): out[n, k, p, q] = sum of x[n, c, p + r, q + s] * w[k, c, r, s]")
    if not x.is_contiguous():
        wrong = contiguous_reading(x)
        if wrong is not None and mm.matches(F.conv2d(wrong.double(), wd)):
            return (f"x is not a contiguous NCHW tensor here (x.stride() == {tuple(x.stride())}), and the result is what "
                    "reading it as contiguous gives: address x with its four strides (or call x.contiguous() first)")
    for cause in (_reduction_tail_skipped, _accumulated_low):
        if found := cause(mm, x, w):
            return found
    precision = mm.precision_loss()
    if precision:
        return precision
    words = {0: ("image", "the batch offset n * x.stride(0) (and out.stride(0))"),
             1: ("output channel", "the grid over output channels and the masks on k"),
             2: ("output row", "the output is (H - R + 1) x (W - S + 1); check how a pixel index maps to (n, p, q)"),
             3: ("output column", "the output is (H - R + 1) x (W - S + 1); check how a pixel index maps to (n, p, q)")}
    for dim, (what, hint) in words.items():
        first = mm.first_wrong_along(dim)
        if first is not None:
            return f"{what}s 0 to {first - 1} are right, every {what} from {first} on has wrong elements: check {hint}"
    return None


STEPS = (16, 32, 64, 128)  # the block a kernel may step through the reduction with


def _orders(w: torch.Tensor):
    """(name, flatten, unflatten) of the two orders a kernel may run the reduction in: (c, r, s),
    w's own memory order, or (r, s, c), each tap's channels together (channels-last style)."""
    k, c, r, s = w.shape
    yield ("(c, r, s)", lambda t: t.reshape(k, c * r * s), lambda f: f.reshape(k, c, r, s))
    yield ("(r, s, c)", lambda t: t.permute(0, 2, 3, 1).reshape(k, r * s * c), lambda f: f.reshape(k, r, s, c).permute(0, 3, 1, 2))


def _reduction_tail_skipped(mm: Mismatch, x: torch.Tensor, w: torch.Tensor) -> str | None:
    """Hypothesis: the loop over the reduction (C x R x S) stops before its last, partial step:
    the last (C x R x S) % BLOCK terms are never added."""
    total = w[0].numel()
    xd = x.double()
    for order, flatten, unflatten in _orders(w.double()):
        for step in STEPS:
            kept = total - total % step
            if kept == total:
                continue
            cut = flatten(w.double()).clone()
            cut[:, kept:] = 0
            if mm.matches(F.conv2d(xd, unflatten(cut))):
                how = ("C x R x S is less than one step, so the loop never ran" if kept == 0 else
                       f"only the first {kept} of C x R x S = {total} terms, in {order} order, were summed")
                return (f"the last, partial step of the reduction is skipped: {how} (reproduced from your inputs). Loop "
                        "triton.cdiv(C * R * S, BLOCK) times and mask the loads of x and w with j < C * R * S (other=0.0)")
    return None


def _accumulated_low(mm: Mismatch, x: torch.Tensor, w: torch.Tensor) -> str | None:
    """Hypothesis: a float16 (or bfloat16) accumulator, rounded at every step of the reduction
    (an implicit GEMM over (c, r, s) in blocks, or one filter tap at a time)."""
    low = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(mm.dtype)
    if low is None:
        return None
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    p, q = h - r + 1, wd - s + 1
    cols = F.unfold(x.float(), (r, s))  # [N, C*R*S, P*Q], in (c, r, s) order
    flat = w.float().reshape(k, c * r * s)
    ways = []
    for step in STEPS:
        if step < c * r * s:
            ways.append((f"steps of {step} through (c, r, s)",
                         [(flat[:, i:i + step] @ cols[:, i:i + step, :]).reshape(n, k, p, q) for i in range(0, c * r * s, step)]))
    if r * s > 1:
        taps = [F.conv2d(x.float()[:, :, i:i + p, j:j + q], w.float()[:, :, i:i + 1, j:j + 1]) for i in range(r) for j in range(s)]
        ways.append(("one filter tap at a time", taps))
    for how, parts in ways:
        for round_each in (True, False):
            if mm.explains(low_precision_sum(parts, low, round_each).double()):
                return (f"the values are less precise than torch's in {mm.dtype}, exactly as a {mm.dtype} accumulator gives, "
                        f"rounded at {how} (reproduced from your inputs). Accumulate in float32 "
                        f"(tl.zeros(..., dtype=tl.float32)) and round to {mm.dtype} only when storing the result")
    return None


def random_cases(rng: random.Random) -> list[Case]:
    cases = []
    for i in range(2):
        r = rng.choice([1, 3, 5])
        n, c, k = rng.randint(1, 3), rng.randint(1, 24), rng.randint(1, 24)
        h, w = rng.randint(r, 20), rng.randint(r, 20)
        cases.append(Case(f"random-{i}-{n}x{c}x{h}x{w}-K={k}-{r}x{r}", {"N": n, "C": c, "H": h, "W": w, "K": k, "R": r},
                          "a shape drawn from the run's seed"))
    return cases


def _out(p: dict) -> tuple[int, int]:
    return p["H"] - p["R"] + 1, p["W"] - p["R"] + 1


SPEC = Assignment(
    name="conv2d",
    title="2-D convolution (valid, stride 1)",
    function="conv2d",
    module="kernels/conv2d.py",
    signature="conv2d(x: Tensor, w: Tensor) -> Tensor  # x: [N, C, H, W], w: [K, C, R, S] -> [N, K, H-R+1, W-S+1]",
    make_inputs=make_inputs,
    truth=truth,
    baseline=baseline,
    explain=explain,
    cases=(
        Case("1x1-2x3x7x9-K=4", {"N": 2, "C": 3, "H": 7, "W": 9, "K": 4, "R": 1}, "a 1x1 filter: a matrix product over channels"),
        Case("3x3-2x3x11x13-K=5", {"N": 2, "C": 3, "H": 11, "W": 13, "K": 5, "R": 3}, "a 3x3 filter on an odd-sized image"),
        Case("5x5-1x2x9x9-K=3", {"N": 1, "C": 2, "H": 9, "W": 9, "K": 3, "R": 5}, "a 5x5 filter"),
        Case("5x5-whole-image-1x4x5x5-K=6", {"N": 1, "C": 4, "H": 5, "W": 5, "K": 6, "R": 5},
             "the filter covers the whole image: the output is 1x1"),
        Case("3x3-C=37-1x37x10x12-K=20", {"N": 1, "C": 37, "H": 10, "W": 12, "K": 20, "R": 3},
             "C x R x S = 333 is a multiple of no block: the last step of the reduction is partial"),
        Case("3x3-C=64-2x64x8x8-K=64", {"N": 2, "C": 64, "H": 8, "W": 8, "K": 64, "R": 3},
             "many channels: the reduction over C x R x S = 576 takes many steps"),
        Case("channels-last-3x3-2x8x9x11-K=6", {"N": 2, "C": 8, "H": 9, "W": 11, "K": 6, "R": 3, "layout": "channels_last"},
             "x is NCHW in shape but channels-last in memory (x.stride(1) == 1): use x's strides"),
        Case("cropped-3x3-2x3x12x13-K=4", {"N": 2, "C": 3, "H": 12, "W": 13, "K": 4, "R": 3, "layout": "cropped"},
             "x is a crop of larger images (x.stride(2) != W): use x's strides"),
    ),
    random_cases=random_cases,
    correctness_points=12,
    performance=Performance(
        # a batch of 128: at 32 the reference takes 0.038 ms on an H100, under the 0.05 ms below
        # which a time is launch-bound and not scored (grader.judge.perf.MIN_SCORED_MS)
        case=Case("resnet-128x64x56x56-K=64-3x3", {"N": 128, "C": 64, "H": 56, "W": 56, "K": 64, "R": 3}),
        dtype="float16",
        bytes_moved=lambda p, dt: (p["N"] * p["C"] * p["H"] * p["W"] + p["K"] * p["C"] * p["R"] ** 2
                                   + p["N"] * p["K"] * _out(p)[0] * _out(p)[1]) * torch.finfo(dt).bits // 8,
        flops=lambda p, dt: 2 * p["N"] * p["K"] * _out(p)[0] * _out(p)[1] * p["C"] * p["R"] ** 2,
        full_at=1.10,
        zero_at=4.0,
        # where cuDNN stays ahead of the reference, the student is scored against cuDNN
        against="faster",
    ),
    performance_points=8,
    # more ResNet layers that benchmarks/references.py measures the reference on (not graded)
    benchmark_cases=((Case("resnet-32x64x56x56-K=64-3x3", {"N": 32, "C": 64, "H": 56, "W": 56, "K": 64, "R": 3}), "bfloat16"),
                     (Case("resnet-32x128x28x28-K=128-3x3", {"N": 32, "C": 128, "H": 28, "W": 28, "K": 128, "R": 3}), "float16"),
                     (Case("resnet-32x256x14x14-K=256-3x3", {"N": 32, "C": 256, "H": 14, "W": 14, "K": 256, "R": 3}), "float16"),
                     (Case("resnet-32x256x56x56-K=64-1x1", {"N": 32, "C": 256, "H": 56, "W": 56, "K": 64, "R": 1}), "float16")),
    forbidden_ops=frozenset({
        "aten::convolution", "aten::_convolution", "aten::conv2d", "aten::cudnn_convolution",
        "aten::mkldnn_convolution", "aten::_slow_conv2d_forward", "aten::slow_conv2d_forward",
        "aten::thnn_conv2d", "aten::conv_depthwise2d", "aten::_nnpack_spatial_convolution",
        "aten::convolution_overrideable", "aten::miopen_convolution",
        "aten::mm", "aten::bmm", "aten::matmul", "aten::addmm", "aten::baddbmm", "aten::einsum", "aten::im2col",
    }),
)
