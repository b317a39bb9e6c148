"""Plan: which calls to make (cases x dtypes), and their inputs, made on the trusted side.

Inputs come from the run's seed and are written with the shared codec (grader.codec), which
the worker reads back: safetensors files, layouts kept.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from grader.codec import rebuild, write_inputs
from grader.judge.shrink import PREFIX, shape_case
from grader.spec import DTYPES, Assignment, Case, course_code


@dataclass
class PlannedCall:
    """One call of the student's function: a case in a dtype. `skip` holds the reason a call
    is planned but not run here (e.g. bf16 in the CPU interpreter)."""

    assignment: str
    case: Case
    dtype: str
    seed: int
    skip: str | None = None
    input_file: Path | None = None
    layout: dict = field(default_factory=dict)
    more: list[tuple[Path, dict]] = field(default_factory=list)  # further calls of this case (Assignment.calls)

    @property
    def runs(self) -> list[tuple[Path | None, dict]]:
        """(input file, layout) of every call of the student's function this case makes (the first
        file None until materialize writes it)."""
        return [(self.input_file, self.layout), *self.more]

    @property
    def id(self) -> str:
        return f"{self.case.name}/{self.dtype}"

    @property
    def test_name(self) -> str:
        """The call's name in results and reports; a partial run's shares are matched by it."""
        return f"{self.case.name} [{self.dtype}]"

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() or c in "-_=" else "_" for c in self.id)


def derive_seed(seed: int, *parts: str) -> int:
    """A stable 63-bit seed per (run seed, case, dtype), independent of planning order."""
    digest = hashlib.sha256(":".join([str(seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def cases_for(spec: Assignment, seed: int) -> list[Case]:
    """The named cases (hidden ones included where this course has them) and the random ones.
    Random shapes come from the run's seed and, in a TA's course, the course secret: a student
    kit (no secret) draws other shapes, so the graded ones cannot be known from the kit."""
    secret = spec.shapes_secret
    shapes = derive_seed(seed, spec.name, "shapes", secret) if secret else derive_seed(seed, spec.name, "shapes")
    with course_code(spec, "random_cases"):
        drawn = spec.random_cases(random.Random(shapes))
    return list(spec.cases) + drawn


def plan_calls(
    spec: Assignment,
    seed: int,
    interpret: bool,
    case_filter: list[str] | None = None,
    dtype_filter: list[str] | None = None,
) -> list[PlannedCall]:
    calls = []
    by_shape = [c for c in (shape_case(spec, n) for n in case_filter or () if n.startswith(PREFIX)) if c is not None]
    # a case by shape (`--case shape=1x17`): a shrunk failure's reproducer
    for case in cases_for(spec, seed) + by_shape:
        if case_filter and case.name not in case_filter:
            continue
        for dtype in spec.dtypes:
            if dtype_filter and dtype not in dtype_filter:
                continue
            skip = None
            if interpret and dtype == "bfloat16":
                skip = "bf16 arithmetic is wrong in Triton's CPU interpreter; graded on a GPU only"
            calls.append(PlannedCall(spec.name, case, dtype, seed, skip))
    return calls


def make_inputs(spec: Assignment, case: Case, dtype: str, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(derive_seed(seed, spec.name, case.name, dtype))
    with course_code(spec, "make_inputs", f"{case.name} [{dtype}]"):
        inputs = spec.make_inputs(case.params, DTYPES[dtype], gen)
    return inputs


def materialize(spec: Assignment, calls: list[PlannedCall], folder: Path) -> None:
    """Write each runnable call's inputs to folder/<slug>.safetensors (+ layout in the call);
    a case of several calls (Assignment.calls) adds <slug>.call<i>.safetensors for the others."""
    folder.mkdir(parents=True, exist_ok=True)
    for call in calls:
        if call.skip:
            continue
        inputs = make_inputs(spec, call.case, call.dtype, call.seed)
        with course_code(spec, "calls", f"{call.case.name} [{call.dtype}]"):
            runs = spec.calls(inputs) if spec.calls else [inputs]
        for i, args in enumerate(runs):
            stem = call.slug if i == 0 else f"{call.slug}.call{i}"
            path = folder / f"{stem}.safetensors"
            layout = write_inputs(args, path)
            (folder / f"{stem}.layout.json").write_text(json.dumps(layout))
            if i == 0:
                call.input_file, call.layout = path, layout
            else:
                call.more.append((path, layout))


def load_inputs(call: PlannedCall, device: str = "cpu", index: int = 0) -> dict[str, torch.Tensor]:
    """The arguments of the case's `index`-th call, as the trusted side made them."""
    path, layout = call.runs[index]
    assert path is not None
    return rebuild(load_file(str(path)), layout, device)
