"""The GPU suite (tests/gpu/) whole, in one call on one GPU machine, within a time budget.

    python scripts/gpu_tests.py                    # every file of tests/gpu/, 450 s, and at most 25 more to stop
    python scripts/gpu_tests.py --budget 300 --workers 6 --summary gpu-summary.txt
    python scripts/gpu_tests.py --cold              # nothing shared between the tests' checks

Each file runs where it can run right (docs/testing.md, "The GPU suite in one call"):
- test_replay_gpu.py first, alone and serially: its replays are decided as a timed replay is, and
  any other process on the GPU meanwhile (another test's) makes a replay's figure a "retry";
- then every other file in one pytest-xdist pool (`-n WORKERS`), the longest first
  (test_profile_gpu.py: a check and two replays under ncu each; test_batch_gpu.py: a class), so
  the short checks of test_gpu.py fill the workers at the end.
What they share: one GRADER_CACHE_DIR (the reference's compiled kernels, the input sets of each
seed and case: made once, by the first check that needs them, under the cache's own locks), one
GRADER_LOCK_DIR (every check's timing, the batch's jobs' included, holds the GPU alone), the warm
judge and zygote a check leaves behind (GRADER_WARM_SECONDS; stopped at the end), and the honest
twins test_gpu.py compares its cheats with (graded once for the whole pool: tests/gpu/test_gpu.py).
Each phase gets what is left of the budget; at its end a phase still running is interrupted
(SIGINT: pytest then writes what finished), and the tests it did not finish are named.

Prints one line per file (passed, failed, errors, skipped, not run, and the failures' names), and
writes them to --summary where asked. Exit status 0 only when every test of every file passed or
was skipped with its reason and none was left unrun.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU = "tests/gpu"
ALONE = ["test_replay_gpu.py"]  # serially, nothing else on the GPU
POOL_FIRST = ["test_profile_gpu.py", "test_batch_gpu.py"]  # the longest tests of the pool, started first
BUDGET_S = 450.0  # of the 8 minutes one device call may take: room for the stop after it (GRACE_S) and the copy back
GRACE_S = 25.0  # after the SIGINT at a phase's end: pytest writes its report, the workers stop


@dataclass
class Phase:
    name: str
    files: list[str]
    workers: int  # 0: no xdist


@dataclass
class FileResult:
    path: str
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    unrun: list[str] = field(default_factory=list)
    why_skipped: set[str] = field(default_factory=set)  # pytest's reasons, as junit keeps them
    seconds: float = 0.0  # the sum of its tests' own durations (in a pool they overlap)

    @property
    def ok(self) -> bool:
        return not (self.failed or self.errors or self.unrun)

    def line(self) -> str:
        counts = [f"{len(self.passed)} passed"] + [f"{len(v)} {k}" for k, v in (
            ("failed", self.failed), ("errors", self.errors), ("skipped", self.skipped), ("not run", self.unrun)) if v]
        bad = [f"FAILED {n}" for n in self.failed] + [f"ERROR {n}" for n in self.errors] + \
            [f"NOT RUN {n}" for n in self.unrun]
        head = f"{'ok  ' if self.ok else 'FAIL'} {self.path}: {', '.join(counts)} ({self.seconds:.0f} s of tests)"
        if self.why_skipped:
            head += " skipped: " + "; ".join(sorted(self.why_skipped))[:300]
        return head + ("".join(f"\n       {b}" for b in bad) if bad else "")


def plan(files: list[str], workers: int) -> list[Phase]:
    """The phases: the files that must run alone, each serially, then one pool of the others,
    the longest first."""
    names = [Path(f).name for f in files]
    alone = [f for f, n in zip(files, names) if n in ALONE]
    pooled = [f for f, n in zip(files, names) if n not in ALONE]
    pooled.sort(key=lambda f: (POOL_FIRST.index(Path(f).name) if Path(f).name in POOL_FIRST else len(POOL_FIRST), f))
    phases = [Phase(Path(f).stem, [f], 0) for f in alone]
    if pooled:
        phases.append(Phase("pool", pooled, workers))
    return phases


STATUS = re.compile(r"(?:\[gw\d+\]\s+(?:\[\s*\d+%\]\s+)?(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+::\S+))"
                    r"|(?:^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b)")


def live_statuses(output: str) -> dict[str, str]:
    """Each test's outcome from pytest's -v lines (xdist's `[gw0] [ 5%] PASSED id` and plain
    pytest's `id PASSED [ 5%]`): what a phase cut before its end still says."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        m = STATUS.search(line.strip())
        if m:
            status, node = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
            if status == "ERROR" or found.get(node) != "FAILED":  # a teardown error after a pass counts
                found[node] = status
    return found


def junit_results(xml: Path) -> dict[str, tuple[str, float, str]]:
    """node id -> (outcome, seconds, why skipped) from pytest's --junitxml file; {} where there is none."""
    try:
        tree = ET.parse(xml)
    except (OSError, ET.ParseError):
        return {}
    out: dict[str, tuple[str, float, str]] = {}
    for case in tree.iter("testcase"):
        parts, name = case.get("classname", "").split("."), case.get("name", "")
        cut = next((i for i in range(len(parts), 0, -1) if (ROOT / ("/".join(parts[:i]) + ".py")).is_file()),
                   len(parts))  # the module's path, then its classes
        node = "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], name])
        kinds = {child.tag for child in case}
        status = "FAILED" if "failure" in kinds else "ERROR" if "error" in kinds else \
            "SKIPPED" if "skipped" in kinds else "PASSED"
        seconds = float(case.get("time") or 0)
        skip = next((child.get("message", "") for child in case if child.tag == "skipped"), "")
        if node in out and out[node][0] != "PASSED":
            status = out[node][0]  # a test's setup and call, or its call and teardown: the worse one
        out[node] = (status, seconds + (out[node][1] if node in out else 0.0), skip)
    return out


def collect(files: list[str], env: dict[str, str]) -> dict[str, list[str]]:
    """Every test id of each file, as pytest collects it here (a file that does not collect is
    one ERROR of its own)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    ids: dict[str, list[str]] = {f: [] for f in files}
    for line in proc.stdout.splitlines():
        if "::" in line:
            path = line.split("::", 1)[0]
            ids.setdefault(path, []).append(line.strip())
    return ids


def run_phase(phase: Phase, env: dict[str, str], deadline: float,
              reports: Path) -> tuple[str, dict[str, tuple[str, float, str]]]:
    """One phase's pytest, interrupted at `deadline`: its output and junit results."""
    xml = reports / f"{phase.name}.xml"
    argv = [sys.executable, "-m", "pytest", "-v", "-rA", "-p", "no:cacheprovider", f"--junitxml={xml}",
            "-o", "junit_family=xunit1"]
    if phase.workers:
        argv += ["-n", str(phase.workers), "--dist", "load"]
    argv += phase.files
    print(f"== {phase.name}: {' '.join(phase.files)}" + (f" (-n {phase.workers})" if phase.workers else " (serially)"),
          flush=True)
    log = reports / f"{phase.name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"   {phase.name}: the budget ends: interrupted", flush=True)
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return log.read_text(errors="replace"), junit_results(xml)


def summarize(ids: dict[str, list[str]], output: str, junit: dict[str, tuple[str, float, str]]) -> list[FileResult]:
    """Each file's tests by outcome: junit's word where the phase wrote it, else its -v line, else not run."""
    live = live_statuses(output)
    results = []
    for path, tests in ids.items():
        r = FileResult(path)
        if not tests:
            r.errors.append(f"{path} (collected no test)")
        for node in tests:
            status, seconds, skip = junit.get(node, (live.get(node, ""), 0.0, ""))
            r.seconds += seconds
            if skip:
                r.why_skipped.add(skip)
            short = node.split("::", 1)[1]
            {"PASSED": r.passed, "XPASS": r.passed, "FAILED": r.failed, "ERROR": r.errors, "SKIPPED": r.skipped,
             "XFAIL": r.skipped}.get(status, r.unrun).append(short)
        results.append(r)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="test files (default: every tests/gpu/test_*.py)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole suite")
    ap.add_argument("--workers", type=int, default=0, help="the pool's xdist workers (default: from the cores)")
    ap.add_argument("--cold", action="store_true", help="share nothing: each check its own cache, no warm judge")
    ap.add_argument("--summary", type=Path, help="also write the summary lines to this file")
    ap.add_argument("--keep", type=Path, help="keep each phase's pytest log and junit XML in this folder")
    args = ap.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.budget
    files = args.files or sorted(str(p.relative_to(ROOT)) for p in (ROOT / GPU).glob("test_*.py"))
    workers = args.workers or max(2, min(8, (os.cpu_count() or 4) // 2))
    if importlib.util.find_spec("xdist") is None:  # pytest-xdist, for the pool's workers
        print("pytest-xdist is not installed: the pool runs serially", flush=True)
        workers = 0
    shared = Path(tempfile.mkdtemp(prefix="grader-gpu-suite-"))
    reports = args.keep or shared / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if not args.cold:
        (shared / "cache").mkdir(mode=0o700)
        (shared / "locks").mkdir(mode=0o700)
        env.update(GRADER_CACHE_DIR=str(shared / "cache"), GRADER_LOCK_DIR=str(shared / "locks"),
                   GRADER_WARM_SECONDS="900", GRADER_SHARED_TWINS=str(shared / "twins"))
    lines = []
    try:
        ids = collect(files, env)
        output, junit = "", {}
        for phase in plan(files, workers):
            if time.monotonic() >= deadline:
                break
            got, phase_junit = run_phase(phase, env, deadline, reports)
            output += got
            junit.update(phase_junit)
        results = summarize(ids, output, junit)
        took = time.monotonic() - start
        lines = [r.line() for r in results]
        total = {k: sum(len(getattr(r, k)) for r in results)
                 for k in ("passed", "failed", "errors", "skipped", "unrun")}
        lines.append(f"{'ok  ' if all(r.ok for r in results) else 'FAIL'} the GPU suite: {total['passed']} passed, "
                     f"{total['failed']} failed, {total['errors']} errors, {total['skipped']} skipped, "
                     f"{total['unrun']} not run, in {took:.0f} s of {args.budget:.0f} (pool: -n {workers}"
                     f"{', cold' if args.cold else ''})")
        print("\n".join(lines), flush=True)
        if args.summary:
            args.summary.write_text("\n".join(lines) + "\n")
        return 0 if all(r.ok for r in results) else 1
    finally:
        if not args.cold:
            sys.path.insert(0, str(ROOT))
            from grader.resident import stop_warm

            stop_warm(shared / "cache")  # the warm judges and zygotes the checks left
        if args.keep is None:
            shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
