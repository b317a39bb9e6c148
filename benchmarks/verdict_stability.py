"""Same code, same verdict: every GPU fixture graded several times, one grade at a time and
several at once, on one GPU.

    python benchmarks/verdict_stability.py [--runs 3] [--jobs 1 4] [--fixture NAME ...] [--json out.json]

Each fixture (tests/fixtures/good and every folder of tests/fixtures/gpu: honest, slow and each
cheat) is graded on vector_add (its scoring size for the timing, one small case for correctness),
`--runs` times at each `--jobs` value, with the run cache shared as in a batch. A verdict is the
performance outcome, its severity, whether it earned speed points and whether every correctness
case passed. The table shows each fixture's verdicts at each --jobs value and whether they are
all the same and the expected one (honest: passed, never flagged; each cheat: no speed credit,
with the severity tests/gpu/test_gpu.py names). Exit 1 if any is not.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from test_gpu import CHEATS  # noqa: E402
from timing_proof import grade, perf_of  # noqa: E402

from grader.judge.runcache import RunCache  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
HONEST = {"good", "gpu/honest_two_streams", "gpu/honest_slow_wrapper", "gpu/slow10"}


def all_fixtures() -> list[str]:
    return ["good"] + sorted(f"gpu/{p.name}" for p in (FIXTURES / "gpu").iterdir()
                             if (p / "kernels" / "vector_add.py").is_file())


def expected(fixture: str) -> tuple[str, str]:
    name = fixture.removeprefix("gpu/")
    if name in CHEATS:
        return "flagged", CHEATS[name][0]
    return "passed", ""


def verdict(run) -> dict:
    t = perf_of(run, "vector_add")
    correct = all(x.outcome == "passed" for x in run.tests if x.kind == "correctness")
    return {"perf": t.outcome, "severity": t.severity, "speed_points": t.score > 0, "correct": correct,
            "ratio": t.details.get("ratio_to_reference"), "message": t.message[:300]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--fixture", action="append", help="a fixture (default: good and every gpu/ fixture)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    fixtures = args.fixture or all_fixtures()
    cache = RunCache.temporary()
    opts_kw = {"isolation": "sandbox", "cache": str(cache.folder)}
    report: dict = {"runs": args.runs, "jobs": args.jobs, "verdicts": {}, "seconds": {}}
    lock = threading.Lock()

    def one(jobs: int, fixture: str, i: int) -> None:
        started = time.time()
        run = grade(fixture, ["vector_add"], ["n=1048577"], opts_kw)
        v = verdict(run)
        with lock:
            report.setdefault("environment", run.environment)
            report["verdicts"].setdefault(fixture, {}).setdefault(str(jobs), []).append(v)
            print(f"--jobs {jobs} run {i} {fixture}: {v['perf']} {v['severity']} ratio {v['ratio']} "
                  f"({time.time() - started:.0f} s) {v['message'][:140]}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(report, indent=2, default=str))

    try:
        for jobs in args.jobs:
            t0 = time.time()
            with ThreadPoolExecutor(jobs) as pool:
                for future in [pool.submit(one, jobs, f, i) for i in range(args.runs) for f in fixtures]:
                    future.result()
            report["seconds"][str(jobs)] = round(time.time() - t0, 1)
    finally:
        cache.remove()
    env = report.get("environment", {})
    print(f"\nGPU: {env.get('gpu')}; torch {env.get('torch')}, triton {env.get('triton')}; "
          f"{args.runs} runs at each of --jobs {', '.join(map(str, args.jobs))}")
    print("\n| fixture | expected | " + " | ".join(f"--jobs {j}" for j in args.jobs) + " | same every time |")
    print("|---" * (3 + len(args.jobs)) + "|")
    ok = True
    for fixture in fixtures:
        want = expected(fixture)
        cells, seen = [], set()
        for j in args.jobs:
            vs = report["verdicts"].get(fixture, {}).get(str(j), [])
            keys = [(v["perf"], v["severity"], v["speed_points"], v["correct"]) for v in vs]
            seen.update(keys)
            ratios = [v["ratio"] for v in vs if v["ratio"] is not None]
            spread = f", ratio {min(ratios):.3f}-{max(ratios):.3f}" if ratios else ""
            cells.append("; ".join(f"{p}{'/' + s if s else ''}" for p, s, *_ in sorted(set(keys))) + f" ({len(vs)} runs{spread})")
        stable = len(seen) == 1 and next(iter(seen))[:2] == want and (want[0] == "passed") == next(iter(seen))[2]
        ok &= stable
        print(f"| {fixture} | {want[0]}{'/' + want[1] if want[1] else ''} | " + " | ".join(cells) + f" | {'yes' if stable else 'NO'} |")
    print(f"\nseconds per --jobs value: {report['seconds']}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
