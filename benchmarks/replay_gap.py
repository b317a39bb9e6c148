"""Why a replay can time a kernel slower than today's event-timed loop (docs/performance.md,
"Replay against event timing": layernorm's and rmsnorm's correct samples on an H100).

For each assignment (--only, default layernorm,rmsnorm) and contender (the correct sample and
the reference), at the scoring shape:
1. a worker process (grader's own Worker) records one call and times the function as the timed
   loop does today (CUDA events, CUPTI on): the baseline event figure;
2. one "variants" process (this file, --variants) times, interleaved rep by rep with one loop
   (L2 flushed as the worker flushes it, GPU sleep, events), each way of launching the same
   kernel that separates one hypothesis:
     function      the contender's function on the worker's own tensors (the worker's path)
     replay        the replay's launches on the replay's own buffers (grader.replay.runner)
     replay_full   Replay.time: inputs restored, result poisoned each rep (the replay as it runs)
     replay_on_worker_tensors  the replay's launcher on the worker's tensors (launcher vs buffers)
     function_on_replay_inputs the function (its own launcher) reading the replay's input buffer
     replay_x_at_+N  the replay's launcher with the input copied to N bytes into a fresh buffer
     replay_side_stream  the replay's launches on a non-default stream
     replay_no_flush     no L2 flush before the launch
   each once with the profiler's CUDA activity off and once on (the worker times under CUPTI),
   and the compiled kernel's figures (registers, spills, warps, stages, shared memory) of the
   function's own JIT cache against the replay's loaded kernel;
3. the replay as a grade would start it (grader.judge.replay_process.run: its own process, in the
   sandbox backend): the production figure.

    python benchmarks/replay_gap.py --out gap.json [--only layernorm,rmsnorm] [--reps 30]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _gpu_clocks() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def variants(rec: str, inputs_path: str, layout_path: str, root: str, module: str, function: str, reps: int) -> dict:
    """Step 2, in a process of its own (the contender is the course's own sample or reference)."""
    import torch
    import triton
    from safetensors.torch import load_file

    from grader.codec import rebuild
    from grader.replay import launchrecord, runner
    from grader.worker import timing

    out: dict = {"clocks_before": _gpu_clocks()}
    layout = json.loads(Path(layout_path).read_text())
    worker_args = rebuild(load_file(inputs_path), layout, "cuda")  # as the worker rebuilds its inputs
    tensors = {k: v for k, v in worker_args.items() if isinstance(v, torch.Tensor)}
    sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location("contender", Path(root) / module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = getattr(mod, function)
    args = list(worker_args.values())
    fn(*args)
    torch.cuda.synchronize()
    flush = timing._flush_buffer()  # the worker's flush, allocated as the worker allocates it

    major, minor = torch.cuda.get_device_capability(0)
    sizes = {k: v.untyped_storage().nbytes() for k, v in tensors.items()}
    plan = launchrecord.load(Path(rec), sizes, arch=major * 10 + minor)
    replay = runner.Replay(plan, tensors)
    launches = [s for s in plan.steps if isinstance(s, launchrecord.RecordedLaunch)]
    out["steps"] = [type(s).__name__ for s in plan.steps]

    # the compiled figures: the function's JIT cache against the replay's loaded kernels
    figures = {}
    try:
        for name in dir(mod):
            jit = getattr(mod, name)
            jit = getattr(jit, "fn", jit) if isinstance(jit, triton.runtime.autotuner.Autotuner) else jit
            if isinstance(jit, triton.runtime.jit.JITFunction):
                for device_cache in getattr(jit, "device_caches", {}).values():
                    for compiled in device_cache[0].values():
                        md = compiled.metadata
                        compiled._init_handles()
                        figures[f"jit:{name}"] = {"hash": md.hash, "num_warps": md.num_warps, "num_stages": md.num_stages,
                                                  "shared": md.shared, "n_regs": compiled.n_regs, "n_spills": compiled.n_spills}
        for key, compiled in replay.kernels.items():
            compiled._init_handles()
            md = compiled.metadata
            figures[f"replay:{compiled.name}"] = {"hash": key, "num_warps": md.num_warps, "num_stages": md.num_stages,
                                                  "shared": md.shared, "n_regs": compiled.n_regs, "n_spills": compiled.n_spills}
    except Exception as exc:  # noqa: BLE001 - Triton's internals: reported, not fatal
        figures["error"] = f"{type(exc).__name__}: {exc}"
    out["figures"] = figures
    out["grids"] = [list(s.grid) for s in launches]

    def bytes_of(t):
        return runner._bytes(t)

    def launcher_on(buffers: dict):
        """The replay's own launches, each tensor argument pointed at `buffers[(role, ref)]`."""
        calls = []
        for step in plan.steps:
            if not isinstance(step, launchrecord.RecordedLaunch):
                return None  # fills or copies: only replayed by the runner itself
            a_list = []
            for a in step.args:
                if a.kind == "tensor":
                    a_list.append(buffers[(a.role, a.ref)][a.offset:])
                else:
                    a_list.append(a.value)
            calls.append((replay.kernels[step.kernel.hash][step.grid], a_list))

        def go():
            for launch, a in calls:
                launch(*a)
        return go

    own_out = {("output", i): torch.empty(o.nbytes, dtype=torch.uint8, device="cuda") for i, o in enumerate(plan.outputs)}
    own_scratch = {("scratch", i): torch.empty(n, dtype=torch.uint8, device="cuda") for i, (n, _) in enumerate(plan.scratch)}
    on_worker = launcher_on({**{("input", k): bytes_of(v) for k, v in tensors.items()}, **own_out, **own_scratch})

    replay_inputs = {}
    for k, v in tensors.items():
        buf = replay.storages["input"][k]
        replay_inputs[k] = torch.empty(0, dtype=v.dtype, device="cuda").set_(buf.untyped_storage(), v.storage_offset(), v.shape, v.stride())
    replay_args = [replay_inputs.get(k, v) for k, v in worker_args.items()]

    side = torch.cuda.Stream()
    cases = {
        "function": (lambda: fn(*args), None),
        "replay": (replay.once, None),
        "replay_on_worker_tensors": (on_worker, None),
        "function_on_replay_inputs": (lambda: fn(*replay_args), None),
        "replay_side_stream": (replay.once, side),
        "replay_no_flush": (replay.once, "noflush"),
    }
    biggest = max(tensors, key=lambda k: tensors[k].untyped_storage().nbytes())
    for shift in (512, 4096, 65536, 1 << 20, 3 << 20):
        src = bytes_of(tensors[biggest])
        moved = torch.empty(src.numel() + shift, dtype=torch.uint8, device="cuda")
        moved[shift:].copy_(src)
        go = launcher_on({**{("input", k): bytes_of(v) for k, v in replay.storages["input"].items()}, ("input", biggest): moved[shift:],
                          **own_out, **own_scratch})
        if go is not None:
            cases[f"replay_x_at_+{shift}"] = (go, None)
    cases = {k: v for k, v in cases.items() if v[0] is not None}

    def timed(call, how) -> float:
        torch.cuda.synchronize()
        if how != "noflush":
            flush.zero_()
            torch.cuda.synchronize()
        stream = how if isinstance(how, torch.cuda.Stream) else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(timing.LAUNCH_SHADOW_CYCLES)
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    for name, (call, how) in cases.items():  # warm each up, and say which fail
        try:
            for _ in range(3):
                timed(call, how)
        except Exception as exc:  # noqa: BLE001 - a variant that cannot run is reported, the rest go on
            out.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    cases = {k: v for k, v in cases.items() if k not in out.get("errors", {})}
    rng = random.Random(0)
    for profiled in (False, True):
        times = {k: [] for k in cases}
        prof = None
        if profiled:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        try:
            for _ in range(reps):
                order = list(cases)
                rng.shuffle(order)
                for name in order:
                    times[name].append(timed(*cases[name]))
        finally:
            if prof is not None:
                prof.__exit__(None, None, None)
        out["cupti_on" if profiled else "cupti_off"] = {k: statistics.median(v) for k, v in times.items()}
    full = replay.time(reps)
    out["replay_full_ms"] = full["median_ms"]
    out["clocks_after"] = _gpu_clocks()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="replay_gap.json")
    parser.add_argument("--only", default="layernorm,rmsnorm")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--variants", nargs=6, metavar=("REC", "INPUTS", "LAYOUT", "ROOT", "MODULE", "FUNCTION"))
    args = parser.parse_args()
    if args.variants:
        print(json.dumps(variants(*args.variants, args.reps)))
        return 0

    import torch
    from replay_vs_events import RECORD, _run

    from grader.spec import Course
    from grader.codec import write_inputs
    from grader.judge import replay_process
    from grader.sandbox.zygote import SandboxState
    from grader.settings import Settings

    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    work = Path(tempfile.mkdtemp(prefix="replay-gap-"))
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": __import__("triton").__version__,
              "rows": []}
    for name in args.only.split(","):
        spec = Course.find(Settings()).get(name)
        perf = spec.performance
        inputs = spec.make_inputs(perf.case.params, getattr(torch, perf.dtype), torch.Generator().manual_seed(0))
        folder = work / name
        folder.mkdir()
        layout = write_inputs(inputs, folder / "inputs.safetensors")
        (folder / "layout.json").write_text(json.dumps(layout))
        # the reference first: its recorded call's result is what the sample's replay is compared with
        contenders = {"reference": (ROOT / "reference", f"{name}.py"), "sample": (ROOT / "tests/fixtures/good", f"kernels/{name}.py")}
        for who, (root, module) in contenders.items():
            row = {"assignment": name, "contender": who}
            rec = folder / f"{who}.rec"
            rec.mkdir()
            rc, so, se, wall = _run([sys.executable, "-c", RECORD, str(root), module, spec.function, str(folder / "inputs.safetensors"),
                                     str(folder / "layout.json"), str(rec), str(folder / f"{who}.call.safetensors"), str(args.reps)], env)
            if rc != 0:
                row["record_failed"] = se[-1500:]
                result["rows"].append(row)
                continue
            row["worker"] = json.loads(so.strip().splitlines()[-1])
            rc, so, se, wall = _run([sys.executable, __file__, "--reps", str(args.reps), "--variants", str(rec), str(folder / "inputs.safetensors"),
                                     str(folder / "layout.json"), str(root), module, spec.function], env, timeout=240)
            row["variants"] = json.loads(so.strip().splitlines()[-1]) if rc == 0 and so.strip() else {"failed": se[-2000:]}
            t0 = time.perf_counter()
            got = replay_process.run(rec, folder / "inputs.safetensors", folder / "layout.json", folder / f"{who}.job", args.reps, 240,
                                     settings=Settings(), sandbox=SandboxState())
            row["sandboxed_replay"] = {"median_ms": got.median_ms, "refused": got.refused, "failed": got.failed, "others": got.others,
                                       "wall_s": time.perf_counter() - t0}
            if got.folder is not None:
                from safetensors.torch import load_file
                expected = list(load_file(str(folder / "reference.call.safetensors")).values())
                try:
                    row["sandboxed_replay"]["wrong"] = replay_process.mismatch(replay_process.results(got, expected), expected, 2e-2, 2e-2)
                except replay_process.ReplyError as exc:
                    row["sandboxed_replay"]["wrong"] = str(exc)
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
