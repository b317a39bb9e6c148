"""The student's profiled launches beside the reference's, in words: the one or two differences
that explain most of the gap ("your kernel moves 2.0x the bytes the reference moves",
"occupancy 25%: 255 registers per thread"), and the table of numbers behind them.

Pure functions over grader.profile.ncu's ProfiledLaunch figures and the bytes the assignment must move
(the spec's `bytes_moved` at the scoring size, as the roofline uses it). Each rule that fires
weighs how much of the time ratio it can account for (at most the ratio itself); causes (bytes
moved, occupancy and what limits it, launches) are said before a symptom (throughput short of the
reference's), the heaviest first, two at most."""

from __future__ import annotations

from dataclasses import dataclass, field

from grader.profile.ncu import ProfiledLaunch
from grader.sanitize import one_line

STALL_WORDS = {
    "long_scoreboard": "global memory loads (long scoreboard)",
    "barrier": "barriers (__syncthreads / tl.debug_barrier)",
    "membar": "memory fences",
    "short_scoreboard": "shared memory and special math (short scoreboard)",
    "mio_throttle": "the shared-memory pipe's queue (MIO throttle)",
    "lg_throttle": "the global load/store queue (LG throttle: many small accesses)",
    "math_pipe_throttle": "busy math pipes",
    "wait": "fixed-latency dependencies (wait)",
    "not_selected": "another warp being issued (not selected)",
    "branch_resolving": "branches",
    "no_instruction": "instruction fetch (no instruction)",
    "drain": "stores draining at exit",
    "imc_miss": "constant cache misses",
    "dispatch_stall": "the dispatcher",
    "tex_throttle": "the texture pipe",
    "sleeping": "sleeping",
}
MORE_BYTES = 1.25  # the student's DRAM traffic over the reference's that is said
LOW_OCCUPANCY = 0.75  # the student's achieved occupancy under this share of the reference's is said
LOW_THROUGHPUT = 0.7  # ... the memory (or compute) throughput as % of peak
CLOSE = 1.10  # a time within this of the reference's: nothing to explain
LAUNCH_GAP_NS = 4000  # about what one more launch adds between kernels of one call


@dataclass
class Side:
    """One contender's profile: its launches summed (time, bytes) and its longest launch (what
    limits occupancy, where its warps wait)."""

    launches: list[ProfiledLaunch]

    def total(self, key: str) -> float | None:
        vals = [x.figures[key] for x in self.launches if key in x.figures]
        return sum(vals) if vals else None

    @property
    def main(self) -> ProfiledLaunch:
        return max(self.launches, key=lambda x: x.figures.get("duration_ns", 0.0))

    def get(self, key: str) -> float | None:
        return self.main.figures.get(key)

    @property
    def duration_ns(self) -> float | None:
        return self.total("duration_ns")

    @property
    def dram_bytes(self) -> float | None:
        r, w = self.total("dram_read_bytes"), self.total("dram_write_bytes")
        return None if r is None and w is None else (r or 0.0) + (w or 0.0)

    @property
    def shared_bytes(self) -> float:
        return (self.get("shared_static_bytes") or 0.0) + (self.get("shared_dynamic_bytes") or 0.0)

    def limiter(self) -> str | None:
        """What bounds the longest launch's occupancy: the occupancy limit (in blocks per SM)
        that is lowest, ties to registers, then shared memory (only where the kernel uses any),
        then blocks per SM, then warps."""
        limits = {"registers": self.get("limit_registers"), "shared memory": self.get("limit_shared"),
                  "blocks per SM": self.get("limit_blocks"), "warps": self.get("limit_warps")}
        if not self.shared_bytes:
            limits.pop("shared memory")
        known = {k: v for k, v in limits.items() if v is not None and v > 0}
        if not known:
            return None
        low = min(known.values())
        return next(k for k in known if known[k] == low)

    def top_stalls(self, n: int = 3) -> list[tuple[str, float]]:
        return sorted(self.main.stalls.items(), key=lambda kv: -kv[1])[:n]


@dataclass
class Explanation:
    ratio: float | None  # the student's profiled time over the reference's
    findings: list[str] = field(default_factory=list)  # at most two, the heaviest first
    table: list[tuple[str, str, str]] = field(default_factory=list)  # (figure, yours, the reference's)

    def to_json(self) -> dict:
        return {"ratio": self.ratio, "findings": self.findings, "table": [list(r) for r in self.table]}


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _int(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e3:.1f} us"


