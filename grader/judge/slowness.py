"""Why a correct kernel is slow, in its own terms: what the compiler made of it, against the GPU.

After timing, the worker reports for each of the student's kernels what Triton's compiled
kernel says (registers per thread, spills, shared memory per program, warps, pipeline stages)
and the grid of its launch (grader.protocol.CompiledKernel). Here those figures become words:
the facts, what among them usually costs speed (spills, a grid smaller than the GPU, registers
or shared memory that leave room for few warps, a GEMM loop without pipelining), and one
sentence on what limits a kernel of this kind (memory-bound or compute-bound, as the roofline
floor says). The worker's word, so feedback only: never a score.
"""

from __future__ import annotations

REGISTERS_PER_SM = 65536  # 32-bit registers per SM (every NVIDIA GPU since Volta)
MAX_WARPS_PER_SM = 64  # Hopper, Ampere A100 (48 on consumer Ampere/Ada)
FEW_WARPS = 16  # fewer resident warps per SM than this hides memory latency poorly
LARGE_SHARED = 96 * 1024  # bytes per program above which at most two programs fit on an SM
SLOW_SHARE = 0.7  # below this share of the roofline (or of the full points) a kernel is told why

TYPICAL = {
    "memory": ("A memory-bound kernel like this one is usually limited by how much of the GPU's bandwidth it keeps "
               "busy: enough programs in flight on every SM, wide contiguous (coalesced) loads and stores, each byte "
               "read once."),
    "compute": ("A compute-bound kernel like this one is usually limited by how busy it keeps the tensor cores: tl.dot "
                "on large tiles (64x64 or more), float32 accumulation, enough stages to overlap the next tile's loads "
                "with this one's math, and a grid that fills every SM."),
}


def facts(name: str, k: dict, sms: int | None) -> str:
    """'add_kernel: 16 registers per thread, no spills, 0 KB of shared memory, 4 warps, 3 stages,
    a grid of 8 programs for 132 SMs'."""
    spills = f"{k['n_spills']} spilled to local memory" if k["n_spills"] else "no spills"
    grid = k.get("grid") or []
    programs = _programs(grid)
    where = ""
    if programs:
        where = f", a grid of {programs} program{'s' if programs != 1 else ''}" + (f" for {sms} SMs" if sms else "")
    return (f"{name}: {k['n_regs']} registers per thread, {spills}, {k['shared'] / 1024:.0f} KB of shared memory, "
            f"{k['num_warps']} warps, {k['num_stages']} stages{where}")


def findings(k: dict, sms: int | None, kind: str) -> list[str]:
    """What in these figures usually costs speed, one sentence each (none: nothing stands out)."""
    found = []
    if k["n_spills"]:
        found.append(f"{k['n_spills']} registers spill to local memory, which is slow: use a smaller block, or keep "
                     "fewer values live at once")
    programs = _programs(k.get("grid") or [])
    if sms and programs and programs < sms:
        found.append(f"the grid has {programs} program{'s' if programs != 1 else ''} for the GPU's {sms} SMs, so "
                     f"{sms - programs} SMs have nothing to do: smaller blocks (or splitting the work) give more "
                     f"programs")
    if k["n_regs"] and k["num_warps"]:
        warps = min(MAX_WARPS_PER_SM, REGISTERS_PER_SM // (k["n_regs"] * 32) // k["num_warps"] * k["num_warps"])
        if warps < FEW_WARPS:
            found.append(f"{k['n_regs']} registers per thread leave room for {warps} warps per SM, too few to hide "
                         "memory latency: a smaller block, or fewer values per thread")
    if k["shared"] > LARGE_SHARED:
        found.append(f"{k['shared'] / 1024:.0f} KB of shared memory per program: at most "
                     f"{max(1, 228 * 1024 // k['shared'])} "
                     "programs fit on an SM at a time; smaller tiles or fewer stages use less")
    if kind == "compute" and 0 < k["num_stages"] < 3:
        found.append(f"{k['num_stages']} pipeline stage{'s' if k['num_stages'] != 1 else ''}: the next tile's loads do "
                     "not overlap this tile's tl.dot; num_stages=3 or 4 (in triton.Config, or at the launch) hides "
                     "them")
    return found


def _programs(grid: list[int]) -> int:
    n = 1
    for g in grid:
        n *= max(int(g), 0)
    return n if grid else 0


def why_slow(compiled: dict, sms: int | None, roofline_kind: str, share: float | None) -> dict | None:
    """The facts and findings of each kernel and the sentence for its kind, for a kernel that
    reached less than SLOW_SHARE of its roofline (`share`, 0 to 1); None for a fast one, or with
    nothing to say (no kernel's figures came back)."""
    if not compiled or share is None or share >= SLOW_SHARE:
        return None
    kind = "compute" if roofline_kind == "cuBLAS GEMM peak" else "memory"
    return {"kind": kind, "share": round(share, 3),
            "facts": [facts(name, k, sms) for name, k in compiled.items()],
            "findings": [f for k in compiled.values() for f in findings(k, sms, kind)],
            "typical": TYPICAL[kind]}


def words(why: dict) -> str:
    """The report's sentences: what the kernel reached, what the compiler made of it, what stands
    out, and what usually limits such a kernel."""
    text = (f"Why it is slow: it reaches {why['share']:.0%} of the roofline. The compiled kernel: "
            f"{'; '.join(why['facts'])}.")
    if why["findings"]:
        text += " What stands out: " + "; ".join(why["findings"]) + "."
    return text + " " + why["typical"]


def gpu_sms(gpu: str | None) -> int | None:
    """The number of SMs of the GPU the workers use (`gpu`: their CUDA_VISIBLE_DEVICES, None: the
    first), as this trusted process sees it; None without a GPU."""
    try:
        import torch

        index = int(gpu.split(",")[0]) if gpu and gpu.split(",")[0].strip().isdigit() else 0
        return int(torch.cuda.get_device_properties(index).multi_processor_count)
    except Exception:  # noqa: BLE001 - no GPU here, or another numbering: the words go without SMs
        return None
