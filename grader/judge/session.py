"""A grading session: the options and the resources one grading process works with
(grader.judge.resources), and the one pipeline that grades with them. Each driver opens one
session (`open_session`): `grader check`, a batch's job process (a job server keeps it for every
job of its slot) and a Ray task; all of them grade through `GradingSession.grade`.

Why one object: check and batch used to assemble a grading each their own way (their own run
cache, environment, workers and warm starts), and drifted: a batch lost the static scan's
warnings that a check kept. Now the settings are read once, by the command that opens the
session (grader.settings), held by its resources and handed down from there, and what differs
between the drivers is only what they do with the result.
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from grader.judge import durations
from grader.judge import grade as pipeline
from grader.judge.context import GradingContext
from grader.judge.resources import Resources
from grader.results import AssignmentResult, RunResult
from grader.sandbox.zygote import SandboxState
from grader.settings import Settings
from grader.spec import Assignment, Course
from grader.submission import Submission

Progress = Callable[[str], None]


class GradingSession(Resources):
    """The resources of one grading process, and the pipeline every driver grades through."""

    def grade(self, sub: Submission, specs: list[Assignment], progress: Progress | None = None,
              phases: dict[str, float] | None = None, jobs: int = 1) -> RunResult:
        """Grade `specs` of `sub`; `phases` (if given) gets each stage's seconds, summed over the
        assignments. `jobs` > 1 grades that many assignments at once, each in its own workers
        (the CPU interpreter runs one core per worker; on a GPU, correctness calls share it and
        timing holds it alone, grader.judge.devicelock): the results are the same, in the same
        order, as one after another."""
        started = time.monotonic()
        ctx = self.context
        run = RunResult(str(sub.root), ctx.seed, dict(self.environment), commit=sub.commit())
        if ctx.scratch_root:
            Path(ctx.scratch_root).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="grader-", dir=ctx.scratch_root) as tmp:
            if jobs > 1 and len(specs) > 1:
                run.assignments = self._grade_at_once(sub, specs, Path(tmp), progress, phases, jobs)
            else:
                roofline = None  # measured by the first timing of the run, then shared by the others
                for spec in specs:
                    result = pipeline.grade_assignment(self, sub, spec, Path(tmp) / spec.name, progress, roofline,
                                                       phases)
                    run.assignments.append(result)
                    roofline = roofline or pipeline.measured_roofline(result)
        if roofline := next(filter(None, map(pipeline.measured_roofline, run.assignments)), None):
            run.environment["roofline"] = roofline
        run.execution_time = time.monotonic() - started
        return run

    def _grade_at_once(self, sub: Submission, specs: list[Assignment], tmp: Path, progress: Progress | None,
                       phases: dict[str, float] | None, jobs: int) -> list[AssignmentResult]:
        """Each assignment in a thread of its own (the work is in its workers; this process
        mostly waits on their pipes), the longest first so that the last to start is short: the
        longest last time where a check kept its seconds (`GradingContext.durations`), else the
        one with the most planned calls."""
        self.warm_up()  # once, before the threads: they fork from the same zygotes
        # each assignment's phases, added up at the end
        own: dict[str, dict[str, float]] = {spec.name: {} for spec in specs}
        last = durations.read(self.context.durations)
        key = durations.key_of(self.context)
        order = sorted(specs, key=lambda s: (-last.get(key(s.name), 0.0), -len(self.context.calls(s))))
        with ThreadPoolExecutor(max_workers=min(jobs, len(specs)), thread_name_prefix="assignment") as pool:
            futures = {spec.name: pool.submit(pipeline.grade_assignment, self, sub, spec, tmp / spec.name, progress,
                                              None,
                                              own[spec.name]) for spec in order}
            results = [futures[spec.name].result() for spec in specs]
        durations.write(self.context.durations, {key(name): sum(seconds.values()) for name, seconds in own.items()})
        if phases is not None:
            for seconds in own.values():
                for name, value in seconds.items():
                    phases[name] = round(phases.get(name, 0.0) + value, 3)
        return results

    def not_gradable(self, spec: Assignment, why: str) -> AssignmentResult:
        """What the student set up cannot be graded at all (their grader.toml): one failed result
        that says why, worth the assignment's points."""
        return pipeline.not_gradable(spec, self.context,
                                     AssignmentResult(spec.name, spec.title, f"{spec.module}:{spec.function}()"), why)


def open_session(context: GradingContext, settings: Settings, course: Course | None = None,
                 sandbox: SandboxState | None = None) -> GradingSession:
    """The session for `context` with the command's `settings` and its `course` (default: the one
    the settings name or imply, found here), and `sandbox`, what its sandbox keeps (default: a new
    one; `grader check` hands the one whose zygotes it kept warm). It holds no process of its own
    (workers end with each assignment; its fork servers end with this process or when idle), so
    there is nothing to close."""
    return GradingSession(context, settings, course if course is not None else Course.find(settings), sandbox)
