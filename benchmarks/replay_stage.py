"""The timing stage by replay against the worker-timed rounds it replaces, side by side, on a GPU.

Runs `grader check SUBMISSION --device cuda --seed S` three times on the same warm machine: as the
grader runs it (the student's kernels replayed with the worker gone: grader.judge.replay_stage), a
second time (the reference's replayed figure kept from the first, as every student after the
first in a class finds it), and with the replay turned off in that process (the fallback: timed
rounds in the worker, witnessed by the grader's clock), then prints and writes, per assignment:
how each run timed it, its ratio to the reference and interval, the ratio's relative difference,
its outcome and flag, and the seconds the performance stage took (the cost side by side; the
input sets are made by the first run and kept, so they are left out of the stage's seconds).

    python benchmarks/replay_stage.py --out replay_stage.json [--submission tests/fixtures/good] [-a softmax ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ROUNDS_ONLY = ("import sys; import grader.judge.perf as perf; "
               "perf._by_replay = lambda *a, **k: (None, 'replay turned off for the side-by-side'); "
               "from grader.cli import main; sys.argv = ['grader'] + sys.argv[1:]; main()")


def run(mode: str, submission: str, seed: int, assignments: list[str], folder: Path) -> tuple[dict, float]:
    out = folder / f"{mode}.json"
    args = ["check", submission, "--device", "cuda", "--seed", str(seed), "--json", str(out), "--html", str(folder / mode)]
    for a in assignments:
        args += ["-a", a]
    command = [sys.executable, "-m", "grader", *args] if mode.startswith("replay") else [sys.executable, "-c", ROUNDS_ONLY, *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    if not out.is_file():
        sys.exit(f"{mode}: no results ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(out.read_text()), wall


def perf_tests(results: dict) -> dict[str, dict]:
    return {t["tags"][0]: t for t in results["tests"] if t["tags"][1] == "performance"}


def row(test: dict) -> dict:
    d = (test.get("extra_data") or {}).get("details") or {}
    phases = d.get("phase_seconds") or {}
    return {"timed_by": d.get("timed_by"), "ratio": d.get("ratio_to_reference"), "interval": d.get("ratio_interval"),
            "outcome": test.get("status") or test.get("outcome"), "severity": (test.get("extra_data") or {}).get("severity"),
            "stage_s": round(sum(v for k, v in phases.items() if k != "inputs"), 2), "phases": phases,
            "refused": d.get("replay_refused"), "reference_kept": ((d.get("replay") or {}).get("reference") or {}).get("kept"),
            "student_ms": (d.get("figures") or {}).get("student", {}).get("median_ms"),
            "reference_ms": (d.get("figures") or {}).get("reference", {}).get("median_ms"),
            "output": test.get("output", "")[:300]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--submission", default=str(ROOT / "tests" / "fixtures" / "good"))
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("-a", "--assignment", action="append", default=[])
    args = parser.parse_args()
    import torch

    rows = {}
    with tempfile.TemporaryDirectory(prefix="replay-stage-") as tmp:
        folder = Path(tmp)
        runs = {mode: run(mode, args.submission, args.seed, args.assignment, folder) for mode in ("replay", "replay_kept", "rounds")}
    tests = {mode: perf_tests(r) for mode, (r, _) in runs.items()}
    print(f"{'assignment':18} {'replay':>8} {'rounds':>8} {'diff':>7} {'stage s: replay / kept reference / rounds':>42}  how")
    for name in sorted(tests["replay"]):
        a, k, b = (row(tests[m].get(name, {})) for m in ("replay", "replay_kept", "rounds"))
        diff = a["ratio"] / b["ratio"] - 1 if a["ratio"] and b["ratio"] else None
        rows[name] = {"replay": a, "replay_kept": k, "rounds": b, "diff": diff}
        print(f"{name:18} {a['ratio'] or '-':>8} {b['ratio'] or '-':>8} {f'{diff:+.1%}' if diff is not None else '-':>7} "
              f"{a['stage_s']:>14} / {k['stage_s']:>8} / {b['stage_s']:<8}  {a['timed_by']} {a['outcome']} {a['severity'] or ''} "
              f"{a['refused'] or ''}")
    summary = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "torch": torch.__version__,
               "triton": __import__("triton").__version__, "submission": args.submission, "seed": args.seed,
               "wall_s": {m: round(w, 1) for m, (_, w) in runs.items()}, "rows": rows,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["wall_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
