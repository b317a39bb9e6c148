"""A NaN or inf the kernel computed, told from memory it never wrote, and where it can come from.

The worker poisons what a call allocates uninitialized with a NaN of our own payload
(grader.codec.POISON), so the judge knows, element by element and bit for bit, which NaNs are
that poison (never written) and which the kernel computed. For a computed one it names the first
such element, the inputs there, and which operations of the kernel can produce it, read from the
student's source without running it (a division, a log, an exp that overflows, a square root).
Runs in the trusted grading process; the source is only parsed, never imported.
"""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import torch

from grader import repofiles

MAX_SOURCE_BYTES = 1 << 20  # a kernel file larger than this is not read for hints

# operation -> (what it is called, how it gives NaN, how it gives inf); None where it cannot
OPERATIONS: dict[str, tuple[str, str | None, str | None]] = {
    "division": ("the division", "0/0 or inf/inf", "x/0"),
    "log": ("the log", "log of a negative number", "log(0) = -inf"),
    "sqrt": ("the square root", "sqrt of a negative number", None),
    "rsqrt": ("the reciprocal square root", "rsqrt of a negative number", "rsqrt(0) = inf"),
    "exp": ("the exp", "exp overflows to inf, then inf - inf or 0 * inf",
            "exp(x) overflows for x > 88.7 in float32, > 11.1 in float16"),
    "power": ("the power", "a negative number to a fractional power", "0 to a negative power"),
}
CALLS = {"log": "log", "log2": "log", "log1p": "log", "exp": "exp", "exp2": "exp", "sqrt": "sqrt", "sqrt_rn": "sqrt",
         "rsqrt": "rsqrt", "fdiv": "division", "div_rn": "division", "pow": "power"}


def first_computed(got: torch.Tensor, ref: torch.Tensor, unwritten: torch.Tensor, inputs: dict) -> dict | None:
    """The computed NaN and inf (not the poison) where the float64 truth is finite: how many, the
    first one, what it should have been and the inputs at that index. None when there are none."""
    computed = (got.isnan() | got.isinf()) & torch.isfinite(ref) & ~unwritten
    if not computed.any():
        return None
    index = tuple(int(i) for i in computed.nonzero()[0])
    value = got[index].item()
    kind = "NaN" if value != value else ("inf" if value > 0 else "-inf")
    there = [f"{k} = {t[index].item():.6g}" for k, t in inputs.items() if isinstance(t, torch.Tensor)
             and t.shape == got.shape]
    there += [f"{k} = {v:g}" for k, v in inputs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {"nan": int((computed & got.isnan()).sum()), "inf": int((computed & got.isinf()).sum()),
            "first_index": list(index), "first_value": kind, "expected": f"{ref[index].item():.6g}",
            "inputs_there": ", ".join(there)}


def where_words(found: dict) -> str:
    """'the first computed NaN is at index (3,) (expected 0.52), where x = 0, y = 0'."""
    there = f", where {found['inputs_there']}" if found["inputs_there"] else ""
    return (f"the first computed {found['first_value']} is at index {tuple(found['first_index'])} (expected "
            f"{found['expected']}){there}")


def kernel_operations(source: str) -> list[tuple[str, int]]:
    """(operation, line) of each operation in the file's Triton kernels (functions decorated
    with a jit) that can produce NaN or inf, in line order; [] when the file does not parse."""
    try:
        tree = repofiles.parse_python(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: set[tuple[str, int]] = set()
    for fn in ast.walk(tree):
        if (not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                or not any("jit" in _dotted(d) for d in fn.decorator_list)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
                found.add(("division", node.lineno))
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
                found.add(("power", node.lineno))
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
                found.add(("division", node.lineno))
            elif isinstance(node, ast.Call):
                name = _dotted(node.func).rsplit(".", 1)[-1]
                if name in CALLS:
                    found.add((CALLS[name], node.lineno))
    return sorted(found, key=lambda f: (f[1], f[0]))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def culprits(found: dict, operations: list[tuple[str, int]]) -> str:
    """The operations of the kernel that can give what was computed (NaN, inf or both), with
    their lines and how; '' when the static reading knows none."""
    words = []
    for op, line in operations:
        name, nan, inf = OPERATIONS[op]
        how = [h for h, wanted in ((nan, found["nan"]), (inf, found["inf"])) if h and wanted]
        if how:
            words.append(f"{name} at line {line} ({'; '.join(how)})")
    if not words:
        return ""
    shown = words[:4] + ([f"{len(words) - 4} more"] if len(words) > 4 else [])
    what = " or ".join(w for w, n in (("NaN", found["nan"]), ("inf", found["inf"])) if n)
    return f"in your kernel, what can compute {what}: {', '.join(shown)}."


def read_source(path: str | Path) -> str:
    """The student's module as text for parsing (never run): '' when it is not a regular file
    (a link is not followed), cannot be read, or is too large."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        data = os.read(fd, MAX_SOURCE_BYTES + 1)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return "" if len(data) > MAX_SOURCE_BYTES else data.decode("utf-8", errors="replace")
