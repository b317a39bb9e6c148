"""How long `grader check` takes with its assignments graded one after another (`--jobs 1`, as
every check did before) and at once (`--jobs N`), side by side.

    python benchmarks/check_jobs.py [--runs 3] [--jobs N] [--device cpu] [-a vector_add ...] [--json out.json]

Runs the real command (`python -m grader check tests/fixtures/good --device cpu --seed 1`)
`--runs` times in each setting, alternating them so a busy machine slows both alike; both keep
what checks keep between runs (each its own cache folder), so every run after the first is a
student's second check. Prints each run's wall seconds, then the median of the runs after the
first in each setting and their ratio (at once / one after another). Both settings must give the
same score and the same outcome for every test: the script exits 1 if not, or if a check fails
to run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.resident import stop_warm  # noqa: E402


def run_check(submission: Path, jobs: int, device: str, assignments: list[str], cache: Path, out: Path) -> dict:
    env = dict(os.environ, GRADER_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "grader", "check", str(submission), "--device", device, "--seed", "1",
               "--jobs", str(jobs), "--json", str(out / "results.json"), "--html", str(out)]
    for a in assignments:
        command += ["-a", a]
    started = time.monotonic()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else None
    return {"seconds": round(seconds, 2), "exit": proc.returncode, "score": results and results["score"],
            "outcomes": results and {t["name"]: t["outcome"] for t in results["tests"]},
            "stderr": proc.stderr[-2000:] if proc.returncode not in (0, 1) else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    parser.add_argument("--device", default="cpu")
    parser.add_argument("-a", "--assignment", action="append", default=[])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    settings = {"one after another": 1, "at once": args.jobs}
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory(prefix="grader-check-jobs-") as tmp:
        folder = Path(tmp)
        submission = folder / "good"
        shutil.copytree(ROOT / "tests" / "fixtures" / "good", submission)
        try:
            for i in range(args.runs):
                for name, jobs in settings.items():
                    out = folder / f"out-{jobs}-{i}"
                    r = run_check(submission, jobs, args.device, args.assignment, folder / f"cache-{jobs}", out)
                    runs[name].append(r)
                    print(f"run {i + 1} {name} (--jobs {jobs}): {r['seconds']} s, exit {r['exit']}, score {r['score']}", flush=True)
                    if r["stderr"]:
                        print(r["stderr"], file=sys.stderr)
        finally:
            for jobs in settings.values():
                stop_warm(folder / f"cache-{jobs}" / "warm")
    failed = [r for rs in runs.values() for r in rs if r["exit"] not in (0, 1) or r["outcomes"] is None]
    verdicts = {json.dumps([r["score"], r["outcomes"]], sort_keys=True) for rs in runs.values() for r in rs}
    later = {name: statistics.median(r["seconds"] for r in rs[1:] or rs) for name, rs in runs.items()}
    ratio = later["at once"] / later["one after another"]
    print(f"median of the later runs: one after another {later['one after another']:.1f} s, "
          f"at once (--jobs {args.jobs}) {later['at once']:.1f} s, ratio {ratio:.3f}")
    print("the same score and outcomes in every run" if len(verdicts) == 1 else "VERDICTS DIFFER between runs")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "median_later_s": later, "ratio": ratio, "jobs": args.jobs,
                                         "same_verdicts": len(verdicts) == 1}, indent=2))
    return 1 if failed or len(verdicts) != 1 else 0


if __name__ == "__main__":
    sys.exit(main())
