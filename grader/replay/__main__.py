"""`python -m grader.replay RECORD INPUTS LAYOUT OUT [--reps N]`: one contender's replay, in a
process of its own that imports no student module. The judge starts it through the sandbox
backend (grader.judge.replay_process.run), with only the grader's own code, the checked record (RECORD,
read-only) and the call's inputs as grader.codec wrote them (INPUTS, LAYOUT: the grader's own
files) in its view. It writes OUT/replay.json (times, or why the record was refused or the replay
failed, and every rep's result sums) and the last rep's result (last.safetensors, after the
times: the judge's hold of the GPU ends with the times; with --pick, only its elements at the
judge's indices, told once the times are written); the judge's side reads them back bounded and
compares them with the truth itself: nothing here knows the answer.

Started early (--ready, --loaded, --arm, --go): it imports, and reads its inputs on the host once
its record is placed (then says so: loaded); sets up on the GPU (context, kernels loaded, inputs
and the first placement's buffers, no kernel of the record run) once armed, while the judge holds
the GPU shared; and runs the record's kernels only once told to go, inside the judge's exclusive
hold.
Which other processes held the GPU is the judge's own observation, not this process's word."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.replay")
    parser.add_argument("record")
    parser.add_argument("inputs")
    parser.add_argument("layout")
    parser.add_argument("out")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--placements", type=int, default=1)
    parser.add_argument("--ready", default="", help="wait for this file before reading the record and the inputs")
    parser.add_argument("--loaded", default="", help="made once the record is checked and the inputs read")
    parser.add_argument("--arm", default="", help="wait for this file before touching the GPU (setting up)")
    parser.add_argument("--armed", default="", help="made once set up on the GPU, waiting for the go")
    parser.add_argument("--go", default="", help="wait for this file to appear before running any kernel")
    parser.add_argument("--pick", default="", help="after the times, wait for this file of flat indices and hand "
                                                   "back the last result's elements there, not the whole result")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    from safetensors.torch import load_file

    from grader.codec import rebuild, write_tensors
    from grader.replay import launchrecord, runner

    _wait_for(args.ready, 0.01)
    layout = json.loads(Path(args.layout).read_text())
    storages = load_file(args.inputs)  # read before the go: the file's bytes, on the host
    host = {k: v for k, v in rebuild(storages, layout, "cpu").items() if isinstance(v, torch.Tensor)}
    sizes = {k: v.untyped_storage().nbytes() for k, v in host.items()}
    try:  # checked before the GPU is touched (a refused record never waits), and again below against this GPU
        launchrecord.load(Path(args.record), sizes)
    except launchrecord.LaunchRecordError as exc:
        _answer(out, json.dumps({"refused": str(exc)}))
        return 0
    _mark(args.loaded)
    _wait_for(args.arm)  # the judge holds the GPU shared meanwhile: set-up runs no kernel of the record's
    gpu = torch.cuda.is_available()
    if not gpu:
        _answer(out, json.dumps({"failed": "no GPU is visible to the replay process", "setup": True}))
        return 0
    major, minor = torch.cuda.get_device_capability(0)
    try:
        plan = launchrecord.load(Path(args.record), sizes, arch=major * 10 + minor)
    except launchrecord.LaunchRecordError as exc:
        _answer(out, json.dumps({"refused": str(exc)}))
        return 0
    placements = max(1, min(args.placements, 16))
    try:  # everything but the timed reps, before the go: the hold covers the measurement alone
        # as the call got them: views over whole storages, rebuilt on the GPU from the same file
        on_gpu = {k: v.to("cuda") for k, v in storages.items()}  # never written: the reps' pristine copy
        inputs = {k: v for k, v in rebuild(on_gpu, layout, "cuda").items() if isinstance(v, torch.Tensor)}
        ready = runner.Placements(plan, inputs)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - out of memory, a kernel file that does not load: ours, not a verdict
        _answer(out, json.dumps({"failed": f"{type(exc).__name__}: {str(exc)[:300]}", "setup": True}))
        return 0
    _mark(args.armed)
    _wait_for(args.go)
    try:
        timed = ready.time(args.reps, placements)
    except Exception as exc:  # noqa: BLE001 - a kernel that faults: the replay failed, and says how
        _answer(out, json.dumps({"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}))
        return 0
    launches = sum(1 for s in plan.steps if isinstance(s, launchrecord.RecordedLaunch))
    # the times first (they end the judge's hold), then the last rep's result, whole, for the comparison
    _answer(out, json.dumps({**timed, "gpu": torch.cuda.get_device_name(0), "launches": launches}))
    if args.pick:  # the judge's indices, told only now that no kernel of the record runs any more
        _wait_for(args.pick)
        write_tensors(ready.picked(_indices(args.pick)), out / ".last.safetensors.tmp")
    else:
        write_tensors({f"output.{i}": t for i, t in enumerate(ready.last())}, out / ".last.safetensors.tmp")
    (out / ".last.safetensors.tmp").replace(out / "last.safetensors")
    return 0


def _indices(path: str) -> torch.Tensor:
    """The judge's flat indices (grader.judge.picks), as the judge wrote them."""
    import os

    from grader.codec import read_tensor

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_tensor(fd, "idx", 64 << 20).reshape(-1)
    finally:
        os.close(fd)


def _mark(path: str) -> None:
    if path:
        Path(path).touch()


def _answer(out: Path, text: str) -> None:
    """replay.json written whole before it appears (the judge reads it as soon as it is there)."""
    tmp = out / ".replay.json.tmp"
    tmp.write_text(text)
    tmp.replace(out / "replay.json")


def _wait_for(path: str, poll_s: float = 0.002) -> None:
    """Until the judge says go (the file appears); the judge stops a replay it no longer needs."""
    if not path:
        return
    import os
    import time

    while not os.path.exists(path):
        time.sleep(poll_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
