"""layernorm_backward: the gradients (dx, dweight, dbias) of layer_norm, the optional second
part of the layernorm assignment. Its inputs are the forward's (assignments/layernorm), with the
upstream gradient dy in place of bias; its result is a tuple of three tensors."""

import importlib.util
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from grader.spec_api import Assignment, Case, aten_ops


def _forward_spec():
    """The forward part's spec module, for its input generator and cases (one source of truth)."""
    path = Path(__file__).resolve().parent.parent / "layernorm" / "spec.py"
    spec = importlib.util.spec_from_file_location("grader_assignment_layernorm_inputs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FORWARD = _forward_spec()


def make_inputs(params: dict, dtype: torch.dtype, gen: torch.Generator) -> dict:
    x = FORWARD.make_x(params, dtype, gen)
    weight = torch.randn(x.shape[-1], generator=gen).to(dtype)
    dy = torch.randn(x.shape, generator=gen).to(dtype)
    return {"dy": dy, "x": x, "weight": weight, "eps": params.get("eps", 1e-5)}


def _grads(dy, x, weight, eps):
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    bias = torch.zeros_like(weight, requires_grad=True)
    y = F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return torch.autograd.grad(y, (x, weight, bias), dy)


def truth(dy, x, weight, eps):
    return _grads(dy, x, weight, eps)  # called on float64 inputs


def baseline(dy, x, weight, eps):
    with torch.enable_grad():
        return _grads(dy, x, weight, eps)  # torch's own backward in the working dtype


def random_cases(rng: random.Random) -> list[Case]:
    shapes = [[rng.randint(1, 200), rng.randint(1, 3000)] for _ in range(2)]
    return [Case(f"random-{i}-{r}x{h}", {"shape": [r, h]}, "a shape drawn from the run's seed") for i, (r, h) in enumerate(shapes)]


SPEC = Assignment(
    name="layernorm_backward",
    title="Layer normalization, backward (optional part)",
    function="layer_norm_backward",
    module="kernels/layernorm.py",
    signature="layer_norm_backward(dy: Tensor, x: Tensor, weight: Tensor, eps: float = 1e-5) -> (dx, dweight, dbias)",
    make_inputs=make_inputs,
    truth=truth,
    baseline=baseline,
    cases=FORWARD.CASES + (
        Case("many-rows-300x64", {"shape": [300, 64]}, "300 rows: dweight and dbias sum over all of them"),
    ),
    random_cases=random_cases,
    correctness_points=10,
    output_names=("dx", "dweight", "dbias"),
    forbidden_ops=aten_ops("native_layer_norm_backward", "native_layer_norm", "layer_norm", "var_mean", "var", "std",
                           "mean", "sum", "rsqrt", "sqrt"),
)
