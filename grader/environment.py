"""The environment a result was produced in: recorded with every run, so a figure can be traced."""

from __future__ import annotations

import platform
import sys

import grader


def describe(device: str) -> dict:
    import torch
    import triton

    env = {
        "grader": grader.__version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "platform": platform.platform(),
        "device": device,
        "mode": "gpu" if device == "cuda" else "cpu-interpreter",
    }
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
        env["gpu_count"] = torch.cuda.device_count()
    else:
        env["gpu"] = None
    return env
