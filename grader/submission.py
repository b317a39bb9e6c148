"""A student's submission: a repo folder, its optional grader.toml, and a private copy.

grader.toml may point an assignment at another module or function name:

    [assignments.softmax]
    module = "src/my_softmax.py"
    function = "softmax_fwd"

Everything here is the student's input: grader.toml is read as data (at most 64 KiB of UTF-8
TOML, each value checked for its type), a module path must stay inside the repo (links and
`..` resolved, `grader.repofiles`), and what an entry gets wrong is that assignment's outcome,
said in one line, never an exception in the grader.
"""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from grader import repofiles
from grader.sanitize import one_line
from grader.spec import Assignment

IGNORED = shutil.ignore_patterns(".git", "__pycache__", "reports", ".grader", "grader-report", "*.safetensors", ".venv",
                                 "node_modules")


CONFIG = "grader.toml"
CONFIG_LIMIT = 64 * 1024
MODULE_NAME_LIMIT = 1024


class SubmissionError(Exception):
    """The submission cannot be graded at all (no folder, unreadable grader.toml)."""


@dataclass
class Submission:
    root: Path
    overrides: dict[str, dict] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # assignment -> what its grader.toml entry gets wrong

    def target(self, spec: Assignment) -> tuple[str, str]:
        """(module path relative to the repo, function name) for this assignment."""
        o = self.overrides.get(spec.name, {})
        return o.get("module", spec.module), o.get("function", spec.function)

    def locate(self, spec: Assignment) -> tuple[Path | None, str]:
        """(the module's real file, "") when it is there; (None, "") when it is not submitted;
        (None, why) when what the student set up cannot be graded: a grader.toml entry of the
        wrong shape, a module that leads out of the repo, a module that is not a regular file."""
        if spec.name in self.problems:
            return None, self.problems[spec.name]
        module = self.target(spec)[0]
        try:
            return repofiles.regular_file(self.root, module), ""
        except repofiles.RepoFileError as exc:
            return None, f"the module {one_line(module, 120)} {exc}"

    def has(self, spec: Assignment) -> bool:
        return self.locate(spec)[0] is not None

    def problem(self, spec: Assignment) -> str:
        """Why this assignment's module cannot be graded ("" when it can, or is simply absent)."""
        return self.locate(spec)[1]

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

            origin = next((r.url for r in git.Repo(self.root, search_parent_directories=False).remotes
                           if r.name == "origin"), "")
        except Exception:  # not a git repository, or no origin: the folder alone
            pass
        return hashlib.sha256(f"{self.root.resolve()}\0{origin}".encode()).hexdigest()[:16]

    def private_copy(self, dest: Path) -> Counter:
        """A copy the worker may scribble on; the student's own folder stays untouched. Links
        are kept only where they stay inside the repo; what was left out is counted."""
        return repofiles.copy_tree(self.root, dest, ignore=IGNORED)


def open_submission(path: Path) -> Submission:
    """The repo and its grader.toml. Raises SubmissionError (one line) when there is no folder
    or grader.toml as a whole cannot be read; an entry of the wrong shape is recorded as that
    assignment's problem instead (`Submission.problems`)."""
    root = Path(path).resolve()
    if not root.is_dir():
        raise SubmissionError(f"no such folder: {path}")
    sub = Submission(root)
    data = read_config(root)
    for name, entry in data.items():
        try:
            sub.overrides[name] = _entry(name, entry)
        except SubmissionError as exc:
            sub.problems[name] = str(exc)
    return sub


def read_config(root: Path) -> dict:
    """grader.toml's [assignments] table ({} without grader.toml); SubmissionError, in one line,
    for a file that is not a regular file, too large, not UTF-8, not TOML, nested too deep, or
    whose `assignments` is not a table."""
    try:
        raw = repofiles.read_bytes(root, CONFIG, CONFIG_LIMIT)
    except FileNotFoundError:
        return {}
    except repofiles.RepoFileError as exc:
        raise SubmissionError(f"{CONFIG} {exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SubmissionError(f"{CONFIG} is not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SubmissionError(f"{CONFIG} is not valid TOML: {one_line(exc, 200)}") from None
    except RecursionError:
        raise SubmissionError(f"{CONFIG} is not valid TOML: nested too deeply") from None
    assignments = data.get("assignments", {})
    if not isinstance(assignments, dict):
        raise SubmissionError(f"{CONFIG}: assignments must be a table ([assignments.NAME]), not a {_type(assignments)}")
    return assignments


def _entry(name: str, entry: object) -> dict[str, str]:
    """One [assignments.NAME] table, checked: only module (a relative path with no `..`) and
    function (a Python name), both strings."""
    where = f"{CONFIG}: [assignments.{one_line(name, 60)}]"
    if not isinstance(entry, dict):
        raise SubmissionError(f"{where} must be a table with module and function, not a {_type(entry)}")
    unknown = sorted(set(entry) - {"module", "function"})
    if unknown:
        raise SubmissionError(f"{where} may only set module and function (not {one_line(', '.join(unknown), 60)})")
    for key, value in entry.items():
        if not isinstance(value, str):
            raise SubmissionError(f"{where} {key} must be a string, not a {_type(value)}")
    module, function = entry.get("module"), entry.get("function")
    if module is not None:
        parts = module.replace("\\", "/").split("/")
        if not module or len(module) > MODULE_NAME_LIMIT or "\0" in module:
            raise SubmissionError(f"{where} module must be a path of 1 to {MODULE_NAME_LIMIT} characters")
        if module.startswith("/") or Path(module).is_absolute():
            raise SubmissionError(f"{where} module = {one_line(module, 120)} is an absolute path: it must be relative "
                                  "to the repository")
        if ".." in parts:
            raise SubmissionError(f"{where} module = {one_line(module, 120)} leads outside the repository (..)")
    if function is not None and not (function.isidentifier() and len(function) <= 200):
        raise SubmissionError(f"{where} function = {one_line(function, 60)} is not a Python function name")
    return dict(entry)


def _type(value: object) -> str:
    return {dict: "table", list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__)
