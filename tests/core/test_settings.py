"""The grader's settings are read in one place (grader.settings.from_environment) and a grading
session carries them: what each variable sets, the one warm-start policy, and that no other
module of the package reads a GRADER_* variable or decides on its own whether we run in CI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import grader
from grader.settings import DEFAULT_WARM_SECONDS, Settings, from_environment

PACKAGE = Path(grader.__file__).parent


def test_an_empty_environment_gives_the_defaults():
    s = from_environment({})
    assert s == Settings()
    assert s.warm.fork_server and s.warm.job_server and s.warm.keep_seconds == DEFAULT_WARM_SECONDS
    assert not s.in_ci and not s.in_actions and s.course is None and s.threads is None


def test_each_variable_sets_its_field():
    s = from_environment({"GRADER_COURSE": "/srv/course", "GRADER_COURSE_SECRET": "s3", "GRADER_REFERENCE_DIR": "/srv/ref",
                          "GRADER_CACHE_DIR": "/c", "GRADER_CACHE_GB": " 2 ", "GRADER_LOCK_DIR": "/l",
                          "GRADER_SANDBOX_UIDS": "70000-70010", "GRADER_THREADS": "4", "GRADER_DOCKER_IMAGE": "img",
                          "GRADER_CONTAINER_CLI": "podman", "CUDA_VISIBLE_DEVICES": "1,2"})
    assert (s.course, s.course_secret, s.reference_dir) == (Path("/srv/course"), "s3", Path("/srv/ref"))
    assert (s.cache_dir, s.cache_gb, s.lock_dir, s.check_cache_base) == (Path("/c"), "2", Path("/l"), Path("/c"))
    assert (s.sandbox_uids, s.threads, s.docker_image, s.visible_gpus) == ("70000-70010", 4, "img", "1,2")
    assert s.container_cli == "podman" and Settings().container_cli == "docker"
    assert from_environment({"XDG_CACHE_HOME": "/x"}).check_cache_base == Path("/x/grader")
    assert from_environment({"GRADER_THREADS": "many"}).threads is None  # not a count: left to the machine


def test_ci_is_decided_once_and_keeps_nothing_warm():
    for env in ({"CI": "true"}, {"GITHUB_ACTIONS": "true"}):
        s = from_environment(env)
        assert s.in_ci and s.warm.keep_seconds == 0
    assert from_environment({"GITHUB_ACTIONS": "true"}).in_actions and not from_environment({"CI": "1"}).in_actions
    assert from_environment({"CI": "1", "GRADER_WARM_SECONDS": "30"}).warm.keep_seconds == 30  # said outright: kept


@pytest.mark.parametrize("env, fork, keep, server", [
    ({"GRADER_WARM": "0"}, False, 0.0, False),  # one switch turns every warm start off
    ({"GRADER_ZYGOTE": "0"}, False, DEFAULT_WARM_SECONDS, True),
    ({"GRADER_JOB_SERVER": "0"}, True, DEFAULT_WARM_SECONDS, False),
    ({"GRADER_WARM_SECONDS": "soon"}, True, 0.0, True),  # not a number: nothing kept (costs speed, not safety)
    ({"GRADER_WARM_SECONDS": "-5"}, True, 0.0, True),
])
def test_warm_starts_are_one_policy(env, fork, keep, server):
    warm = from_environment(env).warm
    assert (warm.fork_server, warm.keep_seconds, warm.job_server) == (fork, keep, server)


def test_the_package_reads_its_settings_nowhere_else():
    """No module but grader/settings.py reads a GRADER_* variable, CI or GITHUB_ACTIONS from the
    environment (os.environ.get, os.environ[...], os.getenv, `in os.environ`); passing the whole
    environment on to a child process is not reading a setting."""
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "settings.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = _read_variable(node)
            if name and (name.startswith("GRADER_") or name in ("CI", "GITHUB_ACTIONS")):
                readers.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} reads {name}")
    assert readers == []


def _read_variable(node: ast.AST) -> str | None:
    """The variable's name where `node` reads one from os.environ (or os.getenv) by a constant name."""
    def environ(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == "environ" or isinstance(n, ast.Name) and n.id == "environ"

    key = None
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and environ(f.value) or \
                isinstance(f, ast.Attribute) and f.attr == "getenv":
            key = node.args[0]
    elif isinstance(node, ast.Subscript) and environ(node.value):
        key = node.slice
    elif isinstance(node, ast.Compare) and any(environ(c) for c in node.comparators):
        key = node.left
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def test_the_scan_of_the_package_would_see_a_reader():
    """The check above can fail: each form it looks for is found in a module that uses it."""
    source = ('import os\nos.environ.get("GRADER_X")\nos.environ["CI"]\nos.getenv("GRADER_Y")\n'
              '"GITHUB_ACTIONS" in os.environ\nos.environ.get("PATH")\n')
    found = [n for n in map(_read_variable, ast.walk(ast.parse(source))) if n]
    assert sorted(found) == ["CI", "GITHUB_ACTIONS", "GRADER_X", "GRADER_Y", "PATH"]


# Where a process starts, and so reads its settings once: the CLI's commands (grader.cli), `python
# -m grader` and the `grader` command's entry (whether a warm judge runs it), a batch's job process
# and job server, a Ray task, the Gradescope upload's fix-up run.
# Everything below them is handed the settings (a grading session's Resources hand them on).
ENTRY_POINTS = {
    "grader/batch/jobs.py": {"_job_process_main", "_job_server_main"},
    "grader/batch/executors.py": {"ray_task"},
    "grader/kit/gradescope.py": {"<module>"},  # its `if __name__ == "__main__":` block
    "grader/resident.py": {"through_resident"},
}


def _environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, enclosing function or <module>) of every call that reads the settings from the
    process's environment: grader.settings' `current()` (however imported, or as
    `settings.current()`), or its `from_environment()` without an env of its own."""
    readers = {"current": "current", "from_environment": "from_environment"}
    imported = {a.asname or a.name: readers[a.name] for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module == "grader.settings" for a in n.names if a.name in readers}
    found = []

    def reads(call: ast.Call) -> bool:
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "settings":
            name = readers.get(f.attr)
        else:
            name = imported.get(f.id) if isinstance(f, ast.Name) else None
        return name == "current" or name == "from_environment" and not call.args and not call.keywords

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            if isinstance(child, ast.Call) and reads(child):
                found.append((child.lineno, where))
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_settings_are_read_only_where_a_process_starts_and_passed_down_from_there():
    """`current()` (the environment, read afresh) only in an entry point: a grading reads its
    settings once, in the command, and the device lock, run cache, workers, sandbox, warm starts
    and executors get them from there, never from the environment on their own."""
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel in ("grader/settings.py", "grader/__main__.py") or rel.startswith("grader/cli/"):
            continue
        for line, where in _environment_reads(ast.parse(path.read_text(), rel)):
            if where not in ENTRY_POINTS.get(rel, ()):
                readers.append(f"{rel}:{line} in {where} reads the settings from the environment")
    assert readers == []


def test_the_course_is_an_object_handed_down_not_a_module_global():
    """No module of the package keeps state in a module global it rebinds (`global NAME`), the
    course folder and its catalogue above all: a command finds its `Course` and hands it down,
    and a grading session owns it. The worker-side and cache globals below are known, and why."""
    allowed = {
        ("grader/worker/memcheck.py", "LAST_VIOLATION"),  # the worker's own process: the last violation it saw
        ("grader/worker/calling.py", "_CALLER"),  # the worker's own process: its one thread that calls a function
        ("grader/batch/similarity.py", "_FPS"),  # a cache of fingerprints of files, keyed by their content
    }
    rebound = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Global):
                rebound += [f"{rel}:{node.lineno} rebinds the module global {n}" for n in node.names if (rel, n) not in allowed]
    assert rebound == []
    from grader import spec

    assert not hasattr(spec, "COURSE_ROOT") and not hasattr(spec, "catalogue") and not hasattr(spec, "get")


MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "remove", "discard", "clear"}
CONTAINERS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


def module_registries(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every module-level mutable container the module changes after import: a
    list, dict or set bound at module level (or a `list()`, `dict()`, `set()`, `defaultdict()`)
    that some code appends to, stores in, pops from or clears. Process-wide state by another name
    than `global`: a constant table that is only read is not one."""
    def mutable(value: ast.AST | None) -> bool:
        if isinstance(value, CONTAINERS):
            return True
        f = value.func if isinstance(value, ast.Call) else None
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in ("list", "dict", "set", "defaultdict", "OrderedDict", "deque")

    bound = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name) and mutable(node.value):
                bound[target.id] = node.lineno

    def named(n: ast.AST) -> str | None:
        return n.id if isinstance(n, ast.Name) and n.id in bound else None

    changed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            changed.add(named(node.func.value))
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        changed.update(named(t.value) for t in targets if isinstance(t, ast.Subscript))
    return sorted((bound[n], n) for n in changed if n is not None)


