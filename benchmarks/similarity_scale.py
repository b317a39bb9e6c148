"""How long similarity across a class takes: a synthetic class of N students per assignment,
every pair compared (grader.batch.similarity.compare_class), and the side-by-side pages of the pairs
listed. Prints one line per assignment and a JSON summary.

    PYTHONPATH=. python benchmarks/similarity_scale.py            # 500 students, softmax and layernorm
    PYTHONPATH=. python benchmarks/similarity_scale.py --students 100 -a vector_add

The class is a worst case for the pair matching: every module starts from one of a few correct
solutions (the bundled `good` one, the reference, and others where there are), so almost every
pair shares fingerprints and is compared in full. Each student then changes it as students do:
every name renamed, their own helper code and comments inserted, block sizes changed, lines
dropped. A few students copy a classmate's module and disguise it (names changed, functions
reordered): the run also reports whether those planted pairs rank above the threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from disguise import disguise  # noqa: E402

HELPERS = [
    "def _check_{n}(x):\n    assert x.is_contiguous() or x.stride(-1) != 0, 'bad layout'\n    return x\n",
    "def _blocks_{n}(n, block):\n    return (n + block - 1) // block\n",
    "DEBUG_{n} = False\n",
    "def _log_{n}(*args):\n    if DEBUG_{n}:\n        print('[kernel]', *args)\n",
    "def _pick_warps_{n}(block):\n    if block >= 4096:\n        return 16\n    return 8 if block >= 2048 else 4\n",
    "# TODO({n}): try a persistent kernel here once it works\n",
    "def _as_2d_{n}(x):\n    return x.reshape(-1, x.shape[-1])\n",
]
COMMENTS = ["# load one block", "# keep the accumulator in fp32", "# mask the tail", "# one program per row",
            "# this was slow before", "# see lecture 4", "# fix for odd sizes"]


def bases(assignment: str) -> list[str]:
    found = [ROOT / "tests" / "fixtures" / "good" / "kernels" / f"{assignment}.py", ROOT / "reference" / f"{assignment}.py"]
    found += [p for p in sorted((ROOT / "tests" / "fixtures").glob(f"{assignment}_*/kernels/{assignment}.py"))
              if "_independent" in str(p)]  # other correct solutions (not the renamed copies)
    return [p.read_text() for p in found if p.is_file()]


def student_version(base: str, rng: random.Random, n: int) -> str:
    text = disguise(base) if rng.random() < 0.5 else base
    lines = text.splitlines()
    for _ in range(rng.randint(2, 6)):  # comments and a dropped line here and there
        i = rng.randrange(len(lines))
        if rng.random() < 0.3 and lines[i].strip().startswith("#"):
            del lines[i]
        else:
            indent = len(lines[i]) - len(lines[i].lstrip())
            lines.insert(i, " " * indent + rng.choice(COMMENTS))
    text = "\n".join(lines)
    for block in ("1024", "2048", "4096"):
        if rng.random() < 0.3:
            text = text.replace(block, rng.choice(["512", "1024", "2048", "4096", "8192"]))
    extra = "".join(h.format(n=n) for h in rng.sample(HELPERS, rng.randint(1, 4)))
    return text + "\n\n" + extra


def synthetic_class(assignment: str, students: int, copies: int, seed: int) -> tuple[dict[str, str], list[tuple[str, str]]]:
    rng = random.Random(seed)
    pool = bases(assignment)
    files = {f"s{i:04d}": student_version(rng.choice(pool), rng, i) for i in range(students - copies)}
    planted = []
    for j in range(copies):
        source = f"s{rng.randrange(students - copies):04d}"
        name = f"c{j:04d}"
        files[name] = disguise(files[source])
        planted.append(tuple(sorted((source, name))))
    return files, planted


def run(assignment: str, students: int, copies: int, seed: int, out: Path) -> dict:
    from grader.settings import Settings
    from grader.spec import Course
    from grader.batch.similarity import DEFAULT_THRESHOLD, MAX_PAIRS, compare_class, side_by_side

    spec = Course.find(Settings()).get(assignment)
    starter = (Path(spec.folder) / "starter" / spec.module).read_text()
    files, planted = synthetic_class(assignment, students, copies, seed)
    t0 = time.perf_counter()
    pairs, fps, counts = compare_class(files, starter, assignment, DEFAULT_THRESHOLD)
    t1 = time.perf_counter()
    for pair in pairs[:MAX_PAIRS]:
        (out / f"{assignment}-{pair.a}--{pair.b}.html").write_text(side_by_side(pair, fps, {"commits": {}, "module": spec.module,
                                                                                              "title": spec.title, "threshold": DEFAULT_THRESHOLD}))
    t2 = time.perf_counter()
    found = {(p.a, p.b) for p in pairs}
    result = {"assignment": assignment, "students": students, **counts, "above_threshold": len(pairs),
              "total_s": round(t1 - t0, 2), "pages_s": round(t2 - t1, 2), "pages": min(len(pairs), MAX_PAIRS),
              "planted_copies": len(planted), "planted_found": sum(p in found for p in planted),
              "mean_bytes": round(sum(map(len, files.values())) / len(files))}
    print(f"{assignment}: {students} students, {counts['pairs']} pairs ({counts['compared']} sharing a fingerprint) compared in "
          f"{result['total_s']} s (tokenizing {counts['fingerprint_s']} s, comparing {counts['compare_s']} s); {len(pairs)} at or above {DEFAULT_THRESHOLD}; {result['pages']} pages in {result['pages_s']} s; "
          f"planted copies found: {result['planted_found']} of {len(planted)}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=500)
    parser.add_argument("--copies", type=int, default=10, help="planted disguised copies among them")
    parser.add_argument("-a", "--assignment", action="append", help="default: softmax and layernorm (the largest module)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import copydetect
    import numpy

    with tempfile.TemporaryDirectory() as tmp:
        results = [run(a, args.students, args.copies, args.seed, Path(tmp)) for a in args.assignment or ["softmax", "layernorm"]]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()
    print(json.dumps({"results": results, "python": platform.python_version(), "copydetect": copydetect.__version__
                      if hasattr(copydetect, "__version__") else "?", "numpy": numpy.__version__, "machine": platform.processor()
                      or platform.machine(), "cores": len(os.sched_getaffinity(0)), "load_average": [round(x, 2) for x in load],
                      "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1))


if __name__ == "__main__":
    main()
