"""`grader release`: the student kit, the template repository a course hands out.

It holds the starters at the module paths the specs expect, the handouts, the public specs,
a student README, a .gitignore for the grader's outputs, the CI workflow (grader.kit.github), the
grader itself (a wheel built from this install, or a requirement the TA names) and
grader-kit.toml, which marks the folder as a kit and says how many hidden cases each
assignment has. Never the reference solutions, the hidden cases (assignments/<name>/hidden.py)
or the course secret: a kit is scanned for all three before it is kept (find_leaks).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from jinja2 import Environment, PackageLoader

from grader import __version__
from grader import spec as specs
from grader.settings import Settings

POINTS_TABLE = "points"  # grader-kit.toml's [points]: course.toml's points (read by grader.kit.points)

PYTHON = "3.11"
TORCH = "2.13.0"  # the course's torch: the kit's install line, its workflow and the Gradescope setup pin it
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # torch's CPU build (no GPU: students, hosted runners)
PACKAGE_HOME = Path(__file__).resolve().parents[2]  # where pyproject.toml is, in a source checkout
PRIVATE_NAMES = {"hidden.py", "starter", "__pycache__", "solution", "solutions"}
STARTER_PATH = re.compile(r"`(?:\.\./[\w-]+/)?starter/([^`]+)`")  # a handout's `starter/kernels/x.py`
# not classroom.yml: Classmoji commits its own .github/workflows/classroom.yml into every student repo
WORKFLOW = ".github/workflows/grader.yml"
WHEEL_DIR = "grader-dist"  # the kit's copy of the grader, installed by requirements-grader.txt
MIN_DISTINCTIVE = 24  # a reference line this long, found in no public file, is the reference's own
GITIGNORE = """# the grader's outputs
.grader/
reports/
grader-report/
*.safetensors
__pycache__/
.venv/
"""

_ENV = Environment(loader=PackageLoader("grader", "templates"), trim_blocks=True, lstrip_blocks=True,
                   keep_trailing_newline=True)


class ReleaseError(Exception):
    """The kit cannot be built as asked (a usage error, or it would leak)."""


@dataclass
class Kit:
    root: Path
    assignments: list[str]
    install: str  # what requirements-grader.txt names
    files: list[str] = field(default_factory=list)


def build_kit(out: Path, names: list[str] | None = None, *, force: bool = False, requirement: str | None = None,
              gpu_runner: str | None = None, title: str = "Triton kernels",
              catalogue: specs.Course | None = None, ci_score: str = "cpu-gradable",
              prove: Callable[[list[str]], None] | None = None, points: dict | None = None) -> Kit:
    """Write the kit of `catalogue`'s assignments (default: the course the default settings imply)
    to `out`: empty or absent, or with force, a folder whose contents are replaced (all but .git:
    regenerate into a clone of the template repository and commit the difference). It is built
    beside `out` and moved in only once scanned, so a failure leaves `out` as it was. `ci_score`:
    course.toml's [ci] score (grader.batch.course.CI_SCORES), which the kit's CI runs report by;
    `points`: course.toml's points by assignment, shipped as grader-kit.toml's [points] for those
    released (grader.kit.points: a check there reports out of them), nothing else of course.toml.
    `prove`, given the names shipped, refuses a course that fails its check before anything is written."""
    catalogue = catalogue if catalogue is not None else specs.Course.find(Settings())
    chosen = [catalogue.get(n) for n in names] if names else list(catalogue.catalogue().values())
    out = Path(out).resolve()
    course = catalogue.root.resolve()
    if out == course or course.is_relative_to(out) or out.is_relative_to(course / "assignments"):
        raise ReleaseError(f"{out} would hold or overwrite the course itself: choose a folder outside it")
    kept = [p for p in out.iterdir() if p.name != ".git"] if out.is_dir() else []
    if kept and not force:
        raise ReleaseError(f"{out} is not empty: choose a new folder, or --force to replace its contents "
                           f"(.git is kept)")
    if prove is not None:  # `grader course check` on what ships (grader.kit.coursecheck): it raises to refuse
        prove([s.name for s in chosen])
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        install, wheel = _grader_install(build, requirement)
        for spec in chosen:
            _add_assignment(build, spec)
        manifest = {"grader": __version__, "title": title, "assignments": {
            s.name: {"module": s.module, "function": s.function, "points": s.max_points, "hidden_cases": s.hidden_count}
            for s in chosen}, "ci": {"score": ci_score}}
        given = points or {}
        shipped = {s.name: toml_number(given[s.name]) for s in chosen if s.name in given}
        if shipped:
            manifest[POINTS_TABLE] = shipped
        (build / specs.KIT_MANIFEST).write_text(_toml(manifest))
        (build / "requirements-grader.txt").write_text(install + "\n")
        (build / ".gitignore").write_text(GITIGNORE)
        rows = [{"name": s.name, "title": s.title, "module": s.module, "function": s.function,
                 "points": f"{shipped.get(s.name, s.max_points):g}",  # the course's, as a check there reports
                 "hidden": s.hidden_count} for s in chosen]
        (build / "README.md").write_text(_ENV.get_template("kit_README.md.j2").render(
            title=title, assignments=rows, python=PYTHON, wheel=wheel, torch=TORCH, cpu_index=TORCH_CPU_INDEX,
            ci_score=ci_score))
        (build / WORKFLOW).parent.mkdir(parents=True)
        (build / WORKFLOW).write_text(workflow(gpu_runner))
        leaks = find_leaks(build, catalogue)
        if leaks:
            raise ReleaseError("the kit would leak private material:\n  " + "\n  ".join(leaks[:20]))
        _check_loads(build, [s.name for s in chosen])
        out.mkdir(exist_ok=True)
        for old in kept:
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
        for part in build.iterdir():
            shutil.move(str(part), str(out / part.name))
    finally:
        shutil.rmtree(build, ignore_errors=True)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()
                   and ".git" not in p.relative_to(out).parts)
    return Kit(out, [s.name for s in chosen], install, files)


def toml_number(value) -> int | float:
    """course.toml's points (a Fraction) as TOML writes a number: 20, not 20.0."""
    value = float(value)
    return int(value) if value.is_integer() else value


