"""The compute roofline, measured in a trusted worker on the grading GPU: a large cuBLAS GEMM.

Compute-bound assignments (those whose Performance gives `flops`) report their TFLOP/s as a
percentage of this, as memory-bound ones report GB/s against the copy bandwidth. float32
is measured with TF32 allowed, because tl.dot on float32 uses TF32 on the GPU.
"""

from __future__ import annotations

import statistics

import torch


def gemm_tflops(dtype: torch.dtype, n: int = 8192, reps: int = 20) -> float:
    """Median TFLOP/s of torch.matmul on n x n x n in `dtype`."""
    a = torch.randn(n, n, device="cuda").to(dtype)
    b = torch.randn(n, n, device="cuda").to(dtype)
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        for _ in range(3):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.matmul(a, b)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed
    return 2 * n**3 / (statistics.median(times) * 1e-3) / 1e12
