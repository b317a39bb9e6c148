"""vector_add: out = x + y, elementwise, 1-D. The first kernel of the course: grids, masks."""

import random

import torch

from grader.spec_api import Assignment, Case, Performance


def make_inputs(params: dict, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    n, stride = params["n"], params.get("stride", 1)
    x = torch.randn(n * stride, generator=gen).to(dtype)[::stride]
    y = torch.randn(n, generator=gen).to(dtype)
    return {"x": x, "y": y}


def truth(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def baseline(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.add(x, y)


def random_cases(rng: random.Random) -> list[Case]:
    sizes = sorted(int(2 ** rng.uniform(0, 21)) for _ in range(3))
    return [Case(f"random-{i}-n={n}", {"n": n}, "a size drawn from the run's seed") for i, n in enumerate(sizes)]


SPEC = Assignment(
    name="vector_add",
    title="Vector addition",
    function="vector_add",
    module="kernels/vector_add.py",
    signature="vector_add(x: Tensor, y: Tensor) -> Tensor",
    make_inputs=make_inputs,
    truth=truth,
    baseline=baseline,
    cases=(
        Case("n=1", {"n": 1}, "a single element: the grid is one program, almost all of it masked"),
        Case("n=127", {"n": 127}, "one short of a power of two: the mask must stop the last lanes"),
        Case("n=128", {"n": 128}, "exactly a power of two"),
        Case("n=129", {"n": 129}, "one past a power of two: a second, nearly empty block"),
        Case("n=98432", {"n": 98432}, "the size of Triton's tutorial, several blocks"),
        Case("n=1048577", {"n": 1048577}, "over a million: many blocks and a one-element tail"),
        Case("strided-n=65537", {"n": 65537, "stride": 2}, "x is a strided view (x.stride(0) == 2)"),
    ),
    random_cases=random_cases,
    correctness_points=6,
    performance=Performance(
        case=Case("n=2^28", {"n": 1 << 28}),
        dtype="float32",
        bytes_moved=lambda p, dt: 3 * p["n"] * torch.finfo(dt).bits // 8,
        flops=lambda p, dt: p["n"],  # one add per element
    ),
    performance_points=4,
    forbidden_ops=frozenset({"aten::add.Tensor", "aten::add.out", "aten::add_.Tensor", "aten::sum", "aten::sum.dim_IntList"}),
)
