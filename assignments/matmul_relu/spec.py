"""matmul_relu: c = relu(a @ b), one tiled GEMM with the activation fused into its epilogue."""

import random

import torch

from grader.spec_api import (Assignment, Case, Mismatch, Performance, contiguous_reading, low_precision_sum,
                              swapped_reading)


def make_operand(rows: int, cols: int, layout: str, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """A rows x cols operand, laid out as asked: contiguous, transposed (the transpose of a
    contiguous cols x rows tensor: stride(0) == 1) or sliced (rows longer than cols)."""
    if layout == "transposed":
        return torch.randn(cols, rows, generator=gen).to(dtype).t()
    if layout == "sliced":
        return torch.randn(rows, cols + 9, generator=gen).to(dtype)[:, 4 : 4 + cols]
    return torch.randn(rows, cols, generator=gen).to(dtype)


def make_inputs(params: dict, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    m, n, k = params["M"], params["N"], params["K"]
    a = make_operand(m, k, params.get("a", "contiguous"), dtype, gen)
    b = make_operand(k, n, params.get("b", "contiguous"), dtype, gen)
    return {"a": a, "b": b}


def truth(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(a @ b)


def tf32(t: torch.Tensor) -> torch.Tensor:
    """t with each float32 mantissa cut to TF32's 10 bits, as the GPU's tensor cores read it
    (tl.dot truncates, it does not round: see its docstring)."""
    return torch.bitwise_and(t.contiguous().view(torch.int32), -(1 << 13)).view(torch.float32)


def baseline(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch in the working dtype: the error model's yardstick and the vendor timing (cuBLAS).
    In float32 it multiplies TF32 operands, because tl.dot on the GPU does (TF32 is allowed)."""
    if a.dtype == torch.float32:
        return torch.relu(tf32(a) @ tf32(b))
    return torch.relu(a @ b)


def explain(mm: Mismatch) -> str | None:
    """This assignment's typical bugs, each tested as a hypothesis on the inputs."""
    if mm.got.isnan().all():
        return None  # the judge's words: the output was never written
    a, b = mm.inputs["a"].double(), mm.inputs["b"].double()
    if mm.matches(a @ b):
        return "negative values were kept: apply the ReLU (tl.maximum(acc, 0.0)) to the tile before storing it"
    a_in, b_in = mm.inputs["a"], mm.inputs["b"]
    for name, t in (("a", a_in), ("b", b_in)):
        if t.is_contiguous():
            continue
        for keep_row in (False, True):
            wrong = contiguous_reading(t, keep_row_stride=keep_row)
            if wrong is None:
                continue
            guess = (wrong.double() @ b) if name == "a" else (a @ wrong.double())
            if mm.matches(torch.relu(guess)):
                assumed = "a stride of 1 along its rows" if keep_row else "a contiguous layout"
                return (f"{name} is a non-contiguous view here ({name}.stride() == {tuple(t.stride())}), and the result is what "
                        f"reading {name} with {assumed} gives: pass {name}.stride(0) and {name}.stride(1) to the kernel and "
                        "address every element with both")
    if both := _both_read_contiguous(mm, a_in, b_in):
        return both
    for cause in (_strides_swapped, _k_tail_skipped, _accumulated_low):
        if words := cause(mm, a_in, b_in):
            return words
    precision = mm.precision_loss()
    if precision:
        return precision
    row = mm.first_wrong_along(0)
    col = mm.first_wrong_along(1)
    if row is not None:
        return (f"rows 0 to {row - 1} are right, every row from {row} on holds wrong elements: the tiles of the last rows are "
                "missing or cut short; check the grid (triton.cdiv(M, BLOCK_M)) and the row masks of the loads and the store")
    if col is not None:
        return (f"columns 0 to {col - 1} are right, columns from {col} on are wrong: the tiles of the last columns are "
                "missing or cut short; check the grid (triton.cdiv(N, BLOCK_N)) and the column masks of the loads and the store")
    return None


def _both_read_contiguous(mm: Mismatch, a_in: torch.Tensor, b_in: torch.Tensor) -> str | None:
    wa, wb = contiguous_reading(a_in), contiguous_reading(b_in)
    if wa is None or wb is None or not mm.matches(torch.relu(wa.double() @ wb.double())):
        return None
    return (f"a and b are non-contiguous views here (strides {tuple(a_in.stride())} and {tuple(b_in.stride())}), and the "
            "result is what reading both as contiguous gives: pass all four strides to the kernel and use them")


STEPS_K = (16, 32, 64, 128, 256)  # the BLOCK_K a kernel may step along K with


def _strides_swapped(mm: Mismatch, a_in: torch.Tensor, b_in: torch.Tensor) -> str | None:
    """Hypothesis: a kernel that uses an operand's two strides the wrong way round."""
    a, b = a_in.double(), b_in.double()
    for name, t in (("a", a_in), ("b", b_in)):
        wrong = swapped_reading(t)
        if wrong is None:
            continue
        guess = (wrong.double() @ b) if name == "a" else (a @ wrong.double())
        if mm.matches(torch.relu(guess)):
            return (f"the result is what reading {name} with its two strides swapped gives ({name}.stride() == "
                    f"{tuple(t.stride())}): step along {name}'s rows with {name}.stride(0) and along its columns "
                    f"with {name}.stride(1)")
    return None


def _k_tail_skipped(mm: Mismatch, a_in: torch.Tensor, b_in: torch.Tensor) -> str | None:
    """Hypothesis: the loop over K stops before the last, partial step (range(0, K - BLOCK_K + 1,
    BLOCK_K), or K // BLOCK_K steps), so the products of the last K % BLOCK_K columns are missing."""
    k = a_in.shape[1]
    a, b = a_in.double(), b_in.double()
    for step in STEPS_K:
        kept = k - k % step
        if kept == k:
            continue
        if mm.matches(torch.relu(a[:, :kept] @ b[:kept])):
            how = (f"K = {k} is less than one step of {step}, so the loop over K never ran" if kept == 0 else
                   f"only the first {kept} of K = {k} were summed, whole steps of BLOCK_K")
            return (f"the last, partial step along K is skipped: {how} (reproduced from your inputs). Loop "
                    "triton.cdiv(K, BLOCK_K) times and mask the loads of a and b with offs_k < K - k0 (other=0.0)")
    return None


def _accumulated_low(mm: Mismatch, a_in: torch.Tensor, b_in: torch.Tensor) -> str | None:
    """Hypothesis: the accumulator is float16 (or bfloat16), rounded at every step along K:
    reproduced for each likely BLOCK_K, in both ways a kernel may round."""
    low = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(mm.dtype)
    if low is None:
        return None
    k = a_in.shape[1]
    a, b = a_in.float(), b_in.float()
    for step in STEPS_K:
        if step >= k:
            break
        parts = [a[:, k0:k0 + step] @ b[k0:k0 + step] for k0 in range(0, k, step)]
        for round_each in (True, False):
            if mm.explains(torch.relu(low_precision_sum(parts, low, round_each).double())):
                return (f"the values are less precise than torch's in {mm.dtype}, exactly as a {mm.dtype} accumulator "
                        f"gives, rounded at every step of {step} along K (reproduced from your inputs). Accumulate in "
                        f"float32 (tl.zeros(..., dtype=tl.float32), tl.dot's default out_dtype) and round to {mm.dtype} "
                        "only when storing the result")
    return None


def random_cases(rng: random.Random) -> list[Case]:
    shapes = [tuple(rng.randint(1, 250) for _ in range(3)) for _ in range(2)]
    return [Case(f"random-{i}-{m}x{n}x{k}", {"M": m, "N": n, "K": k}, "a shape drawn from the run's seed")
            for i, (m, n, k) in enumerate(shapes)]


SPEC = Assignment(
    name="matmul_relu",
    title="Matrix multiplication with a fused ReLU",
    function="matmul_relu",
    module="kernels/matmul_relu.py",
    signature="matmul_relu(a: Tensor, b: Tensor) -> Tensor  # relu(a @ b), a: MxK, b: KxN",
    make_inputs=make_inputs,
    truth=truth,
    baseline=baseline,
    explain=explain,
    cases=(
        Case("1x1x1", {"M": 1, "N": 1, "K": 1}, "one element: the grid is one program, almost all of it masked"),
        Case("K=1-65x67", {"M": 65, "N": 67, "K": 1}, "K = 1: an outer product, a single partial step along K"),
        Case("127x129x131", {"M": 127, "N": 129, "K": 131}, "M, N and K are multiples of no block: partial tiles on every edge"),
        Case("200x180x256", {"M": 200, "N": 180, "K": 256}, "several tiles in every direction"),
        Case("a-transposed-96x80x72", {"M": 96, "N": 80, "K": 72, "a": "transposed"},
             "a is a transposed view (a.stride(0) == 1): use both of a's strides"),
        Case("b-transposed-80x96x72", {"M": 80, "N": 96, "K": 72, "b": "transposed"},
             "b is a transposed view (b.stride(1) != 1): use both of b's strides"),
        Case("sliced-70x90x50", {"M": 70, "N": 90, "K": 50, "a": "sliced", "b": "sliced"},
             "a and b are column slices of wider tensors: a.stride(0) != K and b.stride(0) != N"),
        Case("long-K-64x48x2048", {"M": 64, "N": 48, "K": 2048},
             "a long K: many steps of accumulation, where a float16 accumulator loses precision"),
    ),
    random_cases=random_cases,
    correctness_points=12,
    performance=Performance(
        case=Case("4096x4096x4096", {"M": 4096, "N": 4096, "K": 4096}),
        dtype="float16",
        bytes_moved=lambda p, dt: (p["M"] * p["K"] + p["K"] * p["N"] + p["M"] * p["N"]) * torch.finfo(dt).bits // 8,
        flops=lambda p, dt: 2 * p["M"] * p["N"] * p["K"],
        # the reference is a persistent TMA kernel (1.08x cuBLAS's speed on an H200); a well-tuned
        # classic tiled kernel (pointer loads, autotuned) measured 1.16x its time: full marks
        full_at=1.20,
        zero_at=4.0,
    ),
    performance_points=8,
    benchmark_cases=((Case("4096x4096x4096", {"M": 4096, "N": 4096, "K": 4096}), "bfloat16"),),
    forbidden_ops=frozenset({
        "aten::mm", "aten::matmul", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::linear",
        "aten::mv", "aten::dot", "aten::einsum", "aten::tensordot", "aten::_scaled_mm",
        "aten::relu", "aten::relu_", "aten::clamp_min", "aten::clamp", "aten::threshold",
    }),
)
