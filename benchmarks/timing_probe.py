"""What the timing method sees, on the GPU, for kernels whose right time is known: the same
vector add run plainly, on an unjoined side stream, split over two joined streams, behind a
slow Python wrapper, and from a background thread.

    python benchmarks/timing_probe.py [--n 268435456] [--reps 30] [--json out.json]

For each variant it prints the median per call of the CUDA events, of the GPU time read from the
activity records (grader.judge.activity), of the host's clock (settle calls), and what the records say
(calls that returned before their work was done, work between calls, records that do not fit
the loop). The plain variant's GPU time is the yardstick: every variant does the same work, so
its GPU time must match, whatever its events say. Runs in this process, no sandbox: it checks
the method, not a submission. `--json` keeps the raw records of the first round of each variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from grader.judge import activity  # noqa: E402
from grader.worker import timing


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def _launch(x, y, out, start=0, count=None):
    count = out.numel() - start if count is None else count
    add_kernel[(triton.cdiv(count, 1024),)](x[start:], y[start:], out[start:], count, BLOCK=1024)


def plain(x, y):
    out = torch.empty_like(x)
    _launch(x, y, out)
    return out


SIDE = []


def side_stream(x, y):
    if not SIDE:
        SIDE.append(torch.cuda.Stream())
    out = torch.empty_like(x)
    with torch.cuda.stream(SIDE[0]):
        _launch(x, y, out)
    return out


TWO = []


def two_streams(x, y):
    if not TWO:
        TWO.extend([torch.cuda.Stream(), torch.cuda.Stream()])
    out = torch.empty_like(x)
    caller, half = torch.cuda.current_stream(), (x.numel() + 1) // 2
    for s, start in zip(TWO, (0, half)):
        s.wait_stream(caller)
        with torch.cuda.stream(s):
            _launch(x, y, out, start, min(half, x.numel() - start))
        caller.wait_stream(s)
    return out


def slow_wrapper(x, y):
    seen = 0
    for _root, _dirs, files in os.walk(os.path.dirname(torch.__file__)):
        seen += len(files)
        if seen > 3000:
            break
    return plain(x, y)


def thread(x, y):
    out = torch.empty_like(x)

    def work():
        with torch.cuda.stream(torch.cuda.Stream()):
            _launch(x, y, out)

    threading.Thread(target=work, daemon=True).start()
    return out


VARIANTS = {"plain": plain, "side_stream": side_stream, "two_streams": two_streams, "slow_wrapper": slow_wrapper, "thread": thread}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1 << 28)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    timing.tampered()
    sets = [[torch.randn(args.n, device="cuda"), torch.randn(args.n, device="cuda")] for _ in range(2)]
    print(f"GPU: {timing.device_name()}; torch {torch.__version__}, triton {triton.__version__}; n={args.n}, "
          f"{args.reps} calls x {args.rounds} rounds")
    print("\n| variant | events ms | GPU time ms | host ms per call | GPU / plain's | returned unfinished | strays | record problems |")
    print("|---|---|---|---|---|---|---|---|")
    raw, base = {}, None
    for name, fn in VARIANTS.items():
        events, busy, host, unfinished, strays, problems = [], [], [], 0, 0, []
        for r in range(args.rounds):
            result = timing.time_function(fn, sets, args.reps)
            result.pop("outputs")
            if r == 0:
                raw[name] = {k: v for k, v in result.items()}
            if result["activities"] is None:
                problems.append(f"no records: {result['activity_error']}")
                continue
            reading = activity.read(result["activities"], result["marks"], result["settle_marks"])
            events += result["event_ms"]
            busy += reading.busy_ms
            host += result["host_ms"]
            unfinished += len(reading.unfinished)
            strays += len(reading.strays)
            problems += reading.problems
        gpu = statistics.median(busy) if busy else float("nan")
        base = gpu if name == "plain" else base
        print(f"| {name} | {statistics.median(events) if events else float('nan'):.4f} | {gpu:.4f} | "
              f"{statistics.median(host) if host else float('nan'):.4f} | {gpu / base:.3f} | {unfinished} | {strays} | "
              f"{'; '.join(sorted(set(problems))[:2]) or 'none'} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(raw, default=str))


if __name__ == "__main__":
    main()
