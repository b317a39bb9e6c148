"""dropout: drop each element of x with probability p, scale the kept ones by 1/(1-p).

There is no exact oracle (the mask is random), so `check` judges properties instead of
comparing with a float64 truth: every element is 0 or x/(1-p); the kept fraction is within a
binomial bound of 1-p; the same seed gives the same result; another seed another mask.
Each case calls the student's function three times (`calls`): seed, seed again, seed + 1.
"""

import functools
import math
import random

import torch
import torch.nn.functional as F

from grader.spec_api import Assignment, Case, Performance, Tolerance, Verdict, aten_ops

# A correct kernel fails the kept-fraction bound of one call with probability at most this.
FALSE_FAILURE = 1e-9
TOLERANCE = Tolerance()  # how far a kept value may be from x/(1-p): rounding in the dtype


def make_inputs(params: dict, dtype: torch.dtype, gen: torch.Generator) -> dict:
    shape, layout = params["shape"], params.get("layout", "contiguous")
    if layout == "strided":  # every other element of a longer vector: x.stride(0) == 2
        x = torch.randn(shape[0] * 2, generator=gen).to(dtype)[::2]
    elif layout == "transposed":  # a 2-D view with x.stride(1) != 1
        x = torch.randn(shape[1], shape[0], generator=gen).to(dtype).t()
    else:
        x = torch.randn(*shape, generator=gen).to(dtype)
    x.masked_fill_(x == 0, 1.0)  # a dropped element is a 0: x itself never is, so "dropped" is unambiguous
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    return {"x": x, "p": params["p"], "seed": seed}


def calls(inputs: dict) -> list[dict]:
    """The seed, the same seed again (same result?), then seed + 1 (another mask?)."""
    return [inputs, inputs, {**inputs, "seed": inputs["seed"] + 1}]


def baseline(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """torch's dropout, for the speed comparison only (torch's generator ignores `seed`)."""
    return F.dropout(x, p, training=True)


@functools.lru_cache(maxsize=64)  # the same (n, p) comes back for each seed and dtype
def binomial_bounds(n: int, q: float, alpha: float = FALSE_FAILURE) -> tuple[int, int]:
    """[lo, hi]: the kept count of n independent keeps of probability q lies outside with
    probability at most alpha (exact binomial tails, alpha / 2 on each side)."""
    if q <= 0.0 or q >= 1.0:
        return (0, 0) if q <= 0.0 else (n, n)
    k = torch.arange(n + 1, dtype=torch.float64)
    log_pmf = (math.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)
               + k * math.log(q) + (n - k) * math.log1p(-q))
    pmf = log_pmf.exp()
    below = pmf.cumsum(0)  # P(K <= k)
    above = pmf.flip(0).cumsum(0).flip(0)  # P(K >= k)
    inside = ((below > alpha / 2) & (above > alpha / 2)).nonzero().flatten()
    return int(inside[0]), int(inside[-1])


def _check_one(x: torch.Tensor, p: float, out: torch.Tensor, dtype: str) -> Verdict | None:
    """The properties of one call's result (None: all hold)."""
    if tuple(out.shape) != tuple(x.shape):
        return Verdict("failed", f"the result has shape {tuple(out.shape)}, expected x's shape {tuple(x.shape)}")
    n = x.numel()
    xs, got = x.to(torch.float64), out.to(torch.float64)
    kept = got != 0  # NaN counts as kept, and then as a wrong value
    scale = 1.0 / (1.0 - p) if p < 1 else math.inf
    if p >= 1:
        if kept.any():
            nans = int(got.isnan().sum())
            hint = (f" ({nans} are NaN: x / (1 - p) divides by zero at p = 1; select 0 with "
                    "tl.where(keep, x / (1 - p), 0.0) instead of multiplying by the mask"
                    + (", or else the result was never written)" if nans == n else ")")) if nans else ""
            return Verdict("failed", f"with p = 1 every element is dropped and the result is all zeros, "
                                     f"but {int(kept.sum())} of {n} elements are not 0{hint}")
        return None
    if n and got.isnan().all():
        return Verdict("failed", "every element is NaN, the poison that fills uninitialized memory: "
                                 "the result was never written (is the store missing or fully masked?)")
    expected = xs * scale
    allowed = TOLERANCE.atol[dtype] + TOLERANCE.rtol[dtype] * expected.abs()
    wrong = kept & ~((got - expected).abs() <= allowed)
    if wrong.any():
        first = int(wrong.flatten().nonzero()[0])
        g, e, xv = got.flatten()[first].item(), expected.flatten()[first].item(), xs.flatten()[first].item()
        count = f"{int(wrong.sum())} of {n} elements are neither 0 (dropped) nor x / (1 - p) (kept)"
        if got[wrong].isnan().all():
            return Verdict("failed", f"{count}: they are NaN")
        unscaled = ((got[wrong] - xs[wrong]).abs() <= TOLERANCE.atol[dtype] + TOLERANCE.rtol[dtype] * xs[wrong].abs()).all()
        if unscaled and p > 0:
            return Verdict("failed", f"{count}: the kept elements equal x, not x / (1 - p) = {scale:.4g} * x; "
                                     "scale what you keep by 1 / (1 - p) so that the expected output equals x")
        return Verdict("failed", f"{count}; the first at flat index {first}: got {g:.6g}, x = {xv:.6g}, "
                                 f"expected 0 or x / (1 - p) = {e:.6g}")
    k = int(kept.sum())
    lo, hi = binomial_bounds(n, 1.0 - p)
    if not lo <= k <= hi:
        if p == 0:
            return Verdict("failed", f"with p = 0 nothing is dropped and the result equals x, but {n - k} of {n} "
                                     "elements are 0")
        message = (f"{k} of {n} elements kept ({k / n:.2%}); each is kept with probability 1 - p = {1 - p:.4g}, "
                   f"so a correct kernel keeps between {lo} and {hi} of them (it falls outside with probability "
                   f"below {FALSE_FAILURE:g})")
        lo_p, hi_p = binomial_bounds(n, p)
        if p != 0.5 and lo_p <= k <= hi_p:
            message += ("; you keep each element with probability p instead: keep it when its random number "
                        "is greater than p (random > p), and drop it otherwise")
        return Verdict("failed", message)
    return None


