"""`grader release`: the student kit holds what students need and nothing private.

The leak scan here is the test's own: every file under reference/ whole, each of its lines that
is long and appears in no public file of the course, every hidden case's name (read from the
hidden.py files) and the course secret, searched in every file of the kit and inside its wheel.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import COURSE, FIXTURES, REPO_ROOT
from tests.upload_artifact import uploaded
from grader.kit import github, release
from grader.spec import Course
from grader import spec as specs

SECRET = "kit-test-secret-5f1c0e9a"
# the actions the kit's workflow uses: GitHub's own, at the majors current when this was written
# (checkout v7.0.1, setup-python v7.0.0, upload-artifact v7.0.1 run on Node 24)
CURRENT_ACTIONS = ["actions/checkout@v7", "actions/setup-python@v7", "actions/upload-artifact@v7"]


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    return release.build_kit(tmp_path_factory.mktemp("kit") / "kit", catalogue=Course(COURSE.root, secret=SECRET))


def _hidden_names() -> dict[str, list[str]]:
    names = {}
    for path in sorted((REPO_ROOT / "assignments").glob("*/hidden.py")):
        module_spec = importlib.util.spec_from_file_location(f"test_hidden_{path.parent.name}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        names[path.parent.name] = [c.name for c in module.CASES]
    return names


def _kit_texts(root: Path) -> dict[str, str]:
    texts = {}
    for p in root.rglob("*"):
        if p.is_file() and p.suffix == ".whl":
            with zipfile.ZipFile(p) as z:
                texts.update({f"{p.name}!{m}": z.read(m).decode(errors="replace") for m in z.namelist()})
        elif p.is_file():
            texts[str(p.relative_to(root))] = p.read_bytes().decode(errors="replace")
    return texts


def _public_text() -> str:
    files = [p for p in (REPO_ROOT / "assignments").rglob("*") if p.is_file() and p.name != "hidden.py"]
    files += list((REPO_ROOT / "grader").rglob("*.py")) + [p for p in (REPO_ROOT / "grader" / "templates").rglob("*")
                                                           if p.is_file()]
    return "\n".join(p.read_text(errors="replace") for p in files if "__pycache__" not in p.parts)


def test_kit_holds_no_reference_hidden_case_or_secret(kit):
    texts = _kit_texts(kit.root)
    assert any(name.startswith("grader-") and name.endswith("grader/cli/__init__.py") for name in texts)  # the wheel was scanned
    public = _public_text()
    hits = []
    references = [p for p in (REPO_ROOT / "reference").rglob("*.py") if "__pycache__" not in p.parts]
    assert len(references) >= 8
    distinctive = 0
    for ref in references:
        body = ref.read_text()
        needles = [body.strip()] + [line.strip() for line in body.splitlines()
                                    if len(line.strip()) >= 30 and line.strip() not in public]
        distinctive += len(needles) - 1
        hits += [f"{f}: {ref.name}: {n[:60]!r}" for n in needles for f, t in texts.items() if n in t]
    assert distinctive > 50  # the scan has real lines to look for
    hidden = _hidden_names()
    assert sum(map(len, hidden.values())) >= 4
    hits += [f"{f}: hidden case {n}" for names in hidden.values() for n in names for f, t in texts.items() if n in t]
    hits += [f"{f}: the secret" for f, t in texts.items() if SECRET in t]
    assert not hits, hits
    assert not list(kit.root.rglob("hidden.py")) and not list(kit.root.rglob("reference"))


def test_the_scan_finds_a_planted_reference_hidden_case_or_secret(kit, tmp_path):
    """Both directions: the kit as built is clean, and each kind of leak planted in a copy is found."""
    course = Course(COURSE.root, secret=SECRET)  # GRADER_COURSE_SECRET=SECRET
    assert release.find_leaks(kit.root, course) == []
    for planted, expected in [
        ((REPO_ROOT / "reference" / "softmax.py").read_text(), "reference/softmax.py"),
        (next(line for line in (REPO_ROOT / "reference" / "matmul_relu.py").read_text().splitlines()
              if len(line.strip()) >= 30 and line.strip() not in _public_text()), "of reference/matmul_relu.py"),
        ("CASES = [Case('5x16385', {})]", "hidden case '5x16385'"),
        (f"# {SECRET}", "the course secret"),
    ]:
        copy = tmp_path / f"copy{len(expected)}"
        shutil.copytree(kit.root, copy)
        (copy / "kernels" / "softmax.py").write_text(planted)
        leaks = release.find_leaks(copy, course)
        assert any(expected in leak and leak.startswith("kernels/softmax.py") for leak in leaks), (expected, leaks)


def test_kit_layout_starters_handouts_specs_and_manifest(kit):
    root = kit.root
    for spec in COURSE.catalogue().values():
        module = root / spec.module
        assert module.is_file(), spec.module
        assert f"def {spec.function}(" in module.read_text()
        handout = (root / "assignments" / spec.name / "README.md").read_text()
        original = (spec.folder / "README.md").read_text()
        # the same handout, pointing at the starter where the kit has it (kernels/x.py, not starter/kernels/x.py)
        assert "starter/" not in handout and handout == original.replace("../layernorm/starter/", "").replace("`starter/", "`")
        assert (root / "assignments" / spec.name / "spec.py").read_bytes() == (spec.folder / "spec.py").read_bytes()
        starter = spec.folder / "starter" / spec.module
        if starter.is_file():
            assert module.read_bytes() == starter.read_bytes()  # the starter in place, untouched
    import tomllib

    manifest = tomllib.loads((root / "grader-kit.toml").read_text())
    assert manifest["assignments"]["vector_add"] == {"module": "kernels/vector_add.py", "function": "vector_add",
                                                     "points": 10, "hidden_cases": 6}
    assert manifest["assignments"]["matmul_relu"]["hidden_cases"] == 0
    assert manifest["ci"] == {"score": "cpu-gradable"}  # course.toml's [ci] score, the default where it says none
    readme = (root / "README.md").read_text()
    for words in ("pip install -r requirements-grader.txt", "grader check", "How points work", "hidden cases",
                  "download.pytorch.org/whl/cpu", "kernels/vector_add.py", "python3 -m venv .venv"):
        assert words in readme, words
    # stock Debian and Ubuntu have python3 only: no command of the README starts with a bare `python`
    assert not re.search(r"^python |[;&|] *python ", readme, re.M), readme
    ignored = (root / ".gitignore").read_text().split()
    assert {".grader/", "*.safetensors", "__pycache__/"} <= set(ignored)
    line = (root / "requirements-grader.txt").read_text().strip()
    assert line.startswith("./grader-dist/grader-") and (root / line).is_file()
    with zipfile.ZipFile(root / line) as z:
        tops = {m.split("/")[0] for m in z.namelist()}
    assert "grader" in tops and not tops & {"assignments", "reference", "tests"}


def test_workflow_job_permissions_and_steps(kit):
    flow = yaml.safe_load((kit.root / ".github" / "workflows" / "grader.yml").read_text())  # Classmoji's is classroom.yml
    assert not (kit.root / ".github" / "workflows" / "classroom.yml").exists()
    assert set(flow["on"]) >= {"push", "workflow_dispatch"}
    assert flow["permissions"] == {"contents": "read"}  # it reads the repo; it writes no check run, status or release
    assert list(flow["jobs"]) == ["run-autograding-tests"]
    job = flow["jobs"]["run-autograding-tests"]
    assert job["runs-on"] == "ubuntu-latest"
    steps = job["steps"]
    # GitHub's own actions alone, each at its current major (Node 24); nothing of the discontinued GitHub Classroom's
    assert [s["uses"] for s in steps if "uses" in s] == CURRENT_ACTIONS
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    assert uses[:2] == ["actions/checkout", "actions/setup-python"]
    assert steps[0]["with"]["persist-credentials"] is False  # no later step pushes: the token is not left in .git
    install = next(s for s in steps if s.get("name") == "Install the grader")["run"]
    assert "pip install -r requirements-grader.txt" in install and "whl/cpu" in install
    check = next(s for s in steps if s.get("id") == "grader")
    assert check["run"].split() == ["grader", "check", "--ci", "github", "--device", "cpu"]
    artifact = steps[uses.index("actions/upload-artifact")]
    assert artifact["if"] == "always()" and artifact["with"]["name"] == github.ARTIFACT  # the name the summary gives
    assert artifact["with"]["if-no-files-found"] == "warn"  # a report that is missing is said in the log, not hidden
    # upload-artifact's README: files within folders beginning with `.` are hidden, and left out unless asked for
    assert artifact["with"]["include-hidden-files"] is True
    # the course's torch, its CPU build; pip's downloads cached, keyed on what is installed
    assert f'pip install "torch=={release.TORCH}" --index-url {release.TORCH_CPU_INDEX}' in install
    python = steps[uses.index("actions/setup-python")]["with"]
    assert python["cache"] == "pip" and "requirements-grader.txt" in python["cache-dependency-path"].split()
    # GitHub Classroom is gone: neither the workflow nor the kit's README speaks of it
    for name in (".github/workflows/grader.yml", "README.md"):
        text = (kit.root / name).read_text().lower()
        assert "github classroom" not in text and "github-classroom" not in text, name
    assert f'"torch=={release.TORCH}"' in (kit.root / "README.md").read_text()


@pytest.mark.slow
def test_the_report_artifact_uploads_what_a_real_check_wrote(kit, tmp_path):
    """The kit workflow's artifact step, resolved as upload-artifact resolves it against the
    folder a real `grader check` left in a student's checkout: report.html and results.json, the
    files the job summary and the kit's README send a student to. The step as it was (`.grader/`
    with hidden files left out, upload-artifact's default) uploads nothing: the rule bites."""
    checkout = tmp_path / "kernels-alice"
    shutil.copytree(kit.root, checkout)
    shutil.copy(FIXTURES / "good" / "kernels" / "vector_add.py", checkout / "kernels" / "vector_add.py")
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(REPO_ROOT), GRADER_CACHE_DIR=str(tmp_path / "cache"))
    for k in [k for k in env if k.startswith("GITHUB_")]:
        env.pop(k)
    proc = subprocess.run([sys.executable, "-m", "grader", "check", "-a", "vector_add", "--case", "n=1", "--dtype",
                           "float32", "--device", "cpu"], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = yaml.safe_load((kit.root / ".github" / "workflows" / "grader.yml").read_text())["jobs"][
        "run-autograding-tests"]["steps"]
    artifact = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert uploaded(artifact["with"], checkout) == [".grader/report.html", ".grader/results.json"]
    assert uploaded({"path": ".grader/"}, checkout) == []  # the step before: nothing, silently
    assert uploaded({"path": ".grader/", "include-hidden-files": True}, checkout)[-2:] == [
        ".grader/report.html", ".grader/results.json"]


def test_the_readmes_first_command_installs_what_a_check_needs_and_ci_runs_the_second():
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme[readme.index("## Set-up and the two commands"):]
    block = block[block.index("```\n") + 4:]
    first, second = block[:block.index("```")].strip().splitlines()
    assert "pip install -e . " in first and "[dev]" not in first and first.endswith("grader check tests/fixtures/good")
    assert second.endswith("python -m pytest") and second in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    needed = " ".join(project["dependencies"]).lower()
    assert not any(tool in needed for tool in ("copydetect", "matplotlib", "ray", "mutmut", "pytest"))
    assert any(d.startswith("copydetect") for d in project["optional-dependencies"]["ta"])


def test_workflow_for_a_self_hosted_gpu_runner():
    job = yaml.safe_load(release.workflow("gpu-h100"))["jobs"]["run-autograding-tests"]
    assert job["runs-on"] == ["self-hosted", "gpu-h100"]
    check = next(s for s in job["steps"] if s.get("id") == "grader")
    assert "--device auto" in check["run"]
    install = next(s for s in job["steps"] if s.get("name") == "Install the grader")["run"]
    assert "whl/cpu" not in install and f'pip install "torch=={release.TORCH}"' in install
    with pytest.raises(release.ReleaseError, match="runner label"):
        release.workflow("gpu; rm -rf /")


def _course(tmp_path: Path, monkeypatch, starter_extra: str | None = None, inline_hidden: bool = False) -> Path:
    """A course of vector_add alone, in tmp_path, as the catalogue's course."""
    course = tmp_path / "course"
    shutil.copytree(REPO_ROOT / "assignments" / "vector_add", course / "assignments" / "vector_add",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (course / "reference").mkdir()
    shutil.copy(REPO_ROOT / "reference" / "vector_add.py", course / "reference")
    if starter_extra is not None:
        (course / "assignments" / "vector_add" / "starter" / "kernels" / "helper.py").write_text(starter_extra)
    if inline_hidden:
        spec = course / "assignments" / "vector_add" / "spec.py"
        spec.write_text(spec.read_text().replace('Case("n=1", {"n": 1},', 'Case("n=1", {"n": 1}, hidden=True, why='))
    return course


def test_release_refuses_a_kit_that_would_leak_and_leaves_nothing(tmp_path, monkeypatch):
    course = Course(_course(tmp_path, monkeypatch, starter_extra=(REPO_ROOT / "reference" / "vector_add.py").read_text()))
    out = tmp_path / "kit"
    with pytest.raises(release.ReleaseError, match=r"kernels/helper\.py: the content of reference/vector_add\.py"):
        release.build_kit(out, ["vector_add"], requirement="grader==0.1.0", catalogue=course)
    assert not out.exists() and not list(tmp_path.glob(".kit.partial-*"))


def test_force_rebuilds_into_a_clone_keeping_git_and_a_failure_keeps_what_was_there(tmp_path, monkeypatch):
    course = _course(tmp_path, monkeypatch)
    out = tmp_path / "template"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "old.txt").write_text("from the last release")
    release.build_kit(out, ["vector_add"], requirement="grader==0.1.0", force=True, catalogue=Course(course))
    assert (out / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n" and not (out / "old.txt").exists()
    assert (out / "kernels" / "vector_add.py").is_file()
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    (course / "assignments" / "vector_add" / "starter" / "kernels" / "leak.py").write_text(
        (course / "reference" / "vector_add.py").read_text())
    with pytest.raises(release.ReleaseError, match="would leak"):
        release.build_kit(out, ["vector_add"], requirement="grader==0.1.0", force=True, catalogue=Course(course))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before  # untouched
    assert not list(tmp_path.glob(".template.partial-*"))


def test_release_refuses_hidden_cases_written_in_the_public_spec(tmp_path, monkeypatch):
    course = Course(_course(tmp_path, monkeypatch, inline_hidden=True))
    with pytest.raises(release.ReleaseError, match=r"marks case\(s\) n=1 hidden in the public spec: move them to .*hidden\.py"):
        release.build_kit(tmp_path / "kit", ["vector_add"], requirement="grader==0.1.0", catalogue=course)


def test_release_makes_a_secret_once_and_never_ships_it(tmp_path, monkeypatch):
    course = _course(tmp_path, monkeypatch)
    monkeypatch.delenv("GRADER_COURSE_SECRET", raising=False)
    made = release.ensure_secret(Course(course))
    assert made == str(course / "assignments" / "course-secret.txt") and release.ensure_secret(Course(course)) is None
    secret = (course / "assignments" / "course-secret.txt").read_text().strip()
    assert len(secret) == 32 and oct((course / "assignments" / "course-secret.txt").stat().st_mode)[-3:] == "600"
    kit = release.build_kit(tmp_path / "kit", ["vector_add"], requirement="grader==0.1.0", catalogue=Course(course))
    assert (kit.root / "requirements-grader.txt").read_text() == "grader==0.1.0\n"
    assert not any(secret in t for t in _kit_texts(kit.root).values())


def test_release_cli_usage_errors(tmp_path, cli):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    run = cli("--out", tmp_path / "full", command="release")
    assert run.returncode == 2 and "is not empty" in run.stderr and (tmp_path / "full" / "x").exists()
    run = cli("--out", tmp_path / "k", "-a", "nope", command="release")
    assert run.returncode == 2 and "unknown assignment 'nope'" in run.stderr


@pytest.mark.slow
def test_fresh_venv_installs_the_kits_grader_and_checks(kit, tmp_path):
    """The kit's own install line and entry point: a new venv that sees the system's torch and
    triton (--system-site-packages: no download here) installs the kit's wheel from
    requirements-grader.txt with --no-deps, and its `grader check`, run in a clone of the kit
    with no PYTHONPATH, finds the kit's public specs and grades on the CPU."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    repo = tmp_path / "student"
    shutil.copytree(kit.root, repo)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_COURSE", "GRADER_COURSE_SECRET")}
    env["COLUMNS"] = "200"
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "-r", "requirements-grader.txt"],
                   cwd=repo, env=env, check=True)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import grader, grader.spec as s, grader.settings as g; print(grader.__file__); "
                            "print(s.Course.find(g.current()).root)"],
                           cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert where[0].startswith(str(venv)) and Path(where[1]) == repo  # the kit's grader, the kit's course

    def check(*args):
        return subprocess.run([str(venv / "bin" / "grader"), "check", "-a", "vector_add", "--device", "cpu",
                               "--dtype", "float32", "--seed", "11", *args], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=900)

    starter = check()  # the starter as handed out: it runs, and fails
    assert starter.returncode == 1, starter.stdout + starter.stderr
    shutil.copy(FIXTURES / "good" / "kernels" / "vector_add.py", repo / "kernels" / "vector_add.py")
    good = check()
    assert good.returncode == 0, good.stdout + good.stderr
    assert "6 hidden case(s) of vector_add are not in this kit: they run at grading time" in good.stdout
    import json

    results = json.loads((repo / ".grader" / "results.json").read_text())
    names = {t["extra_data"]["case"] for t in results["tests"] if t["extra_data"].get("case")}
    assert "n=127" in names and not names & set(_hidden_names()["vector_add"])


def test_check_without_a_course_says_where_to_run_it(tmp_path):
    """The grader installed from a kit's wheel, run outside the kit: one line that says what to do."""
    (tmp_path / "empty-course").mkdir()
    env = dict(os.environ, GRADER_COURSE=str(tmp_path / "empty-course"), PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no course found" in proc.stderr and "grader-kit.toml" in proc.stderr, proc.stderr


def test_the_readmes_say_per_platform_what_a_student_sees_and_what_reaches_a_gradebook(kit):
    """The course README's CI table has, for plain Actions, Classroom 50 and Classmoji, what a
    student sees and what reaches a gradebook; Classmoji's row says only what Classmoji's own
    autograding docs say (pass or fail per test, advisory, never a grade), its setup command
    installs the course's torch, and neither the kit's workflow nor its README claims Classmoji
    reads the workflow's output."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("### CI after GitHub Classroom"):readme.index("Setting up Classroom 50 with a self-hosted")]
    assert "| tool | what runs | what a student sees | what reaches a gradebook |" in section
    rows = {line.split("|")[1].strip().split("**")[1]: line.split("|")[1:-1]
            for line in section.splitlines() if line.startswith("| **")}
    assert set(rows) >= {"plain GitHub Actions", "Classroom 50", "Classmoji", "Gradescope"}
    assert all(len(cells) == 4 and all(c.strip() for c in cells) for cells in rows.values()), rows
    classmoji = " ".join(rows["Classmoji"])
    assert "advisory" in classmoji and "never change a grade" in classmoji and "pass or fail" in classmoji
    flat = " ".join(section.split())
    assert f'pip" install "torch=={release.TORCH}" --index-url {release.TORCH_CPU_INDEX}' in flat  # the venv's pip
    assert "pip install torch " not in flat  # never an unpinned torch
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in flat and "github-hosted" in flat
    workflow = (kit.root / ".github" / "workflows" / "grader.yml").read_text()
    header = workflow[:workflow.index("name:")]
    assert "Nothing here reaches a gradebook" in " ".join(header.replace("#", "").split())
    kit_readme = (kit.root / "README.md").read_text()
    assert "grader-report" in kit_readme and "Artifacts" in kit_readme and "Nothing this workflow writes is a grade" in kit_readme


def test_course_tomls_ci_score_reaches_the_kit_and_what_its_ci_reports(tmp_path):
    """`[ci] score = "whole"` in course.toml: `grader release` writes it into grader-kit.toml, which
    the kit's CI (and Classroom 50's autograder, which embeds it) reports its points by."""
    import tomllib

    from grader.kit.github import ci_score

    kit = release.build_kit(tmp_path / "kit", ["vector_add"], catalogue=Course(COURSE.root, secret=SECRET),
                            ci_score="whole")
    assert tomllib.loads((kit.root / "grader-kit.toml").read_text())["ci"] == {"score": "whole"}
    assert ci_score(Course(kit.root)) == "whole"
    assert "they are counted in the total and named" in (kit.root / "README.md").read_text()


@pytest.mark.slow
def test_every_reproducer_of_a_graded_report_runs_in_the_students_kit(tmp_path, monkeypatch):
    """A class graded with the course secret (its random shapes are not the kit's) and the hidden cases:
    every `grader check` line of the student's report, and the stored reproducers of a random and a hidden
    case, pasted into the student's clone of the kit `grader release` built, runs the same case and reaches
    the same verdict (one assignment, float32: a handful of checks)."""
    import html
    import json
    import re
    import shlex

    from tests.classbuild import commit, git
    from tests.conftest import run_cli

    kit = release.build_kit(tmp_path / "kit", ["vector_add"], catalogue=Course(COURSE.root, secret=SECRET)).root
    clone = tmp_path / "clone"  # the student's clone of the kit, with a kernel that has no mask
    shutil.copytree(kit, clone)
    shutil.copytree(FIXTURES / "missing_mask", clone, dirs_exist_ok=True)
    git(clone, "init", "-q", "-b", "main")
    commit(clone, "submission", "2025-01-10T12:00:00+00:00")
    (tmp_path / "roster.csv").write_text(f"student,repo\nbob,{clone}\n")
    monkeypatch.setenv("GRADER_COURSE_SECRET", SECRET)  # the TA's course: its secret draws the graded shapes
    graded = run_cli(["grade", "--roster", "roster.csv", "--out", "out", "--device", "cpu", "-a", "vector_add",
                      "--dtype", "float32", "--seed", "11"], tmp_path)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    report = (tmp_path / "out" / "students" / "bob" / "report.html").read_text()
    shown = {html.unescape(c) for c in re.findall(r"<code>(grader check [^<]+)</code>", report)}
    record = json.loads((tmp_path / "out" / "students" / "bob" / "jobs" / "vector_add.json").read_text())
    tests = {t["name"]: t for t in record["result"]["tests"]}
    spec = COURSE.get("vector_add")
    random = next(t for t in tests.values() if t.get("case") and t["case"] not in {c.name for c in spec.cases}
                  and not t.get("hidden"))
    hidden = next(t for t in tests.values() if t.get("hidden"))
    chosen = {r: "failed" for r in shown} | {random["reproducer"]: random["outcome"], hidden["reproducer"]: hidden["outcome"]}
    assert len(shown) >= 1 and all("random-" not in r for r in chosen), chosen  # drawn cases go by their shape
    monkeypatch.delenv("GRADER_COURSE_SECRET")
    monkeypatch.setenv("GRADER_COURSE", str(kit))  # the kit's course, as a student's clone has it: no secret
    for line, outcome in chosen.items():
        argv = shlex.split(line)
        assert argv[:3] == ["grader", "check", "."], line
        out = clone / "out"  # where run_cli reads the check's results from
        run = run_cli([*argv[1:], "--json", str(out / "results.json"), "--html", str(out)], clone)
        assert run.returncode == 1 and "no such case" not in run.stderr, (line, run.stdout + run.stderr)
        (ran,) = [t for t in run.results["tests"] if t["tags"][1] == "correctness"]
        assert ran["outcome"] == outcome and "mask this load" in ran["output"], (line, ran)
