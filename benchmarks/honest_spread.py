"""The honest spread: how far the grader's clock reads an honest function's calls from its replay.

Reads the log the GPU tests write where GRADER_CONFIRMATION_LOG names a file (tests/gpu/test_gpu.py,
`_log_confirmation`: one line per graded fixture) and prints, for every honest fixture, each clock
figure over its replayed time, then the widest of them: the spread that
grader.judge.timing.decision.Margins.spread must stay above (docs/performance.md, "The honest spread").

    for i in 1 2 3; do GRADER_CONFIRMATION_LOG=/tmp/spread.jsonl python -m pytest -q tests/gpu/test_gpu.py \\
        -k "good_submission or honest or sixty"; done
    python benchmarks/honest_spread.py /tmp/spread.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

HONEST = ("good/", "honest_")


def main(path: str) -> int:
    ratios: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        c = row.get("confirmation") or {}
        if not row["fixture"].startswith(HONEST) or not c.get("replay_ms"):
            continue
        for f in c.get("figures") or []:
            if f["ms"] > 0:
                ratios[row["fixture"]].append((f["source"], f["ms"] / c["replay_ms"]))
    if not ratios:
        print("no honest fixture's confirmation in the log")
        return 1
    widest = 0.0
    for fixture, seen in sorted(ratios.items()):
        words = ", ".join(f"{source} {r:.3f}" for source, r in seen)
        print(f"{fixture}: {words}")
        widest = max(widest, *(abs(r - 1) for _, r in seen))
    print(f"honest spread (widest clock figure from its replay): {widest:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
