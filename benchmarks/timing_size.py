"""The timing size, chosen for the measurement: the same checks at today's and at smaller scoring sizes.

    python benchmarks/timing_size.py [--runs 3] [--variant NAME ...] [--json out.json]

A scoring size must be long enough for the events' resolution and a working set well above L2;
past that, every byte more is only host time (input sets made, loaded, results checked). Each
variant is a copy of this course whose specs time vector_add, dropout and softmax at other sizes
(nothing else differs); the real command, `python -m grader check FIXTURE -a ... --device cuda
--seed 3`, grades tests/fixtures/good (all three) and tests/fixtures/gpu/slow10 (vector_add and
softmax: about 10% more work than the reference) with each variant in turn, alternating, each
variant with its own kept cache (its first check fills it, a check on a fresh machine: "cold").

Printed per variant and assignment: the good kernel's ratio to the reference (min-max over the kept
runs) and its spread (max/min - 1: at most 3% is the bar), whether slow10 was measured slower
(its interval above 1) every run, the score, and the check's seconds (cold, kept median), so the
sizes are compared side by side in one run. Exit 1 if a check fails to run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from grader.resident import stop_warm  # noqa: E402

# each spec's scoring case as it is written in spec.py, and what a variant writes instead
CASES = {
    "vector_add": 'Case("n=2^28", {"n": 1 << 28})',
    "dropout": 'Case("n=2^28-p=0.5", {"shape": [1 << 28], "p": 0.5})',
    "softmax": 'Case("32768x4096", {"rows": 32768, "cols": 4096})',
}
VARIANTS = {
    "before": dict(CASES),
    # each working set 384-512 MiB (six to eight times an H200's L2), about 0.1 ms on an H200
    "smaller": {
        "vector_add": 'Case("n=2^25", {"n": 1 << 25})',
        "dropout": 'Case("n=2^26-p=0.5", {"shape": [1 << 26], "p": 0.5})',
        "softmax": 'Case("16384x4096", {"rows": 16384, "cols": 4096})',
    },
}
FIXTURES = {"good": ["vector_add", "dropout", "softmax"], "gpu/slow10": ["vector_add", "softmax"]}


def course_copy(variant: str, dest: Path) -> Path:
    """This course with the variant's scoring cases written into its specs (whichever are today's)."""
    for folder in ("assignments", "reference"):
        shutil.copytree(REPO_ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name, case in VARIANTS[variant].items():
        spec = dest / "assignments" / name / "spec.py"
        text = spec.read_text()
        written = next((c for c in [CASES[name], *(v[name] for v in VARIANTS.values())] if c in text), None)
        if written is None:
            raise SystemExit(f"{spec}: no known scoring case to replace")
        spec.write_text(text.replace(written, case))
    return dest


def check(fixture: str, assignments: list[str], course: Path, env: dict, out: Path) -> dict:
    argv = [
        sys.executable,
        "-m",
        "grader",
        "check",
        str(REPO_ROOT / "tests" / "fixtures" / fixture),
        "--device",
        "cuda",
        "--seed",
        "3",
        "--json",
        str(out / "results.json"),
        "--html",
        str(out),
        *[x for a in assignments for x in ("-a", a)],
    ]
    began = time.monotonic()
    proc = subprocess.run(argv, env=dict(env, GRADER_COURSE=str(course)), capture_output=True, text=True, cwd=out)
    record: dict = {"seconds": round(time.monotonic() - began, 2), "status": proc.returncode, "perf": {}}
    try:
        results = json.loads((out / "results.json").read_text())
        record["score"] = results.get("score")
        record["not_passed"] = [
            {"name": t["name"], "status": t.get("status"), "output": str(t.get("output", ""))[:600]}
            for t in results["tests"]
            if t.get("status") not in ("passed", None)
        ]
        for t in results["tests"]:
            d = t.get("extra_data", {}).get("details", {})
            if "ratio_to_reference" in d or "phase_seconds" in d:
                name = next((a for a in assignments if t["name"].startswith(a) or a in t["name"]), t["name"])
                record["perf"][name] = {
                    "ratio": d.get("ratio_to_reference"),
                    "interval": d.get("ratio_interval"),
                    "outcome": t.get("status"),
                    "score": t.get("score"),
                    "phase_seconds": d.get("phase_seconds"),
                }
    except (OSError, ValueError, KeyError) as exc:
        record["tail"] = f"{exc}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
    return record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="kept checks per variant and fixture (after a cold one)")
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="default: all")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/grader-timing-size"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--fixture", action="append", choices=sorted(FIXTURES), help="default: both")
    args = ap.parse_args()
    variants = args.variant or list(VARIANTS)
    work = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    courses = {v: course_copy(v, work / "courses" / v) for v in variants}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI", "GITHUB_ACTIONS", "GRADER_CACHE_DIR")}
    env.update(COLUMNS="200", GRADER_WARM_SECONDS="600")
    runs: dict = {v: {f: [] for f in FIXTURES} for v in variants}
    ok = True
    try:
        for i in range(args.runs + 1):
            for v in variants if i % 2 == 0 else variants[::-1]:
                for fixture, names in FIXTURES.items():
                    if args.fixture and fixture not in args.fixture:
                        continue
                    out = work / f"{v}-{fixture.replace('/', '_')}-{i}"
                    out.mkdir()
                    r = check(fixture, names, courses[v], dict(env, GRADER_CACHE_DIR=str(work / f"kept-{v}")), out)
                    r["cold"] = i == 0
                    runs[v][fixture].append(r)
                    ok &= "tail" not in r
                    print(
                        f"{'cold' if i == 0 else 'kept'} {i} {v:8} {fixture:11} {r['seconds']:7.2f} s "
                        f"exit {r['status']} "
                        f"score {r.get('score')} "
                        + json.dumps({a: (p["ratio"], p["interval"]) for a, p in r["perf"].items()}),
                        flush=True,
                    )
                    if "tail" in r:
                        print(r["tail"], file=sys.stderr)
                    if args.json:
                        args.json.write_text(json.dumps(runs, indent=1))
    finally:
        for v in variants:
            stop_warm(work / f"kept-{v}")  # its warm zygotes and judge
    print(
        "\n| variant | assignment | scoring case | good: ratio (min-max, kept runs) | spread "
        "| slow10: slower every run (ratios) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for v in variants:
        for a in FIXTURES["good"]:
            good = [r["perf"].get(a, {}).get("ratio") for r in runs[v]["good"] if not r["cold"]]
            good = [g for g in good if g]
            slow = (
                [r["perf"].get(a, {}) for r in runs[v]["gpu/slow10"] if not r["cold"]]
                if a in FIXTURES["gpu/slow10"]
                else []
            )
            slower = (
                "-"
                if not slow
                else ("yes" if all(s.get("interval") and s["interval"][0] > 1 for s in slow) else "NO")
                + " ("
                + ", ".join(f"{s['ratio']:.3f}" for s in slow if s.get("ratio"))
                + ")"
            )
            spread = f"{max(good) / min(good) - 1:.1%}" if good else "-"
            figures = f"{min(good):.3f}-{max(good):.3f}" if good else "-"
            print(f"| {v} | {a} | {VARIANTS[v][a].split(chr(34))[1]} | {figures} | {spread} | {slower} |")
    print("\n| variant | fixture | cold s | kept median s | scores |")
    print("| --- | --- | --- | --- | --- |")
    for v in variants:
        for fixture in FIXTURES:
            rs = runs[v][fixture]
            kept = [r["seconds"] for r in rs if not r["cold"]]
            cold = next((r["seconds"] for r in rs if r["cold"]), None)
            print(
                f"| {v} | {fixture} | {cold} | {statistics.median(kept) if kept else '-'} | "
                f"{sorted({str(r.get('score')) for r in rs})} |"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
