"""The same `grader grade` run by two installs of the grader, side by side, alternating.

Installs a previous release (a git ref, default 1a7f869) and the working tree into two folders
of their own (`pip install --no-deps --target`, each run with its folder first on the path, so
torch and the other dependencies are the machine's, and only the grader differs), builds one
synthetic class (tests/bench/synthetic_class.py's mix), fetches it once, and grades it with each
install in turn, `--rounds` times, alternating which goes first. On a shared machine the load
changes from minute to minute: alternating and reporting the ratio of each pair keeps that out
of the comparison. It also checks that both give every student the same verdicts.

    python benchmarks/throughput_compare.py                           # the CPU interpreter, tiny cases
    python benchmarks/throughput_compare.py --device cuda --students 11 --jobs 4 --full-cases

Prints a Markdown table and writes every figure to WORKDIR/compare.json.
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
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "bench"))

from classbuild import make_repo  # noqa: E402
from synthetic_class import mix  # noqa: E402


def sh(*args: str, cwd: Path | None = None, env: dict | None = None) -> str:
    return subprocess.run(args, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def install(name: str, source: Path, into: Path) -> Path:
    """The grader from `source` installed (not editable) into a folder of its own, beside this
    python's packages (torch and the other dependencies are this machine's: only the grader
    differs); returns a launcher that runs this python with that folder first on its path. (A
    venv would not do: where this python is itself a venv, a venv made from it sees only the
    base interpreter's packages.)"""
    folder = into / name
    # the wheel built by this python's own setuptools (offline too, as on a GPU machine)
    wheels = into / f"{name}-wheel"
    sh(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source))
    sh(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder / "site"),
       *map(str, wheels.glob("*.whl")))
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={folder / "site"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    where = sh(str(python), "-c", "import grader; print(grader.__file__)", cwd=into).strip()
    if not where.startswith(str(folder)):
        raise SystemExit(f"{name}: the grader imported from {where}, not from {folder}")
    return python


def export(ref: str, dest: Path) -> Path:
    """The tree of `ref` ("WORKTREE": the working tree as it is, untracked files included; a
    folder: that tree, e.g. a release exported where there is no git history)."""
    if Path(ref).is_dir():
        shutil.copytree(ref, dest)
        return dest
    dest.mkdir(parents=True)
    if ref == "WORKTREE":
        files = sh("git", "ls-files", "-co", "--exclude-standard", "-z", cwd=REPO_ROOT).split("\0")
        for f in filter(None, files):
            src = REPO_ROOT / f
            if src.is_file():
                (dest / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / f)
    else:
        archive = subprocess.run(["git", "archive", ref], cwd=REPO_ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def verdicts(out: Path) -> dict:
    """student/assignment -> (score, outcomes of its tests), from the records."""
    found = {}
    for path in sorted(out.glob("students/*/jobs/*.json")):
        if path.name.endswith(".infra_error.json"):
            continue
        r = json.loads(path.read_text())
        tests = (r.get("result") or {}).get("tests", [])
        found[f"{r['student']}/{r['assignment']}"] = [r["status"], sum(t.get("score", 0) for t in tests),
                                                       sorted(f"{t['name']}:{t['outcome']}" for t in tests)]
    return found


def differences(before: dict, after: dict) -> list[str]:
    """Which jobs' verdicts differ and how: status, outcomes, or only the points (on a GPU the
    speed's points move with the timing's noise; on the CPU they never do)."""
    found = []
    for job in sorted(set(before) | set(after)):
        b, a = before.get(job), after.get(job)
        if b == a:
            continue
        if b is None or a is None:
            found.append(f"{job}: graded by one side only")
        elif b[0] != a[0] or b[2] != a[2]:
            gone, new = sorted(set(b[2]) - set(a[2])), sorted(set(a[2]) - set(b[2]))
            found.append(f"{job}: status {b[0]} -> {a[0]}; outcomes {gone} -> {new}")
        else:
            found.append(f"{job}: points {b[1]:.4f} -> {a[1]:.4f} (the same outcomes)")
    return found


def installed_sides(baseline: str, candidate: str, work: Path) -> dict:
    """Both installs compared, each exported into `work` and installed: name -> ref, source, python
    (and the short commit where the ref is one)."""
    sides = {}
    for name, ref in (("baseline", baseline), ("candidate", candidate)):
        source = export(ref, work / "src" / name)
        sides[name] = {"ref": ref, "source": source, "python": install(name, source, work / "venvs")}
        if ref != "WORKTREE" and not Path(ref).is_dir():
            sides[name]["commit"] = sh("git", "rev-parse", "--short", ref, cwd=REPO_ROOT).strip()
    return sides


def job_seconds(out: Path) -> list[float]:
    return [json.loads(p.read_text())["seconds"] for p in out.glob("students/*/jobs/*.json") if not p.name.endswith(".infra_error.json")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="1a7f869", help="the git ref to compare against")
    ap.add_argument("--candidate", default="WORKTREE", help="a git ref, or WORKTREE (the default)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/grader-throughput-compare"))
    ap.add_argument("--students", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--assignment", "-a", action="append", default=[])
    ap.add_argument("--full-cases", action="store_true", help="every case (default on the CPU: --case n=1 --case 1x1 --dtype float32)")
    ap.add_argument("--timeout", default="5")
    ap.add_argument("--gpus", default="", help="grade --gpus (e.g. 0 or 0,1; default: the grader's own)")
    args = ap.parse_args()

    work = args.workdir.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    sides = installed_sides(args.baseline, args.candidate, work)
    students = mix(args.students)
    for student, fixture in students.items():
        make_repo(work / "repos" / student, fixture)
    (work / "roster.csv").write_text("student,repo\n" + "".join(f"{s},repos/{s}\n" for s in students))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sh(str(sides["candidate"]["python"]), "-m", "grader", "fetch", "--roster", "roster.csv", "--out", "ws", cwd=work,
       env=dict(env, GRADER_COURSE=str(sides["candidate"]["source"])))

    assignments = args.assignment or ["vector_add", "softmax"]
    options = ["--device", args.device, "--jobs", str(args.jobs), "--seed", "1234", "--timeout", args.timeout,
               *(["--gpus", args.gpus] if args.gpus else []),
               *[f"--assignment={a}" for a in assignments]]
    if not args.full_cases and args.device == "cpu":
        options += ["--case", "n=1", "--case", "1x1", "--dtype", "float32"]
    runs = []
    for r in range(args.rounds):
        order = ["baseline", "candidate"] if r % 2 == 0 else ["candidate", "baseline"]
        pair = {}
        for name in order:
            out = work / f"out-{name}-{r}"
            before = os.getloadavg()[0]
            start = time.monotonic()
            proc = subprocess.run([str(sides[name]["python"]), "-m", "grader", "grade", "--lock", "ws/lock.json", "--out", str(out),
                                   *options], cwd=work, env=dict(env, GRADER_COURSE=str(sides[name]["source"]), COLUMNS="160"),
                                  capture_output=True, text=True)
            wall = time.monotonic() - start
            seconds = job_seconds(out)
            pair[name] = {"rc": proc.returncode, "wall_s": round(wall, 2), "load_before": round(before, 2),
                          "load_after": round(os.getloadavg()[0], 2), "jobs": len(seconds),
                          "job_s_median": round(statistics.median(seconds), 2) if seconds else None,
                          "job_s_sum": round(sum(seconds), 1), "verdicts": verdicts(out)}
            if proc.returncode not in (0, 1):
                print(proc.stdout[-2000:], proc.stderr[-2000:])
            print(f"round {r} {name}: {pair[name]['wall_s']} s wall, median job {pair[name]['job_s_median']} s, "
                  f"load {pair[name]['load_before']}->{pair[name]['load_after']}", flush=True)
        pair["ratio"] = round(pair["candidate"]["wall_s"] / pair["baseline"]["wall_s"], 3)
        pair["same_verdicts"] = pair["candidate"]["verdicts"] == pair["baseline"]["verdicts"]
        pair["differ"] = differences(pair["baseline"]["verdicts"], pair["candidate"]["verdicts"])
        for line in pair["differ"]:
            print(f"  differ: {line}")
        runs.append(pair)

    print(f"\nbaseline {args.baseline}, candidate {args.candidate}; {len(students)} students x {', '.join(assignments)}, "
          f"--jobs {args.jobs}, {args.device}, {os.cpu_count()} cores\n")
    print("| round | baseline wall s | candidate wall s | candidate / baseline | baseline median job s | candidate median job s "
          "| job-seconds sum (b / c) | load (1 min) | same verdicts |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r, p in enumerate(runs):
        b, c = p["baseline"], p["candidate"]
        print(f"| {r} | {b['wall_s']} | {c['wall_s']} | {p['ratio']} | {b['job_s_median']} | {c['job_s_median']} | "
              f"{b['job_s_sum']} / {c['job_s_sum']} | {min(b['load_before'], c['load_before'])}-{max(b['load_after'], c['load_after'])} "
              f"| {'yes' if p['same_verdicts'] else 'NO'} |")
    ratios = [p["ratio"] for p in runs]
    print(f"\nmedian ratio {statistics.median(ratios):.3f}")
    for p in runs:
        for name in ("baseline", "candidate"):
            p[name].pop("verdicts")
    (work / "compare.json").write_text(json.dumps({"baseline": args.baseline, "candidate": args.candidate, "students": len(students),
                                                    "assignments": assignments, "jobs": args.jobs, "device": args.device,
                                                    "runs": runs, "median_ratio": statistics.median(ratios)}, indent=2))
    print(f"full figures: {work / 'compare.json'}")
    return 0 if all(p["same_verdicts"] for p in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
