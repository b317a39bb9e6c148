"""Replay against today's event timing, side by side, on a GPU.

For each assignment of the catalogue at its scoring shape, and for each contender (the course's
correct sample, the reference, and the timing-cheat fixtures of tests/fixtures/gpu): a worker
process (grader.worker.server's own Worker: the contender's module imported, Triton's launches
hooked) makes one recorded call (grader.worker.launches) and then times the function as the
timing stage does today (grader.worker.timing.time_function, CUDA events); it exits. Then a
replay process (`python -m grader.replay`, no contender code) checks the record, replays the
launches with its own events and hands back its first and last rep's results whole, which are
compared with the reference's result of the recorded call.

Prints and writes (--out) one row per (assignment, contender): event-timed and replayed medians,
the ratio to the reference both ways and their relative difference, whether the replay's result
is right, why a record was refused, and the wall time of each stage (the cost side by side).

    python benchmarks/replay_vs_events.py --out replay.json [--only softmax,vector_add] [--reps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RECORD = r'''
import json, sys, time, statistics
from grader import protocol
from grader.protocol import Call, Contender, Load, Time
from grader.worker import server, timing
root, module, function, inputs, layout, folder, out, reps = sys.argv[1:9]
worker = server.Worker()
server._setup_triton(False, worker.watch)
timing.tampered()
layout = json.load(open(layout))
loaded = worker.load(Load({"c": Contender(root, module, function)}))
assert loaded.ok, loaded
t0 = time.perf_counter()
reply = worker.call(Call("c", inputs, layout, "rec", record_launches=folder))
record_s = time.perf_counter() - t0
res = worker.retained[("c", "rec")]
import torch
from safetensors.torch import save_file
outs = list(res) if isinstance(res, (tuple, list)) else [res]
save_file({f"output.{i}": o.detach().to("cpu").contiguous() for i, o in enumerate(outs)}, out)
t0 = time.perf_counter()
timed = worker.time(Time("c", [inputs], layout, int(reps)))
time_s = time.perf_counter() - t0
print(json.dumps({"event_median_ms": statistics.median(timed.event_ms), "record_s": record_s, "time_s": time_s}))
'''


def _run(cmd: list[str], env: dict, timeout: float = 300) -> tuple[int, str, str, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
        return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        return 124, "", "timeout", time.perf_counter() - t0


def contenders(name: str, work: Path) -> dict[str, tuple[Path, str]]:
    """The correct sample, the reference, and each GPU fixture for this assignment built as the
    tests build a submission (the correct solution overlaid with the fixture's files)."""
    good = ROOT / "tests/fixtures/good"
    found = {"sample": (good, f"kernels/{name}.py"), "reference": (ROOT / "reference", f"{name}.py")}
    for fixture in sorted((ROOT / "tests/fixtures/gpu").iterdir()):
        if fixture.is_dir() and (fixture / "kernels" / f"{name}.py").is_file():
            dest = work / "repos" / fixture.name
            shutil.copytree(good, dest)
            shutil.copy(good / "kernels" / "vector_add.py", dest / "kernels" / "_good_add.py")
            shutil.copy(good / "kernels" / "dropout.py", dest / "kernels" / "_good_dropout.py")
            shutil.copytree(fixture, dest, dirs_exist_ok=True)
            found[fixture.name] = (dest, f"kernels/{name}.py")
    return found


def compare(a_path: Path, b_path: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(a_path)), load_file(str(b_path))
    if sorted(a) != sorted(b):
        return {"right": False, "why": f"results {sorted(a)} vs {sorted(b)}"}
    worst = 0.0
    for k in a:
        x, y = a[k].double(), b[k].double()
        if x.shape != y.shape:
            return {"right": False, "why": f"{k}: shape {list(x.shape)} vs {list(y.shape)}"}
        both_nan = torch.isnan(x) & torch.isnan(y)
        diff = torch.where(both_nan, torch.zeros_like(x), (x - y).abs() / (1e-2 + y.abs()))
        diff = torch.nan_to_num(diff, nan=float("inf"))
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return {"right": worst <= 2e-2, "worst_rel": worst}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="replay_vs_events.json")
    parser.add_argument("--only", default="")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from grader.settings import Settings
    from grader.spec import Course
    from grader.codec import write_inputs

    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    rows = []
    work = Path(tempfile.mkdtemp(prefix="replay-bench-"))
    for name, spec in sorted(Course.find(Settings()).catalogue().items()):
        if args.only and name not in args.only.split(","):
            continue
        perf = spec.performance
        if perf is None:
            continue
        gen = torch.Generator().manual_seed(0)
        inputs = spec.make_inputs(perf.case.params, getattr(torch, perf.dtype), gen)
        folder = work / name
        folder.mkdir()
        layout = write_inputs(inputs, folder / "inputs.safetensors")
        (folder / "layout.json").write_text(json.dumps(layout))
        results = {}
        for who, (root, module) in contenders(name, folder).items():
            rec, out = folder / f"{who}.rec", folder / f"{who}.replay"
            rec.mkdir()
            rc, so, se, wall = _run([sys.executable, "-c", RECORD, str(root), module, spec.function, str(folder / "inputs.safetensors"),
                                     str(folder / "layout.json"), str(rec), str(folder / f"{who}.call.safetensors"), str(args.reps)], env)
            row = {"assignment": name, "contender": who}
            if rc != 0 or not so.strip():
                row["record_failed"] = se.strip().splitlines()[-1][:300] if se.strip() else f"rc {rc}"
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            row.update(json.loads(so.strip().splitlines()[-1]), record_wall_s=wall)
            try:
                recorded = json.loads((rec / "launches.json").read_text())
                row["why_not"] = recorded.get("why_not")
                row["recorded"] = [[x.get("name"), x.get("grid"), x.get("num_warps")] for x in recorded.get("launches", [])]
            except (OSError, ValueError):
                pass
            rc, so, se, wall = _run([sys.executable, "-m", "grader.replay", str(rec), str(folder / "inputs.safetensors"),
                                     str(folder / "layout.json"), str(out), "--reps", str(args.reps)], env)
            row["replay_wall_s"] = wall
            try:
                replayed = json.loads((out / "replay.json").read_text())
            except (OSError, ValueError):
                replayed = {"failed": (se.strip().splitlines() or [f"rc {rc}"])[-1][:300]}
            for key in ("refused", "failed", "median_ms", "other_gpu_processes", "launches"):
                if key in replayed:
                    row[key if key != "median_ms" else "replay_median_ms"] = replayed[key]
            results[who] = row
            rows.append(row)
        ref = results.get("reference", {})
        for who, row in results.items():
            out = folder / f"{who}.replay"
            if (out / "first.safetensors").is_file() and (folder / "reference.call.safetensors").is_file():
                row["replay_first_vs_reference"] = compare(out / "first.safetensors", folder / "reference.call.safetensors")
                row["replay_last_vs_reference"] = compare(out / "last.safetensors", folder / "reference.call.safetensors")
            if (out / "last.safetensors").is_file() and (folder / f"{who}.call.safetensors").is_file():
                row["replay_last_vs_own_call"] = compare(out / "last.safetensors", folder / f"{who}.call.safetensors")
            if "event_median_ms" in ref and "event_median_ms" in row:
                row["event_ratio"] = row["event_median_ms"] / ref["event_median_ms"]
            if "replay_median_ms" in ref and "replay_median_ms" in row:
                row["replay_ratio"] = row["replay_median_ms"] / ref["replay_median_ms"]
            if "event_ratio" in row and "replay_ratio" in row:
                row["ratio_difference"] = row["replay_ratio"] / row["event_ratio"] - 1
            print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                          "triton": __import__("triton").__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
