"""What a sandbox backend is, and which one contains a worker under each `--isolation` mode.

A backend is a module with the functions of `Backend`. Adding one (bubblewrap, nsjail, ...)
is one module beside `namespaces.py` and one line in `BACKENDS`; `WorkerProcess` speaks to the
started worker the same way whatever started it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from grader.sandbox import docker, namespaces, plain
from grader.sandbox.isolation import Isolation
from grader.sandbox.launch import Launch, Started
from grader.sandbox.zygote import SandboxState
from grader.settings import Settings


class Backend(Protocol):
    SUMMARY: str  # a few words for `--isolation`'s help

    def detect(self, probe: Callable[[Isolation], str | None], settings: Settings) -> Isolation:
        """What this backend can do on this machine with `settings` (`probe` starts a test worker
        under a candidate: None if it works, else why not); raises SandboxError if nothing can."""

    def start(self, launch: Launch, isolation: Isolation, sandbox: SandboxState) -> Started:
        """Start one worker with its private channel; raises OSError or SandboxError if it
        cannot (an infrastructure problem). The one place a worker is started."""

    def kill(self, started: Started, isolation: Isolation) -> None:
        """Kill what the worker started beyond the launcher's process group (a PID namespace,
        a container); `WorkerProcess.kill` then kills the group and reaps."""

    def cleanup(self, started: Started) -> None:
        """Once the worker is dead: remove what its start left outside it (a container)."""

    def exit_code(self, code: int) -> int:
        """The worker's exit status from its launcher's (negative: killed by that signal)."""


BACKENDS: dict[str, Backend] = {
    "sandbox": namespaces,
    "docker": docker,
    "none": plain,
}
ISOLATION_MODES = tuple(BACKENDS)


def isolation_help() -> str:
    """`--isolation`'s help, from the registry: each mode and what it is."""
    modes = [f"{mode} ({backend.SUMMARY})" for mode, backend in BACKENDS.items()]
    return f"How student code is contained: {', '.join(modes[:-1])} or {modes[-1]}."


def backend_for(isolation: Isolation | str) -> Backend:
    return BACKENDS[isolation if isinstance(isolation, str) else isolation.mode]
