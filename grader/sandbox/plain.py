"""The plain backend (`--isolation none`, for debugging and the grader's own trusted workers):
a child process in its own session, with limits and a scrubbed environment, nothing more."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable

from grader.sandbox import zygote
from grader.sandbox.init import apply_limits
from grader.sandbox.interpreter import PACKAGE_PARENT
from grader.sandbox.isolation import Isolation
from grader.sandbox.launch import Launch, Started, pipe_pair, worker_argv
from grader.sandbox.zygote import SandboxState
from grader.settings import Settings

SUMMARY = "a plain process with limits, for debugging"  # what `--isolation` help says of this mode


def detect(probe: Callable[[Isolation], str | None], settings: Settings) -> Isolation:
    return Isolation("none", warnings=("--isolation none: the worker runs as you, on the network, "
                                       "and sees every file you can",))


def start(launch: Launch, isolation: Isolation, sandbox: SandboxState) -> Started:
    # the same limits and environment
    forked = zygote.try_start(launch, sandbox, isolation, lambda channel, status_tx, lifeline_rx: (
        {"cwd": str(launch.cwd), "env": launch.env, "limits": launch.limits.for_worker(False, launch.interpret),
         "pass_fds": list(channel), "status_fd": status_tx, "lifeline_fd": lifeline_rx}, None))
    if forked is not None:
        return forked
    (rx, tx), (child_rx, child_tx) = pipe_pair()
    # no view to keep anything from it: the whole package, as a zygote's fork of this backend has
    # it (the trusted side's reference and torch workers load the assignment's spec.py)
    argv = launch.command or worker_argv(str(child_rx), str(child_tx), path=PACKAGE_PARENT)
    try:
        proc = subprocess.Popen(
            argv, cwd=launch.cwd, env=launch.env, pass_fds=(child_rx, child_tx), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=functools.partial(apply_limits, launch.limits.for_worker(False, launch.interpret)),
        )
    except BaseException:
        os.close(rx)
        os.close(tx)
        raise
    finally:
        os.close(child_rx)
        os.close(child_tx)
    return Started(proc, rx, tx)


def kill(started: Started, isolation: Isolation) -> None:
    """Nothing beyond its process group, which `WorkerProcess.kill` kills."""


def cleanup(started: Started) -> None:
    """Nothing outlives the process group."""


def exit_code(code: int) -> int:
    return code
