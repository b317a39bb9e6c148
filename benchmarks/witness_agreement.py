"""How closely the grader's own clock (grader.judge.witness) agrees with the worker's figures on
honest kernels, and what it costs a job.

    python benchmarks/witness_agreement.py [--runs 2] [-a vector_add ...] [--fixture gpu/honest_syncs ...] [--json out.json]

For every assignment with a speed score, grades the correct sample (tests/fixtures/good) with one
correctness case and the scoring case, `--runs` times, by the real command
(`python -m grader check ... --device cuda`); then each `--fixture` (an overlay on the sample, as
the tests build them) on vector_add. Prints, per run: the agreement (the grader's clock over the
worker's figure, median of the rounds; 1.0 is perfect, above 1 + AGREEMENT_MARGIN the score
moves to the grader's clock), whether the burst was a CUDA graph, calls per burst, the witness's
seconds and the whole timing stage's, and the outcome. Exits 1 if an honest run is flagged or not
confirmed. GPU only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "tests"))

from conftest import build_submission  # noqa: E402 - the sample overlaid with a fixture, as the tests build it
from grader.judge.witness import AGREEMENT_MARGIN  # noqa: E402
from grader.settings import Settings  # noqa: E402
from grader.spec import Course  # noqa: E402

def grade(sub: Path, assignment: str, case: str, dtype: str, seed: int, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "grader", "check", str(sub), "--device", "cuda", "--seed", str(seed), "-a", assignment,
               "--case", case, "--dtype", dtype, "--json", str(out / "results.json"), "--html", str(out)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if not (out / "results.json").is_file():
        return {"error": proc.stderr[-1500:]}
    tests = json.loads((out / "results.json").read_text())["tests"]
    perf = next((t for t in tests if t["tags"][1] == "performance"), None)
    if perf is None:
        return {"error": "no performance result"}
    details = perf["extra_data"].get("details", {})
    seen = details.get("witness", {})
    return {"outcome": perf["outcome"], "severity": perf["extra_data"].get("severity"), "agreement": seen.get("agreement"),
            "confirmed": seen.get("confirmed"), "graph": seen.get("graph"), "calls": seen.get("calls"),
            "witness_s": seen.get("cost_s"), "prepare_s": seen.get("prepare_s"), "witness": seen, "timing_s": details.get("phase_seconds", {}).get("timed_rounds"),
            "ratio": details.get("ratio_to_reference"), "eager": seen.get("eager"), "output": perf["output"][:400]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("-a", "--assignment", action="append", default=[])
    parser.add_argument("--fixture", action="append", default=[])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    specs = {name: s for name, s in Course.find(Settings()).catalogue().items() if s.performance is not None}
    plan = [("good", name) for name in (args.assignment or sorted(specs))] + [(f, "vector_add") for f in args.fixture]
    rows, bad = [], 0
    with tempfile.TemporaryDirectory(prefix="grader-witness-") as tmp:
        for fixture, name in plan:
            spec = specs[name]
            sub = build_submission(Path(tmp) / fixture.replace("/", "_") / name, fixture)
            for run in range(args.runs):
                out = Path(tmp) / f"out-{fixture.replace('/', '_')}-{name}-{run}"
                out.mkdir(parents=True)
                row = {"submission": fixture, "assignment": name, "run": run,
                       **grade(sub, name, spec.cases[0].name, spec.performance.dtype, 3 + run, out)}
                rows.append(row)
                honest = row.get("outcome") in ("passed", "failed") and row.get("confirmed")
                bad += not honest
                print(f"{fixture:24} {name:16} run {run}: agreement {row.get('agreement')} graph {row.get('graph')} "
                      f"calls {row.get('calls')} witness {row.get('witness_s')} s (prepare {row.get('prepare_s')}) of timing {row.get('timing_s')} s; "
                      f"{row.get('outcome')} ratio {row.get('ratio')}" + ("" if honest else f"  <-- {row}"), flush=True)
    agreements = [r["agreement"] for r in rows if r.get("agreement") is not None]
    if agreements:
        print(f"agreement: min {min(agreements):.4f}, max {max(agreements):.4f} over {len(agreements)} runs "
              f"(margin: {1 + AGREEMENT_MARGIN:.2f})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
