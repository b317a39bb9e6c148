"""Behaviour unchanged? A check's and a class's outputs, snapshot by one install and compared with another's.

    python scripts/same_outputs.py snapshot --python PY --course DIR --out before.json
    python scripts/same_outputs.py compare before.json after.json

`snapshot` runs the real commands of the grader installed for `PY` (its course `DIR`: assignments/
and reference/) on the CPU, in a scratch folder: `grader check` of several fixtures (correct, buggy,
raising, hanging) on vector_add and softmax with a fixed seed, then a class of those fixtures
through `grader fetch`, `grader grade` and `grader grade --resume`; it keeps every results.json,
each student's record and results.json, summary.json and the gradebooks (CSV), each command's exit
status and the first line of its output that names a score. What changes from run to run by
nature (seconds, dates, absolute paths, the scratch folder, the grader's own code hash in a record's
key, a job's attempt id, the machine) is replaced by a placeholder; similarity shares are not
compared (copydetect's k-gram hashes change with every process). `compare` prints every field that differs, by its
path, and exits 1 if any does: a refactoring must leave it empty.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

FIXTURES = ["good", "missing_mask", "raises", "hangs", "slow"]
ASSIGNMENTS = ["vector_add", "softmax"]
OPTIONS = ["--device", "cpu", "--seed", "7", "--timeout", "5", "--dtype", "float32",
           "--case", "n=1", "--case", "n=127", "--case", "1x1", "--case", "4x8191"]
VOLATILE = re.compile(r"(seconds|time|wall|date|_at$|^at$|started|finished|duration|elapsed|environment|machine|"
                      r"grader_version|code_hash|^key$|^attempt$|host|pid|uid|^gpu$|torch|triton|python)", re.I)
# copydetect hashes each k-gram with Python's hash(), seeded anew in every process: a class's
# similarity shares move by a few thousandths from one run to the next whatever the grader
SAME_RUN_ONLY = ("/similarity/", "similarity.json")


def normalized(value, scratch: str):
    """`value` with what varies by nature replaced: volatile keys, the scratch folder, numbers of seconds."""
    if isinstance(value, dict):
        return {k: "<volatile>" if VOLATILE.search(str(k)) else normalized(v, scratch) for k, v in value.items()}
    if isinstance(value, list):
        return [normalized(v, scratch) for v in value]
    if isinstance(value, str):
        value = value.replace(scratch, "<scratch>") if scratch else value
        value = re.sub(r"\b\d+(\.\d+)? ?(s|ms|seconds)\b", "<n> s", value)
        return re.sub(r"\d{4}-\d\d-\d\dT[0-9:.+Z-]+", "<date>", value)
    return value


def read_csv(path: Path, scratch: str) -> list:
    rows = list(csv.reader(io.StringIO(path.read_text())))
    header = rows[0] if rows else []
    return [[("<volatile>" if i < len(header) and VOLATILE.search(header[i]) else normalized(c, scratch))
             for i, c in enumerate(r)] for r in rows]


def snapshot(python: str, course: Path) -> dict:
    from classbuild import make_repo

    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADER_") and k not in ("CI", "GITHUB_ACTIONS")}
    env.update(GRADER_COURSE=str(course), GRADER_WARM="0", COLUMNS="200", NO_COLOR="1")
    out: dict = {"check": {}, "class": {}}
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as tmp:
        scratch = Path(tmp)
        env["GRADER_CACHE_DIR"] = str(scratch / "cache")

        def run(*argv: str, cwd: Path) -> dict:
            proc = subprocess.run([python, "-m", "grader", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=1800)
            score = next((line.strip() for line in proc.stdout.splitlines() if "Score" in line or "score" in line), "")
            return {"exit": proc.returncode, "score_line": normalized(score, tmp)}

        for fixture in FIXTURES:
            repo = scratch / "repos" / fixture
            make_repo(repo, fixture)
            result = run("check", str(repo), *[x for a in ASSIGNMENTS for x in ("-a", a)], *OPTIONS,
                         "--json", str(scratch / f"{fixture}.json"), "--html", str(scratch / f"{fixture}-html"),
                         cwd=scratch)
            result["results"] = normalized(json.loads((scratch / f"{fixture}.json").read_text()), tmp)
            out["check"][fixture] = result
        (scratch / "roster.csv").write_text("student,repo\n" + "".join(f"{f},repos/{f}\n" for f in FIXTURES))
        out["class"]["fetch"] = run("fetch", "--roster", "roster.csv", "--out", "ws", cwd=scratch)
        for step, extra in (("grade", []), ("resume", ["--resume"])):
            chosen = [x for a in ASSIGNMENTS for x in ("-a", a)]
            result = run("grade", "--lock", "ws/lock.json", "--out", "class", *chosen, *OPTIONS, "--jobs", "2", *extra,
                         cwd=scratch)
            files = {}
            for path in sorted((scratch / "class").rglob("*")):
                rel = str(path.relative_to(scratch / "class"))
                if path.suffix == ".json" and path.is_file():
                    try:
                        files[rel] = normalized(json.loads(path.read_text()), tmp)
                    except ValueError:
                        files[rel] = "<not JSON>"
                elif path.suffix == ".csv":
                    files[rel] = read_csv(path, tmp)
            result["files"] = files
            out["class"][step] = result
    return out


def differences(a, b, path: str = "") -> list[str]:
    if any(part in path for part in SAME_RUN_ONLY):
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                found.append(f"{path}/{k}: only in {'after' if k in b else 'before'}")
            else:
                found += differences(a[k], b[k], f"{path}/{k}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {json.dumps(a)[:200]} -> {json.dumps(b)[:200]}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot")
    snap.add_argument("--python", default=sys.executable)
    snap.add_argument("--course", type=Path, default=REPO_ROOT)
    snap.add_argument("--out", type=Path, required=True)
    comp = sub.add_parser("compare")
    comp.add_argument("before", type=Path)
    comp.add_argument("after", type=Path)
    args = ap.parse_args()
    if args.command == "snapshot":
        args.out.write_text(json.dumps(snapshot(args.python, args.course.resolve()), indent=1, sort_keys=True))
        return 0
    # normalized again: a snapshot taken before a key was known to vary compares all the same
    found = differences(normalized(json.loads(args.before.read_text()), ""),
                        normalized(json.loads(args.after.read_text()), ""))
    for line in found:
        print(line)
    print(f"{len(found)} field(s) differ")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
