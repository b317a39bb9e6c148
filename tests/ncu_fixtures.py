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


# ncu's own output on an NVIDIA H200 (ncu as named by grader.profile.ncu's options, one launch of torch's
# randn kernel, 2026-11-28), cut to the columns the parser reads: the units ncu really prints ("ns" for a
# duration, "inst" for stall ratios), its ==PROF== lines around the table
H200_RAW = """==PROF== Connected to process 485 (/usr/bin/python3.12)
"ID","Process ID","Process Name","Kernel Name","Block Size","Grid Size","Device","CC","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","dram__throughput.avg.pct_of_peak_sustained_elapsed","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active","sm__maximum_warps_per_active_cycle_pct","launch__registers_per_thread","launch__shared_mem_per_block_static","launch__shared_mem_per_block_dynamic","launch__block_size","launch__grid_size","launch__occupancy_limit_blocks","launch__occupancy_limit_registers","launch__occupancy_limit_shared_mem","launch__occupancy_limit_warps","lts__t_sector_hit_rate.pct","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_membar_per_issue_active.ratio","smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio","smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio","smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio","smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio","smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio","smsp__average_warps_issue_stalled_drain_per_issue_active.ratio","smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio","smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio","smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio","smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio"
"","","","","","","","","ns","byte","byte","%","%","%","%","%","register/thread","byte/block","byte/block","","","block","block","block","block","%","inst","inst","inst","inst","inst","inst","inst","inst","inst","inst","inst","inst","inst","inst","inst","inst"
"0","485","python3.12","void unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, void normal_and_transform<float, float, CUDAGeneratorImpl *, void normal_kernel<CUDAGeneratorImpl *>(const TensorBase &, double, double, T1)::[lambda() (instance 1)]::operator ()() lambda() (instance 2)]::operator ()() lambda(float) (instance 1)]>(TensorIteratorBase &, T3, T4)::[lambda(curandStatePhilox4_32_10 *) (instance 2)], void unnamed>::distribution_nullary_kernel<float, float, float4, CUDAGeneratorImpl *, void normal_and_transform<float, float, CUDAGeneratorImpl *, void normal_kernel<CUDAGeneratorImpl *>(const TensorBase &, double, double, T1)::[lambda() (instance 1)]::operator ()() lambda() (instance 2)]::operator ()() lambda(float) (instance 1)]>(TensorIteratorBase &, T3, T4)::[lambda(curandStatePhilox4_32_10 *) (instance 2)], void normal_kernel<CUDAGeneratorImpl *>(const TensorBase &, double, double, T1)::[lambda() (instance 1)]::operator ()() lambda() (instance 2)]::operator ()() lambda(float) (instance 1)]>(TensorIteratorBase &, T4, const T5 &, T6)::[lambda(int, float) (instance 1)]>(long, PhiloxCudaState, T3, T4)","(256, 1, 1)","(1056, 1, 1)","0","9.0","54,816","12,032","40,017,664","24.60","15.19","73.74","50.53","62.50","44","0","0","256","1,056","32","5","32","8","99.98","0.00","0.50","0","0.08","0.06","0","1.80","1.88","3.69","0.31","0.10","0.00","0.02","1.11","0","0"
==PROF== Disconnected from process 485
"""


# Nsight Compute as the CUDA toolkit installs it (CUDA 13.0 on the H200 machine, Nsight Compute 2025.3.1): the
# `ncu` on PATH, <cuda>/bin/ncu, is a POSIX sh launcher that picks the latest version among the folders
# /opt/nvidia/nsight-compute/<year.major.minor> (`opt` here) and <cuda>/bin/../nsight-compute-<version>,
# fails with "nsight-compute directory is not found" where there is none, and execs that folder's
# own `ncu`, a script that runs the real binary under target/<platform>/
LAUNCHER = """#!/bin/sh
CUDA_TOOLKIT_BIN_DIR="$(dirname "$(readlink -f -- "$0")")"
NSIGHT_COMPUTE_DIR=""
best=0
for dir in {opt}/* "$CUDA_TOOLKIT_BIN_DIR"/../nsight-compute-*; do
    [ -d "$dir" ] || continue
    version="${{dir##*/}}"
    version="${{version#nsight-compute-}}"
    case "$version" in *[!0-9.]* | "") continue ;; esac
    year="${{version%%.*}}"; rest="${{version#*.}}"; major="${{rest%%.*}}"; minor="${{rest#*.}}"; minor="${{minor%%.*}}"
    value=$((year * 10000 + major * 100 + minor))
    if [ "$value" -gt "$best" ]; then best=$value; NSIGHT_COMPUTE_DIR="$dir"; fi
done
if [ -z "$NSIGHT_COMPUTE_DIR" ]; then
    echo "ERROR : nsight-compute directory is not found under $CUDA_TOOLKIT_BIN_DIR/../ or {opt}. Nsight Compute is not installed on your system."
    exit 1
fi
NSIGHT_COMPUTE_CLI="$NSIGHT_COMPUTE_DIR/ncu"
if [ ! -x "$NSIGHT_COMPUTE_CLI" ]; then
    echo "ERROR : $NSIGHT_COMPUTE_CLI not found."
    exit 1
fi
exec "$NSIGHT_COMPUTE_CLI" "$@"
"""
INSTALL_NCU = """#!/bin/sh
exec "$(dirname "$(readlink -f "$0")")/target/linux-desktop-glibc_2_11_3-x64/ncu" "$@"
"""
PLATFORM = "target/linux-desktop-glibc_2_11_3-x64"


def install_ncu(root, binary: str, version: str = "2025.3.1", beside_toolkit: bool = False):
    """A stand-in Nsight Compute under `root`: the toolkit's launcher at root/cuda/bin/ncu, the
    install at root/opt/nvidia/nsight-compute/VERSION (or beside the toolkit), its real `binary`
    (a script's text) under target/. Returns (the launcher, the install folder)."""
    from pathlib import Path

    root = Path(root)
    opt = root / "opt" / "nvidia" / "nsight-compute"
    install = root / "cuda" / f"nsight-compute-{version}" if beside_toolkit else opt / version
    launcher = root / "cuda" / "bin" / "ncu"
    for path, text in ((launcher, LAUNCHER.format(opt=opt)), (install / "ncu", INSTALL_NCU),
                       (install / PLATFORM / "ncu", binary)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    (install / "host" / "linux-desktop-glibc_2_11_3-x64").mkdir(parents=True, exist_ok=True)
    (install / "sections").mkdir(exist_ok=True)
    for folder in (root, *[p for p in install.parents if root in p.parents], install):
        folder.chmod(0o755)  # read by a sandboxed replay's own uid
    return launcher, install
