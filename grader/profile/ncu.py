"""Nsight Compute (`ncu`) on a replay: the command line, and its CSV read back as data.

The replay process (`python -m grader.replay`) runs under `ncu` with a fixed metric list, one
pass over each launch of one rep (`--launch-count`, the record's kernels only: `--kernel-name`),
the caches flushed and the clocks at base (ncu's defaults), all of ncu's output in a file of the
replay's result folder (`--log-file`). What comes back was printed by a process that ran a
student's binary, and carries the student's kernel names: it is read bounded, field by field,
and every text in it is sanitized before it is shown.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

NCU_DEFAULT = Path("/usr/local/cuda/bin/ncu")  # where the CUDA toolkit puts it

# the figures kept per launch (name in the profile -> ncu metric)
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "memory_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "compute_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "registers": "launch__registers_per_thread",
    "shared_static_bytes": "launch__shared_mem_per_block_static",
    "shared_dynamic_bytes": "launch__shared_mem_per_block_dynamic",
    "block_size": "launch__block_size",
    "grid_size": "launch__grid_size",
    "limit_blocks": "launch__occupancy_limit_blocks",
    "limit_registers": "launch__occupancy_limit_registers",
    "limit_shared": "launch__occupancy_limit_shared_mem",
    "limit_warps": "launch__occupancy_limit_warps",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
}
# warp stall reasons (WarpStateStats): cycles a warp waits per instruction issued, by reason
STALLS = ("long_scoreboard", "barrier", "membar", "short_scoreboard", "mio_throttle", "lg_throttle",
          "math_pipe_throttle", "wait", "not_selected", "branch_resolving", "no_instruction", "drain",
          "imc_miss", "dispatch_stall", "tex_throttle", "sleeping")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

LOG_NAME = "ncu.csv"  # in the replay's result folder
MAX_LOG_BYTES = 4 << 20
MAX_LAUNCHES = 64  # profiled per contender: one rep's launches, at most this many


def metric_names() -> list[str]:
    return [*METRICS.values(), *(STALL_METRIC.format(s) for s in STALLS)]


def find_ncu(path_env: str | None = None) -> Path | None:
    """The `ncu` command: on PATH, else where the CUDA toolkit installs it; None without one."""
    found = shutil.which("ncu", path=path_env)
    if found:
        return Path(found)
    return NCU_DEFAULT if NCU_DEFAULT.is_file() and os.access(NCU_DEFAULT, os.X_OK) else None


# Nsight Compute's install folder: its own `ncu` (a script that runs the real binary beside it) and the
# binary's folders, target/<platform>/ and host/<platform>/ (the sections, the libraries it loads)
OPT_ROOT = Path("/opt/nvidia/nsight-compute")  # where its own installer and NVIDIA's packages put each version
MAX_LAUNCHER_BYTES = 64 << 10
VERSION = re.compile(r"\b(20\d\d\.\d+(?:\.\d+){0,2})\b")
# an absolute path the launcher names (not one after a variable), up to a variable or a quote
NAMED_FOLDER = re.compile(r"(?<![\w$}/.])/[\w.+/-]*nsight-compute[\w.+/-]*")


@dataclass(frozen=True)
class Install:
    """Where Nsight Compute lies: `command`, what the replay runs as ncu (the install's own `ncu`),
    and `folder`, the install folder the profiled process must see (read-only) for it to start."""

    command: Path
    folder: Path


def is_install(folder: Path) -> bool:
    """`folder` holds an Nsight Compute install: its `ncu` and the real binary's target/ folder."""
    ncu = folder / "ncu"
    return ncu.is_file() and os.access(ncu, os.X_OK) and (folder / "target").is_dir()


def _version_key(folder: Path) -> tuple[int, ...]:
    m = VERSION.search(folder.name)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def locate(found: Path) -> Install | str:
    """The install behind `found` (the `ncu` on PATH), resolved here on the trusted side as the
    launcher would: `found` itself where it lies in an install (or links into one, or is the real
    binary under target/); else `found` is the CUDA toolkit's launcher, a script that runs the
    latest version among <cuda>/nsight-compute-VERSION and OPT_ROOT/VERSION: those folders and the
    ones the script names are looked in, and the newest install there wins. Else why not, in one line."""
    real = Path(os.path.realpath(found))
    for folder in (real.parent, *list(real.parents)[1:3]):  # <install>/ncu, <install>/target/<platform>/ncu
        if is_install(folder):
            return Install(folder / "ncu", folder)
    try:
        with open(real, "rb") as f:
            text = f.read(MAX_LAUNCHER_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        return f"{found} cannot be read ({exc.strerror or exc})"
    if not text.startswith("#!"):  # a binary of its own outside any install: what it needs lies beside it
        return Install(real, real.parent)
    roots = [real.parent.parent]  # the toolkit's folder (<cuda>/bin/ncu), then the folders it names
    for named in NAMED_FOLDER.findall(text):
        path = Path(named.rstrip("/"))
        if ".." in path.parts:  # the rest of a path after a variable ("$BIN"/../nsight-compute-*): the toolkit's
            continue
        roots += [path.parent, path] if VERSION.search(path.name) or path.name.endswith("-") else [path]
    roots = list(dict.fromkeys([*roots, OPT_ROOT]))
    candidates: set[Path] = set()
    for root in roots:
        if not root.is_dir():
            continue
        try:
            inside = [p for p in root.iterdir() if "nsight-compute" in p.name or VERSION.search(p.name)]
        except OSError:
            continue
        candidates |= {p for p in [root, *inside] if is_install(p)}
    if not candidates:
        where = ", ".join(str(r) for r in roots)
        return (f"{found} is a launcher script, and no Nsight Compute install (a folder with its ncu and target/) "
                f"was found where it looks: {where}")
    best = max(candidates, key=lambda c: (_version_key(c), str(c)))
    return Install(best / "ncu", best)


def counters_restricted(params: Path = Path("/proc/driver/nvidia/params")) -> bool | None:
    """Whether the driver lets only admin users read the GPU's performance counters (its
    RmProfilingAdminOnly, set by NVreg_RestrictProfilingToAdminUsers); None where it cannot be read."""
    try:
        text = params.read_text(errors="replace")[:1 << 16]
    except OSError:
        return None
    m = re.search(r"^RmProfilingAdminOnly:\s*(\d+)", text, re.M)
    return None if m is None else m.group(1) != "0"


RESTRICTED = ("the GPU's performance counters are open to admin users only (ERR_NVGPUCTRPERM), and the replay "
              "runs as an unprivileged user in the sandbox: the machine's owner can open them with the nvidia "
              "module option NVreg_RestrictProfilingToAdminUsers=0")


def options(kernel_names: list[str], launches: int, log: str) -> list[str]:
    """ncu's arguments before the replay's command: the metrics, the record's kernels only, one
    rep's launches (`launches`), everything it prints into `log`."""
    names = sorted({n for n in kernel_names if n})
    pattern = "regex:^(" + "|".join(re.escape(n) for n in names) + ")$"
    return ["--csv", "--page", "raw", "--print-units", "base", "--metrics", ",".join(metric_names()),
            "--kernel-name-base", "function", "--kernel-name", pattern,
            "--launch-count", str(max(1, min(int(launches), MAX_LAUNCHES))),
            "--target-processes", "application-only", "--log-file", log]


class NcuError(Exception):
    """ncu's output says no profile was made: why, in one line."""


@dataclass
class ProfiledLaunch:
    """One profiled launch: its kernel's name (student text, sanitized where shown) and figures."""

    kernel: str
    figures: dict[str, float] = field(default_factory=dict)
    stalls: dict[str, float] = field(default_factory=dict)


# every unit in nanoseconds, bytes or a plain count; ncu's base units (--print-units base) write a duration "ns"
UNITS = {"": 1.0, "byte": 1.0, "ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9,
         "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "nsecond": 1.0, "usecond": 1e3,
         "msecond": 1e6, "second": 1e9, "%": 1.0, "register/thread": 1.0, "block": 1.0, "thread": 1.0,
         "warp": 1.0, "cycle": 1.0, "ratio": 1.0, "byte/block": 1.0, "kbyte/block": 1e3, "inst": 1.0}


def _number(text: str, unit: str) -> float | None:
    t = text.strip().replace(",", "")
    try:
        v = float(t)
    except ValueError:
        return None
    scale = UNITS.get(unit.strip().lower())
    if scale is None or not math.isfinite(v):
        return None
    return v * scale


def _errors(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("==ERROR==")]
    if any("ERR_NVGPUCTRPERM" in ln for ln in lines):
        return RESTRICTED
    if lines:
        return "Nsight Compute failed: " + lines[0][len("==ERROR=="):].strip()[:200]
    return ""


def _at(units: list[str], i: int) -> str:
    return units[i] if i < len(units) else ""


def parse(text: str) -> list[ProfiledLaunch]:
    """The launches of ncu's `--csv --page raw` output (a header row of column names, a row of
    units, a row per launch; ncu's own ==PROF== / ==ERROR== lines beside them). NcuError where it
    says why there is no profile, or where no launch was profiled."""
    text = text[:MAX_LOG_BYTES]
    start = re.search(r'^"ID",', text, re.M)  # ncu's own lines come before the table (and after it)
    table = list(csv.reader(io.StringIO(text[start.start():] if start else "")))
    header = 0 if table and "Kernel Name" in table[0] else None
    if header is None or header + 1 >= len(table):
        raise NcuError(_errors(text) or "Nsight Compute profiled no launch of the record's kernels")
    names, units = table[header], table[header + 1]
    col = {name: i for i, name in enumerate(names)}
    stall_cols = {s: col.get(STALL_METRIC.format(s)) for s in STALLS}
    launches = []
    for row in table[header + 2:][:MAX_LAUNCHES]:
        if len(row) != len(names):
            continue
        figures = {}
        for key, metric in METRICS.items():
            i = col.get(metric)
            v = None if i is None else _number(row[i], _at(units, i))
            if v is not None:
                figures[key] = v
        stalls = {}
        for s, i in stall_cols.items():
            v = None if i is None else _number(row[i], _at(units, i))
            if v is not None and v > 0:
                stalls[s] = v
        launches.append(ProfiledLaunch(row[col["Kernel Name"]][:200], figures, stalls))
    if not launches:
        raise NcuError(_errors(text) or "Nsight Compute's output holds no readable launch")
    return launches
