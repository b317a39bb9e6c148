"""The codec both sides of the trust line share: tensors and their layouts in and out.

Inputs travel as safetensors files the worker loads without unpickling anything, and keep
their layout: a strided view travels as the whole storage it views plus (size, stride,
offset), so the student sees the same non-contiguous tensor the spec made, and a write
outside the view's elements is seen too. Imported by the worker: it must stay small and
import nothing else of the package.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

# The worker fills every tensor the student's call allocates uninitialized (torch.empty and its
# kin) with a NaN of our own: a quiet NaN whose payload no arithmetic produces (a CPU computes
# 0xFFC00000, an NVIDIA GPU the canonical 0x7FFFFFFF, torch's own fill and float("nan") give
# 0x7FC00000), one per float dtype, as fp16 and bf16 have fewer payload bits. The judge checks
# the bits of each NaN it finds: only where this payload survives was an element never written;
# any other NaN the kernel computed.
POISON: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float32: (torch.int32, 0x7FE1DEAD),
    torch.float16: (torch.int16, 0x7F5A),
    torch.bfloat16: (torch.int16, 0x7FE5),
    torch.float64: (torch.int64, 0x7FFDEADBEEF1A5E5),
}


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill a float tensor with its dtype's poison NaN, bit for bit (other dtypes are left)."""
    if t.dtype in POISON and t.numel():
        as_int, bits = POISON[t.dtype]
        t.view(as_int).fill_(bits)
    return t


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """Where `t` still holds the poison, bit for bit (False everywhere for other dtypes)."""
    if t.dtype not in POISON:
        return torch.zeros(t.shape, dtype=torch.bool)
    as_int, bits = POISON[t.dtype]
    return t.detach().cpu().contiguous().view(as_int) == bits


def storage_of(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind `t` as a flat tensor of t's dtype, on the CPU: what a view
    can read or write, so a write outside the view's elements is seen too."""
    flat = torch.empty(0, dtype=t.dtype, device=t.device)
    flat.set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),), (1,))
    return flat.detach().to("cpu").clone()


def write_inputs(inputs: dict, path: Path) -> dict:
    """Save inputs (views kept as storage + strides); returns the layout the worker rebuilds
    from. Plain arguments (causal=True, eps=1e-5, a seed) travel in the layout as JSON values."""
    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, dict] = {}
    for name, t in inputs.items():
        if isinstance(t, torch.Tensor):
            tensors[name] = storage_of(t)
            layout[name] = {"size": list(t.shape), "stride": list(t.stride()), "offset": t.storage_offset()}
        elif t is None or isinstance(t, (bool, int, float, str)):
            layout[name] = {"value": t}
        else:
            raise TypeError(f"input {name!r}: a spec's inputs are tensors or plain values, not {type(t).__name__}")
    save_file(tensors, str(path))
    return layout


def rebuild(storages: dict[str, torch.Tensor], layout: dict, device: str = "cpu") -> dict:
    """Inverse of write_inputs: the same views over the same storages, in argument order."""
    return {
        name: spec["value"] if "value" in spec
        else storages[name].to(device).as_strided(spec["size"], spec["stride"], spec["offset"])
        for name, spec in layout.items()
    }
