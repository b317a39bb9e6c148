"""A student's submission: a repo folder, its optional grader.toml, and a private copy.

grader.toml may point an assignment at another module or function name:

    [assignments.softmax]
    module = "src/my_softmax.py"
    function = "softmax_fwd"
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from grader.spec import Assignment

IGNORED = shutil.ignore_patterns(".git", "__pycache__", "reports", ".grader", "grader-report", "*.safetensors", ".venv", "node_modules")


class SubmissionError(Exception):
    """The submission cannot be graded at all (no folder, unreadable grader.toml)."""


@dataclass
class Submission:
    root: Path
    overrides: dict[str, dict] = field(default_factory=dict)

    def target(self, spec: Assignment) -> tuple[str, str]:
        """(module path relative to the repo, function name) for this assignment."""
        o = self.overrides.get(spec.name, {})
        return o.get("module", spec.module), o.get("function", spec.function)

    def has(self, spec: Assignment) -> bool:
        return (self.root / self.target(spec)[0]).is_file()

    def commit(self) -> str | None:
        try:
            import git

            return git.Repo(self.root, search_parent_directories=False).head.commit.hexsha
        except Exception:
            return None  # not a git repo, or no commit yet: nothing to pin

    def identity(self) -> str:
        """Which repository this is, as a short hash: its folder and where it was cloned from
        (the origin's URL). What a check keeps of one student's compiled kernels is kept under
        it, so a machine that checks several students' repositories never hands one student's
        kernels to another's worker."""
        import hashlib

        origin = ""
        try:
            import git

            origin = next((r.url for r in git.Repo(self.root, search_parent_directories=False).remotes if r.name == "origin"), "")
        except Exception:  # not a git repository, or no origin: the folder alone
            pass
        return hashlib.sha256(f"{self.root.resolve()}\0{origin}".encode()).hexdigest()[:16]

    def private_copy(self, dest: Path) -> Path:
        """A copy the worker may scribble on; the student's own folder stays untouched."""
        shutil.copytree(self.root, dest, ignore=IGNORED, symlinks=True)
        return dest


def open_submission(path: Path) -> Submission:
    root = Path(path).resolve()
    if not root.is_dir():
        raise SubmissionError(f"no such folder: {path}")
    overrides: dict[str, dict] = {}
    config = root / "grader.toml"
    if config.is_file():
        try:
            data = tomllib.loads(config.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SubmissionError(f"grader.toml is not valid TOML: {exc}") from None
        for name, entry in data.get("assignments", {}).items():
            if not isinstance(entry, dict) or not set(entry) <= {"module", "function"}:
                raise SubmissionError(f"grader.toml: [assignments.{name}] may only set module and function")
            overrides[name] = {k: str(v) for k, v in entry.items()}
    return Submission(root, overrides)
