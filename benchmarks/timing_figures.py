"""Every figure the timing took of each fixture's calls, fixture by fixture, on one GPU.

Grades each named fixture (tests/fixtures, built as the tests build it) with `grader check` on the
GPU, one after another so that nothing else shares the GPU, and prints, per fixture: its outcome
and points, the figure it was scored from, the replayed time, and each clock figure over the
replayed time (the graph burst, the queued burst behind its gate, a function that cannot be
captured: its eager burst). Rows go to `--log` in the form benchmarks/honest_spread.py reads, so
the honest spread (docs/performance.md) is

    python benchmarks/timing_figures.py --log /tmp/mine/figures.jsonl --rounds 2 --budget 480
    python benchmarks/honest_spread.py /tmp/mine/figures.jsonl

`--budget`: no new check starts after that many seconds (one device call holds them all).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (name in the log, fixture, assignment, case): honest ones first, then what tells its calls apart
FIXTURES = [
    ("honest_pipeline_scratch", "gpu/honest_pipeline_scratch", "vector_add", "n=1048577"),
    ("good/vector_add", "good", "vector_add", "n=1048577"),
    ("good/softmax", "good", "softmax", "1x1"),
    ("honest_many_launches", "gpu/honest_many_launches", "vector_add", "n=1048577"),
    ("cheat_margin_rider", "gpu/cheat_margin_rider", "vector_add", "n=1048577"),
    ("cheat_fast_while_captured", "gpu/cheat_fast_while_captured", "vector_add", "n=1048577"),
    ("honest_syncs", "gpu/honest_syncs", "vector_add", "n=1048577"),
    ("cheat_deterministic_flag", "gpu/cheat_deterministic_flag", "vector_add", "n=1048577"),
    ("honest_slow_wrapper", "gpu/honest_slow_wrapper", "vector_add", "n=1048577"),
    ("cheat_grader_frames", "gpu/cheat_grader_frames", "vector_add", "n=1048577"),
    ("cheat_cpu_hog", "gpu/cheat_cpu_hog", "vector_add", "n=1048577"),
    ("cheat_l2_window", "gpu/cheat_l2_window", "vector_add", "n=1048577"),
    ("honest_two_streams", "gpu/honest_two_streams", "vector_add", "n=1048577"),
]


def grade(fixture: str, assignment: str, case: str, where: Path) -> dict:
    """One check of `fixture` on the GPU; its performance test (or the failure, in words)."""
    from tests.conftest import build_submission

    repo = build_submission(where / "repo", fixture)
    out = where / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(repo), "--seed", "3", "--device", "cuda",
                           "-a", assignment, "--case", case, "--json", str(out / "results.json")],
                          cwd=where, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    try:
        results = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return {"error": f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-600:]}", "seconds": seconds}
    perf = [t for t in results["tests"] if t["tags"][0] == assignment and t["tags"][1] == "performance"]
    if not perf:
        return {"error": "no performance test in results.json", "seconds": seconds}
    return {"perf": perf[0], "seconds": seconds}


def line(name: str, got: dict) -> str:
    if "error" in got:
        return f"{name}: ERROR {got['error']}"
    perf = got["perf"]
    d = perf["extra_data"]["details"]
    c = d.get("confirmation") or {}
    r = c.get("replay_ms") or 0
    figs = ", ".join(f"{f['source']} {f['ms']:.4f} ms ({f['ms'] / r:.3f})" + (" host work" if f["host_work"] else "")
                     for f in c.get("figures") or [] if r)
    return (f"{name}: {perf['outcome']} {perf['score']}/{perf['max_score']} ratio {d.get('ratio_to_reference')} "
            f"timed_by {d.get('timed_by')} verdict {c.get('verdict')} scored_from {c.get('scored_from')} "
            f"replay {r} ms; {figs}; gate {c.get('gate_ms')} ms; busiest {c.get('busiest')} "
            f"({got['seconds']:.0f} s)\n    {perf['output'][:400]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", required=True, help="JSONL file the rows are appended to")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--budget", type=float, default=480.0)
    p.add_argument("--only", action="append", default=[], help="names of FIXTURES to grade (default: all)")
    a = p.parse_args()
    started = time.monotonic()
    chosen = [f for f in FIXTURES if not a.only or f[0] in a.only]
    for round_ in range(a.rounds):
        for name, fixture, assignment, case in chosen:
            if time.monotonic() - started > a.budget:
                print(f"budget spent: {name} round {round_ + 1} and after not run", flush=True)
                return 0
            with tempfile.TemporaryDirectory() as where:  # private (0700): the grader writes there
                got = grade(fixture, assignment, case, Path(where))
            print(line(name, got), flush=True)
            if "perf" in got:
                d = got["perf"]["extra_data"]["details"]
                with open(a.log, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"fixture": name, "round": round_ + 1, "outcome": got["perf"]["outcome"],
                                        "score": got["perf"]["score"], "timed_by": d.get("timed_by"),
                                        "confirmation": d.get("confirmation"), "replay": d.get("replay"),
                                        "ratio": d.get("ratio_to_reference"), "witness": d.get("witness")}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
