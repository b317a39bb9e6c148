"""The tests' own layout (docs/testing.md, "Where a module's tests live"): tests/ mirrors grader/,
so a module's tests are found by its name: grader/judge/perf.py's in tests/judge/test_perf.py,
a top-level module's (grader/results.py) in tests/core/test_results.py; suites across modules in
tests/e2e/ and tests/gpu/. Every test folder is a package, so two folders may hold one file name."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
GRADER = TESTS.parent / "grader"
NOT_MIRRORS = ("core", "e2e", "gpu", "bench")  # core: grader's top-level modules; the others: suites across it
DATA = {"fixtures", "image", "__pycache__"}


def _test_folders(root: Path = TESTS) -> list[Path]:
    return [p for p in sorted(root.rglob("*")) if p.is_dir() and not DATA & set(p.relative_to(root).parts)]


def _grader_names() -> dict[str, set[Path]]:
    """Every module and package of grader/ by its name (perf -> {grader/judge}), where it lies."""
    names: dict[str, set[Path]] = {}
    for p in GRADER.rglob("*.py"):
        if p.name != "__init__.py" and "__pycache__" not in p.parts:
            names.setdefault(p.stem, set()).add(p.parent)
    for p in GRADER.rglob("__init__.py"):
        if p.parent != GRADER:
            names.setdefault(p.parent.name, set()).add(p.parent.parent)
    return names


def layout_problems(root: Path = TESTS) -> list[str]:
    problems = []
    problems += [f"tests/{f.name}: a test file outside a folder (place it where its module's tests live)"
                 for f in sorted(root.glob("test_*.py")) if f.name != Path(__file__).name]
    for folder in [root, *_test_folders(root)]:
        if not (folder / "__init__.py").is_file():
            problems.append(f"{folder.relative_to(root.parent)}: no __init__.py (a test folder is a package)")
    names = _grader_names()
    for folder in _test_folders(root):
        rel = folder.relative_to(root)
        mirrored = GRADER if rel.parts[0] == "core" else None if rel.parts[0] in NOT_MIRRORS else GRADER / rel
        if mirrored is not None and not mirrored.is_dir():
            problems.append(f"tests/{rel}: no grader/{rel} to mirror (nor one of {sorted(NOT_MIRRORS)})")
            continue
        for test in sorted(folder.glob("test_*.py")):
            name = test.stem[len("test_"):]
            where = names.get(name, set())
            if not where or name == folder.name or mirrored in where:
                continue  # no module of that name, the folder's own package as a whole, or the right folder
            homes = sorted(str(w.relative_to(GRADER.parent)) for w in where)
            problems.append(f"tests/{rel}/{test.name}: the tests of a module {name} of {homes} belong in its mirror")
    return problems


def test_tests_mirror_grader_and_every_folder_is_a_package():
    assert layout_problems() == []


def test_a_misplaced_or_loose_test_file_is_named(tmp_path):
    """The rule above fails where it should: a test of grader/judge/perf.py under tests/batch/, a
    loose file at the top, a folder with no __init__.py and one that mirrors nothing."""
    tests = tmp_path / "tests"
    for folder in ("", "batch", "nowhere", "judge"):
        (tests / folder).mkdir(parents=True, exist_ok=True)
        if folder != "judge":
            (tests / folder / "__init__.py").write_text("")
    for path in ("batch/test_perf.py", "test_loose.py", "judge/test_perf.py", "batch/test_batch.py"):
        (tests / path).write_text("")
    problems = layout_problems(tests)
    assert any(p.startswith("tests/batch/test_perf.py: ") for p in problems), problems
    assert any(p.startswith("tests/test_loose.py: ") for p in problems), problems
    assert any("tests/judge: no __init__.py" in p for p in problems), problems
    assert any(p.startswith("tests/nowhere: no grader/nowhere") for p in problems), problems
    assert not any("judge/test_perf.py" in p or "test_batch.py" in p for p in problems), problems
