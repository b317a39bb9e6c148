"""Proof of the timing method, on the GPU: stability, resolution, and the cheats.

    python benchmarks/timing_proof.py [--runs 5] [--json out.json]

- Stability: the correct submission (tests/fixtures/good) graded `--runs` times: the spread
  of its student/reference ratio per assignment (max/min - 1) must be at most 3%.
- Resolution: tests/fixtures/gpu/slow10 (about 10% more work than the reference) must be
  measured slower than the reference in every run.
- Cheats: every tests/fixtures/gpu/cheat_* must be flagged with evidence and earn nothing.
Each run is a full `grade_submission` (correctness on two small cases, then timing).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import build_submission  # noqa: E402

from grader import spec as specs  # noqa: E402
from grader.grade import Options, grade_submission  # noqa: E402
from grader.submission import open_submission  # noqa: E402

ASSIGNMENTS = ["vector_add", "softmax"]
SMALL_CASES = ["n=1", "1x1"]


def perf_of(run, assignment):
    return next(t for t in run.tests if t.assignment == assignment and t.kind == "performance")


ROOFLINE: dict = {}  # measured by the first run, then shared: it is the same GPU


ISOLATION = ["sandbox"]


def grade(fixture: str, seed: int, assignments=ASSIGNMENTS, cases=SMALL_CASES):
    with tempfile.TemporaryDirectory() as tmp:
        sub = open_submission(build_submission(Path(tmp) / "repo", fixture))
        opts = Options("cuda", seed, cases, ["float32"], roofline=ROOFLINE, isolation=ISOLATION[0])
        return grade_submission(sub, [specs.get(a) for a in assignments], opts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-cheats", action="store_true", help="stability and resolution only (tests/test_gpu.py grades the cheats too)")
    parser.add_argument("--isolation", default="sandbox", help="how workers are contained (see grader check --isolation)")
    args = parser.parse_args()
    ISOLATION[0] = args.isolation
    report: dict = {"stability": {a: [] for a in ASSIGNMENTS}, "slow10": {a: [] for a in ASSIGNMENTS}, "cheats": {}}
    t0 = time.time()
    for i in range(args.runs):
        for key, fixture in (("stability", "good"), ("slow10", "gpu/slow10")):
            run = grade(fixture, 100 + i)
            report.setdefault("environment", run.environment)
            for a in ASSIGNMENTS:
                t = perf_of(run, a)
                d = t.details
                print(f"run {i} {fixture} {a}: {t.outcome} {t.message[:160]}", flush=True)
                report[key][a].append({"outcome": t.outcome, "ratio": d.get("ratio_to_reference"),
                                       "interval": d.get("ratio_interval"), "rounds": d.get("rounds"),
                                       "student_ms": d["figures"]["student"]["median_ms"] if "figures" in d else None,
                                       "figures": d.get("figures"), "message": t.message})
    for fixture in [] if args.skip_cheats else sorted(p.name for p in (ROOT / "tests" / "fixtures" / "gpu").glob("cheat_*")):
        run = grade(f"gpu/{fixture}", 7, ["vector_add"], ["n=1048577"])
        t = perf_of(run, "vector_add")
        print(f"{fixture}: {t.outcome} {t.message[:160]}", flush=True)
        report["cheats"][fixture] = {"outcome": t.outcome, "score": run.score, "message": t.message}
    report["seconds"] = round(time.time() - t0, 1)

    print(f"GPU: {report['environment'].get('gpu')}, torch {report['environment']['torch']}, triton {report['environment']['triton']}")
    print("\n| assignment | runs | good: ratio to reference (min-max) | spread | slow10: ratio (min-max) | slow10 slower every run |")
    print("| --- | --- | --- | --- | --- | --- |")
    ok = True
    for a in ASSIGNMENTS:
        good = [r["ratio"] for r in report["stability"][a] if r["ratio"]]
        slow = [r["ratio"] for r in report["slow10"][a] if r["ratio"]]
        spread = max(good) / min(good) - 1 if good else float("nan")
        slower = all(r["interval"] and r["interval"][0] > 1.0 for r in report["slow10"][a])
        ok &= spread <= 0.03 and slower and len(good) == len(slow) == args.runs
        print(f"| {a} | {args.runs} | {min(good):.3f}-{max(good):.3f} | {spread:.1%} | {min(slow):.3f}-{max(slow):.3f} | {'yes' if slower else 'NO'} |")
    print("\n| cheat | outcome | score | evidence |")
    print("| --- | --- | --- | --- |")
    for name, c in report["cheats"].items():
        ok &= c["outcome"] == "flagged" and c["score"] == 0
        print(f"| {name} | {c['outcome']} | {c['score']} | {c['message'][:160]} |")
    print(f"\nall checks {'hold' if ok else 'DO NOT hold'}; {report['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
