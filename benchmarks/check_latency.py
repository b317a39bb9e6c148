"""How long a student waits for `grader check`, with and without what checks keep between runs.

    python benchmarks/check_latency.py [--runs 4] [--device auto] [-a vector_add ...] [--json out.json] [-- extra check options]

Runs the real command (`python -m grader check SUBMISSION`) `--runs` times in each of two
settings, alternating them so a busy machine slows both alike:

- cold: nothing kept (GRADER_CACHE_GB=0): every check makes its performance input sets, starts
  its zygotes and compiles the reference's and the student's kernels anew, as each check did
  before the cache and the warm zygote;
- kept: each setting's own cache folder (GRADER_CACHE_DIR), its first run fills it and starts
  the warm zygote, the later runs reuse them.

Prints each run's wall seconds and exit status, then the median of the later runs (after the
first) of each setting and their ratio (kept / cold). Each check's score must be the same in
both settings: the script exits 1 if not, or if a check fails to run. Warm zygotes it started
are stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


def run_check(submission: Path, assignments: list[str], device: str, extra: list[str], env: dict, out: Path) -> dict:
    argv = [sys.executable, "-m", "grader", "check", str(submission), "--device", device,
            "--json", str(out / "results.json"), "--html", str(out), *[x for a in assignments for x in ("-a", a)], *extra]
    began = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - began
    score = re.search(r"Score: ([0-9.]+) / ([0-9.]+)", proc.stdout)
    record = {"seconds": round(seconds, 2), "status": proc.returncode, "score": score.group(1) if score else None,
              "tail": proc.stdout[-600:] + proc.stderr[-600:]}
    try:  # the grade's own time, and where each timing's went (its phase_seconds)
        results = json.loads((out / "results.json").read_text())
        record["grading_s"] = results.get("execution_time")
        record["timing_phases"] = {t["name"]: t["extra_data"]["details"]["phase_seconds"] for t in results["tests"]
                                   if "phase_seconds" in t.get("extra_data", {}).get("details", {})}
    except (OSError, ValueError, KeyError):
        pass
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submission", type=Path, default=ROOT / "tests" / "fixtures" / "good")
    parser.add_argument("-a", "--assignment", action="append", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("extra", nargs="*", help="more options for grader check (after --)")
    args = parser.parse_args()
    assignments = args.assignment or ["vector_add"]
    base = tempfile.mkdtemp(prefix="grader-check-latency-")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               COLUMNS="200", GRADER_WARM_SECONDS="300")
    env.pop("CI", None)
    env.pop("GITHUB_ACTIONS", None)
    settings = {"cold": dict(env, GRADER_CACHE_GB="0"), "kept": dict(env, GRADER_CACHE_DIR=str(Path(base) / "kept"))}
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    try:
        for i in range(args.runs):
            for name in (settings if i % 2 == 0 else reversed(list(settings))):
                out = Path(base) / f"{name}-{i}"
                r = run_check(args.submission, assignments, args.device, args.extra, settings[name], out)
                runs[name].append(r)
                print(f"run {i} {name:5}: {r['seconds']:7.2f} s  exit {r['status']}  score {r['score']}  "
                      f"grading {r.get('grading_s') or 0:.2f} s  timing phases {json.dumps(r.get('timing_phases', {}))}", flush=True)
    finally:
        stop_warm(Path(base))  # the warm zygotes of both settings and the kept setting's warm judge
        shutil.rmtree(base, ignore_errors=True)
    ok = all(r["score"] is not None and r["status"] in (0, 1) for rs in runs.values() for r in rs)
    scores = {r["score"] for rs in runs.values() for r in rs}
    later = {name: statistics.median(r["seconds"] for r in rs[1:]) if len(rs) > 1 else None for name, rs in runs.items()}
    print(f"\n{'setting':8} {'first run s':>12} {'later runs median s':>20}")
    for name, rs in runs.items():
        print(f"{name:8} {rs[0]['seconds']:12.2f} {later[name] if later[name] is not None else float('nan'):20.2f}")
    ratio = later["kept"] / later["cold"] if later["kept"] and later["cold"] else None
    if ratio is not None:
        print(f"ratio kept / cold (later runs): {ratio:.3f}")
    print(f"same score every run: {'yes' if len(scores) == 1 else 'NO: ' + ', '.join(map(str, scores))}")
    if args.json:
        args.json.write_text(json.dumps({"assignments": assignments, "device": args.device, "runs": runs,
                                         "later_median_s": later, "ratio": ratio}, indent=2))
    if not ok:
        for rs in runs.values():
            for r in rs:
                if r["score"] is None or r["status"] not in (0, 1):
                    print(r["tail"], file=sys.stderr)
    return 0 if ok and len(scores) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
