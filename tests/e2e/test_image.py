"""The grading image, built and used as the Dockerfile says, with podman: `tests/image/build.sh`
builds it from a debootstrap base with CPU torch (nothing downloaded inside the build), then

1. the grader inside it (`podman run IMAGE check ...`, workers in its default sandbox) and
2. the grader on the host with each worker in a container of it (`--isolation docker`,
   GRADER_CONTAINER_CLI=podman)

grade the correct sample (a few cases, in the interpreter) as the host install does, and
hostile code (network, writes outside its copy, the course folder) stays contained.

Needs root and podman (with runc, `default_ulimits = []`: `.ci/run` sets both up); skipped with
the reason where either is missing. Built once per run; the base and the wheels are kept in
/var/tmp/grader-image for the next."""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import FIXTURES, REPO_ROOT, build_submission, run_cli

TAG = "localhost/grader-cpu-test"
PODMAN = shutil.which("podman")
CASES = ["-a", "vector_add", "-a", "softmax", "--case", "n=127", "--case", "1x1", "--dtype", "float32",
         "--device", "cpu", "--seed", "5"]
HOSTILE_CASES = ["-a", "vector_add", "-a", "softmax", "--case", "n=1", "--case", "1x1", "--dtype", "float32",
                 "--device", "cpu", "--seed", "5"]
# what a privileged grader container is given so that its sandbox can make namespaces (README)
NAMESPACES_ALLOWED = ["--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.image,
    pytest.mark.skipif(PODMAN is None, reason="podman is not installed (apt-get install podman runc debootstrap; "
                                              ".ci/run installs them)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="building the image from a debootstrap base needs root"),
]

# reads and writes the course folder of the grader that runs it, wherever that is; raises its report
SNOOP = '''
import os
import torch


def vector_add(x, y):
    report = []
    for path in {paths!r}:
        try:
            with open(path, "rb") as f:
                report.append(path + ": read " + repr(f.read(20)))
        except OSError as exc:
            report.append(path + ": " + type(exc).__name__)
    for path in {writes!r}:
        try:
            with open(path, "w") as f:
                f.write("pwned")
            report.append(path + ": written")
        except OSError as exc:
            report.append(path + ": " + type(exc).__name__)
    raise RuntimeError("snoop report: " + "; ".join(report))
'''


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built once from this checkout."""
    proc = subprocess.run([str(REPO_ROOT / "tests" / "image" / "build.sh"), TAG], env=dict(os.environ, PYTHON=sys.executable),
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return TAG


def outcomes(results: dict) -> list[tuple]:
    return [(t["name"], t["outcome"], t["score"], t["max_score"]) for t in results["tests"]]


def result_of(results: dict, name: str) -> dict:
    return next(t for t in results["tests"] if t["name"] == name)


def in_image(image: str, repo: Path, out: Path, *args: str, privileged: bool = True) -> subprocess.CompletedProcess:
    """Use 2: `grader check` inside a container of the image (no network; the submission read-only)."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [PODMAN, "run", "--rm", "--network", "none", *(NAMESPACES_ALLOWED if privileged else []),
            "--env", "COLUMNS=200", "-v", f"{repo}:/submission:ro", "-v", f"{out}:/out",
            image, "check", "/submission", *args, "--json", "/out/results.json", "--html", "/out"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=1200)


