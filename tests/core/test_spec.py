"""The assignment contract, checked when a spec is loaded (grader.spec.validate): a broken
spec.py or hidden.py is refused with its file and the rule it breaks, by the catalogue and by
`grader list` and `grader check`, before anything is graded; the course's own specs all keep it.
"""

from __future__ import annotations

import ast
import html
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import COURSE, REPO_ROOT, build_submission
from grader import spec as specs


def _course(tmp_path: Path, *names: str) -> Path:
    """A course of copies of these assignments (spec, hidden cases, handout, starter, reference)."""
    course = tmp_path / "course"
    for name in names:
        shutil.copytree(REPO_ROOT / "assignments" / name, course / "assignments" / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
        (course / "reference").mkdir(exist_ok=True)
        shutil.copy(REPO_ROOT / "reference" / f"{name}.py", course / "reference" / f"{name}.py")
    return course


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} is not in {path}: the fixture no longer breaks what it names"
    path.write_text(text.replace(old, new, 1))


# (what is broken, file, text replaced, replacement, the rule the refusal must state)
BROKEN = [
    ("syntax", "spec.py", "def baseline(", "def baseline((", "does not import: SyntaxError"),
    ("raises", "spec.py", "import torch\n", "import torch\nraise RuntimeError('no data file here')\n",
     "does not import: RuntimeError: no data file here"),
    ("no SPEC", "spec.py", "SPEC = Assignment(", "SPECS = Assignment(", "defines no SPEC"),
    ("SPEC not an Assignment", "spec.py", "SPEC = Assignment(", "SPEC = dict(", "SPEC is a dict"),
    ("name", "spec.py", 'name="vector_add"', 'name="vector_sum"',
     "SPEC.name is 'vector_sum', but the folder is 'vector_add' (they must match)"),
    ("function", "spec.py", 'function="vector_add"', 'function="vector-add"', "SPEC.function 'vector-add' is not"),
    ("module", "spec.py", 'module="kernels/vector_add.py"', 'module="../kernels/vector_add.py"',
     "SPEC.module '../kernels/vector_add.py' must be a .py path inside the student's repo"),
    ("points", "spec.py", "correctness_points=6", "correctness_points=0",
     "SPEC.correctness_points must be above 0 (got 0)"),
    ("speed without points", "spec.py", "performance_points=4", "performance_points=0",
     "SPEC.performance and SPEC.performance_points go together"),
    ("no truth", "spec.py", "truth=truth,", "truth=None,",
     "SPEC.truth (the float64 answer) or SPEC.check (a property check) is needed"),
    ("the old name", "spec.py", "truth=truth,", "reference=truth,", "the float64 answer is Assignment(truth=...) now"),
    ("not a function", "spec.py", "make_inputs=make_inputs,", "make_inputs='make_inputs',",
     "SPEC.make_inputs must be a function"),
    ("dtype", "spec.py", "random_cases=random_cases,", "random_cases=random_cases, dtypes=('float32', 'float8'),",
     "SPEC.dtypes must be a tuple of dtypes among"),
    ("no float32", "spec.py", "random_cases=random_cases,", "random_cases=random_cases, dtypes=('float16',),",
     "SPEC.dtypes lacks float32"),
    ("timing dtype", "spec.py", 'dtype="float32",', 'dtype="float64",',
     "SPEC.performance.dtype 'float64' is not one of SPEC.dtypes"),
    ("forbidden op", "spec.py", '"aten::add.Tensor"', '"add.Tensor"', "SPEC.forbidden_ops must be a set of aten op names"),
    ("cases a list", "spec.py", "    ),\n    random_cases=random_cases,", "    ) and [],\n    random_cases=random_cases,",
     "SPEC.cases must be a tuple of Case(...), not a list"),
    ("tolerance", "spec.py", "random_cases=random_cases,",
     "random_cases=random_cases, tolerance=__import__('grader.spec').spec.Tolerance(atol={'float32': 1e-6}),",
     "SPEC.tolerance has no atol or rtol for ['float16', 'bfloat16']"),
    ("timeout", "spec.py", "random_cases=random_cases,", "random_cases=random_cases, call_timeout_s=0,",
     "SPEC.call_timeout_s must be a number of seconds above 0 (got 0)"),
    ("hidden repeats a name", "hidden.py", 'Case("n=4095"', 'Case("n=127"',
     "SPEC.cases repeats a case name (hidden.py's included): ['n=127']"),
    ("hidden not cases", "hidden.py", "CASES = (", "CASES = ('n=5',", "CASES must be a tuple of Case(...)"),
    ("hidden raises", "hidden.py", "CASES = (", "CASES = (1 / 0,", "does not import: ZeroDivisionError"),
]