def check(runs: list[dict], outputs: list, dtype: str) -> Verdict:
    """Trusted: judge the three calls of `calls` from their arguments and results alone."""
    first, _, other = runs  # seed, the same seed again, seed + 1
    x, p, seed = first["x"], first["p"], first["seed"]
    for args, out in ((first, outputs[0]), (other, outputs[2])):
        problem = _check_one(args["x"], args["p"], out, dtype)
        if problem:
            problem.message = f"dropout(x, p={p}, seed={args['seed']}): {problem.message}"
            return problem
    if outputs[1].shape != outputs[0].shape or not torch.equal(outputs[1], outputs[0]):
        differ = int((outputs[1] != outputs[0]).sum()) if outputs[1].shape == outputs[0].shape else x.numel()
        return Verdict("failed", f"two calls with the same seed ({seed}) gave different results ({differ} of {x.numel()} "
                                 "elements differ): the mask must depend only on the seed and each element's index, "
                                 "e.g. tl.rand(seed, offsets), not on torch's generator, the clock or earlier calls")
    held = ["same seed, same result"]
    same_mask_chance = (p * p + (1 - p) * (1 - p)) ** x.numel()
    if 0 < p < 1 and same_mask_chance < FALSE_FAILURE:
        if torch.equal(outputs[2], outputs[0]):
            return Verdict("failed", f"seeds {seed} and {other['seed']} gave the same mask: the result must change with "
                                     "the seed; pass the seed argument to tl.rand(seed, offsets)")
        held.append("another seed, another mask")
    kept = int((outputs[0] != 0).sum())
    if kept:
        held.insert(0, "kept values = x / (1 - p)")
    return Verdict("passed", f"kept {kept} of {x.numel()} ({kept / max(x.numel(), 1):.2%}; 1 - p = {1 - p:.4g}); " + "; ".join(held),
                   {"kept": kept, "elements": x.numel(), "p": p})


def random_cases(rng: random.Random) -> list[Case]:
    cases = []
    for i in range(2):
        n, p = int(2 ** rng.uniform(10, 16)), round(rng.uniform(0.1, 0.9), 2)
        cases.append(Case(f"random-{i}-n={n}-p={p}", {"shape": [n], "p": p}, "a size and p drawn from the run's seed"))
    return cases


SPEC = Assignment(
    name="dropout",
    title="Dropout with a seeded random mask",
    function="dropout",
    module="kernels/dropout.py",
    signature="dropout(x: Tensor, p: float, seed: int) -> Tensor",
    make_inputs=make_inputs,
    truth=None,
    baseline=baseline,
    cases=(
        Case("n=1-p=0.5", {"shape": [1], "p": 0.5}, "a single element: one program, almost all of it masked"),
        Case("n=1025-p=0.3", {"shape": [1025], "p": 0.3}, "one past a power of two: a nearly empty last block"),
        Case("n=98432-p=0.5", {"shape": [98432], "p": 0.5}, "the size of Triton's tutorial, several blocks"),
        Case("n=65539-p=0.1", {"shape": [65539], "p": 0.1}, "a small p: 90% of the elements kept"),
        Case("n=65539-p=0.8", {"shape": [65539], "p": 0.8}, "a large p: 20% of the elements kept"),
        Case("p=0-n=4099", {"shape": [4099], "p": 0.0}, "p = 0: nothing is dropped, the result equals x"),
        Case("p=1-n=4099", {"shape": [4099], "p": 1.0}, "p = 1: everything is dropped, the result is zeros (no NaN)"),
        Case("strided-n=30001-p=0.4", {"shape": [30001], "p": 0.4, "layout": "strided"},
             "x is a strided view (x.stride(0) == 2)"),
        Case("2d-transposed-129x300-p=0.25", {"shape": [129, 300], "p": 0.25, "layout": "transposed"},
             "a 2-D transposed view: the result has x's shape"),
    ),
    random_cases=random_cases,
    correctness_points=10,
    performance=Performance(
        # float32 keeps the kernel memory-bound: the random numbers cost compute per element
        case=Case("n=2^28-p=0.5", {"shape": [1 << 28], "p": 0.5}),
        dtype="float32",
        bytes_moved=lambda p, dt: 2 * p["shape"][0] * torch.finfo(dt).bits // 8,  # read x, write the result
        flops=lambda p, dt: 3 * p["shape"][0],  # compare a random number, select, scale per element (the RNG's own work not counted)
    ),
    performance_points=6,
    calls=calls,
    check=check,
    forbidden_ops=aten_ops("native_dropout", "dropout", "feature_dropout", "alpha_dropout", "bernoulli", "bernoulli_",
                           "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
                           "uniform_", "normal_", "exponential_", "geometric_", "multinomial"),
)
