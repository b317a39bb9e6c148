"""dropout: keep each element of x with probability 1 - p, scaled by 1 / (1 - p); drop the
rest (0). The mask comes from `seed`: the same seed gives the same result.

Fill in the TODOs, then run `grader check -a dropout` from your repo's root. The handout is
README.md in the assignment's folder.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def dropout_kernel(x_ptr, out_ptr, n, p, seed, BLOCK: tl.constexpr):
    # TODO: offsets of this program's elements; mask those past n.
    # TODO: one random number in [0, 1) per element from the seed and the element's offset:
    #       tl.rand(seed, offsets). Keep the element when it is greater than p.
    # TODO: store x / (1 - p) where kept and 0 where dropped, with tl.where (at p = 1,
    #       x * mask / (1 - p) is 0 / 0 = NaN).
    pass


def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    # TODO: x may be a view of any shape: work on its elements in order (x.contiguous().view(-1)),
    #       and return a result of x's shape and dtype.
    out = torch.empty_like(x)
    # TODO: launch triton.cdiv(n, BLOCK) programs.
    return out