def explain(student: list[ProfiledLaunch], reference: list[ProfiledLaunch],
            must_move: int | None = None) -> Explanation:
    """The differences that explain most of the gap between `student`'s launches and
    `reference`'s (each one rep of the same call, profiled alike), with the table."""
    s, r = Side(student), Side(reference)
    ratio = (s.duration_ns / r.duration_ns) if s.duration_ns and r.duration_ns else None
    weighed: list[tuple[bool, float, str]] = []  # (a symptom, weight, words)
    cap = ratio if ratio and ratio > 1 else None

    def weigh(w: float) -> float:
        return min(w, cap) if cap else w

    sb, rb = s.dram_bytes, r.dram_bytes
    bytes_said = False
    if sb and rb and sb >= MORE_BYTES * rb:
        need = f"; the assignment must move {_size(must_move)}" if must_move else ""
        weighed.append((False, weigh(sb / rb), f"your kernel moves {sb / rb:.1f}x the bytes the reference moves "
                                        f"({_size(sb)} against {_size(rb)}{need})"))
        bytes_said = True
    elif sb and must_move and not rb and sb >= MORE_BYTES * must_move:
        weighed.append((False, weigh(sb / must_move), f"your kernel moves {sb / must_move:.1f}x the bytes the "
                                                      f"assignment must move ({_size(sb)} against {_size(must_move)})"))
        bytes_said = True

    so, ro = s.get("occupancy_pct"), r.get("occupancy_pct")
    if so and ro and so < LOW_OCCUPANCY * ro:
        why = s.limiter()
        block = _int(s.get("block_size"))
        if why == "registers":
            text = (f"occupancy {so:.0f}%: {_int(s.get('registers'))} registers per thread "
                    f"(the reference: {_int(r.get('registers'))}, occupancy {ro:.0f}%)")
        elif why == "shared memory":
            text = (f"occupancy {so:.0f}%: {_size(s.shared_bytes)} of shared memory per block "
                    f"(the reference: {_size(r.shared_bytes)}, occupancy {ro:.0f}%)")
        elif why == "blocks per SM":
            text = (f"block size {block}: occupancy limited by blocks per SM ({_int(s.get('limit_blocks'))} blocks "
                    f"of {block} threads fit on an SM: occupancy {so:.0f}%, the reference's blocks of "
                    f"{_int(r.get('block_size'))} threads reach {ro:.0f}%)")
        else:
            text = f"occupancy {so:.0f}% against the reference's {ro:.0f}%"
        weighed.append((False, weigh(ro / so), text))

    if not bytes_said:
        compute_bound = (r.get("compute_pct") or 0) > (r.get("memory_pct") or 0)
        key, what = ("compute_pct", "compute") if compute_bound else ("memory_pct", "memory system")
        sp, rp = s.get(key), r.get(key)
        if sp and rp and sp < LOW_THROUGHPUT * rp:
            stalls = s.top_stalls(1)
            wait = f"; its warps wait most on {STALL_WORDS.get(stalls[0][0], stalls[0][0])}" if stalls else ""
            weighed.append((True, weigh(rp / sp),
                            f"your kernel reaches {sp:.0f}% of the {what}'s peak throughput, "
                            f"the reference {rp:.0f}%{wait}"))

    extra = len(s.launches) - len(r.launches)
    if extra > 0 and s.duration_ns:  # what the extra launches' gaps add to the time, at most
        share = s.duration_ns / max(s.duration_ns - extra * LAUNCH_GAP_NS, 1.0)
        if share >= 1.05:
            weighed.append((False, weigh(share), f"your call makes {len(s.launches)} kernel launches, "
                                                 f"the reference's {len(r.launches)}"))

    weighed.sort(key=lambda w: (w[0], -w[1]))
    findings = [t for _, _, t in weighed[:2]]
    if ratio is not None and ratio <= CLOSE:
        findings = [f"your kernel takes {ratio:.2f}x the reference's time under the profiler: no gap to explain"]
    elif not findings:
        findings = ["no single figure explains the gap: compare the table's rows"]
    return Explanation(round(ratio, 3) if ratio else None, findings, table(s, r, must_move))


def table(s: Side, r: Side, must_move: int | None) -> list[tuple[str, str, str]]:
    rows = [
        ("kernels", _names(s), _names(r)),
        ("duration", _us(s.duration_ns), _us(r.duration_ns)),
        ("DRAM read", _size(s.total("dram_read_bytes")), _size(r.total("dram_read_bytes"))),
        ("DRAM written", _size(s.total("dram_write_bytes")), _size(r.total("dram_write_bytes"))),
        ("bytes the assignment must move", _size(must_move), _size(must_move)),
        ("memory throughput (% of peak)", _pct(s.get("memory_pct")), _pct(r.get("memory_pct"))),
        ("compute throughput (% of peak)", _pct(s.get("compute_pct")), _pct(r.get("compute_pct"))),
        ("achieved occupancy", _pct(s.get("occupancy_pct")), _pct(r.get("occupancy_pct"))),
        ("theoretical occupancy", _pct(s.get("theoretical_occupancy_pct")), _pct(r.get("theoretical_occupancy_pct"))),
        ("occupancy limited by", s.limiter() or "-", r.limiter() or "-"),
        ("registers per thread", _int(s.get("registers")), _int(r.get("registers"))),
        ("shared memory per block", _size(s.shared_bytes), _size(r.shared_bytes)),
        ("block size (threads)", _int(s.get("block_size")), _int(r.get("block_size"))),
        ("grid size (blocks)", _int(s.get("grid_size")), _int(r.get("grid_size"))),
        ("L2 hit rate", _pct(s.get("l2_hit_pct")), _pct(r.get("l2_hit_pct"))),
    ]
    for reason, v in s.top_stalls():
        rv = r.main.stalls.get(reason)
        rows.append((f"stall: {reason.replace('_', ' ')} (cycles per issue)", f"{v:.1f}",
                     "-" if rv is None else f"{rv:.1f}"))
    return rows


def _names(side: Side) -> str:
    """The launches' kernel names (a student's text: one line each, bounded)."""
    names = [one_line(x.kernel, 40) for x in side.launches]
    return ", ".join(names[:4]) + (f" (+{len(names) - 4})" if len(names) > 4 else "")


def lines(assignment: str, e: Explanation) -> list[str]:
    """The explanation as plain text lines for a terminal (escape for rich markup where printed)."""
    head = f"profile of {assignment}" + (f": your kernel takes {e.ratio:.2f}x the reference's time" if e.ratio else "")
    out = [head, *(f"  - {f}" for f in e.findings)]
    width = max(len(row[0]) for row in e.table) if e.table else 0
    out.append(f"    {'':<{width}}  {'yours':>18}  {'reference':>18}")
    for name, mine, ref in e.table:
        out.append(f"    {name:<{width}}  {mine:>18}  {ref:>18}")
    return out
