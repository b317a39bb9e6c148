"""The rules of docs/architecture.md's "Rules the tree keeps", checked over every import of
grader/: at module level, inside a function and under `if TYPE_CHECKING:` alike (a typing-only
import still ties two modules together), read with ast so nothing is imported to check it.

Each rule is a function of a tree's imports that lists what breaks it; the package must break
none, and a small tree built to break each one shows every rule can fail."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import grader

ROOT = Path(grader.__file__).resolve().parent.parent
DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "architecture.md"


@dataclass(frozen=True)
class Import:
    """One import statement's module: `target` is the package's module it names (the deepest
    one that exists: `from grader.sandbox import zygote` is grader.sandbox.zygote), or the top
    name of anything outside the package (`torch`, `os`). `lazy`: inside a function, so it runs
    only when that function is called."""

    importer: str
    target: str
    line: int
    lazy: bool


def modules(root: Path) -> dict[str, Path]:
    """Every module of the `grader` package under `root`, by its dotted name."""
    found = {}
    for path in sorted((root / "grader").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(root: Path) -> list[Import]:
    """Every import of every module of the package under `root`."""
    known = modules(root)
    return [i for name, path in known.items() for i in _imports_of(name, path, known)]


def _imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def deepest(target: str) -> str:
        while target not in known and "." in target:
            target = target.rpartition(".")[0]
        return target

    found = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the importer's package, `level - 1` folders up
                    base = ".".join([*package[:len(package) - child.level + 1], base]).strip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names]
            for target in dict.fromkeys(targets):
                inside = target == "grader" or target.startswith("grader.")
                found.append(Import(name, deepest(target) if inside else target.partition(".")[0], child.lineno, lazy))
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _ours(i: Import) -> bool:
    return _in(i.target, "grader")


def _say(i: Import, why: str) -> str:
    return f"{i.importer}:{i.line} imports {i.target}: {why}"


# -- the rules, each a list of what breaks it -----------------------------------------------------

def circles(found: list[Import]) -> list[str]:
    """Every import circle: the module graph's strongly connected components of more than one
    module (Tarjan's algorithm, iterative), and any module importing itself."""
    graph: dict[str, set[str]] = {}
    for i in found:
        if _ours(i):
            graph.setdefault(i.importer, set()).add(i.target)
            graph.setdefault(i.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = [f"{m} imports itself" for m, to in graph.items() if m in to]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        out.append("an import circle: " + " <-> ".join(sorted(component)))
    return out


def worker_imports(found: list[Import]) -> list[str]:
    """worker/ imports nothing of the package but grader.codec and grader.protocol."""
    return [_say(i, "the worker runs beside the student's code") for i in found
            if _in(i.importer, "grader.worker") and _ours(i)
            and not _in(i.target, "grader.worker", "grader.codec", "grader.protocol") and i.target != "grader"]


def protocol_and_codec_imports(found: list[Import]) -> list[str]:
    """protocol.py imports only the standard library; codec.py only torch and safetensors beside it."""
    allowed = {"grader.protocol": set(), "grader.codec": {"torch", "safetensors"}}
    return [_say(i, "beyond the standard library" + (" and torch, safetensors" if allowed[i.importer] else ""))
            for i in found if i.importer in allowed and i.target != "__future__"
            and i.target not in sys.stdlib_module_names and i.target not in allowed[i.importer]]


def judge_batch_cli_order(found: list[Import]) -> list[str]:
    """judge/ never imports batch/ or cli/; batch/ builds on judge/, never on cli/."""
    return [_say(i, "a lower layer imports a higher one") for i in found
            if _in(i.importer, "grader.judge") and _in(i.target, "grader.batch", "grader.cli")
            or _in(i.importer, "grader.batch") and _in(i.target, "grader.cli")]


def profile_imports(found: list[Import]) -> list[str]:
    """profile/ imports only grader.sanitize beside itself; only judge/profiling.py and cli/
    import it, cli/ only inside the function the flag calls; judge/profiling.py itself is
    imported only inside a function (never on the way to grading)."""
    out = []
    for i in found:
        if _in(i.importer, "grader.profile") and _ours(i) and not _in(i.target, "grader.profile", "grader.sanitize") \
                and i.target != "grader":
            out.append(_say(i, "profile/ is pure: only grader.sanitize beside itself"))
        if _in(i.target, "grader.profile") and not _in(i.importer, "grader.profile"):
            if not (i.importer == "grader.judge.profiling" or _in(i.importer, "grader.cli") and i.lazy):
                out.append(_say(i, "only judge/profiling.py, and cli/ when --profile is given, import profile/"))
        if i.target == "grader.judge.profiling" and not i.lazy:
            out.append(_say(i, "profiling is imported only when asked for"))
    return out


def replay_imports(found: list[Import]) -> list[str]:
    """replay/ imports only grader.codec beside itself, and replay/launchrecord.py only the standard library."""
    out = []
    for i in found:
        if i.importer == "grader.replay.launchrecord" and i.target not in (*sys.stdlib_module_names, "__future__"):
            out.append(_say(i, "the launch record is read with the standard library alone"))
        elif _in(i.importer, "grader.replay") and _ours(i) and not _in(i.target, "grader.replay", "grader.codec") \
                and i.target != "grader":
            out.append(_say(i, "where a student's binary runs, only grader.codec beside replay/"))
    return out


# judge/: a module may import only those of a lower rank (the stages: everything not named here)
JUDGE_RANKS = {"grader.judge.workers": 0, "grader.judge.resources": 1, "grader.judge.perf": 2, "grader.judge.grade": 3,
               "grader.judge.session": 4}


def judge_inner(found: list[Import]) -> list[str]:
    """In judge/: workers under resources, resources under the stages (perf, grade), the
    session on top; nothing of judge/ but the session's own imports it."""
    out = []
    for i in found:
        if not (_in(i.importer, "grader.judge") and _in(i.target, "grader.judge")):
            continue
        ranks = JUDGE_RANKS.get(i.importer), JUDGE_RANKS.get(i.target)
        if i.target == "grader.judge.session" or None not in ranks and ranks[1] >= ranks[0]:
            out.append(_say(i, "judge/ layers: workers < resources < stages < session"))
    return out


def spec_api_importers(found: list[Import]) -> list[str]:
    """No module of the package imports spec_api (the specs' face, above the judge)."""
    return [_say(i, "spec_api is for a course's specs only") for i in found
            if i.target == "grader.spec_api" and i.importer != "grader.spec_api"]


# What the sandbox may import of the package beside itself: the bottom modules it is handed
# values by, never the course model (spec), the judge, a batch, the CLI, the kit or a report.
SANDBOX_MAY_IMPORT = ("grader.settings", "grader.safefiles", "grader.protocol", "grader.environment",
                      "grader.proctable")


def trust_line(found: list[Import]) -> list[str]:
    """The trust line's direction: the sandbox imports nothing above it (only SANDBOX_MAY_IMPORT
    and the package's marker, for its folder), and the worker's code is imported by no trusted
    module: only by the zygote's server, which becomes a worker when it forks."""
    out = []
    for i in found:
        if _in(i.importer, "grader.sandbox") and _ours(i) and i.target != "grader" \
                and not _in(i.target, "grader.sandbox", *SANDBOX_MAY_IMPORT) \
                and not (i.importer == "grader.sandbox.zygote.server" and _in(i.target, "grader.worker")):
            out.append(_say(i, "the sandbox is handed what it needs, it never reaches above the line"))
        if _in(i.target, "grader.worker") and not _in(i.importer, "grader.worker", "grader.sandbox.zygote.server"):
            out.append(_say(i, "the trusted side never loads the worker's code"))
    return out


# sandbox/: a module may import only those of a lower rank. The bottom: the interpreter's
# constants, Isolation, the init (run on its own); then uids, files, the launch; the zygote
# (its server lowest: it runs in the zygote process); the backends; their registry; the process.
SANDBOX_RANKS = {
    "grader.sandbox": 0, "grader.sandbox.interpreter": 0, "grader.sandbox.isolation": 0, "grader.sandbox.init": 0,
    "grader.sandbox.uids": 1, "grader.sandbox.files": 1,
    "grader.sandbox.launch": 2,
    "grader.sandbox.zygote.server": 3, "grader.sandbox.zygote.warm": 4, "grader.sandbox.zygote.client": 5,
    "grader.sandbox.zygote": 6,
    "grader.sandbox.namespaces": 7, "grader.sandbox.plain": 7, "grader.sandbox.docker": 7,
    "grader.sandbox.backend": 8,
    "grader.sandbox.process": 9,
}


def sandbox_inner(found: list[Import], known: dict[str, Path]) -> list[str]:
    """sandbox/'s layers (SANDBOX_RANKS): every import goes down, so no backend imports
    `process` or `backend`, and nothing below the zygote's face imports it; a module of the
    sandbox not placed in the table is one too."""
    out = [f"{m} has no place in the sandbox's layers (SANDBOX_RANKS)" for m in known
           if _in(m, "grader.sandbox") and m not in SANDBOX_RANKS]
    for i in found:
        if i.importer in SANDBOX_RANKS and i.target in SANDBOX_RANKS and i.target != "grader.sandbox" \
                and SANDBOX_RANKS[i.target] >= SANDBOX_RANKS[i.importer]:
            out.append(_say(i, "sandbox/ layers go down only (SANDBOX_RANKS)"))
    return out


def process_table_readers(known: dict[str, Path]) -> list[str]:
    """Only grader/proctable.py reads the process table: a path made from a pid
    (f"/proc/{pid}/...") or a listing of /proc. A process's own /proc/self, the kernel's
    settings (/proc/sys) and the driver's (/proc/driver) are not the process table."""
    out = []
    for name, path in known.items():
        if name == "grader.proctable":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.JoinedStr) and len(node.values) > 1 and isinstance(node.values[0], ast.Constant) \
                    and str(node.values[0].value).startswith("/proc/") \
                    and not str(node.values[0].value).startswith(("/proc/self/", "/proc/sys/", "/proc/driver/")):
                out.append(f"{name}:{node.lineno} reads /proc/<pid>: ask grader.proctable")
            elif isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value in ("/proc", "/proc/")
                                                    for a in node.args):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if called in ("listdir", "scandir", "Path", "glob", "iglob", "walk"):
                    out.append(f"{name}:{node.lineno} lists /proc: ask grader.proctable")
    return out


