"""The zygote a `grader check` leaves warm for the next check: its name (the code and the
environment it was started from, so no worker is forked from stale code). How long it waits is
the command's Settings.warm.keep_seconds; grader.resident.stop_warm stops it sooner."""

from __future__ import annotations

import hashlib
import json

from grader.sandbox.interpreter import code_identity


def warm_name(env: dict[str, str]) -> str:
    """The warm zygote's name: its environment and the code it has imported
    (interpreter.code_identity), so a changed grader or an upgraded torch starts a new one and
    no worker is forked from stale code."""
    digest = hashlib.sha256(json.dumps(sorted(env.items())).encode())
    digest.update(code_identity().encode())
    return digest.hexdigest()[:16]
