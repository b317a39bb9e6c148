"""`actions/upload-artifact`'s search for the files of an artifact, as this test suite reads it
(our own code, not the action's): which files a step's `with:` would upload from a workspace."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path


def uploaded(with_: dict, workspace: Path) -> list[str]:
    """The files `actions/upload-artifact` uploads for a step's `with:`, as its search does: each
    line of `path` a pattern (`!` excludes) searched from its literal prefix, a folder matched with
    everything under it, and unless `include-hidden-files` is true every traversed item whose own
    name starts with `.` skipped, the search's first folder included (@actions/glob's
    `excludeHiddenFiles`, upload-artifact's default since 4.4: "any file beginning with `.` or
    files within folders beginning with `.`")."""
    hidden_ok = str(with_.get("include-hidden-files", "false")).lower() == "true"
    lines = [x.strip() for x in str(with_["path"]).splitlines() if x.strip() and not x.strip().startswith("#")]
    include = [x for x in lines if not x.startswith("!")]
    exclude = [x[1:] for x in lines if x.startswith("!")]

    def matches(pattern: str, rel: str) -> bool:
        pattern = pattern.rstrip("/")
        parts, target = pattern.split("/"), rel.split("/")
        for n in range(len(target), 0, -1):  # a folder the pattern names matches everything under it
            if _glob_parts(parts, target[:n], fnmatch.fnmatchcase):
                return True
        return False

    found = set()
    for pattern in include:
        segments = pattern.rstrip("/").split("/")
        literal = []
        for seg in segments:
            if any(c in seg for c in "*?["):
                break
            literal.append(seg)
        stack = [workspace.joinpath(*literal)] if literal else [workspace]
        while stack:
            item = stack.pop()
            if not os.path.lexists(item) or (not hidden_ok and item.name.startswith(".")):
                continue
            if item.is_dir():
                stack.extend(sorted(item.iterdir(), reverse=True))
            elif matches(pattern, item.relative_to(workspace).as_posix()):
                found.add(item.relative_to(workspace).as_posix())
    return sorted(f for f in found if not any(matches(x, f) for x in exclude))


def _glob_parts(parts: list[str], target: list[str], match) -> bool:
    if not parts:
        return not target
    if parts[0] == "**":
        return any(_glob_parts(parts[1:], target[i:], match) for i in range(len(target) + 1))
    return bool(target) and match(target[0], parts[0]) and _glob_parts(parts[1:], target[1:], match)
