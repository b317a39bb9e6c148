"""The student's module loaded in a sandboxed worker, as the stages use it: started (and
restarted after a timeout or a crash) the same way for correctness calls, the bounds check's
interpreter replay and timing. Made by the session's resources (`Resources.student_worker`)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Callable, ContextManager, Sequence

from grader.judge.context import GradingContext
from grader.judge.runcache import TritonKeep
from grader.protocol import Contender, Failure, Load, Ok, Ping, Reply, Request
from grader.sandbox.isolation import SandboxError
from grader.sandbox.launch import Limits, student_cpus
from grader.sandbox.process import WorkerFailure, WorkerProcess
from grader.sandbox.zygote import SandboxState
from grader.settings import Settings
from grader.spec import Assignment

WORKER_START_TIMEOUT = 300  # seconds for a fresh worker to import torch and Triton, on a loaded machine


class StudentWorker:
    """The student's module loaded in a worker; restarted after a timeout or crash."""

    def __init__(self, context: GradingContext, spec: Assignment, repo: Path, target: tuple[str, str], scratch: Path,
                 hide: Sequence[Path] = (), interpret: bool = False, kept: TritonKeep | None = None,
                 sharing_gpu: Callable[[Callable[[float], None]], ContextManager] | None = None, *,
                 settings: Settings, sandbox: SandboxState) -> None:
        """`kept`: the student's compiled kernels a check keeps between runs; `sharing_gpu(waited)`:
        held while its import or a call runs (grader.judge.devicelock), None in the interpreter;
        `settings` and `sandbox`: the session's, for its workers (grader.sandbox.process.WorkerProcess)."""
        self.context, self.spec, self.repo, self.target, self.scratch = context, spec, repo, target, scratch
        self.interpret = interpret
        self.hide = [*map(Path, context.hide), *hide]  # the submission's folder and its neighbours (other students)
        self.process: WorkerProcess | None = None
        self.starts = 0
        self.worker_scratch: Path | None = None  # the running worker's own folder (home, temp, Triton cache)
        self.gpu_wait = 0.0  # seconds its calls waited for the GPU (other jobs' timing phases)
        self.kept = kept if not interpret else None  # the interpreter compiles nothing
        self._sharing_gpu = sharing_gpu
        self.settings = settings
        self.sandbox = sandbox

    def start(self) -> Ok | Failure:
        """Start and import; returns the worker's reply (ok, or the student's error)."""
        self.close()
        self.starts += 1
        ctx = self.context
        scratch = self.worker_scratch = self.scratch / f"worker-{self.starts}"
        if self.kept is not None:  # what earlier checks compiled of this student's kernels
            self.kept.seed(scratch / "triton-cache")
        try:  # our own start (sandbox, Python, torch, Triton) is not the student's import time, nor their fault
            self.process = WorkerProcess(self.repo, scratch, self.interpret, ctx.gpu,
                                         limits=Limits(cpus=student_cpus()), isolation=ctx.isolation,
                                         writable=[self.repo.parent / "outputs"],
                                         hide=self.hide, job=self.repo.parent, keep_autotuning=self.kept is not None,
                                         settings=self.settings, sandbox=self.sandbox)
            self.process.request(Ping(), WORKER_START_TIMEOUT)
        except (OSError, SandboxError) as exc:
            raise WorkerFailure("infra_error", f"the sandbox could not start a worker: {exc}", "") from None
        except WorkerFailure as f:
            raise WorkerFailure(replace(f.failure, kind="infra_error",
                                        message=f"the worker did not start: {f.message}")) from None
        module, function = self.target
        # an import may run GPU work (or try to disturb another job's timing): it waits, as a call does
        with self.sharing_gpu():
            reply = self.process.request(
                Load({"student": Contender(str(self.repo), module, function)}),
                ctx.import_timeout_for(self.spec),
            )
        assert isinstance(reply, (Ok, Failure))  # decode_reply answers a Load with one of these
        return reply

    def sharing_gpu(self) -> ContextManager:
        """Held while this worker's import or call runs (none in the interpreter)."""
        if self.interpret or self._sharing_gpu is None:
            return nullcontext()
        return self._sharing_gpu(self.waited)

    def waited(self, seconds: float) -> None:
        self.gpu_wait += seconds

    def request(self, message: Request, timeout: float) -> Reply | Failure:
        assert self.process is not None
        return self.process.request(message, timeout)

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None
            if self.kept is not None and self.worker_scratch is not None:
                self.kept.keep(self.worker_scratch / "triton-cache")
