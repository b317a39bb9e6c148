"""rmsnorm: y = x / sqrt(mean(x^2) + eps) * weight over the last dim of a 2-D or 3-D tensor."""

import random

import torch
import torch.nn.functional as F

from grader.spec_api import Assignment, Case, Performance, aten_ops


def make_inputs(params: dict, dtype: torch.dtype, gen: torch.Generator) -> dict:
    shape, layout = params["shape"], params.get("layout", "contiguous")
    hidden = shape[-1]
    v = params.get("scale", 1.0) * torch.randn(*shape, generator=gen)
    rows = v.view(-1, hidden)
    for r in params.get("large_rows", ()):  # their squares overflow float16 (300^2 > 65504)
        rows[r] *= 300.0
    if "zero_row" in params:  # mean(x^2) = 0: only eps keeps 1/sqrt finite
        rows[params["zero_row"]] = 0.0
    v = v.to(dtype)
    if layout == "sliced":  # rows not adjacent: x.stride(-2) > hidden
        base = torch.randn(*shape[:-1], hidden + 37, generator=gen).to(dtype)
        base[..., 5 : 5 + hidden] = v
        x = base[..., 5 : 5 + hidden]
    elif layout == "permuted":  # a 3-D view whose leading dims are swapped: x.view(-1, hidden) fails
        x = v.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        x = v
    weight = torch.randn(hidden, generator=gen).to(dtype)
    return {"x": x, "weight": weight, "eps": params.get("eps", 1e-6)}


def truth(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def baseline(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def random_cases(rng: random.Random) -> list[Case]:
    cases = []
    for i in range(3):
        hidden = rng.randint(1, 5000)
        shape = [rng.randint(1, 200), hidden] if i < 2 else [rng.randint(1, 8), rng.randint(1, 40), hidden]
        cases.append(Case(f"random-{i}-{'x'.join(map(str, shape))}", {"shape": shape}, "a shape drawn from the run's seed"))
    return cases


SPEC = Assignment(
    name="rmsnorm",
    title="RMS normalization",
    function="rms_norm",
    module="kernels/rmsnorm.py",
    signature="rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor",
    make_inputs=make_inputs,
    truth=truth,
    baseline=baseline,
    cases=(
        Case("one-row-1x1024", {"shape": [1, 1024]}, "a single row: a grid of one program"),
        Case("hidden=213-64x213", {"shape": [64, 213]}, "hidden 213, not a multiple of any block: mask the tail of each row"),
        Case("hidden=423-33x423", {"shape": [33, 423]}, "hidden 423, not a multiple of any block: mask the tail of each row"),
        Case("3d-4x37x423", {"shape": [4, 37, 423]}, "a 3-D input: normalize each of the 4*37 rows of the last dim"),
        Case("3d-permuted-6x5x213", {"shape": [6, 5, 213], "layout": "permuted"},
             "a non-contiguous 3-D view: x.view(-1, hidden) fails, use reshape or the strides"),
        Case("sliced-97x300", {"shape": [97, 300], "layout": "sliced"}, "a sliced view: x.stride(0) != hidden"),
        Case("wide-2x20000", {"shape": [2, 20000]}, "rows of 20000: longer than one block of 16384 fp32 (64 KB): loop over the row"),
        Case("large-values-16x4096", {"shape": [16, 4096], "large_rows": [3, 11]},
             "rows 3 and 11 hold values near +-300, whose squares overflow float16: accumulate the sum of squares in float32"),
        Case("zero-row-8x512", {"shape": [8, 512], "zero_row": 2}, "row 2 is all zeros: 1/sqrt(mean(x^2) + eps) is finite only with eps"),
        Case("eps=0.1-16x256", {"shape": [16, 256], "scale": 0.1, "eps": 0.1},
             "eps = 0.1 with small values: use the eps argument, not a constant"),
    ),
    random_cases=random_cases,
    correctness_points=10,
    performance=Performance(
        case=Case("8192x8192", {"shape": [8192, 8192]}),
        dtype="float16",
        # read x, write y, read the weight once
        bytes_moved=lambda p, dt: (2 * p["shape"][0] + 1) * p["shape"][1] * torch.finfo(dt).bits // 8,
        flops=lambda p, dt: 4 * p["shape"][0] * p["shape"][1],  # square, sum, normalize, scale per element
    ),
    performance_points=6,
    forbidden_ops=aten_ops("rms_norm", "_fused_rms_norm", "pow", "mean", "rsqrt", "sqrt", "norm", "linalg_vector_norm",
                        "sum", "native_layer_norm"),
)