RULES = {
    "circles": lambda found, known: circles(found),
    "worker": lambda found, known: worker_imports(found),
    "protocol and codec": lambda found, known: protocol_and_codec_imports(found),
    "judge, batch, cli": lambda found, known: judge_batch_cli_order(found),
    "profile": lambda found, known: profile_imports(found),
    "replay": lambda found, known: replay_imports(found),
    "judge inside": lambda found, known: judge_inner(found),
    "spec_api": lambda found, known: spec_api_importers(found),
    "trust line": lambda found, known: trust_line(found),
    "sandbox inside": sandbox_inner,
    "process table": lambda found, known: process_table_readers(known),
}


@pytest.mark.parametrize("rule", RULES)
def test_the_package_keeps_the_rule(rule):
    assert RULES[rule](imports(ROOT), modules(ROOT)) == []


# -- every rule can fail --------------------------------------------------------------------------

BROKEN = {  # a tree in which each rule is broken once, and only that rule
    "circles": {"grader/a.py": "import grader.b\n", "grader/b.py": "def f():\n    from grader import a\n"},
    "worker": {"grader/worker/server.py": "from grader.judge import verdict\n", "grader/judge/verdict.py": ""},
    "protocol and codec": {"grader/protocol.py": "import json\nimport torch\n",
                           "grader/codec.py": "import torch\nimport numpy\n"},
    "judge, batch, cli": {"grader/judge/x.py": "if True:\n    from grader.batch import y\n", "grader/batch/y.py": ""},
    "profile": {"grader/profile/ncu.py": "import grader.judge.perf\n", "grader/judge/perf.py": "",
                "grader/cli/check.py": "from grader.profile import ncu\n"},
    "replay": {"grader/replay/launchrecord.py": "from grader import codec\n", "grader/codec.py": "",
               "grader/replay/runner.py": "from grader.judge import perf\n", "grader/judge/perf.py": ""},
    "judge inside": {"grader/judge/grade.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                              "    from grader.judge.session import GradingSession\n",
                     "grader/judge/session.py": ""},
    "spec_api": {"grader/report.py": "def f():\n    import grader.spec_api\n", "grader/spec_api.py": ""},
    "trust line": {"grader/sandbox/namespaces.py": "def f():\n    from grader.spec import course_folder\n",
                   "grader/spec.py": "", "grader/judge/workers.py": "import grader.worker.server\n",
                   "grader/worker/server.py": ""},
    "sandbox inside": {"grader/sandbox/launch.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                   "    from grader.sandbox.zygote.client import Forked\n",
                       "grader/sandbox/zygote/__init__.py": "", "grader/sandbox/zygote/client.py": "",
                       "grader/sandbox/stray.py": ""},
    "process table": {"grader/judge/x.py": 'import os\nos.listdir("/proc")\nopen(f"/proc/self/fd/{3}")\n',
                      "grader/resident.py": 'def f(pid):\n    return open(f"/proc/{pid}/cmdline")\n'},
}


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_finds_what_breaks_it(tmp_path, rule):
    """Every rule reports the tree built to break it, and says where; the other trees pass it
    (so a rule is neither blind nor a catch-all)."""
    for name, files in BROKEN.items():
        root = tmp_path / name.replace(" ", "_").replace(",", "")
        for rel, text in {"grader/__init__.py": "", "grader/sandbox/__init__.py": "", **files}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        for folder in (root / "grader").rglob("*"):
            if folder.is_dir() and not (folder / "__init__.py").exists():
                (folder / "__init__.py").write_text("")
        found = RULES[rule](imports(root), modules(root))
        if name == rule:
            assert found, f"the rule {rule!r} missed its broken tree"
            assert all(re.search(r"grader\.", f) for f in found)
        else:
            assert found == [], f"the rule {rule!r} flagged the tree that breaks {name!r}: {found}"


