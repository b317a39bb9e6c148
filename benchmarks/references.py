"""The reference kernels against the vendor baselines and the GPU's measured roofline.

    python benchmarks/references.py [--assignment NAME ...] [--json out.json]

For every assignment with a performance spec and a reference in reference/: the reference
Triton kernel and the torch/cuBLAS/cuDNN baseline, timed interleaved in one trusted worker
with the grading method (grader.worker.timing: L2 flush, CUDA events, rotated input sets), on the
assignment's scoring case and its `benchmark_cases`. Prints one table: time, GB/s or TFLOP/s,
% of roofline, the reference's speed as a fraction of the baseline's, and what a student is
scored against there (the reference, or the faster of the two where the spec says
`against="faster"`); then the machine, the versions, the commit and the date of the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.settings import Settings
from grader.spec import Course  # noqa: E402
from grader.judge.perf import call_times  # noqa: E402
from grader.codec import write_inputs
from grader.judge.plan import derive_seed, make_inputs# noqa: E402
from grader.protocol import Contender, Load, Roofline, Sample, Time  # noqa: E402
from grader.sandbox.process import WorkerProcess  # noqa: E402
from grader.sandbox.zygote import SandboxState  # noqa: E402
from grader.spec import DTYPES  # noqa: E402

ROUNDS, REPS, SETS = 7, 20, 3


def bench(spec, worker: WorkerProcess, folder: Path, roof: dict) -> list[dict]:
    perf = spec.performance
    cases = [(perf.case, perf.dtype), *spec.benchmark_cases]
    rows = []
    for case, dtype in cases:
        files, layout = [], {}
        for i in range(SETS):
            path = folder / f"{spec.name}-{case.name}-{dtype}-{i}.safetensors"
            layout = write_inputs(make_inputs(spec, case, dtype, derive_seed(1, "bench", str(i))), path)
            files.append(str(path))
        times = {"reference": [], "torch": []}
        for _ in range(ROUNDS):
            for c in times:
                reply = worker.request(Time(c, files, layout, REPS), 600)
                assert reply.ok, reply
                times[c] += call_times(reply)[0]
        # dropout has no oracle: its outputs differ from torch's by design (another random stream)
        row_check = None if spec.check else _agreement(worker, folder, f"{spec.name}-{case.name}-{dtype}")
        dt = DTYPES[dtype]
        nbytes = perf.bytes_moved(case.params, dt)
        flops = perf.flops(case.params, dt) if perf.flops else None
        row = {"assignment": spec.name, "case": case.name, "dtype": dtype, "max_diff_vs_torch": row_check}
        for c, ts in times.items():
            ms = statistics.median(ts)
            row[f"{c}_ms"] = round(ms, 4)
            if flops:
                row[f"{c}_tflops"] = round(flops / (ms * 1e-3) / 1e12, 1)
                row[f"{c}_roof_pct"] = round(100 * row[f"{c}_tflops"] / roof["gemm_tflops"][dtype], 1)
            else:
                row[f"{c}_gbps"] = round(nbytes / (ms * 1e-3) / 1e9, 1)
                row[f"{c}_roof_pct"] = round(100 * row[f"{c}_gbps"] / roof["copy_gbps"], 1)
        row["reference_speed_vs_torch"] = round(row["torch_ms"] / row["reference_ms"], 3)
        rows.append(row)
        print(f"  {spec.name} {case.name} {dtype}: reference {row['reference_ms']} ms, torch {row['torch_ms']} ms, "
              f"reference/torch speed {row['reference_speed_vs_torch']}, largest difference {row_check} of torch's largest value",
              flush=True)
    return rows


def _agreement(worker: WorkerProcess, folder: Path, stem: str) -> float:
    """The largest difference between the reference's and torch's outputs of the last timed
    calls, at 4096 sampled elements, relative to torch's largest magnitude there: a fast
    reference that is wrong at the benchmark size must not go unnoticed."""
    import torch
    from safetensors.torch import load_file, save_file

    idx = folder / f"{stem}-idx.safetensors"
    save_file({"idx": torch.randint(0, 1 << 20, (4096,), generator=torch.Generator().manual_seed(0))}, str(idx))
    got = {}
    for c in ("reference", "torch"):
        out = folder / f"{stem}-{c}-sample.safetensors"
        reply = worker.request(Sample(c, [f"set{i}" for i in range(SETS)], str(idx), str(out)), 300)
        assert reply.ok, reply
        got[c] = load_file(str(out))
    worst = 0.0
    for key, t in got["torch"].items():
        t = t.double()
        worst = max(worst, ((got["reference"][key].double() - t).abs().max() / t.abs().max().clamp_min(1e-30)).item())
    return round(worst, 5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--assignment", action="append")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    chosen = [s for s in Course.find(Settings()).catalogue().values()
              if s.performance and s.reference_module().is_file() and (not args.assignment or s.name in args.assignment)]
    rows, roof = [], {}
    sandbox = SandboxState()  # one session: its workers share the copy of the code
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for spec in chosen:
            worker = WorkerProcess(folder, folder / f"scratch-{spec.name}", interpret=False, isolation="none", settings=Settings(), sandbox=sandbox)  # trusted code only
            try:
                ref = spec.reference_module()
                contenders = {"reference": Contender(str(ref.parent), ref.name, spec.function),
                              "torch": Contender(str(spec.folder), "spec.py", "baseline")}
                loaded = worker.request(Load(contenders), 300)
                assert loaded.ok, loaded
                if not roof:
                    measured = worker.request(Roofline(), 600)
                    assert measured.ok, measured
                    roof = dataclasses.asdict(measured)
                    print(f"roofline: {roof}", flush=True)
                rows += bench(spec, worker, folder, roof)
            finally:
                worker.close()
    machine = _machine(roof)
    print(f"\n{machine}")
    print("\n| assignment | case | dtype | reference | torch | reference % of roofline | torch % of roofline | reference speed / torch speed | scored against | largest difference |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        unit = "tflops" if "reference_tflops" in r else "gbps"
        label = "TFLOP/s" if unit == "tflops" else "GB/s"
        against = Course.find(Settings()).get(r["assignment"]).performance.against
        scored = "reference" if against == "reference" else ("faster: torch" if r["reference_speed_vs_torch"] < 1 else "faster: reference")
        print(f"| {r['assignment']} | {r['case']} | {r['dtype']} | {r['reference_ms']} ms, {r['reference_' + unit]} {label} | "
              f"{r['torch_ms']} ms, {r['torch_' + unit]} {label} | {r['reference_roof_pct']}% | {r['torch_roof_pct']}% | "
              f"{r['reference_speed_vs_torch']} | {scored} | {r['max_diff_vs_torch']} |")
    if args.json:
        args.json.write_text(json.dumps({"roofline": roof, "machine": machine, "rows": rows}, indent=2))


def _machine(roof: dict) -> str:
    """The GPU, driver, versions, commit and date of this run, and the roofline measured in it."""
    import datetime
    import platform
    import subprocess

    import torch
    import triton

    def out(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    driver = out("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()[:1]
    # GRADER_COMMIT first: a copy of the tree run elsewhere may sit inside another checkout
    commit = os.environ.get("GRADER_COMMIT") or out("git", "rev-parse", "--short", "HEAD") or "unknown"
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else "?"
    return (f"{roof.get('gpu')} ({sms} SMs, driver {driver[0] if driver else '?'}), torch {torch.__version__}, "
            f"triton {triton.__version__}, Python {platform.python_version()}, commit {commit}, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; roofline of this run: copy "
            f"{roof.get('copy_gbps')} GB/s, cuBLAS 8192^3 GEMM TFLOP/s {roof.get('gemm_tflops')}")


if __name__ == "__main__":
    main()
