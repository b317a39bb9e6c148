"""`python -m grader.replay RECORD INPUTS LAYOUT OUT [--reps N]`: one contender's replay, in a
process of its own (no student module is ever imported here). RECORD is the folder of a launch
record, INPUTS and LAYOUT the call's inputs as grader.codec wrote them (the grader's own file),
OUT a folder for replay.json (times, the other processes seen on the GPU, or the reason the
record was refused) and the results of the first and last rep (first.safetensors, last.safetensors)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def gpu_processes() -> list[int] | None:
    """PIDs of the processes that hold a context on the GPU, by the driver's own list (None if
    it cannot be read): the replay is timed with nothing of the student's on the GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sorted(int(p) for p in out.stdout.split() if p.strip().isdigit())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.replay")
    parser.add_argument("record")
    parser.add_argument("inputs")
    parser.add_argument("layout")
    parser.add_argument("out")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    from safetensors.torch import load_file, save_file

    from grader.codec import rebuild
    from grader.replay import record, runner

    layout = json.loads(Path(args.layout).read_text())
    storages = load_file(args.inputs)
    inputs = {k: v for k, v in rebuild(storages, layout, "cuda").items() if isinstance(v, torch.Tensor)}
    sizes = {k: v.untyped_storage().nbytes() for k, v in inputs.items()}
    major, minor = torch.cuda.get_device_capability(0)
    try:
        plan = record.load(Path(args.record), sizes, arch=major * 10 + minor)
    except record.RecordError as exc:
        (out / "replay.json").write_text(json.dumps({"refused": str(exc)}))
        return 0
    others_before = [p for p in (gpu_processes() or []) if p != os.getpid()]
    replay = runner.Replay(plan, inputs)
    try:
        timed = replay.time(args.reps)
    except Exception as exc:  # noqa: BLE001 - a kernel that faults: the replay failed, and says how
        (out / "replay.json").write_text(json.dumps({"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}))
        return 0
    others_after = [p for p in (gpu_processes() or []) if p != os.getpid()]
    save_file({f"output.{i}": t for i, t in enumerate(timed.pop("first"))}, str(out / "first.safetensors"))
    save_file({f"output.{i}": t for i, t in enumerate(timed.pop("last"))}, str(out / "last.safetensors"))
    (out / "replay.json").write_text(json.dumps({**timed, "gpu": torch.cuda.get_device_name(0),
                                                 "other_gpu_processes": sorted(set(others_before + others_after)),
                                                 "launches": sum(1 for s in plan.steps if isinstance(s, record.Launch))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
