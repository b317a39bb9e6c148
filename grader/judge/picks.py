"""Which elements of a result at the timing size the judge checks: chosen here, told to the
process that holds the result only once that result can no longer change, so that only those
elements cross a process (kilobytes), not the whole result (a gigabyte through a file each way).

Why a sample is enough where a whole result was read before:
- a replay process runs our code around the student's kernels; its reps are over (synchronized)
  before it learns the indices, and nothing of the student's runs after them, so a kernel that
  skipped a fraction f of the work is wrong at about f of the sampled elements: RANDOM indices
  catch any f above a few in a million (a gain far below the timing's own spread);
- the student's worker runs student code, which could compute any element asked for on demand;
  but it could as well compute a whole result on demand, so reading it whole proved no more;
- every result's first and last EDGE elements are always in (a kernel wrong only at the end of
  its range, its last partial block, is wrong there), and a result of up to WHOLE elements is
  read whole;
- the whole result's size comes with the sample, and a result of another size is wrong.
"""

from __future__ import annotations

import secrets

import torch

EDGE = 1 << 16  # the first and the last elements, always
RANDOM = 1 << 20  # more, anywhere, drawn afresh each time
WHOLE = 2 * EDGE + RANDOM  # up to this many elements, all of them


def picks(numel: int) -> torch.Tensor:
    """Flat indices into a result of `numel` elements: all of them up to WHOLE, else the first
    and last EDGE and RANDOM drawn from a seed nobody knows before, sorted (int64)."""
    if numel <= WHOLE:
        return torch.arange(max(0, numel), dtype=torch.int64)
    rng = torch.Generator().manual_seed(secrets.randbits(62))
    middle = torch.randint(EDGE, numel - EDGE, (RANDOM,), generator=rng, dtype=torch.int64)
    ends = torch.cat([torch.arange(EDGE, dtype=torch.int64), torch.arange(numel - EDGE, numel, dtype=torch.int64)])
    return torch.cat([ends, middle]).sort().values
