"""A warm start for workers: a fork server that has imported torch and Triton once.

Starting a worker used to cost a fresh interpreter importing torch and Triton (2-4 s on a CPU
machine, about 10 s on the GPU machine), three or four times per job. A zygote is a process
started exactly as a worker would be (`python -I`, the worker's scrubbed environment, no CUDA
context: nothing has touched the GPU) that imports torch, Triton, numpy, safetensors and
grader.worker, and then only forks. Each fork goes through the same steps as a worker started
by `grader.sandbox.namespaces` with `unshare` and `grader.sandbox.init`:

  fork (A, the `unshare --fork --kill-child` of the exec path): its own session, output to the
  grader's pipe, every other descriptor closed, the worker's environment; unshare(2) of the
  network, PID and mount namespaces (and a user namespace mapping the grader to root when it
  is not root); mount propagation made private;
  fork (the init, PID 1 of the new PID namespace): a fresh /proc, then `sandbox_init.main`:
  the private view of the files, a fork for the worker, which drops every capability and to the
  job's uid, sets its limits and no_new_privs, points its `grader` package at the worker's own
  copy of the code, and runs `grader.worker.server.serve` where the exec path would exec it.

So a worker's namespaces, view, uid and limits are the same; only the interpreter is not new.
What it shares with the zygote is what every worker of this grader loads anyway: the imported
modules of torch, Triton, numpy and safetensors and the grader's worker module. The zygote
never holds anything private: it is started from the worker's environment, not forked from
the grader, holds no seed, input, reference or student file, and imports no student code;
every fork is single use. A zygote serves one job process (its pipes die with it) and one
(interpreter, GPU) setting; it dies with that process (PR_SET_PDEATHSIG).

The grader talks to it over a Unix socket: a request is the worker's configuration as JSON
with its pipe ends as SCM_RIGHTS; the reply is the pid of A; the zygote reports each A's wait
status when it ends, so the grader sees exit codes as it would of its own child.

The package: `server` is the zygote process; `client` the grader's side of it (start or attach,
fork, and `SandboxState`, the session's zygotes); `warm` the zygote kept between checks; this
module is what a backend uses (`try_start`, behind its own `start`: grader.sandbox.namespaces,
grader.sandbox.plain) and what a session warms up ahead (`prewarm`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from grader.sandbox.zygote.client import Forked, SandboxState, Zygote, ZygoteError
from grader.sandbox.zygote.server import PRELOAD
from grader.sandbox.zygote.warm import warm_name

if TYPE_CHECKING:
    from grader.sandbox.launch import Launch, Started
    from grader.sandbox.uids import JobLease
    from grader.settings import Settings, WarmStarts

__all__ = ["Forked", "PRELOAD", "SandboxState", "Zygote", "ZygoteError", "enabled", "prewarm", "start", "try_start",
           "usable", "warm_name", "zygote_key"]


def enabled(warm: "WarmStarts", sandbox: SandboxState) -> bool:
    """GRADER_ZYGOTE=0 (`warm.fork_server` off) starts every worker as a fresh interpreter (the
    exec path), as before; so does a session whose zygote failed once (`sandbox.disabled`)."""
    return warm.fork_server and sys.platform.startswith("linux") and sandbox.disabled is None


def usable(launch: "Launch", sandbox: SandboxState) -> bool:
    """A worker (or the sandbox's probe) can be forked; a test's own command needs its exec."""
    return enabled(launch.settings.warm, sandbox) and (launch.command is None or launch.probe is not None)


def zygote_key(env: dict[str, str]) -> tuple[tuple, dict[str, str]]:
    """Workers whose environments differ only in their own folders share a zygote."""
    base = {k: v for k, v in env.items()  # what is read only when a kernel is compiled or tuned, not at import
            if k not in ("HOME", "TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_AUTOTUNING")}
    return tuple(sorted(base.items())), base


def start(launch: "Launch", sandbox: SandboxState, isolation,
          config: Callable[[tuple[int, int], int, int], tuple[dict, "JobLease | None"]]) -> "Started":
    """The worker `launch` describes, forked by its session's zygote (`sandbox`): `config(channel,
    status_fd, lifeline_fd)` is the backend's own configuration of its init (and the uid lease
    it took), the same one its exec path sends, so the view, uid and limits are the same."""
    from grader.sandbox.launch import Started, pipe_pair

    (rx, tx), channel = pipe_pair()
    status_rx, status_tx = os.pipe()
    lifeline_rx, lifeline = os.pipe()  # EOF when the grader is gone, as for the exec path's init
    out_rx, out_tx = os.pipe()
    lease = None
    try:
        settings, lease = config(channel, status_tx, lifeline_rx)
        z = sandbox.zygote(*zygote_key(launch.env))
        pid = z.fork({"mode": isolation.mode, "namespaces": isolation.namespaces,
                      "user_namespace": isolation.user_namespace,
                      "config": settings, "probe": launch.probe},
                     {"status_fd": status_tx, "lifeline_fd": lifeline_rx, "output": out_tx, "pass": list(channel)})
    except BaseException:
        for fd in (rx, tx, status_rx, lifeline, out_rx):
            os.close(fd)
        if lease is not None:
            lease.release()
        raise
    finally:
        for fd in (*channel, status_tx, lifeline_rx, out_tx):
            os.close(fd)
    return Started(Forked(z, pid, os.fdopen(out_rx, "rb")), rx, tx, status_rx, lifeline, lease)


def try_start(launch: "Launch", sandbox: SandboxState, isolation,
              config: Callable[[tuple[int, int], int, int], tuple[dict, "JobLease | None"]]) -> "Started | None":
    """A backend's first choice: the worker forked by the zygote (see `start`); None where it
    cannot be (off, a test's own command) or the zygote failed, which turns it off for the rest
    of the session (ours, not the student's): the backend then starts a fresh interpreter."""
    if not usable(launch, sandbox):
        return None
    try:
        return start(launch, sandbox, isolation, config)
    except ZygoteError as exc:
        sandbox.disable(str(exc))
        return None


def prewarm(interpret: bool, gpu: str | None, isolation: str, settings: "Settings", sandbox: SandboxState) -> None:
    """Start the zygotes a grade will fork from (a GPU run also replays in the interpreter),
    so their imports overlap whatever comes first. Starting one does not wait for it."""
    from grader.sandbox.launch import worker_env

    if isolation == "docker" or not enabled(settings.warm, sandbox):
        return
    for interp in ({True} if interpret else {False, True}):
        try:
            env = worker_env(Path(tempfile.gettempdir()), interp, None if interp else gpu, settings.threads)
            sandbox.zygote(*zygote_key(env))
        except ZygoteError:
            return