# Process-wide registries kept: only the worker's own state (a worker process serves one student's
# module). The trusted side's (the sandbox's zygotes, their switch, the workers' copy of the code)
# are fields of the object a session holds (grader.sandbox.zygote.SandboxState).
KNOWN_REGISTRIES = {
    ("grader/worker/memcheck.py", "_RANGES"),  # the worker's own process: the tensors it checks accesses against
    ("grader/worker/memcheck.py", "_ROW_STRIDES"),  # the same launch's row strides and integer arguments, which
    ("grader/worker/memcheck.py", "_INTS"),  # name the stride a masked access out of bounds was moved by
    ("grader/worker/server.py", "BLOCKS"),  # the worker's own process: what its one student module launched
    ("grader/worker/server.py", "COMPILED"),
}


def test_no_module_keeps_a_registry_it_changes_but_those_known():
    """The other form of a module global: a container bound at import and changed from then on.
    Every one in the package is listed above with why; a new one fails here."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        found |= {(rel, name) for _, name in module_registries(ast.parse(path.read_text(), rel))}
    assert sorted(found - KNOWN_REGISTRIES) == []
    assert sorted(KNOWN_REGISTRIES - found) == []  # one moved away: off the list


def test_the_scans_of_the_package_would_see_a_reader_and_a_global():
    """The two checks above can fail: each form they look for is found where it is used."""
    source = ("from grader.settings import current, from_environment as env\nfrom grader import settings\n"
              "def f(now):\n    current()\n    settings.current()\n    env()\n    env({})\n    now()\n"
              "x = current()\n")
    assert _environment_reads(ast.parse(source)) == [(4, "f"), (5, "f"), (6, "f"), (9, "<module>")]
    assert _environment_reads(ast.parse("def g(current):\n    current()\n")) == []  # a name of its own
    assert [n.names for n in ast.walk(ast.parse("X = None\ndef f():\n    global X\n    X = 1\n")) if isinstance(n, ast.Global)]
    source = ("A = []\nB: dict = {}\nC = set()\nD = {'k': 1}\nE = []\nF = dict()\n"
              "def f(x):\n    A.append(x)\n    B[x] = 1\n    C.discard(x)\n    del F[x]\n    return D['k'], E[0]\n")
    assert module_registries(ast.parse(source)) == [(1, "A"), (2, "B"), (3, "C"), (6, "F")]  # D, E only read


def test_a_session_hands_its_settings_to_its_workers_and_its_device_lock(tmp_path, monkeypatch):
    """What a command read reaches what the session starts: every worker's launch carries the
    session's settings (threads, warm starts, uid range, container command) and the session's
    sandbox state (its zygotes), and the GPU lock
    lives in the session's lock folder. None of it is read from the environment again."""
    from tests.conftest import COURSE
    from grader.judge.context import GradingContext
    from grader.judge.session import open_session
    from grader.sandbox import process
    from grader.sandbox.isolation import Isolation

    settings = from_environment({"GRADER_THREADS": "3", "GRADER_ZYGOTE": "0", "GRADER_SANDBOX_UIDS": "70000-70010",
                                 "GRADER_LOCK_DIR": str(tmp_path / "locks")})
    monkeypatch.setenv("GRADER_THREADS", "9")  # the environment now: not what the command read
    launches, sandboxes = [], []

    class Backend:  # records each launch instead of starting a process
        @staticmethod
        def detect(probe, settings):
            return Isolation("none")

        @staticmethod
        def start(launch, isolation, sandbox):
            launches.append(launch)
            sandboxes.append(sandbox)
            raise OSError("not started")

    monkeypatch.setattr(process, "backend_for", lambda isolation: Backend)
    session = open_session(GradingContext("cpu", 1, isolation="none"), settings, COURSE)
    with pytest.raises(OSError):
        session.trusted_worker(tmp_path / "trusted")
    worker = session.student_worker(COURSE.get("vector_add"), tmp_path / "job" / "repo", ("kernels/vector_add.py", "vector_add"),
                                    tmp_path / "job" / "scratch")
    with pytest.raises(process.WorkerFailure, match="not started"):
        worker.start()
    assert len(launches) == 2 and all(launch.settings == settings for launch in launches)
    assert sandboxes == [session.sandbox, session.sandbox]  # what the sandbox keeps is the session's, handed down
    assert [launch.env.get("OMP_NUM_THREADS") for launch in launches] == ["3", "3"]
    assert session.course is COURSE and session.settings == settings
    with open_session(GradingContext("cuda", 1, gpu="2"), settings, COURSE).alone_on_gpu():
        assert (tmp_path / "locks" / "gpu-2.lock").is_file()


