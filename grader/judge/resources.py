"""What one grading process works with, built once from its options, its command's settings and
the course it grades: the machine's description, the run cache, the kept kernels of a check,
the device lock, the worker factories with warm starts as one policy, the replay processes'
factory; each is handed the settings it needs from here (nothing below reads the environment).
The stages (grader.judge.grade, grader.judge.perf) take them from here and build nothing
themselves; a grading session (grader.judge.session) is these resources plus the one pipeline.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Callable, ContextManager, Sequence

from grader import environment
from grader.judge import replay_process
from grader.judge.context import GradingContext
from grader.judge.devicelock import gpu_phase, setup_slot, timing_lock
from grader.judge.replay_process import Replayed, ReplayProcess
from grader.judge.runcache import BoundsKeep, RunCache, TritonKeep
from grader.judge.workers import StudentWorker
from grader.sandbox.isolation import Isolation
from grader.sandbox.process import WorkerProcess, detect
from grader.sandbox.zygote import SandboxState, prewarm
from grader.settings import Settings
from grader.spec import Assignment, Course


class Resources:
    """Everything a grading needs besides the submission: built once, shared by every stage
    and every assignment graded in this process."""

    def __init__(self, context: GradingContext, settings: Settings, course: Course,
                 sandbox: SandboxState | None = None) -> None:
        """`settings`: the command's, handed to everything below that needs one (the device lock,
        the workers and their sandbox, the warm starts); `course`: the course being graded;
        `sandbox`: what the sandbox keeps for this session (its zygotes, the workers' copy of the
        code, the probed isolation), handed down with the settings: the command's own where it
        set one up (`grader check` keeps its zygotes warm), else this session's, made here."""
        self.context = context
        self.settings = settings
        self.sandbox = sandbox if sandbox is not None else SandboxState()
        self.course = course
        self.cache = RunCache(Path(context.cache), context.cache_limit) if context.cache else None
        # a check keeps the student's compiled kernels between runs (the interpreter compiles nothing)
        self.kept_kernels = (TritonKeep(Path(context.kept_kernels))
                             if context.kept_kernels and not context.interpret else None)
        self.kept_bounds = BoundsKeep(Path(context.kept_bounds)) if context.kept_bounds else None
        self._warm = False

    @cached_property
    def isolation(self) -> Isolation:
        """How workers are contained here, tried for real once (grader.sandbox.process.detect)."""
        return detect(self.context.isolation, self.settings, self.sandbox)

    @cached_property
    def environment(self) -> dict:
        """The machine, as every result of this session records it (grader.environment)."""
        return environment.describe(self.context.device, self.isolation.describe())

    def warm_up(self) -> None:
        """Start the fork servers this session's workers come from (once, and only once a worker
        is needed), so their imports overlap the copy and the inputs (grader.settings.WarmStarts)."""
        if not self._warm and self.settings.warm.fork_server:
            prewarm(self.context.interpret, self.context.gpu, self.context.isolation, self.settings, self.sandbox)
        self._warm = True

    def student_worker(self, spec: Assignment, repo: Path, target: tuple[str, str], scratch: Path,
                       hide: Sequence[Path] = (),
                       interpret: bool | None = None) -> StudentWorker:
        """A worker for the student's module (started by its `start()`); `interpret` overrides
        the session's device (a GPU run's bounds check replays in the interpreter)."""
        return StudentWorker(self.context, spec, repo, target, scratch, hide=hide,
                             interpret=self.context.interpret if interpret is None else interpret,
                             kept=self.kept_kernels, sharing_gpu=self.sharing_gpu, settings=self.settings,
                             sandbox=self.sandbox)

    def trusted_worker(self, folder: Path) -> WorkerProcess:
        """A worker for our own code (the reference, torch), outside every student's folder."""
        return WorkerProcess(folder, folder / "scratch", interpret=False, gpu=self.context.gpu, isolation="none",
                             triton_cache=self.cache.trusted_triton_cache if self.cache is not None else None,
                             settings=self.settings, sandbox=self.sandbox)

    def replay_process(self, job: Path, reps: int, timeout: float, placements: int) -> ReplayProcess | Replayed:
        """A replay process for one contender's record (grader.judge.replay_process.spawn), started
        in `job` with this session's isolation, GPU and settings, waiting for its record."""
        return replay_process.spawn(job, reps, timeout, isolation=self.context.isolation, gpu=self.context.gpu,
                                    placements=placements, picked=True, settings=self.settings, sandbox=self.sandbox)

    def sharing_gpu(self, waited: Callable[[float], None] | None = None) -> ContextManager:
        """Held while a correctness call or an import runs: waits while another job times."""
        return gpu_phase(self.context.gpu, False, self.settings, enabled=not self.context.interpret, waited=waited)

    def setup_slot(self) -> ContextManager:
        """Held from a timing phase's replays' set-up on the GPU to their end (devicelock.setup_slot)."""
        return setup_slot(self.context.gpu, self.settings, enabled=not self.context.interpret)

    def alone_on_gpu(self) -> ContextManager:
        """Held while timing: no other job's work runs on this GPU."""
        return timing_lock(self.context.gpu, self.settings, enabled=not self.context.interpret)
