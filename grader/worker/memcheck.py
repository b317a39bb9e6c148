"""Bounds checking for Triton's CPU interpreter, installed in the worker.

The interpreter turns tl.load/tl.store into raw numpy reads and writes at the computed
addresses and checks nothing: a missing mask reads garbage or corrupts the heap while the
elements inside the tensor come out right. Here every unmasked lane's address must fall
inside the storage of one of the kernel's tensor arguments; the first that does not raises
OutOfBounds, before the access happens, naming the argument, the lanes and the program.
"""

from __future__ import annotations

import numpy as np

LAST_VIOLATION: dict | None = None


class OutOfBounds(Exception):
    pass


_RANGES: list[tuple[str, int, int]] = []  # (argument name, first byte, one past the last byte)
_ROW_STRIDES: dict[str, int] = {}  # each 2-D (or more) tensor argument's stride(-2), by name
_INTS: dict[str, int] = {}  # the launch's integer arguments, by name


def install() -> bool:
    """Patch the interpreter; returns False where its internals are not the expected ones."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    executor, builder = interp.GridExecutor, interp.InterpreterBuilder
    if (not all(hasattr(executor, a) for a in ("_init_args_hst", "__call__"))
            or not hasattr(builder, "create_masked_store")):
        return False

    original_init = executor._init_args_hst

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = original_init(self, args_dev, kwargs)
        _RANGES.clear()
        _ROW_STRIDES.clear()
        _INTS.clear()
        named = list(zip(self.arg_names, args_hst)) + list(kwargs_hst.items())
        for name, arg in named:
            if hasattr(arg, "untyped_storage"):
                storage = arg.untyped_storage()
                _RANGES.append((name, storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
                if arg.dim() >= 2:
                    _ROW_STRIDES[name] = int(arg.stride(-2))
            elif isinstance(arg, int) and not isinstance(arg, bool):
                _INTS[name] = arg
        return args_hst, kwargs_hst

    original_load, original_store = builder.create_masked_load, builder.create_masked_store

    def load(self, ptrs, mask, other, *rest):
        _check(self, "load", ptrs, mask)
        return original_load(self, ptrs, mask, other, *rest)

    def store(self, ptrs, value, mask, *rest):
        _check(self, "store", ptrs, mask)
        return original_store(self, ptrs, value, mask, *rest)

    executor._init_args_hst = init_args
    builder.create_masked_load, builder.create_masked_store = load, store
    return True


def _check(builder, kind: str, ptrs, mask) -> None:
    global LAST_VIOLATION
    if not _RANGES:
        return
    addresses = np.asarray(ptrs.data, dtype=np.uint64).ravel()
    active = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).ravel()
    size = max(ptrs.get_element_ty().primitive_bitwidth // 8, 1)
    owner = _owner(int(addresses[active][0])) if active.any() else None
    inside = np.zeros_like(active)
    for name, lo, hi in _RANGES:
        if owner is None or name == owner:  # a pointer made from x may not wander into y
            inside |= (addresses >= lo) & (addresses + size <= hi)
    bad = active & ~inside
    if not bad.any():
        return
    first = int(addresses[bad][0])
    name, offset = _nearest(first, owner)
    if offset >= 0:
        where = f"{offset // size + 1} element(s) past the end of {name}"
    else:
        where = f"{-offset // size} element(s) before the start of {name}"
    program = tuple(int(i) for i in (getattr(builder, "grid_idx", None) or ()))
    message = (f"out-of-bounds {kind} in program {program}: {int(bad.sum())} of {active.size} lanes fall outside "
               f"the tensor (the first lies {where}); ")
    if active.all():  # no lane masked off: the access has no mask (or one that lets every lane through)
        message += f"mask this {kind} (e.g. mask=offsets < n)"
    else:
        message += f"the {kind} is masked, and these lanes pass its mask: " + _why_masked_lanes_fall_out(name)
    LAST_VIOLATION = {"kind": kind, "program": program, "where": where, "message": message}
    raise OutOfBounds(message)


def _why_masked_lanes_fall_out(name: str) -> str:
    """A masked access that still leaves its tensor: the addresses are wrong, most often a pointer
    moved by another tensor's row stride (an integer argument equal to another tensor's stride(-2),
    not this one's), else the mask's own bound."""
    own = _ROW_STRIDES.get(name)
    if own is not None:
        for other, stride in _ROW_STRIDES.items():
            arg = next((a for a, v in _INTS.items() if v == stride), None)
            if other != name and stride != own and arg is not None:
                return (f"{name} is moved by {stride} per row, {other}'s row stride (the argument {arg}), but its "
                        f"own row stride is {own}: pass each tensor its own stride and move each pointer by it")
    return ("its addresses are wrong, not a missing mask: check the strides the pointer is moved by (each tensor's "
            "own) and the mask's bound")


def _owner(address: int) -> str | None:
    """The argument whose storage holds the first active lane: the tensor this pointer belongs to."""
    for name, lo, hi in _RANGES:
        if lo <= address < hi:
            return name
    return None


def _nearest(address: int, owner: str | None) -> tuple[str, int]:
    """The pointer's own argument (else the closest), and the byte offset past its end (or before its start,
    negative)."""
    best = None
    for name, lo, hi in _RANGES:
        if owner is not None and name != owner:
            continue
        offset = address - hi if address >= hi else address - lo
        if best is None or abs(offset) < abs(best[1]):
            best = (name, offset)
    assert best is not None
    return best
