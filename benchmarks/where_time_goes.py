"""Where one `grader check`'s seconds go, from the process's start to its exit.

    python benchmarks/where_time_goes.py [--json out.json] -- CHECK ARGS...
    python benchmarks/where_time_goes.py -- tests/fixtures/good -a vector_add --device cuda

Runs the real command in this process (the same code `python -m grader check` runs) with a
clock on its parts: the imports, the setup before grading (options, submission, context, kept
cache, sandbox probe), each assignment's pipeline stages (grader.judge.grade.STAGES, from the
thread that grades it), the performance stage's own phases (from results.json), and what comes
after grading (results, report, summary). Prints a table; `--json` writes every figure.

With `--requests`, also every request the judge makes of a worker (its kind, the contender, the
seconds until the reply) and the replay's steps (grader.judge.replay_stage, replay_process): where
inside a performance phase its seconds go.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

BEGAN = time.monotonic()
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EVENTS: list[dict] = []
_lock = threading.Lock()


def note(what: str, began: float, **kw) -> None:
    with _lock:
        EVENTS.append({"what": what, "at": round(began - BEGAN, 3), "seconds": round(time.monotonic() - began, 3),
                       **kw})


def timed(fn, what: str, **kw):
    def wrapper(*args, **kwargs):
        began = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            note(what, began, **kw)
    return wrapper


def instrument() -> None:
    began = time.monotonic()
    import torch  # noqa: F401
    note("import torch", began)
    began = time.monotonic()
    import grader.cli  # noqa: F401
    from grader.cli import check as check_cli
    from grader.cli import outputs
    from grader.judge import grade
    note("import grader", began)

    def stage(fn, name):
        def wrapper(g):
            began = time.monotonic()
            try:
                return fn(g)
            finally:
                note(f"stage {name or fn.__name__}", began, assignment=g.spec.name)
        return wrapper

    grade.STAGES = tuple((stage(fn, name), name) for fn, name in grade.STAGES)
    check_cli.prepare = timed(check_cli.prepare, "setup (options, submission, context, cache, sandbox)")
    for sink in (outputs.JsonSink, outputs.HtmlSink, outputs.TerminalSink):
        sink.finished = timed(sink.finished, f"output {sink.__name__}")


def instrument_requests() -> None:
    """A clock on each worker request and on the replay's steps (their module attributes: the
    stage calls them through the module, so the wrapped one is the one called)."""
    from grader.judge import perf, replay_process, replay_stage
    from grader.sandbox import process
    from grader.sanitize import one_line

    request = process.WorkerProcess.request

    def clocked(self, message, timeout):
        began = time.monotonic()
        reply = None
        try:
            reply = request(self, message, timeout)
            return reply
        finally:
            note(f"request {type(message).__name__} {getattr(message, 'contender', '')}".rstrip(), began)
            for step, seconds in (getattr(reply, "steps", None) or {}).items():  # the worker's own breakdown
                print(f"  {type(message).__name__} {getattr(message, 'contender', '')}: {one_line(step, 40)} "
                      f"{seconds:.3f} s (worker's clock)", file=sys.stderr)

    process.WorkerProcess.request = clocked
    for module, names in ((replay_stage, ("prepare", "_trusted_calls", "_student_result", "_checked", "stop_student",
                                          "loaded", "arm", "go", "settle", "judge", "keep")),
                          (replay_process, ("place", "settle", "checked_copy", "input_sizes")),
                          (perf, ("_input_sets", "_confirming_bursts", "_eager_round", "_prepare_bursts",
                                  "_confirm_rounds", "_replays_timed"))):
        for name in names:
            setattr(module, name, timed(getattr(module, name), f"{module.__name__.split('.')[-1]}.{name}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--requests", action="store_true", help="clock every worker request and the replay's steps")
    ap.add_argument("check", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    argv = [a for a in args.check if a != "--"]
    instrument()
    if args.requests:
        instrument_requests()
    from grader.cli import main as cli

    code = 0
    began = time.monotonic()
    sys.argv = ["grader", "check", *argv]
    try:
        cli()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    note("grader check (after the imports)", began)
    total = time.monotonic() - BEGAN
    phases = {}
    results = Path(argv[argv.index("--json") + 1]) if "--json" in argv else ROOT / "grader-output" / "results.json"
    try:
        for t in json.loads(results.read_text())["tests"]:
            details = t.get("extra_data", {}).get("details", {})
            if "phase_seconds" in details:
                phases[t["name"]] = details["phase_seconds"]
    except (OSError, ValueError, KeyError):
        pass
    print(f"\n{'at s':>7} {'seconds':>8}  part", file=sys.stderr)
    for e in sorted(EVENTS, key=lambda e: e["at"]):
        print(f"{e['at']:7.2f} {e['seconds']:8.2f}  {e['what']}{' ' + e['assignment'] if 'assignment' in e else ''}",
              file=sys.stderr)
    for name, p in phases.items():
        print(f"performance phases of {name}: {json.dumps(p)}", file=sys.stderr)
    print(f"total {total:.2f} s, exit {code}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"argv": argv, "total_s": round(total, 3), "exit": code, "events": EVENTS,
                                         "performance_phases": phases}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
