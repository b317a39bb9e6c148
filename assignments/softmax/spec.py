"""softmax: row-wise softmax over the last dim of a 2-D tensor, any row length, strided rows."""

import random

import torch

from grader.spec_api import Assignment, Case, Performance


def make_inputs(params: dict, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    rows, cols = params["rows"], params["cols"]
    layout = params.get("layout", "contiguous")
    scale = params.get("scale", 3.0)
    if layout == "transposed":  # column stride != 1
        x = (scale * torch.randn(cols, rows, generator=gen)).to(dtype).t()
    elif layout == "sliced":  # row stride > cols
        x = (scale * torch.randn(rows, cols + 37, generator=gen)).to(dtype)[:, 5 : 5 + cols]
    else:
        x = (scale * torch.randn(rows, cols, generator=gen)).to(dtype)
    if "negative_row" in params:  # exp() underflows to 0 unless the row max is subtracted
        x[params["negative_row"]] = (-30000.0 + torch.randn(cols, generator=gen)).to(dtype)
    return {"x": x}


def truth(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def baseline(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def random_cases(rng: random.Random) -> list[Case]:
    shapes = [(rng.randint(1, 300), rng.randint(1, 5000)) for _ in range(3)]
    return [
        Case(f"random-{i}-{r}x{c}", {"rows": r, "cols": c}, "a shape drawn from the run's seed")
        for i, (r, c) in enumerate(shapes)
    ]


SPEC = Assignment(
    name="softmax",
    title="Row-wise softmax",
    function="softmax",
    module="kernels/softmax.py",
    signature="softmax(x: Tensor) -> Tensor  # over the last dim of a 2-D x",
    make_inputs=make_inputs,
    truth=truth,
    baseline=baseline,
    cases=(
        Case("1x1", {"rows": 1, "cols": 1}, "one element: the result is exactly 1"),
        Case("1823x781", {"rows": 1823, "cols": 781}, "the tutorial's shape: rows not a power of two"),
        Case("4x8191", {"rows": 4, "cols": 8191}, "long rows, one short of a power of two"),
        Case("2x20000", {"rows": 2, "cols": 20000}, "rows longer than 16384 columns: more than one block per row"),
        Case("sliced-97x300", {"rows": 97, "cols": 300, "layout": "sliced"}, "a sliced view: x.stride(0) != number of columns"),
        Case("transposed-300x129", {"rows": 300, "cols": 129, "layout": "transposed"}, "a transposed view: x.stride(1) != 1"),
        Case("negative-row-8x1000", {"rows": 8, "cols": 1000, "negative_row": 3}, "a row of values near -30000: subtract the row max before exp"),
    ),
    random_cases=random_cases,
    correctness_points=12,
    performance=Performance(
        case=Case("32768x4096", {"rows": 32768, "cols": 4096}),
        dtype="float32",
        bytes_moved=lambda p, dt: 2 * p["rows"] * p["cols"] * torch.finfo(dt).bits // 8,
        flops=lambda p, dt: 5 * p["rows"] * p["cols"],  # max, subtract, exp, sum, divide per element
    ),
    performance_points=8,
    forbidden_ops=frozenset({"aten::_softmax", "aten::softmax.int", "aten::_log_softmax", "aten::exp", "aten::sum.dim_IntList", "aten::amax"}),
)
