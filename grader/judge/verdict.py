"""The judge: TRUSTED. Compares what a worker returned with the float64 truth.

It runs in the grading process on tensors read from safetensors files, so nothing the
student did inside the worker (monkeypatching torch.allclose, say) reaches it. A verdict
says what was wrong in words a student can act on: the figures, the first bad index and
the shape of the mismatch ("only columns >= 1024 are wrong").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grader.codec import poisoned, storage_of
from grader.judge import nonfinite
from grader.judge.feedback import nonfinite_words
from grader.judge.mismatch import Mismatch, contiguous_reading, row_reading, strided_writing
from grader.judge.picture import wrong_map
from grader.payloads import CorrectnessPayload
from grader.results import Outcome
from grader.spec import DTYPES, Assignment, Case, course_code


@dataclass
class Verdict:
    outcome: Outcome  # PASSED or FAILED
    message: str
    details: CorrectnessPayload = field(default_factory=CorrectnessPayload)  # a spec's check may give a dict: read so

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)  # a spec's check may write the plain string ("failed")
        if not isinstance(self.details, CorrectnessPayload):
            self.details = CorrectnessPayload.from_json(self.details)


def truth_of(spec: Assignment, inputs: dict, case: str = "") -> Any:
    """The float64 truth on `inputs`: the spec's exact answer(s) (None: the assignment judges by a
    property). One that raises is the course's error (grader.spec.CourseCodeError), never the student's."""
    if spec.truth is None:
        return None
    with course_code(spec, "truth", case):
        return spec.truth(*[t.to(torch.float64) if isinstance(t, torch.Tensor) else t for t in inputs.values()])


def judge_call(
    spec: Assignment,
    case: Case,
    dtype: str,
    inputs: dict[str, torch.Tensor],
    reply: dict,
    saved: dict[str, torch.Tensor],
    expected_device: str,
    kernel_source: str = "",
    ref: Any = None,
) -> Verdict:
    """`inputs` are the originals (cpu); `reply` the worker's metadata; `saved` its file;
    `kernel_source` the student's module as text, only parsed (for what can compute a NaN);
    `ref` the float64 truth if the caller computed it already (`truth_of`).
    The verdict reads the tensors in `saved`; the reply's description of them is held against
    them, never believed instead of them."""
    modified = _modified_input(inputs, saved)
    if modified:
        return modified
    ref = truth_of(spec, inputs, f"{case.name} [{dtype}]") if ref is None else ref
    if isinstance(ref, (tuple, list)):
        return _judge_parts(spec, case, dtype, inputs, reply, saved, expected_device, ref, kernel_source)
    if "output" not in saved:
        return Verdict(Outcome.FAILED, f"{spec.function}() returned {_type_name(reply)}, not a torch.Tensor")
    problem = _delivery("the result", reply, saved["output"], ref.shape, dtype, expected_device)
    if problem:
        return Verdict(Outcome.FAILED, problem)
    with course_code(spec, "baseline", f"{case.name} [{dtype}]"):
        base = spec.baseline(*inputs.values()).to(torch.float64)
    return _compare(spec, case, dtype, inputs, saved["output"], ref, base, kernel_source=kernel_source,
                    launch=reply)


def judge_runs(spec: Assignment, case: Case, dtype: str, runs: list[tuple[dict, dict, dict]], expected_device: str,
               kernel_source: str = "", refs: list | None = None) -> Verdict:
    """A case of several calls (Assignment.calls) or one judged by a property (Assignment.check,
    which gets every call's arguments and tensor result). `runs` holds (inputs, reply, saved)
    per call, in call order; `refs` each call's float64 truth, if computed already."""
    if spec.check is None:
        for i, (inputs, reply, saved) in enumerate(runs):
            verdict = judge_call(spec, case, dtype, inputs, reply, saved, expected_device, kernel_source,
                                 ref=refs[i] if refs else None)
            if verdict.outcome != Outcome.PASSED:
                verdict.message = f"call {i + 1} of {len(runs)}: {verdict.message}"
                return verdict
        return verdict
    outputs = []
    for inputs, reply, saved in runs:
        modified = _modified_input(inputs, saved)
        if modified:
            return modified
        if "output" not in saved:
            return Verdict(Outcome.FAILED, f"{spec.function}() returned {_type_name(reply)}, not a torch.Tensor")
        problem = _delivery("the result", reply, saved["output"], None, dtype, expected_device)
        if problem:
            return Verdict(Outcome.FAILED, problem)
        outputs.append(saved["output"])
    with course_code(spec, "check", f"{case.name} [{dtype}]"):
        verdict = spec.check([inputs for inputs, _, _ in runs], outputs, dtype)
    if verdict.outcome != Outcome.PASSED and case.why:
        verdict.message += f" (this case: {case.why})"
    return verdict


def _type_name(reply: dict) -> str:
    """The worker's word for what the call returned: a type name, cut short (it is told, not trusted)."""
    name = str(reply.get("result_type"))
    return name[:60] + ("..." if len(name) > 60 else "")


def _modified_input(inputs: dict, saved: dict) -> Verdict | None:
    for name, original in inputs.items():
        if not isinstance(original, torch.Tensor):
            continue
        after = saved.get(f"input.{name}")
        before = storage_of(original)
        if (after is None or after.dtype != before.dtype or after.shape != before.shape
                or not torch.equal(after, before)):
            return Verdict(Outcome.FAILED,
                           f"the input {name} was modified in place: a kernel must only write its output")
    return None


def _delivery(what: str, meta: dict, out: torch.Tensor, shape: tuple[int, ...] | None, dtype: str,
              expected_device: str) -> str | None:
    """What is wrong with a result before its values are looked at (None: nothing);
    `shape` None leaves the shape to the assignment's property check. Dtype and shape are the
    saved tensor's; the device is the reply's word (a file holds no device); what the reply says
    of dtype and shape must agree with the tensor."""
    actual = str(out.dtype).removeprefix("torch.")
    if meta.get("device") != expected_device:
        return f"{what} is on {meta.get('device')}, but the inputs were on {expected_device}"
    if shape is not None and list(out.shape) != list(shape):
        return f"{what} has shape {tuple(out.shape)}, expected {tuple(shape)}"
    if actual != dtype:
        return f"{what}'s dtype is {actual}, expected {dtype} (the input's dtype)"
    claimed_dtype, claimed_shape = meta.get("dtype"), meta.get("shape")
    if ((claimed_dtype is not None and claimed_dtype != actual)
            or (claimed_shape is not None and list(claimed_shape) != list(out.shape))):
        return (f"the worker's reply describes {what} as {str(meta.get('dtype'))[:30]} of shape "
                f"{_claimed_shape(meta)}, but the tensor it saved is {actual} of shape {tuple(out.shape)}: the reply "
                f"is not what the call returned")
    return None


def _claimed_shape(meta: dict) -> str:
    shape = meta.get("shape")
    return str(tuple(shape[:8])) + ("..." if len(shape) > 8 else "") if isinstance(shape, list) else "none"


def _judge_parts(spec: Assignment, case: Case, dtype: str, inputs: dict[str, torch.Tensor], reply: dict,
                 saved: dict[str, torch.Tensor], expected_device: str, refs: Any, kernel_source: str = "") -> Verdict:
    """A tuple result (e.g. dx, dw, db): each part against the truth's part, in the
    error model of its own torch baseline; the first wrong part is named."""
    n = len(refs)
    names = spec.output_names if len(spec.output_names) == n else tuple(f"output {i}" for i in range(n))
    metas = reply.get("outputs")
    parts = sum(1 for k in saved if k.startswith("output."))
    if metas is None or len(metas) != n:
        got = f"{len(metas)} tensors" if metas is not None else _type_name(reply)
        return Verdict(Outcome.FAILED,
                       f"{spec.function}() returned {got}, expected a tuple of {n} tensors ({', '.join(names)})")
    if parts != n or any(f"output.{i}" not in saved for i in range(n)):
        return Verdict(Outcome.FAILED, f"the worker's reply describes {n} results, but the file it saved holds {parts} "
                                       f"(output.0 to output.{n - 1} expected): the reply is not what the call "
                                       f"returned")
    with course_code(spec, "baseline", f"{case.name} [{dtype}]"):
        bases = spec.baseline(*inputs.values())
    details, summary = CorrectnessPayload(), []
    for i, (meta, ref, base) in enumerate(zip(metas, refs, bases)):
        what = f"{names[i]} (result {i + 1} of {n})"
        problem = _delivery(what, meta, saved[f"output.{i}"], ref.shape, dtype, expected_device)
        if problem:
            return Verdict(Outcome.FAILED, problem)
        verdict = _compare(spec, case, dtype, inputs, saved[f"output.{i}"], ref, base.to(torch.float64), part=i,
                           kernel_source=kernel_source)
        if verdict.outcome != Outcome.PASSED:
            verdict.message = f"{what} is wrong: {verdict.message}"
            verdict.details.wrong_output = names[i]
            return verdict
        details.parts[names[i]] = verdict.details
        summary.append(f"{names[i]}: {verdict.message}")
    return Verdict(Outcome.PASSED, "; ".join(summary), details)


def _compare(spec: Assignment, case: Case, dtype: str, inputs: dict, out: torch.Tensor, ref: torch.Tensor,
             base: torch.Tensor,
             part: int | None = None, kernel_source: str = "", launch: dict | None = None) -> Verdict:
    """The error model: |out - ref| <= k x torch's max error + atol + rtol x |ref|, elementwise.
    `part`: which of the truth's results this is, for a function that returns several.
    `launch`: the worker's word on the call (the result's strides, its launches' BLOCK* sizes),
    only ever used to choose between explanations of a result already judged wrong.
    A NaN is 'never written' only where the worker's poison survives, bit for bit (`unwritten`);
    any other NaN or inf was computed, and is named so (grader.judge.nonfinite)."""
    base_err = _finite_max((base - ref).abs())
    tol = spec.tolerance
    allowed = tol.k * base_err + tol.atol[dtype] + tol.rtol[dtype] * ref.abs()
    got = out.to(torch.float64)
    unwritten = poisoned(out).reshape(got.shape)
    err = (got - ref).abs()
    bad = ~(err <= allowed)  # NaN compares False: a NaN where the truth is finite is bad
    both_nan = got.isnan() & ref.isnan()
    bad &= ~both_nan
    details = CorrectnessPayload(
        max_abs_error=_finite_max(err),
        max_rel_error=_finite_max(err / ref.abs().clamp_min(torch.finfo(DTYPES[dtype]).tiny)),
        torch_abs_error=base_err,
        allowed_abs_error=f"{tol.k:g} x torch's error + {tol.atol[dtype]:g} + {tol.rtol[dtype]:g} x |ref|",
        bad_elements=int(bad.sum()),
        elements=bad.numel(),
    )
    finite_ref = torch.isfinite(ref)
    nan, inf = int((got.isnan() & finite_ref).sum()), int((got.isinf() & finite_ref).sum())
    if nan or inf:  # the maxima above are over finite values only: say what they leave out
        details.nan_elements, details.inf_elements = nan, inf
    if never := int((unwritten & finite_ref).sum()):
        details.unwritten_elements = never
    if not bad.any():
        return Verdict(Outcome.PASSED, f"max abs error {details.max_abs_error:.3g} (torch's: {base_err:.3g})", details)
    first = tuple(int(i) for i in bad.nonzero()[0])
    details.first_bad_index = list(first)
    details.first_bad_value = f"got {got[first].item():.6g}, expected {ref[first].item():.6g}"
    mismatch = Mismatch(bad, got, ref, inputs, allowed, base_err, dtype, unwritten)
    launch = launch or {}
    # before any tail or block pattern, which a stride bug mimics
    strides = strides_ignored(spec, mismatch, part) or strides_mixed(spec, mismatch, launch.get("stride"), part)
    own = _spec_explanation(spec, mismatch)
    if strides and not (own and "stride" in own):  # the spec's words only where they name the strides too
        own = strides
    pattern = own or describe_mismatch(bad, got, inputs, unwritten, blocks=launch.get("blocks"))
    computed = nonfinite.first_computed(got, ref, unwritten, inputs)
    if computed:  # what of the kernel can compute it, as its source reads (the same words in every case)
        details.computed_nonfinite = computed
        if hint := nonfinite.culprits(computed, nonfinite.kernel_operations(kernel_source)):
            pattern = f"{pattern.rstrip('.')}; {hint}"
    details.pattern = pattern
    details.wrong_map = wrong_map(bad, got, unwritten)
    message = f"{details.bad_elements} of {bad.numel()} elements wrong"
    if nan or inf:
        message += f" ({nonfinite_words(nan, inf)})"
    message += f"; {pattern}"
    if computed:
        message += f" ({nonfinite.where_words(computed)})"
    if case.why:
        message += f" (this case: {case.why})"
    return Verdict(Outcome.FAILED, message, details)


def _spec_explanation(spec: Assignment, mismatch: Mismatch) -> str | None:
    """The assignment's own words, if it has any for this mismatch. An explanation that breaks
    must not cost the verdict: the generic words are used instead."""
    if spec.explain is None:
        return None
    try:
        return spec.explain(mismatch)
    except Exception:
        return None


def strides_ignored(spec: Assignment, mismatch: Mismatch, part: int | None = None) -> str | None:
    """The hypothesis 'the kernel reads an input as if it were contiguous', for every assignment:
    recompute the truth with each non-contiguous input read that way (all of it contiguous,
    or only its last stride taken as 1) and ask whether the student's result is exactly that.
    Tested before the generic tail and row patterns, which a stride bug often mimics."""
    if mismatch.got.isnan().all():
        return None  # nothing was stored: the judge's words for that
    for name, t in mismatch.inputs.items():
        if not isinstance(t, torch.Tensor) or t.is_contiguous():
            continue
        for keep_row in (False, True):
            wrong = contiguous_reading(t, keep_row_stride=keep_row)
            if wrong is None:
                continue
            guess = _truth_reading(spec, mismatch, name, wrong, part)
            if guess is not None and mismatch.matches(guess):
                strides = ", ".join(f"{name}.stride({d})" for d in range(t.dim()))
                assumed = "with a step of 1 along its last dimension" if keep_row else "as if it were contiguous"
                return (f"the result is exactly what reading {name} {assumed} gives, but {name} is a non-contiguous "
                        f"view here ({name}.stride() == {tuple(t.stride())}): the strides are the cause, not a mask or "
                        f"the grid; pass {strides} to the kernel and address every element of {name} with them")
    return None


def _truth_reading(spec: Assignment, mismatch: Mismatch, name: str, reading: torch.Tensor,
                   part: int | None) -> torch.Tensor | None:
    """The float64 truth of the failing case with input `name` replaced by `reading` (what a kernel
    with the hypothesised mistake reads), its `part` for a tuple result; None where the spec has no
    truth or it cannot take that reading (which then proves nothing)."""
    if spec.truth is None:
        return None
    args = [(reading if k == name else v) for k, v in mismatch.inputs.items()]
    try:
        guess = spec.truth(*[a.to(torch.float64) if isinstance(a, torch.Tensor) else a for a in args])
    except Exception:  # noqa: BLE001 - a truth that cannot take this reading proves nothing
        return None
    if isinstance(guess, (tuple, list)):
        guess = guess[part or 0]
    return guess


def strides_mixed(spec: Assignment, mismatch: Mismatch, out_stride: list[int] | None,
                  part: int | None = None) -> str | None:
    """The hypotheses 'the kernel steps along every row by 1' and 'the output is moved by the
    input's row stride', for a 2-D input and output: the truth recomputed from what such a
    kernel reads, written into an output of the strides the call's result has (the worker's
    word, `out_stride`) the way such a kernel writes, and read back; named only where the
    student's result is exactly that. Triton's own tutorials make these two: a softmax whose
    output, from empty_like, takes a transposed input's strides; a layer norm that moves X and
    Y by X's row stride."""
    got = mismatch.got
    if spec.truth is None or got.dim() != 2 or got.isnan().all() or not out_stride or len(out_stride) != 2:
        return None
    stride = (int(out_stride[0]), int(out_stride[1]))
    if min(stride) < 0 or 1 + sum((n - 1) * s for n, s in zip(got.shape, stride)) > 4 * got.numel() + 64:
        return None  # not a layout an output allocated for this call has
    for name, t in mismatch.inputs.items():
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or tuple(t.shape) != tuple(got.shape):
            continue
        read = row_reading(t)
        guess = _truth_reading(spec, mismatch, name, read, part)
        if not isinstance(guess, torch.Tensor) or tuple(guess.shape) != tuple(got.shape):
            continue
        tried = {(stride[0], 1): "steps", (t.stride(0), 1): "row"}
        for written, kind in tried.items():
            if written == stride and read is t:
                continue  # that is the right kernel
            if not mismatch.matches(strided_writing(guess, stride, written)):
                continue
            if kind == "row" and written[0] != stride[0]:
                return (f"the result is exactly what moving the output by {name}'s row stride gives: {name}.stride(0) "
                        f"== {t.stride(0)}, but the output's is {stride[0]} (output.stride() == {stride}): the "
                        f"strides are the cause, not a mask; each tensor needs its own: pass the output's stride(0) "
                        f"to the kernel for it, and {name}.stride(0) for {name}")
            views = [f"{name}.stride() == {tuple(t.stride())}"] if t.stride(1) != 1 else []
            if stride[1] != 1:
                views.append(f"the output's is {stride} (empty_like keeps a view's strides)")
            return (f"the result is exactly what a kernel gets that steps along each row by 1 (a column stride of 1), "
                    f"but here {' and '.join(views)}: the column strides are the cause, not the block size or a mask; "
                    f"pass {name}.stride(1) and the output's stride(1) to the kernel and address each column with "
                    f"them (or allocate a contiguous output with torch.empty({name}.shape, ...))")
    return None


def describe_mismatch(bad: torch.Tensor, got: torch.Tensor, inputs: dict[str, torch.Tensor],
                      unwritten: torch.Tensor | None = None, blocks: dict[str, int] | None = None) -> str:
    """The mismatch in words, most specific explanation first. `unwritten`: where the worker's
    poison survives (None: every NaN is taken for memory never written)."""
    never = got.isnan() if unwritten is None else unwritten
    for name, t in inputs.items():
        if isinstance(t, torch.Tensor) and t.shape == got.shape and torch.equal(got, t.to(torch.float64)):
            return f"the result equals the input {name}: did you return the input instead of the output?"
    if never.all():
        return ("every element is NaN, the poison that fills uninitialized memory: "
                "the output was never written (is the store missing or fully masked?)")
    if got.isnan().all():
        if not never.any():
            return ("every element is NaN, computed by your kernel: none of them is the poison of memory never "
                    "written, so the store ran and stored NaN")
        return (f"every element is NaN: {int(never.sum())} were never written (the poison of uninitialized memory), "
                f"the other {int((~never).sum())} your kernel computed")
    nan_note = _nan_note(bad, got, never)
    if bad.all():
        return "every element is wrong." + nan_note
    if bad.dim() == 1:
        return _describe_1d(bad) + nan_note
    if bad.dim() == 2:
        strided = any(isinstance(t, torch.Tensor) and t.dim() == 2 and t.stride(1) != 1 for t in inputs.values())
        return _describe_2d(bad, got, strided, never, blocks) + nan_note
    return f"first wrong element at {tuple(int(i) for i in bad.nonzero()[0])}." + nan_note


def _nan_note(bad: torch.Tensor, got: torch.Tensor, never: torch.Tensor) -> str:
    """Whether the wrong elements' NaNs were never written or computed (the poison's bits tell)."""
    if not got[bad].isnan().all():
        return ""
    if never[bad].all():
        return " The wrong elements hold NaN, the poison of memory never written."
    if not never[bad].any():
        return " The wrong elements hold NaN computed by your kernel (not the poison of memory never written)."
    return " The wrong elements hold NaN: some never written (the poison), some computed by your kernel."


def _suffix_start(mask: torch.Tensor) -> int | None:
    """i if mask is False before i and True from i on (a contiguous tail), else None."""
    idx = mask.nonzero().flatten()
    if len(idx) and int(idx[0]) > 0 and len(idx) == mask.numel() - int(idx[0]):
        return int(idx[0])
    return None


def _block_note(i: int) -> str:
    power = i & -i
    return f" ({i} is a multiple of {power}: a block boundary)" if power >= 16 else ""


def _describe_1d(bad: torch.Tensor) -> str:
    start = _suffix_start(bad)
    if start is not None:
        return (f"only elements from index {start} on are wrong, the first {start} are right{_block_note(start)}: "
                "the last, partial block is not handled; check your mask (offsets < n) and the grid size (triton.cdiv)")
    idx = bad.nonzero().flatten()
    return f"{len(idx)} elements wrong, scattered between index {int(idx[0])} and {int(idx[-1])}"


def _short_block(cut: int, blocks: dict[str, int] | None) -> str:
    """Why a row is wrong from column `cut` on: its block cut short, unless the kernel's launches
    passed a block (a BLOCK* argument, the worker's word) as long as the row is, or longer."""
    covering = {k: v for k, v in (blocks or {}).items() if isinstance(v, int) and v > cut}
    if covering:
        name, size = next(iter(covering.items()))
        return (f"your {name} = {size} covers these columns, so the block is not what cuts the row: check how the "
                "kernel addresses each column (a column stride other than 1: x.stride(1), the output's stride(1)) "
                "and the store's mask")
    return ("a row longer than your block is cut short; loop over the row in blocks, or size the block with "
            "triton.next_power_of_2(n_cols)")


def _describe_2d(bad: torch.Tensor, got: torch.Tensor, strided: bool = True, never: torch.Tensor | None = None,
                 blocks: dict[str, int] | None = None) -> str:
    rows, cols = bad.any(dim=1), bad.any(dim=0)
    never = got.isnan() if never is None else never
    unwritten = _suffix_start((never & bad).all(dim=0))
    if unwritten is not None:
        return (f"columns >= {unwritten} were never written (they hold the NaN poison of uninitialized "
                f"memory){_block_note(unwritten)}, and the rest of each row is off too: "
                + _short_block(unwritten, blocks))
    col_start = _suffix_start(cols)
    if col_start is not None and rows.all():
        return (f"only columns >= {col_start} are wrong, in every row{_block_note(col_start)}: "
                + _short_block(col_start, blocks))
    row_start = _suffix_start(rows)
    if row_start is not None:
        right = "row 0 is right" if row_start == 1 else f"rows 0 to {row_start - 1} are right"
        return (f"{right}, every row from {row_start} on is wrong: the row offset is off; "
                "use the tensors' own row strides (x.stride(0), out.stride(0)), not the number of columns")
    if rows.all():
        if not strided:  # the stride hint only where an input really steps along a row by more than 1
            return "every row has wrong elements"
        return "every row has wrong elements: check how the kernel steps along a row (x.stride(1) may not be 1)"
    wrong_rows = rows.nonzero().flatten().tolist()
    shown = ", ".join(map(str, wrong_rows[:5])) + (" ..." if len(wrong_rows) > 5 else "")
    return f"only rows {shown} are wrong ({len(wrong_rows)} of {rows.numel()})"


def _finite_max(t: torch.Tensor) -> float:
    t = t[torch.isfinite(t)]
    return float(t.max()) if t.numel() else 0.0
