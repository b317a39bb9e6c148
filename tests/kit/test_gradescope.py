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

from tests.conftest import COURSE, FIXTURES
from tests.sandbox.test_isolation import path_without_unshare
from grader.kit.gradescope import build_autograder
from grader.settings import Settings
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
        data = b"".join(z.read(n) for n in names)
    assert {"setup.sh", "run_autograder", "course/assignments/vector_add/spec.py", "course/assignments/vector_add/hidden.py",
            "course/reference/vector_add.py"} <= names
    assert not any("starter" in n or "__pycache__" in n for n in names)
    assert not any(n.startswith("course/assignments/softmax") for n in names)  # only the chosen assignment
    # and only its reference kernel, never the course secret (a fresh seed per submission needs none)
    assert [n for n in names if n.startswith("course/reference/")] == ["course/reference/vector_add.py"]
    assert "course/assignments/course-secret.txt" not in names and SECRET.encode() not in data
    wheel = [n for n in names if n.startswith("grader-") and n.endswith(".whl")]
    assert len(wheel) == 1 and f"./{wheel[0]}" in setup
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
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
        assert GRADESCOPE_TEST_KEYS - {"status"} <= set(t) and t["visibility"] in VISIBILITY, t
        # Gradescope's two statuses; a check that did not run has neither (a program reading it sees no failure)
        assert t["status"] in ("passed", "failed") if t["outcome"] != "skipped" else "status" not in t, t
    # 7 public + 6 hidden + 3 random cases x 3 dtypes, the own-kernel check, speed
    assert len(tests) == 16 * 3 + 2
    hidden = {t["extra_data"]["case"] for t in tests if t["visibility"] == "after_published"}
    assert hidden == {"n=4095", "strided-n=3001-stride=3", "n=2-pair", "n=1023-below-1024", "n=65535-odd-tail",
                      "strided-n=7-stride=4"}  # hidden cases ran, shown after publishing
    skipped = [t for t in tests if t["outcome"] == "skipped"]
    # a check that could not run here is skipped, not failed: no status, 0 of 0, its output saying why and
    # what it is worth where it runs (its points stay in the run's max_score)
    assert len(skipped) == 16 + 1 and all("status" not in t and t["score"] == 0 == t["max_score"] for t in skipped)
    assert all(t["output"].startswith("[skipped] ") for t in skipped)
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


# -- as Gradescope runs it: root, in a container whose seccomp profile refuses namespaces ----------

WORKER_UID = 60450  # conftest's range is the default 60001-...: a uid of it, to read the course files as

# at import and in its kernel function: everything of the course it can find, the grader's
# environment and other processes' command lines, a write into the results, and the network
HOSTILE = r'''
import glob, os, socket

ROOT = {root!r}
TMP_FILE = {tmp_file!r}  # a name of this run's own in /tmp


def snoop():
    out = ["uid=%d" % os.getuid()]
    paths = [ROOT + "/source/course/assignments/vector_add/hidden.py", ROOT + "/source/course/reference/vector_add.py",
             ROOT + "/source/course/assignments/course-secret.txt", ROOT + "/source/setup.sh", "/proc/1/environ"]
    paths += glob.glob(ROOT + "/source/**", recursive=True) + glob.glob(ROOT + "/results/**", recursive=True)
    # every other process's environment (its own uid's are the worker's own: their environment is its own)
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            if os.stat(os.path.dirname(path)).st_uid != os.getuid():
                paths.append(path)
        except OSError:
            pass  # ended meanwhile
    for path in paths:
        try:
            with open(path, "rb") as f:
                out.append("READ %s %r" % (path, f.read(200)))
        except OSError as exc:
            out.append("no %s" % type(exc).__name__)
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                out.append("CMDLINE %r" % f.read(300))
        except OSError:
            pass
    for path in (ROOT + "/results/results.json", ROOT + "/source/pwned", TMP_FILE):
        try:
            with open(path, "w") as f:
                f.write("pwned")
            out.append("WROTE %s" % path)
        except OSError as exc:
            out.append("no write %s" % type(exc).__name__)
    try:
        with socket.create_connection(("127.0.0.1", {port}), timeout=2) as s:
            s.sendall(b"from the worker")
            out.append("NETWORK connected")
    except OSError as exc:
        out.append("NETWORK %s" % type(exc).__name__)
    return out


AT_IMPORT = snoop()


def vector_add(x, y):
    raise RuntimeError("hostile report: " + " | ".join(AT_IMPORT + snoop()))
'''