def workflow(gpu_runner: str | None = None) -> str:
    if gpu_runner is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", gpu_runner):
        raise ReleaseError(f"--gpu-runner {gpu_runner!r}: a runner label is letters, digits, '-', '_' and '.'")
    return _ENV.get_template("classroom.yml.j2").render(gpu_runner=gpu_runner, python=PYTHON, timeout_minutes=60,
                                                              torch=TORCH, cpu_index=TORCH_CPU_INDEX)


def ensure_secret(catalogue: specs.Course) -> str | None:
    """Make the course secret if the course has none (and none is given in the environment), so
    that graded random shapes differ from any a kit can draw. Returns the file made, if any."""
    if catalogue.secret():
        return None
    path = catalogue.root / specs.SECRET_FILE
    path.write_text(secrets.token_hex(16) + "\n")
    os.chmod(path, 0o600)
    return str(path)


# -- the parts -------------------------------------------------------------------------------------

def _add_assignment(out: Path, spec: specs.Assignment) -> None:
    folder = spec.folder
    inline = _inline_hidden(folder)
    if inline:
        raise ReleaseError(f"{folder / 'spec.py'} marks case(s) {', '.join(inline)} hidden in the public spec: "
                           f"move them to {folder / 'hidden.py'} (CASES = (...)), which is never released")
    dest = out / "assignments" / folder.name
    shutil.copytree(folder, dest, ignore=lambda d,
                    names: [n for n in names if n in PRIVATE_NAMES or n.endswith(".pyc")])
    for handout in dest.glob("*.md"):  # the kit has the starters in place: point at them there
        handout.write_text(STARTER_PATH.sub(r"`\1`", handout.read_text()))
    starter = folder / "starter"
    if starter.is_dir():
        for src in sorted(p for p in starter.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            target = out / src.relative_to(starter)
            if target.exists() and target.read_bytes() != src.read_bytes():
                raise ReleaseError(f"two starters write {target.relative_to(out)} differently ({src})")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    module = out / spec.module
    text = module.read_text() if module.is_file() else ""
    if not re.search(rf"^def {re.escape(spec.function)}\s*\(", text, re.M):
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(text + _stub(spec, fresh=not text))


def _stub(spec: specs.Assignment, fresh: bool) -> str:
    """A function that says what to write, where an assignment has no starter for it."""
    head = (f'"""{spec.title}: see assignments/{spec.name}/README.md."""\n\nimport torch\nimport triton\n'
            "import triton.language as tl\n") if fresh else ""
    return (f"{head}\n\ndef {spec.function}(*args, **kwargs):\n    # {spec.signature}\n"
            f"    raise NotImplementedError(\"{spec.function}: write it with a Triton kernel "
            f"(assignments/{spec.name}/README.md)\")\n")


def _inline_hidden(folder: Path) -> list[str]:
    """Hidden cases written in spec.py itself (which is released): the spec loaded without hidden.py."""
    import importlib.util

    module_spec = importlib.util.spec_from_file_location(f"grader_release_{folder.name}", folder / "spec.py")
    assert module_spec is not None and module_spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return [c.name for c in module.SPEC.cases if c.hidden]


def _grader_install(out: Path, requirement: str | None) -> tuple[str, str | None]:
    """(the line of requirements-grader.txt, the wheel's file name if one was built)."""
    if requirement:
        return requirement, None
    if not (PACKAGE_HOME / "pyproject.toml").is_file():
        raise ReleaseError("this grader is not a source checkout, so no wheel can be built for the kit: "
                           "name what students install with --grader-requirement (e.g. 'grader==0.1.0')")
    dest = out / WHEEL_DIR  # committed with the kit (grader check's own outputs go to .grader/, which git ignores)
    dest.mkdir()
    wheel = build_wheel(dest)
    return f"./{WHEEL_DIR}/{wheel.name}", f"{WHEEL_DIR}/{wheel.name}"


def build_wheel(dest: Path) -> Path:
    """The grader package as a wheel, built offline from a copy of its sources (pyproject.toml,
    README.md, grader/): the checkout gets no build/ or egg-info, and no course file goes in."""
    with tempfile.TemporaryDirectory(prefix="grader-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(PACKAGE_HOME / name, src / name)
        shutil.copytree(PACKAGE_HOME / "grader", src / "grader", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest)]
        proc = subprocess.run([*pip_wheel, "--no-build-isolation", "--no-index", str(src)], capture_output=True,
                              text=True)
        if proc.returncode != 0:  # this Python's setuptools cannot build wheels (older than 70.1 without `wheel`):
            # let pip fetch the build requirements pyproject.toml names, from the indexes it is configured with
            proc = subprocess.run([*pip_wheel, str(src)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ReleaseError(f"building the grader's wheel failed: {proc.stderr.strip()[-800:]}")
    wheels = sorted(dest.glob("grader-*.whl"))
    if not wheels:
        raise ReleaseError("building the grader's wheel produced no grader-*.whl")
    return wheels[-1]


def _check_loads(kit: Path, names: list[str]) -> None:
    """The kit's specs load on their own (a spec may lean on another assignment's) and hold no hidden case."""
    code = ("import json; from grader import spec, settings; c = spec.Course.find(settings.current()).catalogue(); "
            "print(json.dumps({n: sum(x.hidden for x in s.cases) for n, s in c.items()}))")
    env = {k: v for k, v in os.environ.items() if k not in ("GRADER_COURSE_SECRET",)}
    env.update(GRADER_COURSE=str(kit), PYTHONPATH=str(PACKAGE_HOME))
    proc = subprocess.run([sys.executable, "-c", code], cwd=kit, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise ReleaseError(f"the kit's specs do not load on their own (release the assignments they need too): "
                           f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    if sorted(loaded) != sorted(names) or any(loaded.values()):
        raise ReleaseError(f"the kit's specs load as {loaded}, expected {names} with no hidden case")


# -- the leak scan ---------------------------------------------------------------------------------

def private_needles(catalogue: specs.Course | None = None) -> dict[str, str]:
    """What must never appear in a kit of `catalogue` (default: the course the default settings
    imply), by what it is: every reference and solution file whole and each of its distinctive lines
    (long, and in no public file of the course), every hidden case's name, the secret."""
    catalogue = catalogue if catalogue is not None else specs.Course.find(Settings())
    course = catalogue.root
    public = _public_corpus(course)
    needles: dict[str, str] = {}
    private = [course / "reference", course / "solutions"]  # the instructor's kernels and the correct submissions
    for ref in sorted(p for folder in private if folder.is_dir() for p in folder.rglob("*")):
        if not ref.is_file() or "__pycache__" in ref.parts:
            continue
        text = ref.read_text(errors="replace")
        if text.strip():
            needles[text.strip()] = f"the content of {ref.relative_to(course)}"
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if len(line) >= MIN_DISTINCTIVE and line not in public:
                needles.setdefault(line, f"line {n} of {ref.relative_to(course)}")
    for folder in sorted((course / "assignments").glob("*/hidden.py")):
        for case in specs._load_hidden(folder.parent):
            needles[case.name] = f"the name of hidden case {case.name!r} of {folder.parent.name}"
    secret = catalogue.secret()
    if secret:
        needles[secret] = "the course secret"
    return needles


def _public_corpus(course: Path) -> str:
    parts = []
    for folder in (course / "assignments").glob("*"):
        for p in folder.rglob("*"):
            if p.is_file() and p.name != "hidden.py" and p.suffix in (".py", ".md", ".txt"):
                parts.append(p.read_text(errors="replace"))
    parts += [p.read_text(errors="replace") for p in (PACKAGE_HOME / "grader").rglob("*") if p.is_file()
              and p.suffix in (".py", ".j2")]
    return "\n".join(parts)


def find_leaks(kit: Path, catalogue: specs.Course | None = None) -> list[str]:
    """'FILE: what leaked' for every private needle of `catalogue` (the course released) found in a
    file of the kit (inside zips and wheels too)."""
    needles = private_needles(catalogue)
    hits = []
    for path, text in _kit_texts(kit):
        for needle, what in needles.items():
            if needle in text:
                hits.append(f"{path}: {what}")
    return hits


def _kit_texts(kit: Path):
    for p in sorted(kit.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(kit).as_posix()
        if p.suffix in (".whl", ".zip"):
            with zipfile.ZipFile(p) as z:
                for member in z.namelist():
                    yield f"{rel}!{member}", z.read(member).decode(errors="replace")
        else:
            yield rel, p.read_bytes().decode(errors="replace")


def _toml(data: dict) -> str:
    """grader-kit.toml (flat tables of strings and numbers: no TOML writer needed)."""
    lines = ["# A student kit made by `grader release`: `grader check` here runs the public checks."]
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    lines += [f"{k} = {json.dumps(v)}" for k, v in top.items()]
    for name, entry in data["assignments"].items():
        lines += ["", f"[assignments.{name}]", *[f"{k} = {json.dumps(v)}" for k, v in entry.items()]]
    for table, entry in data.items():
        if isinstance(entry, dict) and table != "assignments":
            lines += ["", f"[{table}]", *[f"{k} = {json.dumps(v)}" for k, v in entry.items()]]
    return "\n".join(lines) + "\n"
