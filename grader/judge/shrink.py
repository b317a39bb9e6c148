"""The smallest failing case: a failure shrunk to the least shape that still fails, and cases by shape.

A student debugging a mask bug in a 4096 x 4096 case would rather see that it already fails at
1 x 17 and passes at 1 x 16. After a case fails, the judge tries smaller cases of the same kind:
each shape dimension shrunk in turn (a binary search over a ladder of sizes around the powers of
two), every other parameter of the case kept (its layout: strided, transposed, sliced; causal;
p, eps; the dtype), and a dimension that is not a multiple of 16 stays so (the case exists for
its tail). The search is bounded in time and never changes the score: points come from the
planned cases only.

A shrunk case is named by its shape, `shape=1x17` (and the case's other parameters where they
differ from the assignment's first case: `shape=1x2x130,D=64,causal=true`), a name `--case`
accepts, so its one-line reproducer runs it alone.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable

from grader.spec import Assignment, Case

# the parameters of a case that are sizes a kernel's grid and masks depend on: the others (a head
# dim D, a filter size R, a layout, p, eps) are what the case is about, and are kept
DIM_KEYS = ("n", "M", "N", "K", "rows", "cols", "B", "H", "C", "W")
PREFIX = "shape="
SHRINK_BUDGET_S = 8.0  # per assignment
MAX_RUNS = 24  # per assignment
TAIL = 16  # a dimension not a multiple of this stays so: the case is there for a partial block
INVALID = "invalid"  # what a trial returns for a size the assignment cannot make (not a pass, not a failure)


def _dim_keys(params: dict) -> list[str] | None:
    """The case's size parameters, in order: its "shape" list, or its named sizes; None: none."""
    if isinstance(params.get("shape"), list):
        return ["shape"]
    keys = [k for k in params if k in DIM_KEYS and type(params[k]) is int]
    return keys or None


def dims_of(params: dict) -> list[int] | None:
    keys = _dim_keys(params)
    if keys is None:
        return None
    return list(params["shape"]) if keys == ["shape"] else [params[k] for k in keys]


def with_dims(params: dict, dims: list[int]) -> dict:
    keys = _dim_keys(params)
    assert keys is not None  # dims came from dims_of: the case has sizes
    out = dict(params)
    if keys == ["shape"]:
        out["shape"] = list(dims)
    else:
        out.update(zip(keys, dims))
    return out


def _template(spec: Assignment) -> dict:
    return spec.cases[0].params if spec.cases else {}


def _value(v: object) -> str:
    if isinstance(v, str) and v.replace("_", "").isalnum():
        return v
    return json.dumps(v, separators=(",", ":"))


def shape_name(spec: Assignment, params: dict) -> str | None:
    """`shape=AxB[,key=value...]` for a case of these params: the sizes, then each other parameter
    that differs from the assignment's first case. None when the name could not rebuild them."""
    dims, keys, template = dims_of(params), _dim_keys(params), _template(spec)
    if dims is None or keys is None:  # both None together: no sizes
        return None
    extras = [f"{k}={_value(v)}" for k, v in params.items()
              if k not in keys and template.get(k, _MISSING) != v]
    name = PREFIX + "x".join(map(str, dims)) + "".join("," + e for e in extras)
    rebuilt = shape_case(spec, name)
    return name if rebuilt is not None and rebuilt.params == params else None


_MISSING = object()


def example_name(spec: Assignment) -> str | None:
    """A `--case shape=...` this assignment takes, for a message: its first case by its sizes
    (each assignment names its sizes its own way: `shape=17` for a vector, `shape=1x17` for rows)."""
    template = _template(spec)
    dims = dims_of(template)
    if dims is None:
        return None
    return shape_name(spec, with_dims(template, dims[:-1] + [17]))


def _split(text: str) -> list[str]:
    """Split on commas outside brackets: `1x17,large_rows=[3,11]` -> ['1x17', 'large_rows=[3,11]']."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{" and 1 or (-1 if ch in "]}" else 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def shape_case(spec: Assignment, text: str) -> Case | None:
    """The case `--case shape=1x17[,key=value...]` names for this assignment: the first case's
    parameters with these sizes and values; None when the text does not fit the assignment."""
    if not text.startswith(PREFIX) or len(text) > 300:
        return None
    head, *rest = _split(text[len(PREFIX):])
    try:
        dims = [int(d) for d in head.split("x")]
    except ValueError:
        return None
    template = _template(spec)
    keys = _dim_keys(template)
    if keys is None or any(d < 1 or d > 1 << 31 for d in dims) or (keys != ["shape"] and len(dims) != len(keys)):
        return None
    params = with_dims(template, dims)
    for item in rest:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            return None
        try:
            params[key] = json.loads(raw)
        except ValueError:
            params[key] = raw
    return Case(text, params, "a case given by its shape")


def ladder(now: int, original: int) -> list[int]:
    """The sizes below `now` worth trying: 1 to 8, and one below, at and above each power of two;
    without the multiples of 16 when the case's own size is not one (it is there for its tail)."""
    values = set(range(1, 9))
    p = 8
    while p < now:
        values.update((p - 1, p, p + 1))
        p *= 2
    values.add(now - 1)
    keep_tail = original % TAIL != 0
    return sorted(v for v in values if 1 <= v < now and not (keep_tail and v % TAIL == 0))


