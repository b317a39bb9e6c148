"""`grader gradescope`: the autograder zip, unpacked as Gradescope does under a root that stands for
/autograder, grades a fixture submission and writes a results.json in Gradescope's format."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import COURSE, FIXTURES
from grader.kit.gradescope import build_autograder
from grader.spec import Course
from grader.kit.release import ReleaseError

SECRET = "gs-test-secret-0b7d"
GRADESCOPE_TEST_KEYS = {"score", "max_score", "status", "name", "number", "output", "tags", "visibility", "extra_data"}
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    out = tmp_path_factory.mktemp("gs") / "autograder.zip"
    members = build_autograder(out, ["vector_add"], catalogue=Course(COURSE.root, secret=SECRET))  # GRADER_COURSE_SECRET
    return out, members


def test_zip_holds_setup_run_the_grader_and_the_course(autograder):
    out, members = autograder
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
        setup = z.read("setup.sh").decode()
        run = z.read("run_autograder").decode()
        secret = z.read("course/assignments/course-secret.txt").decode().strip()
    assert {"setup.sh", "run_autograder", "course/assignments/vector_add/spec.py", "course/assignments/vector_add/hidden.py",
            "course/reference/vector_add.py"} <= names
    assert not any("starter" in n or "__pycache__" in n for n in names)
    assert not any(n.startswith("course/assignments/softmax") for n in names)  # only the chosen assignment
    wheel = [n for n in names if n.startswith("grader-") and n.endswith(".whl")]
    assert len(wheel) == 1 and f"./{wheel[0]}" in setup
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert secret == SECRET  # the graded random shapes are the course's, on Gradescope's side
    assert "--index-url https://download.pytorch.org/whl/cpu" in setup
    assert "-a vector_add" in run and "--device cpu" in run
    assert subprocess.run(["bash", "-n", "-c", setup]).returncode == 0
    assert subprocess.run(["bash", "-n", "-c", run]).returncode == 0


def test_cuda_option_and_a_wrong_name(tmp_path):
    build_autograder(tmp_path / "a.zip", ["vector_add"], cuda=True)
    with zipfile.ZipFile(tmp_path / "a.zip") as z:
        assert "whl/cu" in z.read("setup.sh").decode() and "--device auto" in z.read("run_autograder").decode()
    with pytest.raises(ReleaseError, match="takes a .zip"):
        build_autograder(tmp_path / "a.tar", ["vector_add"])


def _gradescope_root(tmp_path: Path, autograder_zip: Path, submission: Path | None) -> tuple[Path, dict]:
    """What Gradescope's image build does with the zip (source/, run_autograder copied to the root),
    with setup.sh's venv made without downloads: it sees this machine's torch and triton
    (--system-site-packages) and gets the zip's grader wheel with --no-deps."""
    root = tmp_path / "autograder"
    with zipfile.ZipFile(autograder_zip) as z:
        z.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    os.chmod(root / "run_autograder", 0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_COURSE", "GRADER_COURSE_SECRET")}
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(root / "venv")], check=True)
    wheel = next((root / "source").glob("grader-*.whl"))
    subprocess.run([str(root / "venv" / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)], env=env, check=True)
    if submission is not None:
        shutil.copytree(submission, root / "submission")
    env.update(GRADER_AUTOGRADER_ROOT=str(root), COLUMNS="200")
    return root, env


