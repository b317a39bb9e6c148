"""What ships, run as its users run it, outside the course checkout: the grader built as a wheel,
the kit made by `grader release`, set up as the kit's README says in a fresh venv that does not
see the system's packages (torch's CPU build, the course's version), then
(a) `grader check` on the correct sample and the untouched starter, with warm starts off, on the
    fork server, and from a warm process, against the course checkout's grade of the same repo;
(b) the kit's workflow `run:` steps, with GitHub Actions' variables;
(c) the Classroom 50 autograder (`release --classroom50`), called as Classroom 50's runner calls it;
(d) the Gradescope zip (`grader gradescope`) unpacked under a folder standing for /autograder,
    its own setup.sh run (apt-get stood in for), then run_autograder;
(e) README's Classmoji recipe, its setup and run commands as written, as Classmoji's command grader
    runs them on ubuntu-latest: as a user of its own (`runner`), the system Python's PEP 668 marker
    in place, the environment stripped to what the command grader passes, in the runner's work
    folder, namespaces refused until its sysctl has run.

One build, one kit venv and one Gradescope venv for the module; torch's wheel is fetched once into
a wheelhouse kept between runs (`$XDG_CACHE_HOME/grader-tests/wheels`). Where a flag allows it a
run grades a few cases; the workflow and the autograders grade what they grade."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import FIXTURES, REPO_ROOT
from tests.upload_artifact import uploaded
from grader.kit.release import TORCH, TORCH_CPU_INDEX

pytestmark = pytest.mark.slow

SEED = "11"
FEW = ("--case", "n=127", "--case", "strided-n=65537")  # a masked tail and a strided view, both dtypes
GOOD = FIXTURES / "good" / "kernels" / "vector_add.py"
MODULE = Path("kernels") / "vector_add.py"
INSTALL_TIMEOUT = 1500
CHECK_TIMEOUT = 900


@dataclass
class Shipped:
    root: Path
    kit: Path
    classroom: Path  # the Classroom 50 config folder release --classroom50 wrote
    gradescope_zip: Path
    repo: Path  # a student's clone of the kit, its .venv made as the kit's README says
    env: dict  # no PYTHONPATH, no course, no secret; pip finds torch in the wheelhouse

    @property
    def bin(self) -> Path:
        return self.repo / ".venv" / "bin"


def _clean_env(root: Path, wheelhouse: Path) -> dict:
    drop = ("PYTHONPATH", "GRADER_COURSE", "GRADER_COURSE_SECRET", "VIRTUAL_ENV", "PYTHONHOME", "GRADER_WARM",
            "GRADER_ZYGOTE", "CI", "GITHUB_ACTIONS", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "CLASSROOM", "SUBMISSION_TAG")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    env["PIP_FIND_LINKS"] = " ".join(filter(None, [str(wheelhouse), env.get("PIP_FIND_LINKS", "")]))
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["GRADER_CACHE_DIR"] = str(root / "cache")
    env["GRADER_WARM_SECONDS"] = "0"
    return env


def _wheelhouse() -> Path:
    """torch's CPU wheel, fetched once and kept between test runs."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    house = base / "grader-tests" / "wheels"
    house.mkdir(parents=True, exist_ok=True)
    if not list(house.glob(f"torch-{TORCH}+cpu-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(house),
                        f"torch=={TORCH}+cpu", "--index-url", TORCH_CPU_INDEX], check=True, timeout=INSTALL_TIMEOUT)
    return house


def _fenced_block_after(markdown: str, heading: str) -> str:
    text = markdown[markdown.index(heading):]
    start = text.index("```") + 3
    start = text.index("\n", start) + 1
    return text[start:text.index("```", start)]


