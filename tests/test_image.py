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

import pytest

from conftest import FIXTURES, REPO_ROOT, build_submission, run_cli

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


def test_hostile_code_in_the_image_is_contained(image, tmp_path):
    """Writes outside its copy and reads of the image's course folder (its hidden cases) fail."""
    repo = tmp_path / "snoop"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "vector_add.py").write_text(SNOOP.format(
        paths=["/opt/grader/assignments/softmax/hidden.py", "/opt/grader/assignments/vector_add/spec.py"],
        writes=["/etc/pwned", "/opt/grader/pwned", "/opt/venv/pwned"]))
    proc = in_image(image, repo, tmp_path / "out", "-a", "vector_add", "--case", "n=1", "--dtype", "float32", "--device", "cpu")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    report = result_of(results, "vector_add: n=1 [float32]")["output"]
    assert "snoop report:" in report, proc.stdout + proc.stderr
    assert ": read" not in report and ": written" not in report, report
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