@pytest.mark.slow
def test_run_autograder_grades_a_submission_into_results_json(autograder, tmp_path):
    sub = tmp_path / "sub"  # uploaded by dragging the file in: no kernels/ folder
    sub.mkdir()
    shutil.copy(FIXTURES / "good" / "kernels" / "vector_add.py", sub)
    root, env = _gradescope_root(tmp_path, autograder[0], sub)
    proc = subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vector_add: kernels/vector_add.py not found; grading vector_add.py" in proc.stdout
    data = json.loads((root / "results" / "results.json").read_text())
    assert data["extra_data"]["environment"]["mode"].startswith("cpu")
    assert isinstance(data["execution_time"], int) and data["execution_time"] > 0
    assert data["stdout_visibility"] == "hidden"  # the output names hidden cases
    tests = data["tests"]
    for t in tests:
        assert GRADESCOPE_TEST_KEYS <= set(t) and t["status"] in ("passed", "failed") and t["visibility"] in VISIBILITY, t
    # 7 public + 6 hidden + 3 random cases x 3 dtypes, the own-kernel check, speed
    assert len(tests) == 16 * 3 + 2
    hidden = {t["extra_data"]["case"] for t in tests if t["visibility"] == "after_published"}
    assert hidden == {"n=4095", "strided-n=3001-stride=3", "n=2-pair", "n=1023-below-1024", "n=65535-odd-tail",
                      "strided-n=7-stride=4"}  # hidden cases ran, shown after publishing
    skipped = [t for t in tests if t["outcome"] == "skipped"]
    # a check that could not run here has not passed: failed, its share in the total, nothing earned
    assert len(skipped) == 16 + 1 and all(t["status"] == "failed" and t["score"] == 0 < t["max_score"] for t in skipped)
    ran = [t for t in tests if t["outcome"] != "skipped"]
    assert all(t["outcome"] == "passed" and t["status"] == "passed" for t in ran)
    # 6 correctness points over 48 cases x dtypes (12 or 13 hundredths each); the 32 that ran here earn
    # about 4, out of the spec's whole 10 (the speed's 4 and the bfloat16 cases need a GPU)
    assert data["max_score"] == 10
    assert data["score"] == pytest.approx(4.0, abs=0.16) and sum(t["score"] for t in tests) == pytest.approx(data["score"])
    # the score Gradescope stores is not the grade, and the first lines a student and a TA read say so
    assert data["output"].splitlines()[1].startswith("CPU only: 6 of these 10 points need a GPU and were not graded")
    assert data["extra_data"]["incomplete"] == ["CPU only"]
    assert [t["number"] for t in tests[:3]] == ["1.1", "1.2", "1.3"]
    assert "leaderboard" not in data  # no timing on the CPU
    assert (root / "results" / "report" / "report.html").is_file()


@pytest.mark.slow
def test_run_autograder_without_the_module_still_writes_results(autograder, tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "notes.txt").write_text("forgot the kernel")
    root, env = _gradescope_root(tmp_path, autograder[0], sub)
    proc = subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((root / "results" / "results.json").read_text())
    # -a names the assignment, so a missing module is graded (zero), not an unreadable run
    assert data["score"] == 0 and data["max_score"] == 10  # out of the spec's whole total, all lost
    missing = [t for t in data["tests"] if t["name"] == "vector_add: not submitted"]
    assert missing and "kernels/vector_add.py is not in the submission" in missing[0]["output"]
    assert missing[0]["status"] == "failed" and missing[0]["outcome"] == "failed"


@pytest.mark.slow
def test_run_autograder_with_no_submission_folder_explains(autograder, tmp_path):
    root, env = _gradescope_root(tmp_path, autograder[0], None)
    proc = subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0
    data = json.loads((root / "results" / "results.json").read_text())
    assert data["score"] == 0 and data["tests"] == []
    assert "could not grade this submission (exit code 2)" in data["output"] and "no such folder" in data["output"]


def test_a_flat_upload_is_found_by_name(tmp_path):
    """Files dragged into Gradescope arrive without their folders."""
    from grader.kit.gradescope import locate_modules

    (tmp_path / "vector_add.py").write_text("# the student's kernel\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "softmax.py").write_text("# one\n")
    (tmp_path / "softmax.py").write_text("# two: ambiguous, left alone\n")
    (tmp_path / "grader.toml").write_text('[assignments.layernorm]\nmodule = "src/ln.py"\n')
    done = locate_modules(tmp_path, ["vector_add", "softmax", "layernorm", "matmul_relu"])
    assert done == ["vector_add: kernels/vector_add.py not found; grading vector_add.py"]
    from grader.submission import open_submission
    from grader import spec as specs

    sub = open_submission(tmp_path)
    assert sub.target(COURSE.get("vector_add")) == ("vector_add.py", "vector_add")
    assert sub.target(COURSE.get("layernorm")) == ("src/ln.py", "layer_norm")  # the student's own entry kept
    assert sub.target(COURSE.get("softmax"))[0] == "kernels/softmax.py"
    assert locate_modules(tmp_path, ["vector_add"]) == []  # already named: nothing more to do