@pytest.mark.parametrize("what, file, old, new, rule", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_spec_is_refused_with_its_file_and_rule(tmp_path, what, file, old, new, rule):
    folder = _course(tmp_path, "vector_add") / "assignments" / "vector_add"
    _edit(folder / file, old, new)
    with pytest.raises(specs.SpecError) as refused:
        specs._load_spec(folder)
    # hidden.py's cases join the spec's before the rules are checked: a rule they break is the spec's
    blamed = folder / (file if what.startswith(("hidden not", "hidden raises")) else "spec.py")
    assert list(refused.value.broken) == [blamed]
    assert any(rule in r for r in refused.value.broken[blamed]), refused.value.broken
    assert f"{blamed}: " in str(refused.value) and rule in str(refused.value)


def test_every_broken_spec_is_said_at_once_and_none_is_dropped(tmp_path):
    course = _course(tmp_path, "vector_add", "softmax")
    _edit(course / "assignments" / "vector_add" / "spec.py", "correctness_points=6", "correctness_points=-1")
    _edit(course / "assignments" / "softmax" / "spec.py", "import torch\n", "import torch\nimport no_such_module\n")
    catalogue = specs.Course(course)
    with pytest.raises(specs.SpecError) as refused:
        catalogue.catalogue()
    assert sorted(refused.value.broken) == [course / "assignments" / n / "spec.py" for n in ("softmax", "vector_add")]
    with pytest.raises(specs.SpecError):
        catalogue.get("vector_add")  # never a catalogue without the broken ones


def test_the_course_specs_keep_the_contract():
    assert {name: specs.problems(spec) for name, spec in COURSE.catalogue().items()} == {
        name: [] for name in COURSE.catalogue()}
    assert len(COURSE.catalogue()) == 9


def _grader(course: Path, cwd: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GRADER_COURSE=str(course), COLUMNS="300", **env_vars,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_grader_list_refuses_a_broken_spec(tmp_path):
    course = _course(tmp_path, "vector_add", "softmax")
    listed = _grader(course, tmp_path, "list", "--json")  # the same course, intact: listed
    assert listed.returncode == 0, listed.stderr
    assert "vector_add" in listed.stdout and "softmax" in listed.stdout
    spec_file = course / "assignments" / "vector_add" / "spec.py"
    _edit(spec_file, "truth=truth,", "truth=None,")
    refused = _grader(course, tmp_path, "list")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{spec_file}: SPEC.truth (the float64 answer) or SPEC.check (a property check) is needed" in refused.stderr
    assert "Traceback" not in refused.stderr and "softmax" not in refused.stdout


def test_grader_check_refuses_a_broken_spec_before_grading(tmp_path):
    course = _course(tmp_path, "vector_add")
    spec_file = course / "assignments" / "vector_add" / "spec.py"
    _edit(spec_file, "SPEC = Assignment(", "SPEC = 0, Assignment(")
    repo = build_submission(tmp_path / "repo", "good")
    out = tmp_path / "out"
    summary = tmp_path / "summary.md"
    refused = _grader(course, tmp_path, "check", str(repo), "--json", str(out / "results.json"), "--html", str(out),
                      "--ci", "github", GITHUB_STEP_SUMMARY=str(summary), GITHUB_OUTPUT=str(tmp_path / "output"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    rule = "SPEC is a tuple: it must set SPEC = Assignment(...)"
    assert f"{spec_file}: {rule}" in refused.stderr
    assert "Traceback" not in refused.stderr and not (out / "results.json").exists()
    shown = html.unescape(summary.read_text())  # the job summary, where CI shows it (Markdown-escaped)
    assert "the check could not run" in shown and rule in shown and "spec.py" in shown


# -- the spec's public API: one module, the only one a spec file imports from the grader --------------

def _grader_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) for every import of the grader package in `path` (read, not run)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grader":
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.split(".")[0] == "grader"]
    return found


COURSE_FILES = sorted([*(REPO_ROOT / "assignments").glob("*/spec.py"), *(REPO_ROOT / "assignments").glob("*/hidden.py")])


@pytest.mark.parametrize("path", COURSE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_spec_file_imports_the_grader_only_through_its_api(path):
    from grader import spec_api

    imports = _grader_imports(path)
    assert imports, f"{path} imports nothing of the grader: the test reads the wrong files"
    for module, names in imports:
        assert module == "grader.spec_api", f"{path}: imports {module}; a spec imports from grader.spec_api only"
        assert set(names) <= set(spec_api.__all__), f"{path}: {sorted(set(names) - set(spec_api.__all__))} not in the API"


def test_the_api_declares_what_specs_use_and_the_package_never_imports_it():
    from grader import spec_api

    assert all(hasattr(spec_api, name) for name in spec_api.__all__)
    used = {n for p in COURSE_FILES for _, names in _grader_imports(p) for n in names}
    assert used <= set(spec_api.__all__) and {"Assignment", "Case", "Mismatch", "Verdict", "aten_ops"} <= used
    # the specs' face, not a layer: no module of the package builds on it (it imports the judge)
    inside = [p for p in (REPO_ROOT / "grader").rglob("*.py") if any(m == "grader.spec_api" or "spec_api" in names
                                                                   for m, names in _grader_imports(p))]
    assert inside == []
