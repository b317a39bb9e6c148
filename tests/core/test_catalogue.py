"""Conformance of the course catalogue: every assignment under assignments/ has what the grader,
the student kit and the test suite need, and a failure says what is missing and where to add it.

An assignment is one folder, assignments/<name>/ (spec.py, README.md, starter/), plus its
reference solution in reference/ and a correct solution among the good fixtures
(tests/fixtures/good/<the spec's module>). The checks are functions of (spec, course folder,
fixtures folder), so the last test runs them on a new assignment in a temporary course.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import COURSE, FIXTURES, REPO_ROOT
from grader import spec as specs
from grader.spec import Course
from grader.judge.plan import make_inputs
from grader.kit import coursecheck
from grader.results import Outcome

GOOD = FIXTURES / "good"
NAMES = sorted(COURSE.catalogue())


def _where(path: Path, course: Path) -> str:
    try:
        return str(path.relative_to(course))
    except ValueError:
        return str(path)


def _defines(path: Path, function: str) -> bool:
    """The file defines `function` at the top level (read, not imported: a starter's stub may not run)."""
    return bool(re.search(rf"^def {re.escape(function)}\s*\(", path.read_text(), re.M))


def _load(path: Path, name: str):
    loader = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


# -- the checks: each returns the problems it found, each a path and what is missing there --------

def spec_problems(spec: specs.Assignment, course: Path) -> list[str]:
    """The contract the grader checks when it loads a spec (grader.spec.problems), said of its file."""
    return [f"assignments/{spec.folder.name}/spec.py: {p}" for p in specs.problems(spec)]


def handout_problems(spec: specs.Assignment, course: Path) -> list[str]:
    handout = spec.folder / "README.md"
    if not handout.is_file():
        return [f"{_where(handout, course)}: the handout is missing (what to write, the signature, the points)"]
    if spec.function not in handout.read_text():
        return [f"{_where(handout, course)}: the handout never names the function {spec.function}() students must write"]
    if "reports/report.html" in handout.read_text():
        return [f"{_where(handout, course)}: the handout names reports/report.html; the report is .grader/report.html"]
    return []


def starter_problems(spec: specs.Assignment, course: Path) -> list[str]:
    """The assignment's own starter/<module>, or (a second part sharing a module, like
    layernorm_backward) another assignment's starter of that module, defines the function."""
    own = spec.folder / "starter" / spec.module
    shared = sorted((course / "assignments").glob(f"*/starter/{spec.module}"))
    starter = own if own.is_file() else (shared[0] if shared else None)
    if starter is None:
        return [f"{_where(own, course)}: the starter is missing (the module students start from, at the path SPEC.module names)"]
    if not _defines(starter, spec.function):
        return [f"{_where(starter, course)}: the starter does not define {spec.function}() (a stub students fill in)"]
    return []


def reference_file(spec: specs.Assignment, course: Path) -> Path:
    """reference/<name>.py, which the grader times against (grader.kit.coursecheck.reference_file)."""
    return coursecheck.reference_file(Course(course), spec)


def reference_problems(spec: specs.Assignment, course: Path) -> list[str]:
    path = reference_file(spec, course)
    if not path.is_file():
        return [f"{_where(path, course)}: the reference solution is missing (it must export {spec.function}())"]
    try:
        module = _load(path, f"catalogue_reference_{spec.name}")
    except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
        return [f"{_where(path, course)}: the reference does not import: {type(exc).__name__}: {exc}"]
    if not callable(getattr(module, spec.function, None)):
        return [f"{_where(path, course)}: the reference does not export {spec.function}()"]
    params = list(inspect.signature(getattr(module, spec.function)).parameters)
    inputs = list(make_inputs(spec, spec.public_cases[0], "float32", 0))
    args = [a for a in inputs if a in params]
    if spec.calls is None and args != [a for a in params if a in inputs]:
        return [f"{_where(path, course)}: {spec.function}({', '.join(params)}) does not take the spec's inputs ({', '.join(inputs)})"]
    return []


def fixture_problems(spec: specs.Assignment, course: Path, fixtures: Path) -> list[str]:
    path = fixtures / spec.module
    if not path.is_file():
        return [f"{_where(path, course)}: the good fixture is missing (a correct {spec.module} that defines {spec.function}())"]
    if not _defines(path, spec.function):
        return [f"{_where(path, course)}: the good fixture does not define {spec.function}()"]
    return []


def static_problems(spec: specs.Assignment, course: Path, fixtures: Path) -> list[str]:
    return (spec_problems(spec, course) + handout_problems(spec, course) + starter_problems(spec, course)
            + reference_problems(spec, course) + fixture_problems(spec, course, fixtures))


# -- the good fixture, graded on its smallest public case in float32 -------------------------------
# (the grading itself is the course check's: grader.kit.coursecheck, which `grader course check` runs)

def grade_in_process(spec: specs.Assignment, path: Path, case: specs.Case | None = None):
    """The judge's verdict on `path`'s function for `case` (default: the spec's smallest public
    case), float32."""
    function = getattr(_load(path, f"catalogue_good_{spec.name}"), spec.function)
    case = case or coursecheck.smallest_case(spec)
    return case, coursecheck.grade_in_process(spec, function, case, "float32")


_INTERPRETED = f"""
import json, sys
from pathlib import Path
sys.path[:0] = [{str(Path(__file__).parents[2])!r}]
import tests.core.test_catalogue as here
from grader import spec as specs
from grader.kit import coursecheck
coursecheck._first_config_only()
verdicts = {{}}
import random
for folder, module, every in json.loads(sys.argv[1]):
    spec = specs._load_spec(Path(folder), specs.Course(Path(folder).parent.parent))
    try:
        cases = [*spec.cases, *spec.random_cases(random.Random(0))] if every else [None]
        for one in cases:  # every case: the first that fails, else the last
            case, verdict = here.grade_in_process(spec, Path(module), one)
            if verdict.outcome.value != "passed":
                break
        verdicts[spec.name] = [verdict.outcome.value, case.name, verdict.message]
    except Exception as exc:
        verdicts[spec.name] = ["error", "", f"{{type(exc).__name__}}: {{exc}}"]
print(json.dumps(verdicts))
"""


def grade_in_interpreter(jobs: list[tuple[Path, Path]], every_case: bool = False) -> dict[str, list[str]]:
    """grade_in_process for each (assignment folder, module file) (on every named, hidden and
    random case with `every_case`: the first that fails, else the last), in one plain Python with
    TRITON_INTERPRET=1 from the start: Triton reads it at import, and its own library (tl.zeros...)
    must be interpreted too. Autotune keeps its first config, as in the grader's worker (timing
    configs needs a GPU). No sandbox, no worker: each verdict is the judge's, in process there.
    Returns name -> [outcome, case, message]."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _INTERPRETED, json.dumps([[str(f), str(m), every_case] for f, m in jobs])],
                          env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def good_verdicts() -> dict[str, list[str]]:
    jobs = [(COURSE.get(n).folder, GOOD / COURSE.get(n).module) for n in NAMES if (GOOD / COURSE.get(n).module).is_file()]
    return grade_in_interpreter(jobs)


# -- the catalogue ----------------------------------------------------------------------------------

def test_the_catalogue_is_the_assignment_folders():
    folders = sorted(p.parent.name for p in (COURSE.root / "assignments").glob("*/spec.py"))
    assert NAMES == folders and "vector_add" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_spec_is_complete(name):
    problems = spec_problems(COURSE.get(name), COURSE.root)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", NAMES)
def test_handout(name):
    problems = handout_problems(COURSE.get(name), COURSE.root)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", NAMES)
def test_starter(name):
    problems = starter_problems(COURSE.get(name), COURSE.root)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", NAMES)
def test_reference_exports_the_function(name):
    problems = reference_problems(COURSE.get(name), COURSE.root)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", NAMES)
def test_good_fixture_passes_in_the_interpreter(name, good_verdicts):
    spec = COURSE.get(name)
    problems = fixture_problems(spec, COURSE.root, GOOD)
    assert not problems, "\n".join(problems)
    outcome, case, message = good_verdicts[name]
    assert outcome == Outcome.PASSED, f"tests/fixtures/good/{spec.module}: {spec.function}() is {outcome} on {case} [float32]: {message}"


@pytest.fixture(scope="module")
def reference_verdicts() -> dict[str, list[str]]:
    course = COURSE.root
    return grade_in_interpreter([(COURSE.get(n).folder, reference_file(COURSE.get(n), course)) for n in NAMES
                                 if COURSE.get(n).performance and reference_file(COURSE.get(n), course).is_file()],
                               every_case=True)


@pytest.mark.parametrize("name", NAMES)
def test_reference_passes_every_case_in_the_interpreter(name, reference_verdicts):
    """The kernel students are timed against is itself graded like a student's, in float32 on
    every named and random case: a faster reference must stay exact (its GPU-only fast paths
    are checked by tests/judge/test_compute_assignments.py on a GPU)."""
    if name not in reference_verdicts:
        pytest.skip(f"{name} has no speed part, so no reference of its own is timed")
    outcome, case, message = reference_verdicts[name]
    assert outcome == Outcome.PASSED, f"reference/{name}.py is {outcome} on {case} [float32]: {message}"


# -- the checks themselves: a new assignment is one folder plus its reference ----------------------

NEW = "vector_plus"


def _course_with_a_new_assignment(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A course of vector_add and a copy of it under another name: its folder (spec, handout,
    starter), its reference and its good fixture, renamed."""
    course, fixtures = tmp_path / "course", tmp_path / "good"
    src = REPO_ROOT / "assignments" / "vector_add"
    shutil.copytree(src, course / "assignments" / "vector_add", ignore=shutil.ignore_patterns("__pycache__"))
    folder = course / "assignments" / NEW
    shutil.copytree(src, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "starter" / "kernels" / "vector_add.py").rename(folder / "starter" / "kernels" / f"{NEW}.py")
    (course / "reference").mkdir()
    shutil.copy(REPO_ROOT / "reference" / "vector_add.py", course / "reference" / "vector_add.py")
    (fixtures / "kernels").mkdir(parents=True)
    shutil.copy(GOOD / "kernels" / "vector_add.py", fixtures / "kernels" / "vector_add.py")
    renamed = [folder / "spec.py", folder / "README.md", folder / "starter" / "kernels" / f"{NEW}.py"]
    for path, text in [(p, p.read_text()) for p in renamed] + [
            (course / "reference" / f"{NEW}.py", (REPO_ROOT / "reference" / "vector_add.py").read_text()),
            (fixtures / "kernels" / f"{NEW}.py", (GOOD / "kernels" / "vector_add.py").read_text())]:
        path.write_text(text.replace("vector_add", NEW))
    monkeypatch.delenv("GRADER_REFERENCE_DIR", raising=False)
    return course, fixtures


def test_adding_an_assignment_is_one_folder_plus_its_reference(tmp_path, monkeypatch):
    course, fixtures = _course_with_a_new_assignment(tmp_path, monkeypatch)
    catalogue = Course(course)
    assert sorted(catalogue.catalogue()) == ["vector_add", NEW]
    spec = catalogue.get(NEW)
    assert (spec.function, spec.module, spec.folder) == (NEW, f"kernels/{NEW}.py", course / "assignments" / NEW)
    assert spec.reference_module() == course / "reference" / f"{NEW}.py"  # where the grader times it from
    assert static_problems(spec, course, fixtures) == []
    assert grade_in_interpreter([(spec.folder, fixtures / spec.module)])[NEW][:2] == [Outcome.PASSED, "n=1"]


def test_each_missing_part_is_named_with_where_to_add_it(tmp_path, monkeypatch):
    course, fixtures = _course_with_a_new_assignment(tmp_path, monkeypatch)
    catalogue = Course(course)
    folder = course / "assignments" / NEW
    (folder / "README.md").unlink()
    shutil.rmtree(folder / "starter")
    (course / "reference" / f"{NEW}.py").unlink()
    (fixtures / "kernels" / f"{NEW}.py").unlink()
    spec = catalogue.get(NEW)
    assert static_problems(spec, course, fixtures) == [
        f"assignments/{NEW}/README.md: the handout is missing (what to write, the signature, the points)",
        f"assignments/{NEW}/starter/kernels/{NEW}.py: the starter is missing (the module students start from, at the path SPEC.module names)",
        f"reference/{NEW}.py: the reference solution is missing (it must export {NEW}())",
        f"{fixtures / 'kernels' / f'{NEW}.py'}: the good fixture is missing (a correct kernels/{NEW}.py that defines {NEW}())",
    ]
    assert static_problems(catalogue.get("vector_add"), course, fixtures) == []  # the others are untouched


def test_a_wrong_part_is_named_too(tmp_path, monkeypatch):
    course, fixtures = _course_with_a_new_assignment(tmp_path, monkeypatch)
    catalogue = Course(course)
    spec_file = course / "assignments" / NEW / "spec.py"
    intact = spec_file.read_text()
    spec_file.write_text(intact.replace("correctness_points=6", "correctness_points=0"))
    with pytest.raises(specs.SpecError) as refused:  # a spec that breaks the contract is refused at load
        catalogue.get(NEW)
    assert refused.value.broken == {spec_file: ["SPEC.correctness_points must be above 0 (got 0)"]}
    spec_file.write_text(intact)
    (course / "reference" / f"{NEW}.py").write_text(f"def not_{NEW}(x, y):\n    return x + y\n")
    broken = fixtures / "kernels" / f"{NEW}.py"
    broken.write_text(broken.read_text().replace("x + y", "x - y"))
    spec = catalogue.get(NEW)
    assert static_problems(spec, course, fixtures) == [f"reference/{NEW}.py: the reference does not export {NEW}()"]
    outcome, case, message = grade_in_interpreter([(spec.folder, broken)])[NEW]  # failed, with the judge's reason
    assert (outcome, case) == (Outcome.FAILED, "n=1") and "1 of 1 elements wrong" in message, message
