"""How workers are contained on this machine (`Isolation`), and the error that says a sandbox
cannot be set up at all. Plain data: every other sandbox module builds on it."""

from __future__ import annotations

from dataclasses import dataclass


class SandboxError(Exception):
    """The sandbox cannot be set up at all: an infrastructure problem, not the student's."""


@dataclass(frozen=True)
class Isolation:
    """How workers are contained on this machine, found once per process by
    `grader.sandbox.process.detect`."""

    mode: str  # sandbox | docker | none (grader.sandbox.backend.ISOLATION_MODES)
    namespaces: bool = False  # network, PID and mount namespaces (unshare)
    user_namespace: bool = False  # not root: the namespaces hang off a user namespace
    user_switch: bool = False  # root: each worker runs as a dedicated unprivileged uid
    warnings: tuple[str, ...] = ()

    def describe(self) -> dict:
        if self.mode != "sandbox":
            return {"mode": self.mode, "warnings": list(self.warnings)}
        return {
            "mode": self.mode,
            "network": "none (own network namespace)" if self.namespaces else "the host's",
            "processes": "own PID namespace: all killed with the worker" if self.namespaces
            else "own session; children swept",
            "files": ("private view: only the system, Python and the job folder (writable), nothing of the course; "
                      "no capabilities") if self.namespaces
            else ("what every user may read: the grader's own files are closed to its uid (0700/0600)"
                  if self.user_switch else "everything its user can reach"),
            "user": "a dedicated unprivileged uid" if self.user_switch else ("the grader's own (in a user namespace)"
                                                                            if self.user_namespace
                                                                            else "the grader's own"),
            "warnings": list(self.warnings),
        }
