"""A student's `grader check` by two installs of the grader, side by side, alternating.

Installs a previous release (a git ref or a folder, default ee5d6b5) and the working tree side by
side (as benchmarks/throughput_compare.py does: only the grader differs), then runs the
real command, `python -m grader check tests/fixtures/good -a ASSIGNMENT --device cuda`, with each
install in turn: first cold (GRADER_CACHE_GB=0, nothing kept: a check on a fresh machine), then
`--runs` times with each install's own kept cache (its first run fills it), alternating which goes
first. Each install grades with its own course (GRADER_COURSE: its tree's assignments/ and
reference/). Prints each run's seconds and score and the medians' ratio (candidate / baseline).

    python benchmarks/check_compare.py --device cuda -a vector_add --runs 3
    python benchmarks/check_compare.py --device cpu --runs 2 -- --case n=1 --dtype float32

Writes every figure to WORKDIR/check_compare.json. Exits 1 if a check fails to run or the two
installs score the correct submission differently.
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
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
sys.path.insert(0, str(REPO_ROOT))

from throughput_compare import installed_sides  # noqa: E402

from grader.resident import stop_warm  # noqa: E402


def check(python: Path, source: Path, assignments: list[str], device: str, extra: list[str], env: dict,
          out: Path) -> dict:
    argv = [str(python), "-m", "grader", "check", str(REPO_ROOT / "tests" / "fixtures" / "good"), "--device", device,
            "--seed", "3", "--json", str(out / "results.json"), "--html", str(out),
            *[x for a in assignments for x in ("-a", a)], *extra]
    began = time.monotonic()
    proc = subprocess.run(argv, env=dict(env, GRADER_COURSE=str(source)), capture_output=True, text=True,
                          cwd=out.parent)
    seconds = time.monotonic() - began
    score = re.search(r"Score: ([0-9.]+) / ([0-9.]+)", proc.stdout)
    record = {"seconds": round(seconds, 2), "status": proc.returncode, "score": score.group(1) if score else None}
    try:
        results = json.loads((out / "results.json").read_text())
        record["grading_s"] = round(results.get("execution_time") or 0, 2)
        record["timing_phases"] = {t["name"]: t["extra_data"]["details"]["phase_seconds"] for t in results["tests"]
                                   if "phase_seconds" in t.get("extra_data", {}).get("details", {})}
    except (OSError, ValueError, KeyError):
        record["tail"] = proc.stdout[-800:] + proc.stderr[-800:]
    return record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="ee5d6b5")
    ap.add_argument("--candidate", default="WORKTREE")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/grader-check-compare"))
    ap.add_argument("-a", "--assignment", action="append", default=[])
    ap.add_argument("--catalogue", action="store_true", help="every assignment in one check (no -a)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=3, help="kept runs per install (the first fills its cache)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold run")
    ap.add_argument("extra", nargs="*", help="more options for grader check (after --)")
    args = ap.parse_args()
    work = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sides = installed_sides(args.baseline, args.candidate, work)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI", "GITHUB_ACTIONS", "GRADER_CACHE_DIR")}
    env.update(COLUMNS="200", GRADER_WARM_SECONDS="600")
    assignments = [] if args.catalogue else args.assignment or ["vector_add"]
    runs: dict[str, dict[str, list[dict]]] = {name: {"cold": [], "kept": []} for name in sides}
    settings = {"cold": lambda name: dict(env, GRADER_CACHE_GB="0"),
                "kept": lambda name: dict(env, GRADER_CACHE_DIR=str(work / f"kept-{name}"))}
    plan = ([] if args.no_cold else [("cold", 0)]) + [("kept", i) for i in range(args.runs)]
    try:
        for setting, i in plan:
            for name in (("baseline", "candidate") if i % 2 == 0 else ("candidate", "baseline")):
                out = work / f"{name}-{setting}-{i}"
                out.mkdir()
                r = check(sides[name]["python"], sides[name]["source"], assignments, args.device, args.extra,
                          settings[setting](name), out)
                runs[name][setting].append(r)
                print(f"{setting} {i} {name:9}: {r['seconds']:7.2f} s  exit {r['status']}  score {r['score']}  "
                      f"timing phases {json.dumps(r.get('timing_phases', {}))}", flush=True)
    finally:
        for name in sides:
            stop_warm(work / f"kept-{name}")  # its warm zygotes and judge
    later = {name: statistics.median(r["seconds"] for r in runs[name]["kept"][1:]) if len(runs[name]["kept"]) > 1
             else None for name in sides}
    cold = {name: runs[name]["cold"][0]["seconds"] if runs[name]["cold"] else None for name in sides}
    print(f"\n{', '.join(assignments) or 'the whole catalogue'} on {args.device}; baseline {sides['baseline'].get('commit', args.baseline)}, "
          f"candidate {sides['candidate'].get('commit', args.candidate)}\n")
    print("| install | cold s | kept: first run s | kept: later runs median s |")
    print("|---|---|---|---|")
    for name in sides:
        first = runs[name]["kept"][0]["seconds"] if runs[name]["kept"] else None
        print(f"| {name} | {cold[name]} | {first} | {later[name]} |")
    ratios = {"cold": cold["candidate"] / cold["baseline"] if cold["candidate"] and cold["baseline"] else None,
              "kept": later["candidate"] / later["baseline"] if later["candidate"] and later["baseline"] else None}
    print(f"\ncandidate / baseline: cold {ratios['cold']}, kept {ratios['kept']}")
    scores = {name: {r["score"] for s in runs[name].values() for r in s} for name in sides}
    ok = all(r["status"] in (0, 1) and r["score"] is not None for n in sides for s in runs[n].values() for r in s)
    same = scores["baseline"] == scores["candidate"] and len(scores["candidate"]) == 1
    seen = json.dumps({k: sorted(map(str, v)) for k, v in scores.items()})
    print(f"same score every run: {'yes' if same else 'NO: ' + seen}")
    (work / "check_compare.json").write_text(json.dumps({"assignments": assignments, "device": args.device,
                                                         "sides": {n: {k: str(v) for k, v in s.items()}
                                                                   for n, s in sides.items()},
                                                         "runs": runs, "ratios": ratios}, indent=1))
    if not ok:
        for name in sides:
            for s in runs[name].values():
                for r in s:
                    if "tail" in r:
                        print(r["tail"], file=sys.stderr)
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
