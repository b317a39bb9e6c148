"""Nothing in the judge or the replay makes up its own settings: every `settings` parameter and
field there is required, so the session's Settings (its uids, threads, container command, warm
starts) reach every worker and replay process it starts, never the defaults by omission
(docs/architecture.md, "Rules the tree keeps")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "grader"
REQUIRED_IN = ("judge", "replay")


def defaulted_settings(root: Path) -> list[str]:
    """Each `settings` parameter or class field under `root` that has a default, as file:line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                positional = [*a.posonlyargs, *a.args]
                defaulted = positional[len(positional) - len(a.defaults):] if a.defaults else []
                defaulted += [k for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                found += [f"{where}:{node.lineno} {node.name}()" for arg in defaulted if arg.arg == "settings"]
            elif isinstance(node, ast.ClassDef):
                found += [f"{where}:{f.lineno} {node.name}.settings" for f in node.body
                          if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
                          and f.target.id == "settings" and f.value is not None]
    return found


def test_the_judge_and_the_replay_take_settings_they_are_handed():
    for package in REQUIRED_IN:
        assert (PACKAGE / package).is_dir()
        assert defaulted_settings(PACKAGE / package) == [], f"grader/{package}: settings with a default"


def test_a_defaulted_settings_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "def a(x, settings=None): pass\n"
        "def b(x, *, settings=S()): pass\n"
        "def c(x, settings): pass\n"
        "def d(x, *, settings): pass\n"
        "class E:\n    settings: S = S()\n"
        "class F:\n    settings: S\n")
    assert defaulted_settings(tmp_path / "pkg") == ["pkg/m.py:1 a()", "pkg/m.py:2 b()", "pkg/m.py:6 E.settings"]