@dataclass
class Shrunk:
    """The search's outcome: the smallest case that still failed, the closest that passed."""

    smallest: Case | None = None
    passing: Case | None = None
    runs: int = 0
    tested: dict = field(default_factory=dict)  # dims -> failed?


def search(spec: Assignment, case: Case, fails: Callable[[Case], bool | str | None], deadline: float,
           max_runs: int = MAX_RUNS) -> Shrunk:
    """Shrink `case` one dimension at a time (a binary search on its ladder, the others held),
    keeping each smaller size that still fails. `fails(case)` runs one case: True it failed, False
    it passed, INVALID no such case can be made (or it raised there: another matter), None the
    worker died (the search stops there). Stops at `deadline` (time.monotonic()) or after `max_runs` runs."""
    result = Shrunk()
    original = dims_of(case.params)
    if original is None or shape_name(spec, case.params) is None:
        return result
    dims = list(original)
    cases: dict[tuple, Case] = {}
    stopped = False
    for i in range(len(dims)):
        steps = ladder(dims[i], original[i])
        lo, hi = 0, len(steps)
        while lo < hi and not stopped:
            if time.monotonic() > deadline or result.runs >= max_runs:
                stopped = True
                break
            mid = (lo + hi) // 2
            trial = dims[:i] + [steps[mid]] + dims[i + 1:]
            params = with_dims(case.params, trial)
            name = shape_name(spec, params)
            if name is None:
                lo = mid + 1
                continue
            cases[tuple(trial)] = smaller = Case(name, params,
                                                 f"a smaller case of {case.name}, the same in all but its sizes")
            result.runs += 1
            failed = fails(smaller)
            if failed is None:
                stopped = True
                break
            if failed == INVALID:  # no case of that size: look only at larger ones
                lo = mid + 1
                continue
            result.tested[tuple(trial)] = failed
            if failed:
                hi = mid
            else:
                lo = mid + 1
        if hi < len(steps) and result.tested.get(tuple(dims[:i] + [steps[hi]] + dims[i + 1:])):
            dims[i] = steps[hi]
        if stopped:
            break
    # the closest passing case, where the search left none: one size less in one dimension (the
    # last one first), whatever its kind: "fails at 1x17, passes at 1x16" is the boundary itself
    for j in reversed(range(len(dims))):
        if stopped or dims == original or _near_passing(result.tested, dims) or time.monotonic() > deadline \
                or result.runs >= max_runs + len(dims):
            break
        trial = dims[:j] + [dims[j] - 1] + dims[j + 1:]
        if (dims[j] <= 1 or tuple(trial) in result.tested
                or (name := shape_name(spec, with_dims(case.params, trial))) is None):
            continue
        cases[tuple(trial)] = smaller = Case(name, with_dims(case.params, trial), f"a smaller case of {case.name}")
        result.runs += 1
        failed = fails(smaller)
        if failed is None:
            break
        if failed != INVALID:
            result.tested[tuple(trial)] = failed
    if dims != original:
        result.smallest = cases[tuple(dims)]
        # the passing case closest to it: the same in every size but one, and smaller there by the least
        if near := _near_passing(result.tested, dims):
            result.passing = cases[near]
    return result


def _near_passing(tested: dict, dims: list[int]) -> tuple | None:
    """The passing trial the same as `dims` in every size but one, and smaller there by the least."""
    near = [(dims[j] - t[j], t) for t, failed in tested.items() if not failed
            for j in range(len(dims)) if t[j] < dims[j] and all(t[k] == dims[k] for k in range(len(dims)) if k != j)]
    return min(near)[1] if near else None


def boundary(failing: Case, passing: Case) -> str:
    """'K = 17 fails, K = 16 passes: one past a multiple of 16, a partial block along K' for
    two cases that differ in one size; '' otherwise."""
    a, b = dims_of(failing.params), dims_of(passing.params)
    if a is None or b is None or len(a) != len(b):
        return ""
    differ = [i for i in range(len(a)) if a[i] != b[i]]
    if len(differ) != 1:
        return ""
    i = differ[0]
    keys = _dim_keys(failing.params)
    assert keys is not None  # a is not None: the case has sizes
    name = keys[i] if keys != ["shape"] else ("the last dimension" if i == len(a) - 1 else f"dimension {i}")
    words = f"{name} = {a[i]} fails, {name} = {b[i]} passes"
    power = b[i] & -b[i]
    if a[i] == b[i] + 1 and power >= TAIL:
        words += f": one past a multiple of {power}, a partial block along {name} (its mask, or the grid)"
    return words
