"""Nsight Compute output for the profile's tests: `ncu --csv --page raw --print-units base` as it
prints it (a header row, a units row, a row per launch; ncu's own ==PROF== lines beside), with
figures an H100 gives for softmax (fp32, 8192 x 8192: 512 MiB the assignment must move) for the
reference and four students: the correct sample, one that reads its input twice, one with a block
of one warp, one that spends 255 registers per thread."""

from __future__ import annotations

import csv
import io

from grader.profile.ncu import METRICS, STALL_METRIC, STALLS

MUST_MOVE = 2 * 8192 * 8192 * 4
ID_COLUMNS = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
              "Grid Size", "Device", "CC"]
UNITS = {"duration_ns": "nsecond", "dram_read_bytes": "byte", "dram_write_bytes": "byte", "memory_pct": "%",
         "dram_pct": "%", "compute_pct": "%", "occupancy_pct": "%", "theoretical_occupancy_pct": "%",
         "registers": "register/thread", "shared_static_bytes": "byte/block", "shared_dynamic_bytes": "byte/block",
         "block_size": "", "grid_size": "", "limit_blocks": "block", "limit_registers": "block",
         "limit_shared": "block", "limit_warps": "block", "l2_hit_pct": "%"}

BASE = dict(duration_ns=192_160, dram_read_bytes=268_566_528, dram_write_bytes=268_437_504, memory_pct=89.1,
            dram_pct=89.1, compute_pct=31.4, occupancy_pct=86.2, theoretical_occupancy_pct=100,
            registers=26, shared_static_bytes=0, shared_dynamic_bytes=0, block_size=128, grid_size=8192,
            limit_blocks=32, limit_registers=18, limit_shared=32, limit_warps=16, l2_hit_pct=3.2)
BASE_STALLS = dict(long_scoreboard=21.4, barrier=1.2, not_selected=0.9, wait=0.8, short_scoreboard=0.6)

REFERENCE = [("softmax_kernel", BASE, BASE_STALLS)]
CORRECT = [("softmax", {**BASE, "duration_ns": 197_890, "occupancy_pct": 85.0, "registers": 30}, BASE_STALLS)]
READS_TWICE = [("softmax_two_pass", {**BASE, "duration_ns": 391_030, "dram_read_bytes": 805_437_440,
                                     "dram_write_bytes": 268_437_504, "memory_pct": 90.3},
                {**BASE_STALLS, "long_scoreboard": 24.0})]
TINY_BLOCK = [("softmax_one_warp", {**BASE, "duration_ns": 421_700, "block_size": 32, "occupancy_pct": 44.6,
                                    "theoretical_occupancy_pct": 50, "limit_blocks": 32, "limit_registers": 64,
                                    "limit_warps": 64, "memory_pct": 41.0, "dram_pct": 41.0, "grid_size": 8192},
               {**BASE_STALLS, "long_scoreboard": 9.8})]
MANY_REGISTERS = [("softmax_unrolled", {**BASE, "duration_ns": 512_300, "registers": 255, "block_size": 256,
                                        "occupancy_pct": 12.4, "theoretical_occupancy_pct": 12.5, "limit_blocks": 32,
                                        "limit_registers": 1, "limit_warps": 8, "memory_pct": 34.0, "dram_pct": 34.0,
                                        "grid_size": 8192},
                   {**BASE_STALLS, "long_scoreboard": 41.0})]


def ncu_csv(launches, prelude: str = "==PROF== Connected to process 4242 (/usr/bin/python3.12)\n") -> str:
    metrics = list(METRICS.items())
    header = ID_COLUMNS + [m for _, m in metrics] + [STALL_METRIC.format(s) for s in STALLS]
    units = [""] * len(ID_COLUMNS) + [UNITS[k] for k, _ in metrics] + ["ratio"] * len(STALLS)
    out = io.StringIO()
    w = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(header)
    w.writerow(units)
    for i, (name, figures, stalls) in enumerate(launches):
        ids = [str(i), "4242", "python3.12", "127.0.0.1", name, "1", "7", f"({figures['block_size']}, 1, 1)",
               f"({figures['grid_size']}, 1, 1)", "0", "9.0"]
        w.writerow(ids + [f"{figures[k]:,}" for k, _ in metrics] + [f"{stalls.get(s, 0):,}" for s in STALLS])
    return prelude + "==PROF== Profiling \"kernel\": 0%....50%....100% - 40 passes\n" + out.getvalue() \
        + "==PROF== Disconnected from process 4242\n"
