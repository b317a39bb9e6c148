"""Names that say which thing they are: no two classes of the package share a name, so a reader
(and a grep) never mistakes a launch record's error for a job record's, or a profiled launch for
a worker's launch (docs/architecture.md, "Rules the tree keeps")."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "grader"
# spec.Course (the course model) and batch/course.py's (course.toml) are told apart on their own
TOLERATED = {"Course"}


def classes(root: Path = PACKAGE) -> dict[str, list[str]]:
    """Every module-level class of the package by name: the modules that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found[node.name].append(str(path.relative_to(root.parent)))
    return found


def shared(found: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: where for name, where in found.items() if len(where) > 1 and name not in TOLERATED}


def test_no_two_classes_of_the_package_share_a_name():
    found = classes()
    assert len(found) > 100  # the whole package was read
    assert shared(found) == {}, "classes that share a name (give each a name that says which it is)"


def test_a_shared_class_name_is_found(tmp_path):
    for module in ("a", "b"):
        (tmp_path / "pkg" / module).mkdir(parents=True)
        (tmp_path / "pkg" / module / "record.py").write_text("class RecordError(ValueError):\n    pass\n")
    assert shared(classes(tmp_path / "pkg")) == {"RecordError": ["pkg/a/record.py", "pkg/b/record.py"]}
