"""`grader course new PATH` and `grader assignment new NAME --shape ...`: a course repo of its own,
and an assignment's skeleton that `grader course check` passes as written.

A course folder: assignments/<name>/ (spec.py, hidden.py, README.md, starter/<module>),
reference/<name>.py (the instructor's kernel, timed against), solutions/<module> (a correct
submission, checked like a student's), course.toml (a class's deadlines and policies), a README
and .github/workflows/course-check.yml, which runs `grader course check` on every push.
The templates are in grader/templates/skeleton/<shape>/, written with the name put in.
"""

from __future__ import annotations

import keyword
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

SHAPES = {
    "elementwise": "one output element per input element (relu, gelu, add): a 1-D tensor, masked tail, strides",
    "rowwise": "a reduction over each row of a 2-D tensor (sum, max, norm): one program per row",
    "matmul": "a tiled matrix product (a @ b): 2-D blocks, a K loop, masks on every edge",
}

_ENV = Environment(loader=PackageLoader("grader", "templates/skeleton"), undefined=StrictUndefined,
                   keep_trailing_newline=True)


class SkeletonError(ValueError):
    """The course or assignment cannot be written as asked (a usage error), in one line."""


def new_course(path: Path, title: str = "Triton kernels") -> list[str]:
    """Write an empty course at `path` (new, or an empty folder); the files written."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise SkeletonError(f"{path} is not an empty folder: a course is made in a new one")
    files = {
        "README.md": _ENV.get_template("course_README.md.j2").render(title=title),
        "course.toml": _ENV.get_template("course.toml.j2").render(title=title),
        ".github/workflows/course-check.yml": _ENV.get_template("course-check.yml.j2").render(),
        ".gitignore": "assignments/course-secret.txt\n.grader/\n__pycache__/\n*.safetensors\n",
        "assignments/.keep": "",
        "reference/.keep": "",
        "solutions/.keep": "",
    }
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return sorted(files)


def new_assignment(course: Path, name: str, shape: str) -> list[str]:
    """Write assignment `name` of `shape` into the course folder `course`; the files written."""
    course = Path(course)
    if shape not in SHAPES:
        raise SkeletonError(f"--shape {shape!r}: one of {', '.join(SHAPES)}")
    if not name.isidentifier() or keyword.iskeyword(name) or not name.islower():
        raise SkeletonError(f"{name!r} is no assignment name: a lower-case Python identifier (relu, row_sum)")
    if not (course / "assignments").is_dir():
        raise SkeletonError(f"{course} is no course folder (no assignments/; `grader course new` makes one)")
    folder = course / "assignments" / name
    module = f"kernels/{name}.py"
    files = {
        f"assignments/{name}/spec.py": "spec.py.j2",
        f"assignments/{name}/hidden.py": "hidden.py.j2",
        f"assignments/{name}/README.md": "README.md.j2",
        f"assignments/{name}/starter/{module}": "starter.py.j2",
        f"reference/{name}.py": "kernel.py.j2",
        f"solutions/{module}": "kernel.py.j2",
    }
    taken = [rel for rel in files if (course / rel).exists()]
    if folder.exists() or taken:
        raise SkeletonError(f"{name} exists already in {course} ({(taken or [f'assignments/{name}'])[0]}): "
                            "choose another name")
    for rel, template in files.items():
        text = _ENV.get_template(f"{shape}/{template}").render(name=name, module=module, shape=shape,
                                                              role="reference" if rel.startswith("reference/")
                                                              else "solution")
        (course / rel).parent.mkdir(parents=True, exist_ok=True)
        (course / rel).write_text(text)
    return list(files)
