"""Throughput of `grader grade` on a synthetic class, serial against parallel.

Builds a class of N student repos (default 30) mixing correct, slow (correct but slow),
buggy and hanging submissions from tests/fixtures, fetches it, grades it once per --jobs value
(each in its own output folder, same seed), and reports wall time, students per hour and per
GPU-hour, and whether the timing ratios of the correct submissions stay within the stability
bar when jobs overlap:

- all correct submissions are the same code, so within one run their ratios to the reference
  differ only by measurement noise: the run's coefficient of variation (CV) must be <= the bar;
- the median ratio of the parallel run must be within the bar of the serial run's.

On the GPU machine (the figures for docs/performance.md):
    python tests/bench/synthetic_class.py --out /tmp/synthetic --device cuda --jobs 1 2 4 8
    python tests/bench/synthetic_class.py --out /tmp/class --device cuda --students 12 -a vector_add -a softmax --jobs 0
(`--jobs 0`: no --jobs given, the grader's own choice, 2 per GPU)
On a CPU-only machine (Triton's interpreter, CI-sized cases; no timing, so no ratios):
    python tests/bench/synthetic_class.py --out /tmp/synthetic-cpu --device cpu --jobs 1 2 -a vector_add -a softmax \\
        --timeout 5 --case n=1 --case 1x1 --dtype float32
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

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

from classbuild import make_repo  # noqa: E402

BUGGY = ["missing_mask", "floor_grid", "row_stride", "short_row", "wrong_dtype", "returns_input", "writes_nothing",
         "raises", "os_exit", "syntax_error", "torch_softmax"]


def mix(n: int) -> dict[str, str]:
    """Student -> fixture: 40% correct, 20% slow, 25% buggy, 15% hanging, interleaved."""
    pattern = ["good", "slow", "buggy", "good", "hangs", "good", "buggy", "slow", "good", "buggy",
               "good", "buggy", "slow", "good", "hangs", "good", "buggy", "good", "slow", "hangs"]
    students, bug = {}, 0
    for i in range(n):
        kind = pattern[i % len(pattern)]
        if kind == "buggy":
            kind, bug = BUGGY[bug % len(BUGGY)], bug + 1
        students[f"student{i:02d}-{kind}"] = kind
    return students


def grader(*args: str, cwd: Path) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
               COLUMNS="160")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def ratios(out: Path, students: dict[str, str]) -> dict[str, dict[str, float]]:
    """assignment -> correct student -> student/reference time ratio, from the records."""
    found: dict[str, dict[str, float]] = {}
    for name, fixture in students.items():
        if fixture != "good":
            continue
        for path in (out / "students" / name / "jobs").glob("*.json"):
            if path.name.endswith(".infra_error.json"):
                continue
            record = json.loads(path.read_text())
            for t in (record.get("result") or {}).get("tests", []):
                ratio = t.get("details", {}).get("ratio_to_reference")
                if t["kind"] == "performance" and ratio:
                    found.setdefault(record["assignment"], {})[name] = ratio
    return found


def phases(out: Path) -> dict[str, dict[str, float]]:
    """Where the jobs' time went: each stage's median and total seconds over the run's records
    (`phase_seconds` of the job, and of its timing: perf.* stages), with the job's own seconds."""
    found: dict[str, list[float]] = {}
    for path in out.glob("students/*/jobs/*.json"):
        if path.name.endswith(".infra_error.json"):
            continue
        record = json.loads(path.read_text())
        found.setdefault("job (wall, in its job process)", []).append(record["seconds"])
        for name, sec in (record.get("phase_seconds") or {}).items():
            found.setdefault(name, []).append(sec)
        for t in (record.get("result") or {}).get("tests", []):
            for name, sec in (t.get("details", {}).get("phase_seconds") or {}).items():
                found.setdefault(f"perf.{name}", []).append(sec)
    return {k: {"median": round(statistics.median(v), 2), "total": round(sum(v), 1), "n": len(v)} for k, v in found.items()}


