"""Proof of the timing method, on the GPU: stability, resolution, and the cheats.

    python benchmarks/timing_proof.py [--runs 5] [-a NAME ...] [--skip-cheats] [--json out.json]

- Stability: the correct submission (tests/fixtures/good) graded `--runs` times, every
  assignment it solves (or those named by -a) at its scoring size: the spread of its
  student/reference ratio per assignment (max/min - 1) must be at most 3%.
- Resolution: tests/fixtures/gpu/slow10 (about 10% more work than the reference, for
  vector_add and softmax) must be measured slower than the reference in every run.
- Cheats: every tests/fixtures/gpu/cheat_* must be flagged with evidence and earn nothing.
Each run is a full grading session's `grade()` (correctness on each assignment's first case, the
bounds check, then timing) with the same seed, as every student of a batch gets the run's
seed; the run cache (grader.judge.runcache) is shared, as in a batch: the input sets and the
roofline are made once. `--json` is rewritten after every grade, so a cut-off run keeps
what it measured; the tables cover the runs that finished. `--jobs N` grades N runs at once, as `grader grade --jobs` does: their
timing phases still take the GPU one at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import build_submission  # noqa: E402

from grader.spec import Course  # noqa: E402
from grader.judge.context import GradingContext  # noqa: E402
from grader.judge.session import open_session  # noqa: E402
from grader.judge.runcache import RunCache  # noqa: E402
from grader.submission import open_submission  # noqa: E402
from grader.settings import Settings  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
SEED = 100
SPREAD_BAR = 0.03


def solved_by(fixture: str) -> list[str]:
    """The assignments with a performance check whose module the fixture holds."""
    return [name for name, spec in Course.find(Settings()).catalogue().items()
            if spec.performance is not None and (FIXTURES / fixture / spec.module).is_file()]


def perf_of(run, assignment):
    return next(t for t in run.tests if t.assignment == assignment and t.kind == "performance")


def grade(fixture: str, assignments: list[str], cases: list[str] | None, opts_kw: dict, verbose: bool = False):
    started = time.monotonic()

    def progress(step: str) -> None:
        if verbose:
            print(f"    {time.monotonic() - started:6.1f} s  {step}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        sub = open_submission(build_submission(Path(tmp) / "repo", fixture))
        chosen = [Course.find(Settings()).get(a) for a in assignments]
        first_cases = cases or sorted({s.cases[0].name for s in chosen})  # one small case each: the proof is the timing
        run = open_session(GradingContext("cuda", SEED, tuple(first_cases), ("float32",), **opts_kw), Settings()).grade(sub, chosen, progress)
        progress("done")
        return run


def record(t) -> dict:
    d = t.details
    return {"outcome": t.outcome, "ratio": d.get("ratio_to_reference"), "interval": d.get("ratio_interval"),
            "rounds": d.get("rounds"), "figures": d.get("figures"), "phase_seconds": d.get("phase_seconds"), "message": t.message}


def tables(report: dict, runs: int) -> bool:
    env = report.get("environment", {})
    print(f"GPU: {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}")
    print("\n| assignment | runs | good: ratio to reference (min-max) | spread | within 3% | slow10: ratio (min-max) | slow10 slower every run |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    for a, rows in report["stability"].items():
        good = [r["ratio"] for r in rows if r["ratio"]]
        slow = [r["ratio"] for r in report["slow10"].get(a, []) if r["ratio"]]
        spread = max(good) / min(good) - 1 if good else float("nan")
        stable = len(good) == runs and spread <= SPREAD_BAR
        ok &= stable
        cells = [a, str(len(good)), f"{min(good):.3f}-{max(good):.3f}" if good else "-", f"{spread:.1%}", "yes" if stable else "NO"]
        if a in report["slow10"]:
            slower = len(slow) == runs and all(r["interval"] and r["interval"][0] > 1.0 for r in report["slow10"][a])
            ok &= slower
            cells += [f"{min(slow):.3f}-{max(slow):.3f}" if slow else "-", "yes" if slower else "NO"]
        else:
            cells += ["(no slow10 variant)", "-"]
        print("| " + " | ".join(cells) + " |")
    if report["cheats"]:
        print("\n| cheat | outcome | score | evidence |")
        print("| --- | --- | --- | --- |")
    for name, c in report["cheats"].items():
        ok &= c["outcome"] == "flagged" and c["score"] == 0
        print(f"| {name} | {c['outcome']} | {c['score']} | {c['message'][:160]} |")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--assignment", "-a", action="append", default=[], help="only these (default: all that tests/fixtures/good solves)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-cheats", action="store_true", help="stability and resolution only (tests/gpu/test_gpu.py grades the cheats too)")
    parser.add_argument("--jobs", type=int, default=1, help="grades at once (timing phases still one at a time)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print each grading step with its time")
    parser.add_argument("--isolation", default="sandbox", help="how workers are contained (see grader check --isolation)")
    args = parser.parse_args()
    assignments = args.assignment or solved_by("good")
    slow = [a for a in solved_by("gpu/slow10") if a in assignments]
    cache = RunCache.temporary()
    opts_kw = {"isolation": args.isolation, "cache": str(cache.folder)}
    report: dict = {"seed": SEED, "stability": {a: [] for a in assignments}, "slow10": {a: [] for a in slow}, "cheats": {}, "grades": []}
    t0 = time.time()

    def save() -> None:
        report["seconds"] = round(time.time() - t0, 1)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, default=str))

    tasks = [(i, key, fixture, names) for i in range(args.runs)
             for key, fixture, names in (("stability", "good", assignments), ("slow10", "gpu/slow10", slow)) if names]
    done: dict[tuple[str, int], list] = {}
    lock = threading.Lock()

    def one(task) -> None:
        i, key, fixture, names = task
        started = time.time()
        run = grade(fixture, names, None, opts_kw, args.verbose)
        with lock:
            report.setdefault("environment", run.environment)
            report["grades"].append({"run": i, "fixture": fixture, "seconds": round(time.time() - started, 1)})
            done[(key, i)] = [record(perf_of(run, a)) for a in names]
            for a, r in zip(names, done[(key, i)]):
                print(f"run {i} {fixture} {a}: {r['outcome']} {r['message'][:160]}", flush=True)
                print(f"    phases (s): {r['phase_seconds']}", flush=True)
            print(f"run {i} {fixture}: {time.time() - started:.0f} s", flush=True)
            for k in ("stability", "slow10"):  # the finished runs, in run order
                report[k] = {a: [] for a in report[k]}
            for (k, j), rows in sorted(done.items(), key=lambda kv: kv[0][1]):
                for a, r in zip(report[k], rows):
                    report[k][a].append(r)
            save()

    try:
        # grades of several runs may overlap (--jobs): their compile and correctness phases
        # share the GPU, their timing phases take it alone (grader.judge.devicelock), as in a batch
        with ThreadPoolExecutor(args.jobs) as pool:
            for future in [pool.submit(one, t) for t in tasks]:
                future.result()
        for fixture in [] if args.skip_cheats else sorted(p.name for p in (FIXTURES / "gpu").glob("cheat_*")):
            run = grade(f"gpu/{fixture}", ["vector_add"], ["n=1048577"], opts_kw)
            t = perf_of(run, "vector_add")
            print(f"{fixture}: {t.outcome} {t.message[:160]}", flush=True)
            report["cheats"][fixture] = {"outcome": t.outcome, "score": run.score, "message": t.message}
            save()
    finally:
        cache.remove()
    save()
    ok = tables(report, args.runs)
    print(f"\nall checks {'hold' if ok else 'DO NOT hold'}; {report['seconds']} s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