def test_imports_are_read_at_every_depth(tmp_path):
    """A function's import, a TYPE_CHECKING import and a relative one are imports too."""
    found = {(i.importer, i.target, i.lazy) for i in imports(ROOT)}
    assert ("grader.cli.check", "grader.judge.profiling", True) in found  # inside the --profile function
    assert ("grader.sandbox.zygote", "grader.sandbox.launch", False) in found  # under TYPE_CHECKING
    for rel, text in {"grader/__init__.py": "", "grader/a/__init__.py": "from . import b\n",
                      "grader/a/b.py": "def f():\n    from ..c import d\n", "grader/c.py": ""}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert {(i.importer, i.target, i.lazy) for i in imports(tmp_path)} == {("grader.a", "grader.a.b", False),
                                                                          ("grader.a.b", "grader.c", True)}


# -- every rule of the document has its test ------------------------------------------------------

# A phrase of each rule in docs/architecture.md's "Rules the tree keeps", and where it is tested.
DOC_RULES = {
    "`grader/worker/` imports nothing": "worker",
    "`protocol.py` imports only the standard library": "protocol and codec",
    "`judge/` never imports `batch/` or `cli/`": "judge, batch, cli",
    "`profile/` imports only `grader.sanitize`": "profile",
    "`replay/` imports only `grader.codec`": "replay",
    "In `judge/`: `workers` under `resources`": "judge inside",
    "Only `settings.py` reads a `GRADER_*` variable": "tests/core/test_settings.py",
    "No import circles anywhere": "circles",
    "no module of\n  the package imports `spec_api`": "spec_api",
    "The trust line's direction": "trust line",
    "In `sandbox/`:": "sandbox inside",
    "Only `proctable.py` reads the process table": "process table",
    "No two classes of `grader/` share a name": "tests/core/test_names.py",
    "No `settings` parameter or field anywhere": "tests/core/test_settings.py",
    "Only `kit/annotations.py` writes a workflow command annotation": "tests/e2e/test_sinks.py",
}


def rules_of_the_document() -> list[str]:
    text = DOC.read_text()
    section = text.split("Rules the tree keeps", 1)[1].split("\n## ", 1)[0]
    return [rule for rule in re.split(r"\n- ", section)[1:]]


def test_every_rule_of_the_document_is_tested():
    """Each bullet of "Rules the tree keeps" names one check here (or the file that checks it),
    so a rule added to the document without its test fails this test."""
    untested = [rule.splitlines()[0] for rule in rules_of_the_document()
                if sum(phrase in rule for phrase in DOC_RULES) != 1]
    assert untested == []
    rules = rules_of_the_document()
    assert [phrase for phrase in DOC_RULES if not any(phrase in rule for rule in rules)] == []  # none left behind
    for where in DOC_RULES.values():
        assert where in RULES or (ROOT / where).is_file()