def _run(argv, cwd, env, timeout=CHECK_TIMEOUT, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="session")
def shipped(tmp_path_factory) -> Shipped:
    root = tmp_path_factory.mktemp("shipped")
    env = _clean_env(root, _wheelhouse())
    course_env = dict(env, PYTHONPATH=str(REPO_ROOT), GRADER_COURSE_SECRET="shipped-test-secret")  # no secret file made
    kit, classroom = root / "kit", root / "classroom50" / "cs101"
    _ok(_run([sys.executable, "-m", "grader", "release", "--out", kit, "-a", "vector_add", "--classroom50", classroom],
             REPO_ROOT, course_env, timeout=INSTALL_TIMEOUT))
    gradescope_zip = root / "autograder.zip"
    _ok(_run([sys.executable, "-m", "grader", "gradescope", "--out", gradescope_zip, "-a", "vector_add"],
             REPO_ROOT, course_env, timeout=INSTALL_TIMEOUT))
    repo = root / "student"
    shutil.copytree(kit, repo)
    install = _fenced_block_after((repo / "README.md").read_text(), "## Install")
    _ok(_run(["bash", "-ec", install], repo, env, timeout=INSTALL_TIMEOUT))
    return Shipped(root, kit, classroom, gradescope_zip, repo, env)


BAD = {"failed", "error", "timeout", "crashed", "flagged", "infra_error"}


def _outcomes(results: dict) -> dict[str, str]:
    return {t["name"]: t["outcome"] for t in results["tests"]}


def _graded_as(sample: str, outcomes: dict[str, str]) -> bool:
    """The correct sample: passes all it runs (the rest skipped on the CPU); the starter: fails
    every case it runs (each of FEW in float32 and float16), and never errs or crashes."""
    seen = list(outcomes.values())
    if sample == "good":
        return "passed" in seen and not set(seen) & BAD
    return seen.count("failed") >= 4 and not set(seen) & (BAD - {"failed"})


def _with(repo: Path, sample: str) -> None:
    """The student's module: the course's correct one, or the kit's starter as handed out."""
    source = GOOD if sample == "good" else Path(repo).parent / "kit" / MODULE
    shutil.copy(source, repo / MODULE)


def _shipped_check(shipped: Shipped, json_out: Path, *flags: str, **env) -> subprocess.CompletedProcess:
    return _run([shipped.bin / "grader", "check", "-a", "vector_add", "--device", "cpu", "--seed", SEED, *FEW,
                 "--json", json_out, *flags], shipped.repo, dict(shipped.env, **env))


def _course_check(shipped: Shipped, json_out: Path) -> tuple[dict, str]:
    """The course checkout's grader on the same repo and the same (kit's) specs: its results and stderr."""
    env = dict(shipped.env, PYTHONPATH=str(REPO_ROOT), GRADER_COURSE=str(shipped.repo), GRADER_WARM="0")
    proc = _run([sys.executable, "-m", "grader", "check", "-a", "vector_add", "--device", "cpu", "--seed", SEED, *FEW,
                 "--json", json_out], shipped.repo, env)
    return json.loads(json_out.read_text()), proc.stderr


