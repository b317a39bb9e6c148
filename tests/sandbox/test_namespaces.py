"""The worker's view is an allowlist (nothing of the course folder, wherever it is), the worker
holds no capability (so nothing it was given can be undone), and what it writes is read back
bounded (a FIFO or a link in place of a file fails that call at once).

Attacked as root (with the uid switch, in a user namespace, and as root in its namespaces,
each forked by the zygote and as a fresh interpreter) and as an ordinary user (uid 65534, in a
subprocess); the attack itself is tests/sandbox_attack.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from tests import sandbox_attack
from tests.conftest import SANDBOX, AS_NOBODY, REPO_ROOT, assert_nothing_left
from grader import spec as specs
from grader.judge.runcache import TritonKeep
from grader.sandbox import files, namespaces
from grader.sandbox.isolation import Isolation
from grader.sandbox.process import WorkerProcess, detect
from grader.settings import Settings

ISOLATION = detect("sandbox", settings=Settings(), sandbox=SANDBOX)
ROOT = os.geteuid() == 0
needs_namespaces = pytest.mark.skipif(not ISOLATION.namespaces, reason=f"no namespaces here: {ISOLATION.warnings}")
NOBODY = 65534

MODES = {  # as root: each way the namespaces backend may run
    "uid switch": Isolation("sandbox", namespaces=True, user_switch=True),
    "user namespace": Isolation("sandbox", namespaces=True, user_namespace=True),
    "root in its namespaces": Isolation("sandbox", namespaces=True),
}
SECRETS = ("course .git", "git show", "good solution", "hidden cases", "reference", "roster", "beside", "list course")


@pytest.fixture(scope="module")
def course_files():
    """The course (this checkout), a roster-like file put in it, and a file beside it (in the
    folder that holds the checkout, or a folder there): each readable by any user outside."""
    roster = REPO_ROOT / f"roster-test-{os.getpid()}.csv"
    roster.write_text("login,name\nalice,Alice\n")
    roster.chmod(0o644)
    beside = None
    for folder in (REPO_ROOT.parent, *sorted(p for p in REPO_ROOT.parent.iterdir() if p.is_dir() and p != REPO_ROOT)):
        beside = next((f for f in sorted(folder.iterdir()) if f.is_file() and f.stat().st_mode & stat.S_IROTH), None)
        if beside:
            break
    try:
        yield REPO_ROOT.resolve(), roster, beside or roster
    finally:
        roster.unlink()


def assert_contained(report: dict, own: dict) -> None:
    """Nothing of the course read, nothing undone, nothing written but its own repo."""
    assert all(own.values()), own  # the control: each file is there and readable outside the sandbox
    for name in SECRETS:
        assert report[name].startswith("no: "), (name, report[name])
    assert report["mounts"] > 5 and report["umounted"] == [] and report["remounted rw"] == [], report
    assert report["umount command"] != 0 and report["mount command"] != 0
    nested = report["unshare"]  # a user namespace made inside: all capabilities there, over locked mounts
    assert nested["unshare"] == 0 and int(nested["caps"], 16) != 0, nested
    assert nested["umounted"] == [] and nested["remounted rw"] == [] and not nested["wrote"], nested
    assert all(int(report["caps"][k], 16) == 0 for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), report["caps"]
    assert report["caps"]["NoNewPrivs"] == "1"
    for name in ("/", "/usr", "/etc", "the worker's code", "the job folder", "the course"):
        assert report[f"write {name}"].startswith("no: "), (name, report[f"write {name}"])
    assert report["write its repo"] == "yes" and report["wrote its repo"]
    assert report["left outside"] == [] and not report["left in the course"]


@needs_namespaces
@pytest.mark.parametrize("forked", [False, True], ids=["fresh", "forked"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_worker_sees_nothing_of_the_course_and_cannot_undo_its_view(tmp_path, monkeypatch, course_files, mode, forked):
    if mode != "user namespace" and not ROOT:
        pytest.skip("as root only (the uid switch, or root in its namespaces)")
    monkeypatch.setenv("GRADER_ZYGOTE", "1")  # sandbox_attack.attack sets it per run; restored after
    report = sandbox_attack.attack(tmp_path / "job", MODES[mode], *course_files, forked=forked, sandbox=SANDBOX)
    assert_contained(report, sandbox_attack.own_reads(*course_files))
    assert_nothing_left()


def _nobody_can_use_namespaces() -> str | None:
    """Why uid 65534 cannot run the sandbox here, or None."""
    if not ROOT:
        return "starting a run as uid 65534 needs root"
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", "unshare", "--user",
                            "--map-root-user", "--net", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"uid {NOBODY} cannot make user namespaces here: {probe.stderr.strip()[:200]}"
    if not os.access(REPO_ROOT, os.R_OK) or not REPO_ROOT.stat().st_mode & stat.S_IROTH:
        return f"this checkout is not readable by uid {NOBODY}"
    return None




@pytest.mark.slow
@needs_namespaces
def test_as_an_ordinary_user_the_worker_is_contained_alike(course_files):
    why = _nobody_can_use_namespaces()
    if why:
        pytest.skip(why)
    home = Path(tempfile.mkdtemp(prefix="grader-nobody-"))  # the job and scratch folders go here: the user's own
    try:
        (home / "tmp").mkdir()
        for folder in (home, home / "tmp"):
            os.chown(folder, NOBODY, NOBODY)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home / "tmp"),
               "GRADER_CACHE_DIR": str(home / "cache"), "GRADER_WARM_SECONDS": "0", "LANG": "C.UTF-8",
               "GRADER_COURSE_SECRET": "a-course-secret-of-this-user"}  # the course's own file is root's (grader release makes it 0600)
        out = home / "report.json"
        code = AS_NOBODY.format(uid=NOBODY, home=str(home), env=env)
        run = subprocess.run([sys.executable, "-c", code, str(Path(sandbox_attack.__file__)), str(out), *map(str, course_files)],
                             capture_output=True, text=True, timeout=1500)
        assert run.returncode == 0, run.stderr[-5000:]
        report = json.loads(out.read_text())
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert report["uid"] == NOBODY
    namespaces_, user_namespace, user_switch, warnings = report["isolation"]
    assert namespaces_ and user_namespace and not user_switch, report["isolation"]  # unshare --user --map-root-user
    for forked in (False, True):
        assert_contained(report[f"attack forked={forked}"], report["own reads"])
    good = report["good"]["tests"]
    assert good["softmax: 1x1 [float32]"][0] == "passed" and good["vector_add: n=1 [float32]"][0] == "passed", good
    trick = report["trick"]["tests"]["softmax: cannot be graded"]  # refused on the trusted side, before any worker
    assert trick[0] == "failed" and "leads outside the repository" in trick[1], trick
    outputs = report["outputs"]
    assert outputs["tests"]["vector_add: n=1 [float32]"][0] == "failed" and "is a FIFO" in outputs["tests"]["vector_add: n=1 [float32]"][1]
    assert outputs["tests"]["vector_add: n=98432 [float32]"][0] == "passed" and outputs["seconds"] < 300
    assert_nothing_left()


@needs_namespaces
@pytest.mark.parametrize("linked", ["module", "folder"])
def test_a_link_to_the_courses_own_solution_is_the_students_error_not_points(tmp_path, linked):
    """kernels/softmax.py -> <course>/tests/fixtures/good/kernels/softmax.py (or kernels/ -> the
    course's folder of them): the link leads out of the submission, to files the worker cannot
    see; refused as the student's own outcome, never infra_error, never points."""
    repo = sandbox_attack.build(tmp_path / "trick")
    if linked == "module":
        sandbox_attack.link_to_the_good_solution(repo, REPO_ROOT)
    else:
        shutil.rmtree(repo / "kernels")
        (repo / "kernels").symlink_to(REPO_ROOT / "tests" / "fixtures" / "good" / "kernels")
    assert (repo / "kernels" / "softmax.py").read_text()  # the control: it resolves outside the sandbox
    graded = sandbox_attack.grade(repo, ("1x1", "n=1"))
    # the trusted side refuses the link before any worker starts (grader.repofiles), and were it
    # to pass, the worker's view holds nothing for it to lead to (test_a_worker_sees_nothing_of_the_course_and_cannot_undo_its_view)
    outcome, message = graded["tests"]["softmax: cannot be graded"]
    assert outcome == "failed" and "leads outside the repository" in message, message
    # vector_add: its own file, graded as always; or behind the same link, refused alike
    if linked == "module":
        assert graded["tests"]["vector_add: n=1 [float32]"][0] == "passed"
    else:
        assert graded["tests"]["vector_add: cannot be graded"][0] == "failed"
    assert all(t[0] not in ("infra_error", "passed") for n, t in graded["tests"].items() if n.startswith("softmax"))
    assert_nothing_left()


def test_the_view_binds_no_folder_that_holds_a_private_one(monkeypatch, tmp_path):
    """Wherever the course lies: a sys.path entry that holds it is not bound; a course inside
    a bound folder (/usr here) is covered; the worker's code is its own copy, not the course's."""
    real = namespaces._worker_sys_path()
    monkeypatch.setattr(namespaces, "_worker_sys_path", lambda: (*real, str(REPO_ROOT.parent), str(REPO_ROOT)))
    view = namespaces.sandbox_view(tmp_path / "job", [tmp_path / "job" / "repo"], [], Settings(course=Path("/usr/share/doc")), code=SANDBOX.worker_code())
    bound = [path for path, _ in view["binds"]]
    for private in (str(REPO_ROOT.resolve()), "/usr/share/doc", os.path.realpath(Path.home())):
        assert not [b for b in bound if namespaces._inside(private, b) and b not in ("/usr",)], (private, bound)
    assert "/usr/share/doc" in view["covers"] and "/usr" in bound
    assert str(SANDBOX.worker_code()) in bound and not (SANDBOX.worker_code() / "grader" / "spec.py").exists()
    from grader.sandbox import process

    process.detect("sandbox", settings=Settings(), sandbox=SANDBOX)  # the probe and the workers import from the copy: they write nothing into it
    assert sorted(p.name for p in (SANDBOX.worker_code() / "grader").iterdir()) == ["__init__.py", "codec.py", "protocol.py", "replay", "worker"]
    assert not list(SANDBOX.worker_code().rglob("__pycache__"))
    assert dict(view["binds"])[str((tmp_path / "job" / "repo").resolve())] is True  # its own folder, writable


def test_an_installed_grader_hides_its_package_not_the_site_packages_it_lies_in(monkeypatch, tmp_path):
    """Installed from a wheel (the kit, the image), the folder above grader/ is site-packages:
    the worker imports torch and Triton from there, so it stays bound and only grader/ is
    covered. In a checkout the whole folder above grader/ (the course) stays private."""
    prefix = tmp_path / "venv"
    site_packages = prefix / "lib" / "python3" / "site-packages"
    (site_packages / "grader").mkdir(parents=True)
    (site_packages / "torch").mkdir()
    monkeypatch.setattr(namespaces, "PACKAGE_PARENT", str(site_packages))
    real = namespaces._worker_sys_path()
    monkeypatch.setattr(namespaces, "_worker_sys_path", lambda: (*real, str(site_packages)))
    view = namespaces.sandbox_view(tmp_path / "job", [tmp_path / "job" / "repo"], [], settings=Settings(), code=SANDBOX.worker_code())
    bound = [path for path, _ in view["binds"]]
    assert any(namespaces._inside(str(site_packages / "torch"), b) for b in bound), bound
    assert str(site_packages / "grader") in view["covers"], view["covers"]
    assert namespaces.private_folders([], settings=Settings()) == sorted(set(namespaces.private_folders([], settings=Settings())))
    assert str(site_packages) not in namespaces.private_folders([], settings=Settings())
    monkeypatch.setattr(namespaces, "PACKAGE_PARENT", str(prefix / "course"))  # a checkout: the course itself
    assert str(prefix / "course") in namespaces.private_folders([], settings=Settings())


@needs_namespaces
def test_a_private_folder_inside_an_allowed_one_is_blank(tmp_path, monkeypatch):
    doc = Path("/usr/share/doc")
    inside = next((f for f in sorted(doc.glob("*/copyright")) if os.access(f, os.R_OK)), None)
    if inside is None:
        pytest.skip("no /usr/share/doc/*/copyright to hide here")
    repo = tmp_path / "job" / "repo"
    repo.mkdir(parents=True)
    (repo / "mod.py").write_text(f"import os\nprint('doc', os.listdir({str(doc)!r}))\nprint('usr', os.path.isdir('/usr/share'))\n"
                                 f"print('read', os.path.exists({str(inside)!r}))\n")
    worker = WorkerProcess(repo, tmp_path / "job" / "scratch", interpret=True, command=[sys.executable, "mod.py"],
                           settings=Settings(course=doc), sandbox=SANDBOX)  # a course kept in /usr/share/doc
    try:
        worker.proc.wait(timeout=120)
        text = worker.output.text()
    finally:
        worker.close()
    assert "doc []" in text and "usr True" in text and "read False" in text, text


# -- what a worker writes, read back bounded --------------------------------------------------------

def _within(seconds: float, fn):
    """fn()'s result or exception, or a failure if it has not returned within `seconds`."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(_outcome(fn)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    return box[0]


def _outcome(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - what the call raised is the result looked at
        return exc


def test_a_worker_file_that_is_not_a_plain_file_fails_at_once_with_a_clear_message(tmp_path):
    outputs = tmp_path / "job" / "outputs"
    outputs.mkdir(parents=True)
    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(b"the grader's")
    os.mkfifo(outputs / "fifo.safetensors")
    (outputs / "zero.safetensors").symlink_to("/dev/zero")
    (outputs / "link.safetensors").symlink_to(secret)
    (outputs / "folder.safetensors").mkdir()
    (outputs / "big.safetensors").write_bytes(b"x" * 1000)
    (outputs / "ok.safetensors").write_bytes(b"fine")
    for name, words in (("fifo", "is a FIFO, not a regular file"), ("zero", "a symbolic link"), ("link", "a symbolic link"),
                        ("folder", "is a folder, not a regular file")):
        result = _within(5, lambda: files.read_worker_file(outputs / f"{name}.safetensors"))
        assert isinstance(result, files.WorkerFileError) and words in str(result), (name, result)
        assert str(result).startswith(f"{name}.safetensors") and "Errno" not in str(result)
    result = _within(5, lambda: files.read_worker_file(outputs / "big.safetensors", limit=999))
    assert isinstance(result, files.WorkerFileError) and "larger than 999 bytes" in str(result)
    assert files.read_worker_file(outputs / "ok.safetensors") == b"fine"  # a plain file reads as before
    # outputs/ itself a link to a folder holding a file of the same name: not followed either
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ok.safetensors").write_bytes(b"not the worker's")
    moved = tmp_path / "job2"
    moved.mkdir()
    (moved / "outputs").symlink_to(elsewhere)
    result = _within(5, lambda: files.read_worker_file(moved / "outputs" / "ok.safetensors"))
    assert isinstance(result, files.WorkerFileError) and "outputs/ is not a plain folder" in str(result), result


def test_kept_kernels_are_never_read_through_a_link_nor_from_a_fifo(tmp_path):
    """TritonKeep copies back what a worker compiled: its cache folder replaced by a link to a
    folder of the grader's is not followed, and an entry holding a FIFO is skipped at once."""
    grader_files = tmp_path / "graders"
    (grader_files / "entry").mkdir(parents=True)
    (grader_files / "entry" / "id_rsa").write_text("the grader's key")
    keep = TritonKeep(tmp_path / "kept")
    linked = tmp_path / "worker-1" / "triton-cache"
    linked.parent.mkdir()
    linked.symlink_to(grader_files)
    assert keep.keep(linked) == 0 and not list((tmp_path / "kept").glob("*/id_rsa"))
    cache = tmp_path / "worker-2" / "triton-cache"
    (cache / "fifo-entry").mkdir(parents=True)
    os.mkfifo(cache / "fifo-entry" / "kernel.so")
    (cache / "plain-entry").mkdir()
    (cache / "plain-entry" / "kernel.json").write_text("{}")
    assert _within(10, lambda: keep.keep(cache)) == 1  # the plain one only, without waiting on the FIFO
    assert (tmp_path / "kept" / "plain-entry" / "kernel.json").read_text() == "{}"
    assert not (tmp_path / "kept" / "fifo-entry").exists()


@needs_namespaces
def test_a_job_folder_known_through_a_link_is_in_the_view(tmp_path):
    """The view binds real paths; a folder the grader names through a link (a temp folder that is
    a link, say) is reachable by that name too, and nothing else of the link's side comes with it."""
    (tmp_path / "real" / "job" / "repo").mkdir(parents=True)
    (tmp_path / "real" / "other.txt").write_text("beside the job")
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    repo = tmp_path / "alias" / "job" / "repo"
    (repo / "mod.py").write_text(f"import os\nprint('own', os.path.exists({str(repo / 'mod.py')!r}))\n"
                                 f"print('other', os.path.exists({str(tmp_path / 'real' / 'other.txt')!r}))\n")
    worker = WorkerProcess(repo, tmp_path / "alias" / "job" / "scratch", interpret=True, command=[sys.executable, "mod.py"], settings=Settings(), sandbox=SANDBOX)
    try:
        assert worker.proc.wait(timeout=120) == 0, (worker.status(), worker.output.text())
        text = worker.output.text()
    finally:
        worker.close()
    assert "own True" in text and "other False" in text, text
