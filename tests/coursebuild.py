"""Courses for the course-authoring tests: folders outside the grader's repo, made from its own
vector_add, broken in the ways an instructor breaks an assignment."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
VECTOR_ADD = REPO_ROOT / "assignments" / "vector_add" / "spec.py"

# (assignment name, the line of vector_add's spec.py replaced, what replaces it)
RAISES_AT_GRADING = [
    ("fails_inputs", '    n, stride = params["n"], params.get("stride", 1)\n',
     '    n, stride = params["n"], params.get("stride", 1)\n    if n == 1:\n        raise KeyError("n")\n'),
    ("fails_truth", "def truth(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:\n",
     "def truth(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:\n    assert x.numel() > 1, 'too short'\n"),
]


def copy_of_vector_add(root: Path, name: str, old: str = "", new: str = "") -> Path:
    """assignments/<name>/spec.py (vector_add's, renamed, `old` replaced by `new`) and
    reference/<name>.py: the assignment's folder."""
    folder = root / "assignments" / name
    folder.mkdir(parents=True)
    text = VECTOR_ADD.read_text()
    assert old in text
    (folder / "spec.py").write_text(text.replace(old, new, 1).replace('name="vector_add"', f'name="{name}"'))
    (root / "reference").mkdir(exist_ok=True)
    shutil.copy(REPO_ROOT / "reference" / "vector_add.py", root / "reference" / f"{name}.py")
    return folder


def broken_course(root: Path) -> Path:
    """A course whose specs load and break only while grading: `fails_inputs` (make_inputs raises
    on n=1, at spec.py:13) and `fails_truth` (truth raises on n=1, at spec.py:18)."""
    for name, old, new in RAISES_AT_GRADING:
        copy_of_vector_add(root, name, old, new)
    return root