def _open_root(autograder_zip: Path) -> tuple[Path, Path, dict]:
    """`_gradescope_root` in a folder every user may enter, as /autograder is (the workers' uid
    runs the venv's Python from it)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="grader-gs-"))
    base.chmod(0o755)
    root, env = _gradescope_root(base, autograder_zip, None)
    root.chmod(0o755)
    return base, root, env


def _can_read_as(uid: int, path: Path) -> bool:
    """Whether uid `uid` (no groups) opens `path` for reading."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.close(os.open(path, os.O_RDONLY))
            os._exit(0)
        except BaseException:  # noqa: BLE001 - the child only says whether it could
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


# Gradescope's Python is the image's (/usr/bin/python3), open to every uid; this machine's may lie
# in a closed folder (/root/.pyenv): run_autograder runs in a mount namespace of its own where
# that folder is an open tmpfs with the Python prefix bound back (root's, as in conftest.AS_NOBODY)
OPEN_PYTHON = """
import ctypes, os, pathlib, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), what)
check(libc.unshare(0x00020000), "unshare")
check(libc.mount(None, b"/", None, 16384 | (1 << 18), None), "private")
prefix = os.path.realpath(sys.base_prefix)
closed = next((a for a in reversed(pathlib.Path(prefix).parents) if not os.stat(a).st_mode & 0o001), None)
if closed is not None:
    fd = os.open(prefix, os.O_PATH | os.O_DIRECTORY)
    check(libc.mount(b"tmpfs", str(closed).encode(), b"tmpfs", 0, b"mode=0755"), "tmpfs")
    os.makedirs(prefix, exist_ok=True)
    check(libc.mount(f"/proc/self/fd/{fd}".encode(), prefix.encode(), None, 4096 | 16384, None), "bind")
os.execv(sys.argv[1], sys.argv[1:])
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="Gradescope runs the autograder as root; the worker uid needs root")
def test_a_hostile_submission_as_gradescope_runs_it_reads_nothing_of_the_course(autograder):
    """As root without namespaces (Gradescope's Docker container refuses them; emulated here as in
    tests/sandbox/test_isolation.py, with no `unshare` to make them; tests/e2e/test_image.py refuses them as
    Docker's seccomp profile does): each worker runs as a
    dedicated uid, and the zip's folder and the results are root's alone. A submission that snoops
    at import and in its function finds no hidden case, reference kernel, secret or environment of
    the grader, writes nothing, and the run still ends with a results.json; its network is the
    container's (said in results.json: no namespace can cut it)."""
    import secrets
    import socket

    base, root, env = _open_root(autograder[0])
    try:
        hidden_text = (COURSE.root / "assignments" / "vector_add" / "hidden.py").read_text()
        reference_text = (COURSE.reference / "vector_add.py").read_text()
        marker = f"gs-env-marker-{secrets.token_hex(8)}"
        tmp_file = Path("/tmp") / f"gs-worker-{secrets.token_hex(8)}-pwned"
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            sub = root / "submission"
            (sub / "kernels").mkdir(parents=True)
            (sub / "kernels" / "vector_add.py").write_text(HOSTILE.format(root=str(root), port=listener.getsockname()[1],
                                                                                 tmp_file=str(tmp_file)))
            env.update(PATH=path_without_unshare(base / "bin"), GS_ENV_MARKER=marker, GRADER_COURSE_SECRET=SECRET)
            proc = subprocess.run([sys.executable, "-c", OPEN_PYTHON, str(root / "run_autograder")], cwd=root, env=env,
                                  capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        data = json.loads((root / "results" / "results.json").read_text())
        isolation = data["extra_data"]["environment"]["isolation"]
        assert isolation["user"] == "a dedicated unprivileged uid" and isolation["network"] == "the host's", (
            isolation, proc.stdout, proc.stderr)
        assert any(w.startswith("sandbox without namespaces") for w in isolation["warnings"]), isolation
        reports = [t["output"] for t in data["tests"] if "hostile report:" in t["output"]]
        assert len(reports) >= 16, [t["output"][:200] for t in data["tests"]]  # every case ran, and failed
        report = reports[0]
        uid = int(report.split("uid=", 1)[1].split(" ", 1)[0])
        assert 60000 <= uid < 61184, report
        # /tmp is anyone's (sticky) without namespaces: a file of its own there, as its own uid, is all it may write
        wrote = [p for p in report.split(" | ") if p.startswith("WROTE") and p != f"WROTE {tmp_file}"]
        assert "READ " not in report and not wrote, [p[:300] for p in report.split(" | ") if
                                                     p.startswith(("READ", "WROTE"))]
        if tmp_file.exists():
            assert tmp_file.stat().st_uid == uid, tmp_file.stat()  # the worker's own file, never root's
            tmp_file.unlink()
        # the course closed before grading: the zip's folder and the results, to every uid but root's
        for path in [root / "source" / "course" / "assignments" / "vector_add" / "hidden.py",
                     root / "source" / "course" / "reference" / "vector_add.py", root / "results" / "results.json"]:
            assert path.is_file() and not _can_read_as(WORKER_UID, path), path
        assert _can_read_as(WORKER_UID, root / "venv" / "pyvenv.cfg")  # what a worker needs stays open
        # nothing of the course anywhere the student or the gradebook sees
        seen = "\n".join([json.dumps(data), proc.stdout, proc.stderr,
                          (root / "results" / "report" / "report.html").read_text(errors="replace")])
        for needle in [hidden_text[:60], reference_text[:60], 'Case("n=65535-odd-tail"', SECRET, marker]:
            assert needle not in seen, needle
        assert not (root / "source" / "pwned").exists() and data["tests"]  # results.json is the grader's (read above)
        # every reproducer is the student's own command; a hidden case's names its shape, which their kit runs
        reproducers = [t["extra_data"]["reproducer"] for t in data["tests"] if t["extra_data"].get("reproducer")]
        assert reproducers and all(r.startswith("grader check . --device cpu -a vector_add") for r in reproducers)
        hidden = [t for t in data["tests"] if t["visibility"] == "after_published"]
        assert {t["extra_data"]["reproducer"].split("--case ", 1)[1].split(" ", 1)[0] for t in hidden} >= {
            "'shape=4095'", "'shape=65535'"}, [t["extra_data"]["reproducer"] for t in hidden]
        assert not any(t["extra_data"]["case"] in t["extra_data"]["reproducer"] for t in hidden)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_no_namespaces_and_no_other_uid_is_refused_with_the_reason(tmp_path, monkeypatch):
    """Not root and no namespaces: a worker would read the course as the grader's own user, so
    nothing is graded and results.json says why (the student sees it)."""
    from grader.kit import gradescope
    from grader.sandbox import process
    from grader.sandbox.isolation import Isolation

    monkeypatch.setattr(process, "detect", lambda mode, settings, sandbox: Isolation(
        "sandbox", warnings=("sandbox without namespaces (unshare: Operation not permitted): ...",)))
    (tmp_path / "submission").mkdir()
    assert gradescope.main([str(tmp_path), str(tmp_path / "submission"), "vector_add"], Settings()) == 3
    data = json.loads((tmp_path / "results" / "results.json").read_text())
    assert data["score"] == 0 and data["tests"] == []
    # whose fault it is first, then the staff's fix, then the reason
    assert data["output"].startswith("The autograder did not grade this submission: the autograder's machine, not "
                                     "your code, stopped this check: nothing was graded. Course staff: run the "
                                     "autograder as root"), data["output"]
    assert "Do not resubmit for this" in data["output"]
    assert "The sandbox can neither make namespaces nor run the submission as another user here" in data["output"]
    assert "Operation not permitted" in data["output"]
    # with another uid to run it as, it goes on, and the course's folder is closed
    monkeypatch.setattr(process, "detect", lambda mode, settings, sandbox: Isolation("sandbox", user_switch=True))
    (tmp_path / "source" / "course").mkdir(parents=True)
    (tmp_path / "source" / "course" / "hidden.py").write_text("x")
    os.chmod(tmp_path / "source" / "course" / "hidden.py", 0o644)
    assert gradescope.main([str(tmp_path), str(tmp_path / "submission"), "vector_add"], Settings()) == 0
    assert os.stat(tmp_path / "source" / "course" / "hidden.py").st_mode & 0o077 == 0
    assert os.stat(tmp_path / "source").st_mode & 0o077 == 0