def spread(values: list[float]) -> dict:
    if not values:
        return {}
    mean = statistics.fmean(values)
    return {"n": len(values), "median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "cv": round(statistics.pstdev(values) / mean, 4) if mean else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--students", type=int, default=30)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--gpus", default="all")
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2, 4, 8],
                    help="--jobs values to compare (the first is the baseline); 0: none given, the grader's own choice")
    ap.add_argument("--timeout", default="10", help="seconds one call may take (bounds the hanging submissions)")
    ap.add_argument("--assignment", "-a", action="append", default=[], help="only these assignments (default: all)")
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--dtype", action="append", default=[])
    ap.add_argument("--seed", default="1234")
    ap.add_argument("--stability-bar", type=float, default=0.05, help="allowed CV and median shift of the ratios")
    args = ap.parse_args()

    root = args.out.resolve()
    if root.exists():
        shutil.rmtree(root)
    students = mix(args.students)
    for name, fixture in students.items():
        make_repo(root / "repos" / name, "good" if fixture == "good" else fixture)
    (root / "roster.csv").write_text("student,repo\n" + "".join(f"{s},repos/{s}\n" for s in students))
    rc, text, _ = grader("fetch", "--roster", "roster.csv", "--out", "ws", cwd=root)
    if rc != 0:
        print(text)
        return 1

    n_gpus = 1
    if args.device == "cuda":
        import torch

        n_gpus = torch.cuda.device_count() if args.gpus == "all" else len(args.gpus.split(","))
    extra = [f"--assignment={a}" for a in args.assignment] + [f"--case={c}" for c in args.case] + [f"--dtype={d}" for d in args.dtype]
    runs = []
    for jobs in args.jobs:
        out = root / f"jobs-{jobs}"
        rc, text, wall = grader("grade", "--lock", "ws/lock.json", "--out", str(out), "--device", args.device, "--gpus", args.gpus,
                                *(["--jobs", str(jobs)] if jobs else []), "--seed", args.seed, "--timeout", args.timeout, *extra, cwd=root)
        summary = json.loads((out / "summary.json").read_text())
        run = {"jobs": jobs, "rc": rc, "wall_s": round(wall, 1), "load_average": os.getloadavg(), "students_per_hour": round(len(students) / wall * 3600, 1),
               "students_per_gpu_hour": round(len(students) / (wall / 3600 * n_gpus), 1), "counts": summary["counts"],
               "ratios": {a: spread(list(r.values())) for a, r in ratios(out, students).items()}, "phases": phases(out)}
        runs.append(run)
        print(f"--jobs {jobs}: {run['wall_s']} s, {run['students_per_gpu_hour']} students per GPU-hour, counts {summary['counts']}",
              flush=True)

    base = runs[0]
    report = {"students": len(students), "mix": {k: sum(1 for f in students.values() if (f if f in ("good", "slow", "hangs") else "buggy") == k)
                                                 for k in ("good", "slow", "buggy", "hangs")},
              "device": args.device, "gpus": n_gpus, "stability_bar": args.stability_bar, "runs": runs}
    header = ["--jobs", "wall s", "students / GPU-hour", "speed-up", *[f"{a} ratio median (CV)" for a in sorted(base["ratios"])],
              "timing within the bar"]
    print("\n| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
    for run in runs:
        ok = all(r.get("cv") is not None and r["cv"] <= args.stability_bar
                 and abs(r["median"] / base["ratios"][a]["median"] - 1) <= args.stability_bar
                 for a, r in run["ratios"].items()) if run["ratios"] else None
        run["timing_within_bar"] = ok
        cells = [f"{run['ratios'][a]['median']} ({run['ratios'][a]['cv']:.1%})" for a in sorted(base["ratios"]) if a in run["ratios"]]
        row = [run["jobs"], run["wall_s"], run["students_per_gpu_hour"], f"{base['wall_s'] / run['wall_s']:.2f}x", *cells,
               "n/a (no timing)" if ok is None else ("yes" if ok else "NO")]
        print("| " + " | ".join(map(str, row)) + " |")
    print("\nWhere a job's time goes (seconds: median per job, and the total over the run)\n")
    print("| stage | " + " | ".join(f"--jobs {r['jobs']} median | total" for r in runs) + " |")
    print("|---|" + "---|---|" * len(runs))
    for name in dict.fromkeys(k for r in runs for k in r["phases"]):
        cells = [f"{r['phases'][name]['median']} | {r['phases'][name]['total']}" if name in r["phases"] else "- | -" for r in runs]
        print(f"| {name} | " + " | ".join(cells) + " |")
    (root / "throughput.json").write_text(json.dumps(report, indent=2))
    print(f"\nfull figures: {root / 'throughput.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