def on_host(tmp_path: Path, repo: Path, *args: str, docker: bool) -> tuple[subprocess.CompletedProcess, dict]:
    """The host's grader (this checkout); with `docker`, each worker in a container of the image."""
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    env = {"GRADER_CONTAINER_CLI": "podman", "GRADER_DOCKER_IMAGE": TAG} if docker else {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        run = run_cli(["check", str(repo), *args, *(["--isolation", "docker"] if docker else []),
                       "--json", str(out / "results.json"), "--html", str(out)], tmp_path)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return run, run.results


@pytest.fixture(scope="module")
def host_baseline(tmp_path_factory) -> dict:
    """The correct sample's cases graded by the host install, in its default sandbox."""
    tmp = tmp_path_factory.mktemp("host")
    run, results = on_host(tmp, FIXTURES / "good", *CASES, docker=False)
    assert run.returncode == 0 and results is not None, run.stdout + run.stderr
    return results


def test_the_grader_in_the_image_grades_the_correct_sample_as_the_host_does(image, host_baseline, tmp_path):
    proc = in_image(image, FIXTURES / "good", tmp_path / "out", *CASES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert outcomes(results) == outcomes(host_baseline) and results["score"] == host_baseline["score"] > 0
    # given SYS_ADMIN, its sandbox is the full one: namespaces, a worker uid of its own, nothing to warn of
    isolation = results["extra_data"]["environment"]["isolation"]
    assert isolation["network"].startswith("none") and isolation["user"] == "a dedicated unprivileged uid", isolation
    assert isolation["warnings"] == [] and "warning:" not in proc.stderr


def test_the_image_says_when_its_sandbox_has_no_namespaces(image, tmp_path):
    """An unprivileged container refuses namespaces: a CI run stops with the reason and the flags
    that give them (no weaker sandbox than asked, unattended); a student's own check still grades
    and says so on the terminal and in results.json."""
    stopped = in_image(image, FIXTURES / "good", tmp_path / "ci", *CASES, "--ci", "github", privileged=False)
    said = " ".join((stopped.stdout + stopped.stderr).split())
    assert stopped.returncode == 2, said
    assert "the sandbox isolation cannot be built as asked on this machine" in said, said
    assert "the grader runs in a container: give it --cap-add SYS_ADMIN" in said, said
    assert not (tmp_path / "ci" / "results.json").exists() or json.loads((tmp_path / "ci" / "results.json").read_text())["score"] == 0
    proc = in_image(image, FIXTURES / "good", tmp_path / "out", *CASES, privileged=False)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    isolation = results["extra_data"]["environment"]["isolation"]
    assert isolation["network"] == "the host's" and any("sandbox without namespaces" in w for w in isolation["warnings"])
    assert "warning: sandbox without namespaces" in " ".join(proc.stderr.split())
    assert "the grader runs in a container: give it --cap-add SYS_ADMIN" in " ".join(proc.stderr.split()), proc.stderr
    assert proc.returncode == 0 and results["score"] > 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("privileged", [True, False], ids=["namespaces", "no-namespaces"])
def test_hostile_code_in_the_image_is_contained(image, tmp_path, privileged):
    """Writes outside its copy and reads of the image's course folder (its hidden cases) fail: with
    namespaces (the worker's own file view), and without them (a worker uid in the grader's own file
    tree, where the Dockerfile keeps the course folder root's alone)."""
    repo = tmp_path / "snoop"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "vector_add.py").write_text(SNOOP.format(
        paths=["/opt/grader/assignments/softmax/hidden.py", "/opt/grader/assignments/vector_add/spec.py"],
        writes=["/etc/pwned", "/opt/grader/pwned", "/opt/venv/pwned"]))
    proc = in_image(image, repo, tmp_path / "out", "-a", "vector_add", "--case", "n=1", "--dtype", "float32", "--device", "cpu",
                    privileged=privileged)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    report = result_of(results, "vector_add: n=1 [float32]")["output"]
    assert "snoop report:" in report, proc.stdout + proc.stderr
    assert ": read" not in report and ": written" not in report, report
    if not privileged:  # the network stays the container's there (docs/security.md): nothing more to try
        return
    # and over the network: nothing answers inside, and the sandbox gives it no network at all
    network = build_submission(tmp_path / "net", "hostile/network")
    (network / "port.txt").write_text("9")
    (network / "marker.txt").write_text("1")
    proc = in_image(image, network, tmp_path / "out2", *HOSTILE_CASES)
    results = json.loads((tmp_path / "out2" / "results.json").read_text())
    assert "Network is unreachable" in result_of(results, "vector_add: n=1 [float32]")["output"], proc.stdout + proc.stderr


def test_workers_in_containers_grade_the_correct_sample_as_the_host_does(image, host_baseline, tmp_path):
    run, results = on_host(tmp_path, FIXTURES / "good", *CASES, docker=True)
    assert run.returncode == 0 and results is not None, run.stdout + run.stderr
    assert outcomes(results) == outcomes(host_baseline) and results["score"] == host_baseline["score"]
    assert results["extra_data"]["environment"]["isolation"]["mode"] == "docker"


def test_hostile_workers_in_containers_are_contained(image, tmp_path):
    """No network, no write outside the container's own /tmp, nothing of the host's course."""
    repo = tmp_path / "snoop"
    (repo / "kernels").mkdir(parents=True)
    course_files = [str(REPO_ROOT / "reference" / "vector_add.py"), str(REPO_ROOT / "assignments" / "softmax" / "hidden.py"),
                    "/opt/grader/assignments/softmax/hidden.py"]
    host_writes = [str(REPO_ROOT / "pwned-by-snoop"), "/etc/pwned-by-snoop", "/opt/grader-host/grader/pwned.py"]
    (repo / "kernels" / "vector_add.py").write_text(SNOOP.format(paths=course_files, writes=host_writes))
    run, results = on_host(tmp_path / "a", repo, "-a", "vector_add", "--case", "n=1", "--dtype", "float32", "--device", "cpu",
                           docker=True)
    report = result_of(results, "vector_add: n=1 [float32]")["output"]
    assert "snoop report:" in report, run.stdout + run.stderr
    assert ": read" not in report and ": written" not in report, report
    assert not (REPO_ROOT / "pwned-by-snoop").exists() and not Path("/etc/pwned-by-snoop").exists()

    marker = str(secrets.randbelow(10**9))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        network = build_submission(tmp_path / "net", "hostile/network")
        (network / "port.txt").write_text(str(listener.getsockname()[1]))
        (network / "marker.txt").write_text(marker)
        run, results = on_host(tmp_path / "b", network, *HOSTILE_CASES, docker=True)
        ready, _, _ = select.select([listener], [], [], 0.5)
        assert not ready, "a connection from a worker's container reached the host"
    # inside, 127.0.0.1 is the container's own loopback (--network none): refused, nothing sent
    report = result_of(results, "vector_add: n=1 [float32]")["output"]
    assert "network report: ConnectionRefusedError" in report and "connected and sent" not in report, report
    # its 50 left-behind processes died with the container: none runs, and no container of this run is left
    assert subprocess.run(["pgrep", "-f", f"sleep 3600.{marker}"], capture_output=True).returncode == 1
    left = subprocess.run([PODMAN, "ps", "-a", "--filter", "name=grader-worker-", "--format", "{{.Names}}"],
                          capture_output=True, text=True).stdout.split()
    assert left == [], left


# -- Gradescope's autograder, as Gradescope builds and runs it ---------------------------------------

BASE = "localhost/grader-base:bookworm"  # tests/image/build.sh's Debian base, imported by the image fixture
GRADESCOPE_TAG = "localhost/grader-gradescope-test"
# what the image's build reaches without a network: apt-get's packages are in the base already, pip's
# wheels in build.sh's cache (PIP_NO_INDEX: setup.sh's --index-url is not asked)
OFFLINE = ("mkdir -p /offline && printf '#!/bin/sh\\nexit 0\\n' >/offline/apt-get && chmod 755 /offline/apt-get && "
           "export PATH=/offline:$PATH PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels && ")
HOSTILE_AT_GRADESCOPE = r'''
import glob, os, socket


def snoop():
    out = ["uid=%d" % os.getuid()]
    paths = ["/autograder/source/course/assignments/vector_add/hidden.py", "/autograder/source/course/reference/vector_add.py",
             "/autograder/source/setup.sh", "/proc/1/environ"]
    paths += glob.glob("/autograder/source/**", recursive=True) + glob.glob("/autograder/results/**", recursive=True)
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
    out.append("CMDLINES %d" % len(glob.glob("/proc/[0-9]*/cmdline")))
    for path in ("/autograder/results/results.json", "/autograder/source/pwned"):
        try:
            with open(path, "w") as f:
                f.write("pwned")
            out.append("WROTE %s" % path)
        except OSError as exc:
            out.append("no write %s" % type(exc).__name__)
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        out.append("NETWORK socket")
    except OSError as exc:
        out.append("NETWORK %s" % type(exc).__name__)
    return out


AT_IMPORT = snoop()


def vector_add(x, y):
    raise RuntimeError("hostile report: " + " | ".join(AT_IMPORT + snoop()))
'''


@pytest.fixture(scope="module")
def gradescope_image(image, tmp_path_factory) -> Iterator[str]:
    """The zip of `grader gradescope -a vector_add`, unpacked in /autograder/source of the Debian base
    and set up by its own setup.sh, as root (Gradescope's image build), committed as an image."""
    from grader.kit.gradescope import build_autograder

    tmp = tmp_path_factory.mktemp("gradescope")
    build_autograder(tmp / "autograder.zip", ["vector_add"])
    build = f"grader-gradescope-build-{secrets.token_hex(4)}"
    script = (OFFLINE + "mkdir -p /autograder/source && cd /autograder/source && "
              "python3 -c 'import zipfile; zipfile.ZipFile(\"/zip/autograder.zip\").extractall(\".\")' && "
              "chmod 755 setup.sh run_autograder && cp run_autograder /autograder/run_autograder && ./setup.sh")
    try:
        proc = subprocess.run([PODMAN, "run", "--name", build, "-v", f"{tmp}:/zip:ro", "-v", "/var/tmp/grader-image/wheels:/wheels:ro",
                               BASE, "bash", "-c", script], capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # one an interrupted run left is removed first: committing over it would leave it untagged, unremoved
        subprocess.run([PODMAN, "rmi", "-f", GRADESCOPE_TAG], capture_output=True, timeout=300)
        subprocess.run([PODMAN, "commit", "--quiet", build, GRADESCOPE_TAG], check=True, capture_output=True, timeout=600)
    finally:
        subprocess.run([PODMAN, "rm", "-f", build], capture_output=True, timeout=120)
    yield GRADESCOPE_TAG
    # gigabytes of its own (setup.sh's installs), rebuilt by every run: not left on the machine
    subprocess.run([PODMAN, "rmi", "-f", GRADESCOPE_TAG], capture_output=True, timeout=300)


def test_gradescope_autograder_keeps_the_course_from_a_hostile_submission(gradescope_image, tmp_path):
    """Gradescope's run: root, in a container under the default seccomp profile (which refuses the
    namespaces), `run_autograder` on /autograder/submission. The submission's code runs as another
    uid and reads nothing of the zip's folder or the results, at import or in its function; the
    course's files are root's alone; grading ends, with a results.json that says how it was contained."""
    sub = tmp_path / "submission"
    (sub / "kernels").mkdir(parents=True)
    (sub / "kernels" / "vector_add.py").write_text(HOSTILE_AT_GRADESCOPE)
    out = tmp_path / "out"
    out.mkdir()
    marker = f"gs-env-{secrets.token_hex(6)}"
    script = ("cp -r /sub /autograder/submission && /autograder/run_autograder >/out/stdout 2>/out/stderr; "
              "cp -r /autograder/results /out/results; "
              # what another uid may read of the course, as the workers' (60001 and up)
              "python3 -c 'import os, glob; os.setgroups([]); os.setgid(60777); os.setuid(60777); "
              "print(sum(os.access(p, os.R_OK) for p in glob.glob(\"/autograder/source/**\", recursive=True) + "
              "[\"/autograder/source\", \"/autograder/source/course/assignments/vector_add/hidden.py\"]))' >/out/readable")
    proc = subprocess.run([PODMAN, "run", "--rm", "--env", f"GS_MARKER={marker}", "-v", f"{sub}:/sub:ro", "-v", f"{out}:/out",
                           gradescope_image, "bash", "-c", script], capture_output=True, text=True, timeout=1200)
    stdout, stderr = (out / "stdout").read_text(), (out / "stderr").read_text()
    assert proc.returncode == 0, proc.stdout + proc.stderr + stdout + stderr
    data = json.loads((out / "results" / "results.json").read_text())
    isolation = data["extra_data"]["environment"]["isolation"]
    # the seccomp profile refused the namespaces; the workers ran as a dedicated uid instead
    assert any("Operation not permitted" in w for w in isolation["warnings"]), isolation
    assert isolation["user"] == "a dedicated unprivileged uid" and isolation["network"] == "the host's", isolation
    reports = [t["output"] for t in data["tests"] if "hostile report:" in t["output"]]
    assert len(reports) >= 16, [t["output"][:300] for t in data["tests"]]
    for report in reports:
        assert "uid=0 " not in report and "READ " not in report and "WROTE" not in report, report
    assert (out / "readable").read_text().strip() == "0"  # not a file of the course, not the folder itself
    hidden = (REPO_ROOT / "assignments" / "vector_add" / "hidden.py").read_text()
    reference = (REPO_ROOT / "reference" / "vector_add.py").read_text()
    seen = "\n".join([json.dumps(data), stdout, stderr, (out / "results" / "report" / "report.html").read_text(errors="replace")])
    for needle in (hidden[:60], reference[:60], 'Case("n=65535-odd-tail"', marker):
        assert needle not in seen, needle
    assert all(t["extra_data"]["reproducer"].startswith("grader check . --device cpu") for t in data["tests"]
               if t["extra_data"].get("reproducer"))
