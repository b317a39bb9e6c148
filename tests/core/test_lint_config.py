"""Lint and types stay on: CI runs scripts/lint before the tests, with a real rule set; in grader/
a `# noqa` names its rule, and a `# type: ignore` its error code and why (a library's wrong types).
scripts/lint itself runs ruff and mypy."""

import re
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def test_ci_lints_before_the_readmes_test_command():
    lines = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    tests = next(i for i, line in enumerate(lines) if line.endswith("python -m pytest"))
    assert "scripts/lint" in [line.strip() for line in lines[:tests]]
    script = (REPO_ROOT / "scripts" / "lint").read_text()
    assert "python -m ruff check grader" in script and "python -m mypy" in script


def test_the_rule_set_and_the_type_checks():
    tools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]
    assert tools["ruff"]["line-length"] == 120
    assert {"E", "W", "F", "I", "B"} <= set(tools["ruff"]["lint"]["select"])
    mypy = tools["mypy"]
    assert mypy["files"] == ["grader"] and mypy["check_untyped_defs"] is True
    assert not mypy.get("ignore_missing_imports") and not mypy.get("ignore_errors")
    strict = set()
    for override in mypy.get("overrides", []):  # named libraries without type information, or stricter rules
        assert not override.get("ignore_errors")
        if override.get("ignore_missing_imports"):
            assert all(m.split(".")[0] in ("triton", "copydetect", "tomli", "canvasapi") for m in override["module"])
        else:
            assert set(override) == {"module", "disallow_untyped_defs"} and override["disallow_untyped_defs"] is True
            strict.update(override["module"])
    assert {"grader.judge.*", "grader.replay.*"} <= strict  # every function of the judge and the replay is typed


def test_every_exception_in_grader_names_its_rule():
    bare = []
    for path in sorted((REPO_ROOT / "grader").rglob("*.py")):
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines, 1):
            for m in re.finditer(r"#\s*(type:\s*ignore|noqa)(\[[^\]]*\]|:\s*[A-Z]+[0-9]+)?(.*)", line):
                kind, rule, rest = m.group(1), m.group(2), m.group(3)
                # a type: ignore says why: after it on the line, or in the comment line just above
                why = rest.strip(" -#") or (n > 1 and lines[n - 2].strip().startswith("#"))
                if not rule or (kind.startswith("type") and not why):
                    bare.append(f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}")
    assert not bare, "\n".join(bare)
