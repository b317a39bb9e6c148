"""layernorm: y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim.

The backward pass is a separate graded part, assignments/layernorm_backward, which makes
its inputs with `make_inputs` below.
"""

import random

import torch
import torch.nn.functional as F

from grader.spec_api import Assignment, Case, Mismatch, Performance, aten_ops


def make_x(params: dict, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """x of params["shape"] in `dtype`, with the edge values and the layout the case asks for."""
    shape, layout = params["shape"], params.get("layout", "contiguous")
    hidden = shape[-1]
    v = params.get("scale", 1.0) * torch.randn(*shape, generator=gen)
    rows = v.view(-1, hidden)
    if "offset" in params:  # rows of +-offset + N(0, 1): E[x^2] - E[x]^2 cancels catastrophically
        signs = torch.tensor([1.0, -1.0]).repeat(rows.shape[0] // 2 + 1)[: rows.shape[0], None]
        rows += signs * params["offset"]
    if "constant_row" in params:  # var = 0: only eps keeps 1/sqrt(var + eps) finite
        rows[params["constant_row"]] = 2.5
    v = v.to(dtype)
    if layout == "sliced":  # rows not adjacent: x.stride(-2) > hidden
        base = torch.randn(*shape[:-1], hidden + 37, generator=gen).to(dtype)
        base[..., 5 : 5 + hidden] = v
        return base[..., 5 : 5 + hidden]
    return v


def make_inputs(params: dict, dtype: torch.dtype, gen: torch.Generator) -> dict:
    x = make_x(params, dtype, gen)
    hidden = x.shape[-1]
    weight = torch.randn(hidden, generator=gen).to(dtype)
    bias = torch.randn(hidden, generator=gen).to(dtype)
    return {"x": x, "weight": weight, "bias": bias, "eps": params.get("eps", 1e-5)}


def truth(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + eps) * weight + bias


def baseline(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def explain(mm: Mismatch) -> str | None:
    """This assignment's typical bugs in the affine step, each tested as a hypothesis on the inputs."""
    if mm.got.isnan().all():
        return None  # the judge's words: the output was never written
    x, weight, bias = (mm.inputs[k].double() for k in ("x", "weight", "bias"))
    eps = mm.inputs["eps"]
    normalized = truth(x, torch.ones_like(weight), torch.zeros_like(bias), eps)
    if bias.abs().max() > 0 and mm.matches(normalized * weight):
        return ("the bias is missing: the result is exactly (x - mean) / sqrt(var + eps) * weight (reproduced from your "
                "inputs); load bias and add it: y = x_hat * weight + bias")
    if mm.matches(normalized + bias):
        return ("the weight is missing: the result is exactly (x - mean) / sqrt(var + eps) + bias (reproduced from your "
                "inputs); load weight and scale by it: y = x_hat * weight + bias")
    if mm.matches(normalized):
        return "neither weight nor bias is applied: y = x_hat * weight + bias, with x_hat = (x - mean) / sqrt(var + eps)"
    return None


def random_cases(rng: random.Random) -> list[Case]:
    shapes = [[rng.randint(1, 200), rng.randint(1, 5000)] for _ in range(3)]
    return [Case(f"random-{i}-{r}x{h}", {"shape": [r, h]}, "a shape drawn from the run's seed") for i, (r, h) in enumerate(shapes)]


CASES = (
    Case("one-row-1x1024", {"shape": [1, 1024]}, "a single row: a grid of one program"),
    Case("hidden=213-64x213", {"shape": [64, 213]}, "hidden 213, not a multiple of any block: mask the tail of each row"),
    Case("hidden=423-33x423", {"shape": [33, 423]}, "hidden 423, not a multiple of any block: mask the tail of each row"),
    Case("sliced-97x300", {"shape": [97, 300], "layout": "sliced"}, "a sliced view: x.stride(0) != hidden"),
    Case("3d-2x33x213", {"shape": [2, 33, 213]}, "a 3-D input: normalize each of the 2*33 rows of the last dim"),
    Case("wide-2x20000", {"shape": [2, 20000]}, "rows of 20000: longer than one block of 16384 fp32 (64 KB): loop over the row"),
    Case("offset-16x4096", {"shape": [16, 4096], "offset": 1000.0},
         "rows of +-1000 + N(0, 1): var = mean(x^2) - mean(x)^2 cancels; subtract the mean first, then square"),
    Case("constant-row-8x512", {"shape": [8, 512], "constant_row": 5}, "row 5 is constant: var = 0, finite only with eps"),
    Case("eps=0.1-16x256", {"shape": [16, 256], "scale": 0.1, "eps": 0.1},
         "eps = 0.1 with small values: use the eps argument, not a constant"),
)

SPEC = Assignment(
    name="layernorm",
    title="Layer normalization",
    function="layer_norm",
    module="kernels/layernorm.py",
    signature="layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor",
    make_inputs=make_inputs,
    truth=truth,
    baseline=baseline,
    explain=explain,
    cases=CASES,
    random_cases=random_cases,
    correctness_points=12,
    performance=Performance(
        case=Case("8192x8192", {"shape": [8192, 8192]}),
        dtype="float16",
        # read x, write y, read weight and bias once
        bytes_moved=lambda p, dt: (2 * p["shape"][0] + 2) * p["shape"][1] * torch.finfo(dt).bits // 8,
        flops=lambda p, dt: 8 * p["shape"][0] * p["shape"][1],  # mean, variance, normalize, scale, shift per element
    ),
    performance_points=8,
    forbidden_ops=aten_ops("native_layer_norm", "layer_norm", "group_norm", "native_group_norm", "batch_norm",
                           "native_batch_norm", "var_mean", "var", "std", "std_mean", "mean", "sum", "rsqrt", "sqrt"),
)
