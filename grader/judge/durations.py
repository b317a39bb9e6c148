"""How long each assignment took in a student's last check on this machine: a hint for the order
in which a check grades its assignments at once (the longest first, so that the last to start is
short). A file of the check's kept cache, the grader's own (no worker sees that folder); read
bounded (no link, no FIFO), and anything unreadable is no hint at all, never an error."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from grader.safefiles import read_plain, write_atomic

if TYPE_CHECKING:
    from grader.judge.context import GradingContext

MAX_BYTES = 64 << 10
MAX_ENTRIES = 256


def key_of(ctx: GradingContext) -> Callable[[str], str]:
    """An assignment's entry, per device and case selection (a check of one case is short)."""
    chosen = ",".join(ctx.cases or ()) + "|" + ",".join(ctx.dtypes or ())
    return lambda name: f"{ctx.device}:{name}:{chosen}"


def read(path: str | None) -> dict[str, float]:
    if not path:
        return {}
    try:
        raw = read_plain(path, MAX_BYTES)
        data = json.loads(raw) if raw else {}
    except (OSError, ValueError):
        return {}
    found: dict[str, float] = {}
    for k, v in list(data.items())[:MAX_ENTRIES] if isinstance(data, dict) else []:
        try:
            if isinstance(k, str) and type(v) in (int, float) and math.isfinite(v) and v >= 0:
                found[k] = float(v)
        except OverflowError:
            continue
    return found


def write(path: str | None, seconds: dict[str, float]) -> None:
    """`seconds` added to what the file holds (atomically: a check beside this one may write too),
    through the kept folder's descriptor into a file made for it (grader.safefiles.write_atomic):
    never through a link planted in its place. A full disk leaves the hint as it was."""
    if not path:
        return
    merged = {**read(path), **{k: round(v, 2) for k, v in seconds.items()}}
    where = Path(path)
    try:
        folder = os.open(where.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        write_atomic(folder, where.name, json.dumps(dict(list(merged.items())[-MAX_ENTRIES:])).encode())
    except OSError:
        pass
    finally:
        os.close(folder)
