"""The machine a result is produced on: whether it has a GPU (the one place that decides), and
its description, recorded with every run so that a figure can be traced."""

from __future__ import annotations

import platform
import sys

import grader
from grader.device import Device


def has_gpu() -> bool:
    """A CUDA GPU is visible to this process (grading on it, or workers that must reach it)."""
    import torch

    return torch.cuda.is_available()


def describe(device: Device, isolation: dict | None = None) -> dict:
    import torch
    import triton

    env = {
        "grader": grader.__version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "mode": "gpu" if device == Device.CUDA else "cpu-interpreter",
    }
    if device == Device.CUDA:
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
        env["gpu_count"] = torch.cuda.device_count()
    else:
        env["gpu"] = None
    if isolation is not None:
        env["isolation"] = isolation
    return env
