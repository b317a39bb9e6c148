"""The README's first command on a fresh clone, before and after it installed only what a check
needs: the install (`pip install -e ".[dev]"` then, `pip install -e .` now), each in its own
fresh venv that does not see the system's packages, side by side.

    python benchmarks/first_run.py [--runs 1] [--check] [--json out.json]

Each run clones this checkout (git clone of HEAD), makes a venv, installs torch's CPU build as
the command's first part does (`torch==2.13.0+cpu`; pip's cache and find-links as configured, the
same for both), then times the grader's install alone and measures the venv on disk (du). The two
settings alternate so a busy machine slows both alike. Prints each run's seconds and MB, then the
medians and their ratio (now / then). `--check` also runs the command's last part,
`grader check tests/fixtures/good`, once in the new venv, and prints its score.
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
TORCH = ["--no-deps", "torch==2.13.0+cpu", "--index-url", "https://download.pytorch.org/whl/cpu"]
SETTINGS = {"then: .[dev]": ".[dev]", "now: .": "."}


def du_mb(path: Path) -> float:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 1024


def one(target: str, base: Path, env: dict) -> dict:
    clone = base / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    venv = clone / ".venv"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + TORCH, cwd=clone, env=env, check=True)
    torch_mb = du_mb(venv)
    started = time.perf_counter()
    subprocess.run(pip + ["-e", target], cwd=clone, env=env, check=True)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "venv_mb": du_mb(venv), "grader_mb": du_mb(venv) - torch_mb, "clone": str(clone)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--check", action="store_true", help="also run grader check tests/fixtures/good in the new venv")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "GRADER_COURSE")}
    results: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    kept = None
    with tempfile.TemporaryDirectory(prefix="grader-first-run-") as tmp:
        for run in range(args.runs):
            for name, target in SETTINGS.items():
                base = Path(tmp) / f"{run}-{target.strip('.[]') or 'plain'}"
                base.mkdir()
                r = one(target, base, env)
                results[name].append(r)
                print(f"run {run + 1} {name:<14} install {r['seconds']:7.1f} s   venv {r['venv_mb']:7.0f} MB "
                      f"(the grader's part {r['grader_mb']:6.0f} MB)", flush=True)
                if target == "." and args.check and kept is None:
                    kept = Path(r["clone"])
                else:
                    shutil.rmtree(base / "clone", ignore_errors=True)
        summary = {name: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "venv_mb", "grader_mb")}
                   for name, rs in results.items()}
        then, now = summary["then: .[dev]"], summary["now: ."]
        print(f"median install: then {then['seconds']:.1f} s, now {now['seconds']:.1f} s, ratio now/then "
              f"{now['seconds'] / then['seconds']:.2f}")
        print(f"median venv:    then {then['venv_mb']:.0f} MB, now {now['venv_mb']:.0f} MB, ratio now/then "
              f"{now['venv_mb'] / then['venv_mb']:.2f} (the grader's part: {then['grader_mb']:.0f} MB against "
              f"{now['grader_mb']:.0f} MB)")
        if kept is not None:
            started = time.perf_counter()
            proc = subprocess.run([str(kept / ".venv" / "bin" / "grader"), "check", "tests/fixtures/good"], cwd=kept,
                                  env=dict(env, GRADER_CACHE_DIR=str(Path(tmp) / "cache")), capture_output=True, text=True)
            score = [line for line in proc.stdout.splitlines() if line.startswith("Score:")]
            summary["check"] = {"seconds": time.perf_counter() - started, "exit": proc.returncode, "score": score}
            print(f"grader check tests/fixtures/good: {summary['check']['seconds']:.0f} s, exit {proc.returncode}, "
                  f"{' '.join(score) or proc.stdout[-2000:] + proc.stderr[-2000:]}")
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