def _defaulted_settings(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, what, the function it is in) where `settings` can be left out: a parameter or a
    dataclass field named settings with a default, or a `Settings()` made on the spot (the
    defaults, not the command's)."""
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            found.extend((node.lineno, "a settings parameter with a default", node.name)
                         for arg, _ in pairs if arg.arg == "settings")
            where = node.name
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "settings":
            required = (isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "field"
                        and not any(k.arg in ("default", "default_factory") for k in node.value.keywords))
            if node.value is not None and not required:
                found.append((node.lineno, "a settings field with a default", where))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Settings":
            found.append((node.lineno, "Settings() made on the spot", where))
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(tree, "<module>")
    return found


# where a caller that names no course folder gets the one the default settings imply: every caller
# in the package names it; tests leave it out. Known, and to go the same way as `settings`.
CATALOGUE_DEFAULTS = {
    ("grader/kit/classroom50.py", "_default_course"), ("grader/kit/classroom50_config.py", "write_classroom"),
    ("grader/kit/github.py", "report_github"), ("grader/kit/gradescope.py", "build_autograder"),
    ("grader/kit/gradescope.py", "locate_modules"), ("grader/kit/release.py", "build_kit"),
    ("grader/kit/release.py", "private_needles"), ("grader/judge/context.py", "resolve"),
    ("grader/settings.py", "from_environment"),  # where the command's settings are made, once
}


def test_settings_are_a_required_argument_never_a_default():
    """A function or record of the package that works with settings is handed the command's: a
    default (`settings: Settings = Settings()`) would hide a caller that forgot them, and a worker,
    a replay process or a batch would run with the defaults instead of the TA's GRADER_* variables."""
    defaulted = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        defaulted += [f"{rel}:{line}: {what} in {where}"
                      for line, what, where in _defaulted_settings(ast.parse(path.read_text(), rel))
                      if (rel, where) not in CATALOGUE_DEFAULTS or what != "Settings() made on the spot"]
    assert defaulted == []


def test_the_scan_for_defaulted_settings_would_see_each_form():
    source = ("def f(settings=Settings()):\n    pass\n"
              "def g(x, *, settings: Settings = None):\n    pass\n"
              "class C:\n    settings: Settings = Settings()\n"
              "class D:\n    settings: Settings = field(kw_only=True)\n"
              "def h(x, *, settings):\n    return grader.settings.Settings()\n")
    assert _defaulted_settings(ast.parse(source)) == [
        (1, "a settings parameter with a default", "f"), (1, "Settings() made on the spot", "f"),
        (3, "a settings parameter with a default", "g"), (6, "a settings field with a default", "<module>"),
        (6, "Settings() made on the spot", "<module>"), (10, "Settings() made on the spot", "h")]