def test_the_kits_venv_sees_only_what_its_readme_installed(shipped):
    cfg = (shipped.repo / ".venv" / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    where = _ok(_run([shipped.bin / "python", "-c", "import grader, torch, triton; print(grader.__file__); "
                      "print(torch.__file__); print(torch.__version__)"], shipped.repo, shipped.env)).stdout.split()
    assert all(p.startswith(str(shipped.repo / ".venv")) for p in where[:2]), where
    assert where[2] == f"{TORCH}+cpu"
    # a student's check needs no TA tool
    listed = _ok(_run([shipped.bin / "python", "-m", "pip", "list", "--format=json"], shipped.repo, shipped.env)).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert not names & {"copydetect", "matplotlib", "ray", "mutmut"}, names


@pytest.mark.parametrize("sample", ["good", "starter"])
def test_the_kit_grades_like_the_course_checkout_warm_starts_on_and_off(shipped, sample, tmp_path):
    _with(shipped.repo, sample)
    expected, course_stderr = _course_check(shipped, tmp_path / "course.json")
    unconfined = "sandbox without namespaces" in course_stderr
    want = _outcomes(expected)
    assert _graded_as(sample, want), want
    modes = {"cold": {"GRADER_WARM": "0"}, "fork server": {}}
    if sample == "good":  # the first start leaves a warm process, which the second check uses
        modes |= {"warm start": {"GRADER_WARM_SECONDS": "30"}, "from the warm process": {"GRADER_WARM_SECONDS": "30"}}
    for mode, env in modes.items():
        out = tmp_path / f"{mode}.json"
        proc = _shipped_check(shipped, out, **env)
        assert proc.returncode == (0 if sample == "good" else 1), (mode, proc.stdout[-4000:] + proc.stderr[-2000:])
        got = json.loads(out.read_text())
        assert _outcomes(got) == want, (mode, proc.stdout[-4000:])
        assert got["score"] == expected["score"], mode
        # the sandbox is as strong from the wheel as from the checkout (it once fell back: no Python in its view)
        assert ("sandbox without namespaces" in proc.stderr) == unconfined, (mode, proc.stderr[-2000:])
    if sample == "starter":
        assert "stores nothing" in proc.stdout, proc.stdout[-3000:]


def test_the_kits_workflow_steps_grade_the_correct_sample(shipped, tmp_path):
    _with(shipped.repo, "good")
    workflow = yaml.safe_load((shipped.repo / ".github" / "workflows" / "grader.yml").read_text())
    steps = [s for s in workflow["jobs"]["run-autograding-tests"]["steps"] if "run" in s]
    assert [s.get("id") for s in steps if "grader check" in s["run"]] == ["grader"]
    output, summary = tmp_path / "output", tmp_path / "summary.md"
    output.touch()
    summary.touch()
    env = dict(shipped.env, GITHUB_ACTIONS="true", CI="true", GITHUB_OUTPUT=str(output), GITHUB_STEP_SUMMARY=str(summary),
               GITHUB_WORKSPACE=str(shipped.repo), GITHUB_REPOSITORY="course/kernels-alice", GITHUB_SHA="0" * 40,
               RUNNER_TEMP=str(tmp_path), GITHUB_ACTOR="alice", RUNNER_OS="Linux")
    env["PATH"] = os.pathsep.join([str(shipped.bin), env["PATH"]])  # setup-python's interpreter, with the kit's venv
    env["VIRTUAL_ENV"] = str(shipped.repo / ".venv")
    for step in steps:  # as Actions runs a `run:` step: bash -e, in the workspace
        proc = _run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], shipped.repo, env,
                    timeout=INSTALL_TIMEOUT)
        assert proc.returncode == 0, (step["name"], proc.stdout[-4000:] + proc.stderr[-4000:])
    lines = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    payload = json.loads(base64.b64decode(lines["result"]))
    assert payload["status"] == "pass" and payload["tests"], payload
    assert all(t["status"] == "pass" and t["score"] == t["max_score"] for t in payload["tests"]), payload
    earned = sum(t["score"] for t in payload["tests"])
    # one total in every output: the result, the summary's title and the Points notice (a GPU's points in it)
    assert earned > 0 and f"Triton kernels: {earned:g} / {payload['max_score']:g} points" in summary.read_text()
    assert f"::notice title=Points::{earned:g} / {payload['max_score']:g} points" in proc.stdout
    assert "::error" not in proc.stdout
    # what the artifact step uploads from the folder this check left, as upload-artifact resolves its path
    artifact = next(s for s in workflow["jobs"]["run-autograding-tests"]["steps"]
                    if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert uploaded(artifact["with"], shipped.repo) == [".grader/report.html", ".grader/results.json"]


@pytest.mark.parametrize("sample", ["good", "starter"])
def test_the_classroom50_autograder_grades_as_its_runner_calls_it(shipped, sample, tmp_path):
    """Classroom 50's runner (runner.py) fetches the assignment's bundle into its runtime folder
    and runs `python3 autograder.py` with the student's checkout as the working directory; here the
    runner's Python is one with torch and the grader installed (as our README asks of a runner).
    The starter's failures are a grade too (0 points), never the autograder's own error."""
    _with(shipped.repo, sample)
    runtime = tmp_path / "runtime"
    shutil.copytree(shipped.classroom / "autograders" / "vector-add", runtime / "vector-add")
    output = tmp_path / "output"
    output.touch()
    env = dict(shipped.env, GITHUB_ACTIONS="true", CI="true", GITHUB_OUTPUT=str(output), RUNNER_TEMP=str(tmp_path),
               GITHUB_WORKSPACE=str(shipped.repo), GITHUB_REPOSITORY="course/cs101-vector-add-alice", GITHUB_SHA="0" * 40,
               GITHUB_SERVER_URL="https://github.com", GITHUB_ACTOR="alice", GITHUB_REF_NAME="main",
               CLASSROOM="cs101", ASSIGNMENT="vector-add", SUBMISSION_TAG="submit/20260101T000000Z-0000000",
               MODE="individual", USERNAME="alice", OWNER="alice", ASSIGNMENT_TYPE="individual",
               COMMIT_URL="https://github.com/course/cs101-vector-add-alice/commit/0",
               RELEASE_URL="https://github.com/course/cs101-vector-add-alice/releases/tag/submit/x",
               REVIEW_URL="https://github.com/course/cs101-vector-add-alice/compare/a...b")
    for stale in ("result.json", "release-body.md"):
        (shipped.repo / stale).unlink(missing_ok=True)
    proc = _run([shipped.bin / "python", runtime / "vector-add" / "autograder.py"], shipped.repo, env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((shipped.repo / "result.json").read_text())
    assert [t["passed"] for t in result["tests"]] == [sample == "good"], result
    if sample == "good":  # out of the points a CPU runner can grade (the kit's default [ci] score): all of them
        assert result["score"] > 0 and result["score"] == result["max-score"], result
        assert all(t["needs-gpu"]["counted"] is False for t in result["tests"] if "needs-gpu" in t), result
    else:
        assert result["score"] == 0 and (shipped.repo / "release-body.md").read_text().startswith("## Triton kernels: 0 / ")
    assert "status=error" not in output.read_text()


def test_the_gradescope_zip_sets_itself_up_and_grades(shipped, tmp_path):
    root = tmp_path / "autograder"
    with zipfile.ZipFile(shipped.gradescope_zip) as z:
        z.extractall(root / "source")
    for script in ("setup.sh", "run_autograder"):
        (root / "source" / script).chmod(0o755)
    shim = tmp_path / "bin"  # the image's package manager: what it was asked for is recorded, nothing installed
    shim.mkdir()
    (shim / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "apt.txt"}\n')
    (shim / "apt-get").chmod(0o755)
    env = dict(shipped.env, GRADER_AUTOGRADER_ROOT=str(root))
    env["PATH"] = os.pathsep.join([str(shim), env["PATH"]])
    setup = _run(["bash", root / "source" / "setup.sh"], root / "source", env, timeout=INSTALL_TIMEOUT)
    assert setup.returncode == 0, setup.stdout[-4000:] + setup.stderr[-4000:]
    assert "util-linux" in (tmp_path / "apt.txt").read_text()
    (root / "submission" / "kernels").mkdir(parents=True)
    shutil.copy(GOOD, root / "submission" / MODULE)
    run = _run([root / "source" / "run_autograder"], root, env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert _graded_as("good", _outcomes(results)) and results["score"] > 0, results.get("output", results)


# what classroom-resources' autograding-command-grader hands a Classmoji test's commands
CLASSMOJI_ENV = {"FORCE_COLOR": "true", "DOTNET_CLI_HOME": "/tmp", "DOTNET_NOLOGO": "true"}
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _runner_pip_conf(house: Path) -> str:
    """The runner's pip.conf: the wheelhouse first, then where this machine's own pip finds packages
    (its find-links and index settings, from the environment or its user's pip.conf), which the
    runner user, with a home of its own and a stripped environment, would not otherwise see. On a
    machine whose pip reaches the index directly these are empty and only the wheelhouse is added."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, list[str]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in ("find-links", "extra-index-url", "index-url", "cert") and value:
            for item in value.strip().strip("'\"").split():
                if item not in found.setdefault(name, []):
                    found[name].append(item)
    found["find-links"] = [str(house), *[f for f in found.get("find-links", []) if f != str(house)]]
    lines = ["[global]", "disable-pip-version-check = true"]
    lines += [f"{name} = {' '.join(values)}" for name, values in found.items()]
    return "\n".join(lines) + "\n"


def _classmoji_recipe() -> tuple[str, str]:
    """README's Classmoji setup and run commands, as a course pastes them into Classmoji."""
    block = _fenced_block_after((REPO_ROOT / "README.md").read_text(), "Classmoji, set up:")
    lines = dict(line.split(": ", 1) for line in block.strip().splitlines())
    return lines["setup"], lines["run"]


def _externally_managed() -> bool:
    """The system python3 carries the PEP 668 marker (in its stdlib folder), as ubuntu-24.04's does."""
    if not SYSTEM_PYTHON.is_file():
        return False
    where = subprocess.run([SYSTEM_PYTHON, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                           capture_output=True, text=True).stdout.strip()
    return bool(where) and (Path(where) / "EXTERNALLY-MANAGED").is_file()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root to run as a user of its own")
@pytest.mark.skipif(not _externally_managed(), reason="no system python3 with a PEP 668 EXTERNALLY-MANAGED marker")
def test_classmojis_recipe_installs_and_grades_as_its_command_grader_runs_it(shipped, tmp_path):
    """Classmoji's classroom.yml has only actions/checkout before its tests, and its command
    grader runs a test's setup and run commands with PATH, HOME, FORCE_COLOR and a few more: no
    setup-python, no CI variables. README's recipe, as written, as the user `runner` (made where
    missing), with the system python3 whose PEP 668 marker refuses `pip install`, in the runner's
    work folder, on a PATH where namespaces are refused until its `sudo -n sysctl` has run: it
    installs, grades the correct sample (exit 0) and the starter (exit 1) in the sandbox."""
    from tests.kit.test_classroom50 import USERNS, apparmor_runner

    setup, run = _classmoji_recipe()
    if subprocess.run(["id", "runner"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "runner"], check=True)
    base = Path(tempfile.mkdtemp(prefix="grader-classmoji-"))  # under /tmp: the runner user's to reach
    try:
        work = base / "work"
        (work / "_temp").mkdir(parents=True)
        repo = work / "kernels-alice" / "kernels-alice"
        shutil.copytree(shipped.kit, repo)
        home = base / "home"
        (home / ".config" / "pip").mkdir(parents=True)
        house = base / "wheels"  # torch's CPU wheel where this runner's pip finds it (no download here)
        shutil.copytree(_wheelhouse(), house)
        (home / ".config" / "pip" / "pip.conf").write_text(_runner_pip_conf(house))
        saved = os.environ["PATH"]
        os.environ["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # the runner image's, without this machine's pyenv
        try:
            path, calls = apparmor_runner(base / "bin", sudo=True)
        finally:
            os.environ["PATH"] = saved
        subprocess.run(["chown", "-R", "runner:runner", str(base)], check=True)
        base.chmod(0o755)
        env = dict(CLASSMOJI_ENV, PATH=path, HOME=str(home))

        def as_runner(command: str) -> subprocess.CompletedProcess:
            return subprocess.run(["runuser", "-u", "runner", "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                                   "bash", "-c", command], cwd=repo, capture_output=True, text=True,
                                  timeout=INSTALL_TIMEOUT)

        refused = as_runner("python3 -m pip install --dry-run six")  # the system Python refuses pip, as on the runner
        if "No module named pip" not in refused.stderr:  # (a system Python without pip refuses it too)
            assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr, refused.stderr[-2000:]
        installed = as_runner(setup)
        assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr[-4000:]
        assert f"sysctl -w {USERNS}=0" in calls.read_text()
        for sample, code in (("good", 0), ("starter", 1)):
            shutil.copy(GOOD if sample == "good" else shipped.kit / MODULE, repo / MODULE)
            checked = as_runner(run)
            assert checked.returncode == code, (sample, checked.stdout[-4000:] + checked.stderr[-4000:])
            assert "sandbox without" not in checked.stderr and "Weaker sandbox" not in checked.stdout, checked.stderr
            results = json.loads((repo / ".grader" / "results.json").read_text())
            assert _graded_as(sample, _outcomes(results)), (sample, _outcomes(results))
            assert "\x1b[?25l" not in checked.stdout  # FORCE_COLOR drew no live bar in the log
            assert "::error" not in checked.stdout or sample == "starter"
    finally:
        shutil.rmtree(base, ignore_errors=True)
