"""The worker's container: capped output, timeouts that kill everything, crashes, the
namespaced sandbox (uid, limits, view of the files), its fallback without namespaces, and
the docker command (checked by its construction and by a stand-in `docker`)."""

import io
import os
import secrets
import shutil
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.conftest import SANDBOX, COURSE, FIXTURES, REPO_ROOT, assert_nothing_left, run_cli
from grader import spec as specs
from grader.settings import Settings, from_environment
from grader.protocol import Contender, Load, Run
from grader.sandbox import docker, files, launch, namespaces, process, uids
from grader.sandbox.isolation import Isolation
from grader.sandbox.launch import Limits
from grader.sandbox.zygote import SandboxState
from grader.sandbox.process import CappedOutput, WorkerFailure, WorkerProcess

ISOLATION = process.detect("sandbox", settings=Settings(), sandbox=SANDBOX)
needs_namespaces = pytest.mark.skipif(not ISOLATION.namespaces, reason=f"no namespaces here: {ISOLATION.warnings}")
needs_user_switch = pytest.mark.skipif(not ISOLATION.user_switch, reason="the worker switches user only when the grader runs as root")


def test_capped_output_keeps_head_and_tail():
    stream = io.BufferedReader(io.BytesIO(b"HEAD" + b"x" * 1_000_000 + b"TAIL"))
    text = CappedOutput(stream, keep=100).text()
    assert text.startswith("HEAD") and text.endswith("TAIL")
    assert "bytes of output elided" in text and len(text) < 400


def _load(worker: WorkerProcess, repo: Path, module: str, function: str = "f"):
    return worker.request(Load({"s": Contender(str(repo), module, function)}), 60)


def _repo(tmp_path: Path, source: str, name: str = "mod.py") -> Path:
    repo = tmp_path / "job" / "repo"
    repo.mkdir(parents=True)
    (repo / name).write_text(textwrap.dedent(source))
    return repo


def _run_module(repo: Path, tmp_path: Path, **options) -> tuple[int, str, object]:
    """Run the repo's mod.py in a sandboxed worker, as student code runs: its exit status,
    its captured output as text, and the capture itself."""
    worker = WorkerProcess(repo, tmp_path / "job" / "scratch", interpret=True, command=[sys.executable, "mod.py"], **options, settings=Settings(), sandbox=SANDBOX)
    try:
        code = worker.proc.wait(timeout=60)
        return code, worker.output.text(), worker.output
    finally:
        worker.close()


def _call(worker: WorkerProcess, tmp_path: Path, timeout: float):
    inputs = tmp_path / "job" / "none.safetensors"
    save_file({}, str(inputs))
    inputs.chmod(0o644)  # the worker's uid reads it
    return worker.request(Run("s", str(inputs), {}, "cpu", str(tmp_path / "job" / "repo" / "out.safetensors")), timeout=timeout)


@pytest.mark.slow
def test_timeout_kills_the_worker_and_everything_it_started(tmp_path):
    marker = f"300.{secrets.randbelow(10**9)}"
    repo = _repo(tmp_path, f"""
        import os, subprocess, time
        subprocess.Popen(['sleep', '{marker}'])
        if os.fork() == 0:  # a daemon in a session of its own
            os.setsid()
            os.execvp('sleep', ['sleep', '{marker}'])
        def f():
            time.sleep(300)
        """)
    worker = WorkerProcess(repo, tmp_path / "job" / "scratch", interpret=True, settings=Settings(), sandbox=SANDBOX)
    try:
        assert _load(worker, repo, "mod.py").ok
        start = time.monotonic()
        with pytest.raises(WorkerFailure) as info:
            _call(worker, tmp_path, timeout=1)
        assert info.value.outcome == "timeout" and "no answer within 1 s" in info.value.message
        assert time.monotonic() - start < 60  # killed at its 1 s timeout, not waited out (it sleeps 300 s)
    finally:
        worker.close()
    assert_nothing_left(marker)


@pytest.mark.slow
def test_worker_death_is_reported_with_its_status(tmp_path):
    repo = _repo(tmp_path, "import os\nos._exit(7)\n")
    worker = WorkerProcess(repo, tmp_path / "job" / "scratch", interpret=True, settings=Settings(), sandbox=SANDBOX)
    try:
        with pytest.raises(WorkerFailure) as info:
            _load(worker, repo, "mod.py")
        assert info.value.outcome == "crashed" and "exited with status 7" in info.value.message
    finally:
        worker.close()


def test_a_flood_of_output_neither_blocks_the_worker_nor_fills_memory(tmp_path):
    repo = _repo(tmp_path, """
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(100):
            sys.stdout.write(chunk)
        print("THE END")
        """)
    start = time.monotonic()
    code, text, out = _run_module(repo, tmp_path)
    assert code == 0
    assert out.total >= 100 << 20
    assert len(out.head) <= out.keep and len(out.tail) <= 2 * out.keep  # what is held, whatever was printed
    assert "bytes of output elided" in text and text.rstrip().endswith("THE END") and len(text) < 3 * out.keep
    assert time.monotonic() - start < 60


@pytest.mark.slow
@needs_user_switch
def test_workers_of_one_job_alive_together_share_its_uid(tmp_path):
    """A GPU run's interpreter replay starts a second worker on the job while the first must
    still write its timing samples to outputs/: the second start must not lock it out."""
    repo = _repo(tmp_path, """
        import os, torch
        def f():
            return torch.tensor([float(os.getuid())])
        """)
    outputs = tmp_path / "job" / "outputs"
    inputs = tmp_path / "job" / "none.safetensors"
    save_file({}, str(inputs))
    inputs.chmod(0o644)
    first = WorkerProcess(repo, tmp_path / "job" / "scratch-1", interpret=True, writable=[outputs], settings=Settings(), sandbox=SANDBOX)
    try:
        assert _load(first, repo, "mod.py").ok
        second = WorkerProcess(repo, tmp_path / "job" / "scratch-2", interpret=True, writable=[outputs], settings=Settings(), sandbox=SANDBOX)
        try:
            assert _load(second, repo, "mod.py").ok
            assert second.lease.uid == first.lease.uid
        finally:
            second.close()
        reply = first.request(Run("s", str(inputs), {}, "cpu", str(outputs / "out.safetensors")), timeout=60)
        assert reply.ok, reply
        assert int(next(iter(load_file(outputs / "out.safetensors").values()))[0]) == first.lease.uid
    finally:
        first.close()
    # the job's lease was given back with its last worker ...
    assert not [job for job in uids.JobLease._held if job.startswith(str(tmp_path))]
    # ... and a new worker of the job starts cleanly, and writes its outputs as its own uid
    third = WorkerProcess(repo, tmp_path / "job" / "scratch-3", interpret=True, writable=[outputs], settings=Settings(), sandbox=SANDBOX)
    try:
        assert _load(third, repo, "mod.py").ok
        reply = third.request(Run("s", str(inputs), {}, "cpu", str(outputs / "third.safetensors")), timeout=60)
        assert reply.ok, reply
        assert int(next(iter(load_file(outputs / "third.safetensors").values()))[0]) == third.lease.uid
    finally:
        third.close()


@needs_user_switch
def test_worker_runs_as_an_unprivileged_uid_with_limits(tmp_path):
    repo = _repo(tmp_path, """
        import os, resource
        print("uid", os.getuid(), os.getgid(), os.getgroups())
        print("nproc", resource.getrlimit(resource.RLIMIT_NPROC)[0])
        forked = 0
        try:
            for _ in range(100):
                if os.fork() == 0:
                    import time; time.sleep(30); os._exit(0)
                forked += 1
        except OSError as exc:
            print("fork refused after", forked, exc.strerror)
        for path in ("/etc/shadow", "/proc/1/environ"):
            try:
                open(path).read(); print("READ", path)
            except OSError as exc:
                print("cannot read", path, exc.strerror)
        """)
    _, text, _ = _run_module(repo, tmp_path, limits=Limits(processes=20))
    first, last = (int(x) for x in uids.uid_range(Settings().sandbox_uids).split("-"))
    uid, gid = (int(x) for x in text.split("uid ", 1)[1].split()[:2])
    assert first <= uid <= last and gid == uid and "[]" in text.split("uid ", 1)[1].splitlines()[0]
    assert "nproc 20" in text and "fork refused after" in text
    assert int(text.split("fork refused after ")[1].split()[0]) < 20
    assert "READ" not in text and "cannot read /etc/shadow Permission denied" in text
    assert_nothing_left()


@pytest.mark.slow
@needs_namespaces
def test_worker_sees_only_its_job_and_writes_only_its_own_folders(tmp_path):
    hidden = tmp_path / "hidden"  # e.g. the other students' repos, the output folder
    hidden.mkdir()
    (hidden / "secret.txt").write_text("s3cret")
    outputs = tmp_path / "job" / "outputs"
    repo = _repo(tmp_path, f"""
        import os
        from pathlib import Path
        COURSE_ROOT = Path({str(REPO_ROOT.resolve())!r})  # the course: not in the worker's view at all
        def attempt(what, fn):
            try:
                fn(); print(what, "yes")
            except OSError as exc:
                print(what, "no", exc.strerror)
        def list_reference():
            if not os.listdir(COURSE_ROOT / "reference"):
                raise OSError(0, "blank")
        attempt("list reference", list_reference)
        attempt("read hidden cases", lambda: open(COURSE_ROOT / "assignments" / "softmax" / "hidden.py").read())
        attempt("read hidden", lambda: open({str(hidden / 'secret.txt')!r}).read())
        attempt("write repo", lambda: open("mine.txt", "w").write("x"))
        attempt("write outputs", lambda: open({str(outputs / 'o.txt')!r}, "w").write("x"))
        attempt("write job", lambda: open("../planted.txt", "w").write("x"))
        attempt("write checkout", lambda: open(COURSE_ROOT / "planted.txt", "w").write("x"))
        attempt("network", lambda: __import__("socket").create_connection(("127.0.0.1", 9), timeout=2))
        print("processes", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        """)
    _, text, _ = _run_module(repo, tmp_path, writable=[outputs], hide=[hidden])
    for line in ("list reference no", "read hidden cases no", "read hidden no", "write repo yes", "write outputs yes", "write job no",
                 "write checkout no", "network no"):
        assert line in text, (line, text)
    processes = eval(text.split("processes ", 1)[1].splitlines()[0])  # noqa: S307 - a list it printed
    assert len(processes) == 2 and 1 in processes  # its init and itself: nothing of the host
    assert (repo / "mine.txt").exists() and (outputs / "o.txt").exists() and not (tmp_path / "job" / "planted.txt").exists()


@pytest.mark.slow
def test_without_namespaces_it_says_so_and_still_sweeps_every_child(tmp_path, monkeypatch):
    which = shutil.which
    monkeypatch.setattr(namespaces.shutil, "which", lambda name: None if name == "unshare" else which(name))
    own = SandboxState()  # a session of its own: the degraded probe is not the tests' cached one
    try:
        degraded = process.detect("sandbox", settings=Settings(), sandbox=own)
        assert not degraded.namespaces  # as root, a dedicated uid where its Python is open to it (test_gradescope)
        assert len(degraded.warnings) == 1 and "the unshare command is missing" in degraded.warnings[0]
        assert "could outlive it" in degraded.warnings[0]
        marker = f"300.{secrets.randbelow(10**9)}"
        repo = _repo(tmp_path, f"""
            import os, time
            for _ in range(3):
                if os.fork() == 0:
                    os.setsid()
                    if os.fork() == 0:
                        os.execvp('sleep', ['sleep', '{marker}'])
                    os._exit(0)
            def f():
                time.sleep(300)
            """)
        worker = WorkerProcess(repo, tmp_path / "job" / "scratch", interpret=True, isolation=degraded, settings=Settings(), sandbox=own)
        try:
            assert _load(worker, repo, "mod.py").ok
            with pytest.raises(WorkerFailure) as info:
                _call(worker, tmp_path, timeout=1)
            assert info.value.outcome == "timeout"
        finally:
            worker.close()
        assert_nothing_left(marker)
    finally:
        own.close()


def test_chown_of_the_job_never_follows_a_planted_symlink(tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("root's")
    job = tmp_path / "job"
    (job / "repo").mkdir(parents=True)
    (job / "repo" / "link").symlink_to(precious)
    before = precious.stat()
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    uids.chown_tree(job, 60999, 60999)
    assert precious.stat().st_uid == before.st_uid and os.lstat(job / "repo" / "link").st_uid == 60999


def test_a_run_cache_file_linked_into_a_job_stays_the_graders(tmp_path):
    """Input sets shared by the jobs of a run are hard-linked into each job folder; handing the
    job folder to a worker's uid must not hand over the shared file (the next student's inputs)."""
    from grader.judge.runcache import RunCache

    spec = COURSE.get("vector_add")
    cache = RunCache(tmp_path / "cache")
    job = tmp_path / "job"
    (job / "perf").mkdir(parents=True)
    cache.perf_inputs(spec, spec.cases[1], "float32", 3, 0, job / "perf" / "set0.safetensors", link=True)
    shared = next(cache.folder.glob("inputs-*.safetensors"))
    assert os.path.samefile(shared, job / "perf" / "set0.safetensors")  # linked, not copied
    (job / "perf" / "own.txt").write_text("the job's own")
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    uids.chown_tree(job, 60999, 60999)
    assert shared.stat().st_uid == os.geteuid()
    assert (job / "perf" / "own.txt").stat().st_uid == 60999 and (job / "perf").stat().st_uid == 60999


def test_files_are_linked_into_a_job_only_where_its_worker_cannot_write_them():
    iso = Isolation
    assert files.worker_cannot_write(iso("sandbox", user_switch=True))
    assert files.worker_cannot_write(iso("sandbox", namespaces=True))  # the job folder is mounted read-only
    assert not files.worker_cannot_write(iso("sandbox"))  # same uid, no private view: copies
    assert not files.worker_cannot_write(iso("none"))
    assert not files.worker_cannot_write(iso("docker"))


def test_reading_a_worker_file_refuses_a_symlink(tmp_path):
    target = tmp_path / "elsewhere.safetensors"
    save_file({}, str(target))
    link = tmp_path / "out.safetensors"
    link.symlink_to(target)
    with pytest.raises(OSError):
        files.read_worker_file(link)
    assert files.read_worker_file(target) == target.read_bytes()


def test_docker_command_contains_the_worker(tmp_path):
    job = tmp_path / "job"
    argv = docker.docker_command("grader-worker-x", job / "repo", job, [job / "repo", job / "scratch", job / "outputs"],
                                  launch.worker_env(job / "scratch", False, "2"), "2",
                                  Limits(processes=256, memory=8 << 30), interpret=False, command=["python", "-c", "pass"], settings=Settings(), code=SANDBOX.worker_code())
    text = " ".join(argv)
    assert argv[:3] == ["docker", "run", "--rm"]
    for flags in (["--network", "none"], ["--read-only"], ["--pids-limit", "256"], ["--memory", "8192m"],
                  ["--memory-swap", "8192m"], ["--user", docker.DOCKER_USER], ["--cap-drop", "ALL"],
                  ["--security-opt", "no-new-privileges"], ["--gpus", '"device=2"'], ["--workdir", str(job / "repo")]):
        i = argv.index(flags[0])
        assert argv[i:i + len(flags)] == flags, flags
    assert f"type=bind,source={job},target={job},readonly" in argv
    assert f"type=bind,source={job / 'outputs'},target={job / 'outputs'}" in argv
    assert "CUDA_VISIBLE_DEVICES" not in text  # the container sees its one GPU as device 0
    assert "--env PYTHONPATH=/opt/grader-host" in text and "target=/opt/grader-host/grader,readonly" in text
    # the worker's own copy of its code, never the course's grader/ or anything beside it
    assert f"type=bind,source={SANDBOX.worker_code() / 'grader'},target=/opt/grader-host/grader,readonly" in argv
    assert str(REPO_ROOT.resolve()) not in text.replace(str(job), "")
    assert f"type=tmpfs,target={docker.IMAGE_COURSE},tmpfs-size=65536,tmpfs-mode=0555" in argv  # the image's assignments/
    # the command replaces the image's entrypoint (the grader's CLI)
    assert argv[-5:] == ["--entrypoint", "python", Settings().docker_image, "-c", "pass"]
    assert "--cpuset-cpus" not in argv  # no CPUs named: the host's


def test_a_students_worker_is_confined_to_its_own_cpus_by_the_container_and_by_its_affinity(tmp_path, monkeypatch):
    job = tmp_path / "job"
    argv = docker.docker_command("grader-worker-x", job / "repo", job, [job / "repo"],
                                  launch.worker_env(job / "scratch", False, "2"), "2", Limits(cpus=(1, 2, 3)),
                                  interpret=False, command=["python", "-c", "pass"], settings=Settings(),
                                  code=SANDBOX.worker_code())
    assert argv[argv.index("--cpuset-cpus") + 1] == "1,2,3"  # a cgroup's cpuset: enforced, not advisory
    assert Limits(cpus=(1, 2)).for_worker(False, False)["cpus"] == [1, 2] and Limits().for_worker(True, False)["cpus"] is None
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda _: {0, 1, 2, 3, 4})
    assert launch.student_cpus() == (1, 2, 3, 4)  # the first CPU left to the grading process's clock
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda _: {0, 1})
    assert launch.student_cpus() is None  # too few to give one away
    monkeypatch.undo()  # launch.os is os itself
    # the mask applied where every backend applies its limits (the sandbox's init, a zygote's fork, the plain preexec)
    from grader.sandbox.init import apply_limits

    mine = sorted(os.sched_getaffinity(0))
    child = os.fork()
    if child == 0:
        try:
            apply_limits({"cpus": mine[-1:]})
            os._exit(0 if sorted(os.sched_getaffinity(0)) == mine[-1:] else 1)
        except BaseException:
            os._exit(2)
    assert os.waitpid(child, 0)[1] == 0


FAKE_DOCKER = '''#!{python}
"""A stand-in for `docker`: runs the container's command here, as docker_command asked."""
import os, signal, sys
state, args = os.environ["FAKE_DOCKER_STATE"], sys.argv[1:]
if args[0] in ("kill", "rm"):
    try:
        os.killpg(int(open(os.path.join(state, args[-1])).read()), signal.SIGKILL)  # its own session (start_new_session)
    except (OSError, ValueError):
        pass
    sys.exit(0)
valued = {{"--name", "--network", "--tmpfs", "--user", "--cap-drop", "--security-opt", "--pids-limit", "--memory",
          "--memory-swap", "--ulimit", "--mount", "--gpus", "--workdir", "--env", "--entrypoint"}}
i, opts = 1, []
while args[i].startswith("-"):
    opts.append((args[i], args[i + 1] if args[i] in valued else None))
    i += 2 if args[i] in valued else 1
command = [dict(opts)["--entrypoint"], *args[i + 1:]]
grader = next(v for k, v in opts if k == "--mount" and "target=/opt/grader-host/grader" in v)
host = os.path.dirname(grader.split("source=")[1].split(",")[0])
env = {{"PATH": os.environ["PATH"]}}
env.update(v.replace("/opt/grader-host", host).split("=", 1) for k, v in opts if k == "--env")
command = [sys.executable if c == "python" else c.replace("/opt/grader-host", host) for c in command]
open(os.path.join(state, dict(opts)["--name"]), "w").write(str(os.getpid()))
os.chdir(dict(opts)["--workdir"])
os.execve(command[0], command, env)
'''


@pytest.mark.slow
def test_docker_mode_speaks_through_fifos_and_is_killed_by_name(tmp_path, monkeypatch):
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER.format(python=sys.executable))
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    repo = tmp_path / "job" / "repo"
    shutil.copytree(FIXTURES / "good", repo)
    (repo / "kernels" / "slow.py").write_text("import time\ndef slow(x, y):\n    time.sleep(300)\n")
    inputs = tmp_path / "job" / "in.safetensors"
    import torch

    from grader.codec import write_inputs

    layout = write_inputs({"x": torch.ones(5), "y": torch.ones(5)}, inputs)
    outputs = tmp_path / "job" / "outputs"
    worker = WorkerProcess(repo, tmp_path / "job" / "scratch", interpret=True, isolation=Isolation("docker"), writable=[outputs], settings=Settings(), sandbox=SANDBOX)
    try:
        contenders = {"s": Contender(str(repo), "kernels/vector_add.py", "vector_add"),
                      "t": Contender(str(repo), "kernels/slow.py", "slow")}
        assert worker.request(Load(contenders), 60).ok
        reply = worker.request(Run("s", str(inputs), layout, "cpu", str(outputs / "o.safetensors")), 60)
        assert reply.ok and reply.launches == {"add_kernel": 1}
        assert load_file(str(outputs / "o.safetensors"))["output"].tolist() == [2.0] * 5
        with pytest.raises(WorkerFailure) as info:
            worker.request(Run("t", str(inputs), layout, "cpu", str(outputs / "o.safetensors")), 2)
        assert info.value.outcome == "timeout"
    finally:
        worker.close()
    assert stat.S_ISFIFO(os.stat(tmp_path / "job" / "scratch" / ".channel" / "requests").st_mode)
    assert_nothing_left()


@pytest.mark.slow
def test_isolation_option_rejects_what_cannot_work(tmp_path, monkeypatch):
    repo = tmp_path / "good"
    shutil.copytree(FIXTURES / "good", repo)
    monkeypatch.setenv("PATH", "/usr/bin:/bin" if not shutil.which("docker", path="/usr/bin:/bin") else "/nonexistent")
    for value, message in (("docker", "no `docker` command on this machine"), ("chroot", "--isolation must be one of")):
        run = run_cli(["check", str(repo), "--isolation", value, "--json", str(tmp_path / "r.json"), "--html", str(tmp_path)], tmp_path)
        assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr, run.stderr


@pytest.mark.slow
@needs_user_switch
def test_a_sandbox_that_cannot_start_is_an_infra_error_not_the_students(tmp_path, monkeypatch):
    from grader import spec as specs
    from grader.judge.context import GradingContext
    from grader.judge.session import open_session
    from grader.submission import open_submission

    from grader.settings import from_environment

    # the settings this test process was started with (GRADER_WARM_SECONDS=0: no fork server, whose own
    # process would lease the uid out of the monkeypatch's reach), the sandbox found with them before
    # the range breaks
    settings = from_environment()
    assert process.detect("sandbox", settings, sandbox=SANDBOX).user_switch
    monkeypatch.setattr(uids, "UID_RANGE", "0-0")  # root's: never lent to a worker
    repo = tmp_path / "good"
    shutil.copytree(FIXTURES / "good", repo)
    session = open_session(GradingContext("cpu", 1, ("n=1",), ("float32",)), settings, sandbox=SANDBOX)  # its probe kept
    run = session.grade(open_submission(repo), [COURSE.get("vector_add")])
    test = run.tests[0]  # one result for the whole assignment: no case could run
    assert test.outcome == "infra_error" and "no free worker uid in 0-0" in test.message, test
    assert test.name == "worker" and "importing kernels/vector_add.py failed" not in test.message  # ours, not the student's import


def test_where_nothing_can_start_it_says_so_and_runs_plain_processes(monkeypatch):
    monkeypatch.setattr(process, "_probe", lambda isolation, settings, sandbox: "the init failed")
    fallback = process.detect("sandbox", settings=Settings(), sandbox=SandboxState())  # probed afresh
    assert fallback.mode == "none" and "no sandbox can start here (the init failed" in fallback.warnings[0]


@pytest.mark.parametrize("hidden", [True, False])
def test_a_checks_kept_cache_is_hidden_though_its_job_folder_lies_inside_it(tmp_path, hidden):
    """grader check keeps the next check's input sets (the fresh one too) in a folder beside its
    job folders; the worker sees its own job, not the cache. Hidden or not, the cache is not in
    the worker's view (an allowlist: its job folder, not what holds it), wherever it lies: here
    inside the grader package, as the course folder is never shown to a worker either."""
    from grader.sandbox.interpreter import PACKAGE_PARENT

    cache = Path(PACKAGE_PARENT) / "grader" / f".test-cache-{os.getpid()}-{hidden}"
    try:
        _kept_cache_visible(cache, hidden)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _kept_cache_visible(cache: Path, hidden: bool) -> None:
    (cache / "run").mkdir(parents=True)
    for folder in (cache, cache / "run"):
        folder.chmod(0o755)  # readable by any uid but for the view
    (cache / "run" / "inputs-fresh.safetensors").write_text("the fresh set")
    (cache / "run" / "inputs-fresh.safetensors").chmod(0o644)
    job = cache / "jobs" / "grader-x" / "vector_add"
    repo = job / "repo"
    repo.mkdir(parents=True)
    (repo / "mod.py").write_text(textwrap.dedent(f"""
        import os
        for what, path in (("own", "mod.py"), ("cache", {str(cache / 'run' / 'inputs-fresh.safetensors')!r})):
            try:
                open(path).read(); print(what, "yes")
            except OSError as exc:
                print(what, "no", exc.strerror)
        """))
    worker = WorkerProcess(repo, job / "scratch", interpret=True, command=[sys.executable, "mod.py"], hide=[cache] if hidden else [], settings=Settings(), sandbox=SANDBOX)
    try:
        worker.proc.wait(timeout=60)
        text = worker.output.text()
    finally:
        worker.close()
    assert (cache / "run" / "inputs-fresh.safetensors").read_text() == "the fresh set"  # there, outside the view
    assert "own yes" in text, text
    assert "cache no" in text if ISOLATION.namespaces else "cache yes" in text, text



@pytest.mark.parametrize("zygote_on", ["1", "0"])
def test_the_trusted_sides_plain_worker_loads_an_assignments_spec_forked_or_fresh(tmp_path, monkeypatch, zygote_on):
    """The reference and torch side of a timing runs in a plain worker that imports the
    assignment's spec.py (which imports grader.spec): it gets the whole package, however it is
    started; a sandboxed worker gets only the worker's copy."""
    import subprocess

    spec = COURSE.get("vector_add")
    worker = WorkerProcess(tmp_path / "trusted", tmp_path / "trusted" / "scratch", interpret=True, isolation="none",
                           settings=from_environment({"GRADER_ZYGOTE": zygote_on}), sandbox=SANDBOX)
    try:
        reply = worker.request(Load({"torch": Contender(str(spec.folder), "spec.py", "baseline")}), 120)
        assert not hasattr(reply, "kind"), reply  # a Failure has a kind; Ok does not
    finally:
        worker.close()
    # an editable install's finder can fall back to the course's package, as it did here but not on
    # a machine without one: the package each bootstrap puts first decides, so look at its folder
    started: list[list[str]] = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: started.append(argv) or real_popen(argv, **kw))
    worker = WorkerProcess(tmp_path / "fresh", tmp_path / "fresh" / "scratch", interpret=True, isolation="none",
                           settings=from_environment({"GRADER_ZYGOTE": "0"}), sandbox=SANDBOX)
    worker.close()
    boot = next(a for a in started if "-c" in a)
    code = boot[boot.index("-c") + 1].split("; from grader.worker")[0]
    has_spec = "; import grader, os; sys.exit(0 if os.path.isfile(os.path.join(grader.__path__[0], 'spec.py')) else 3)"
    assert subprocess.run([sys.executable, "-I", "-B", "-c", code + has_spec]).returncode == 0
    sandboxed = launch.worker_argv("3", "4", path=str(SANDBOX.worker_code()))
    code = sandboxed[sandboxed.index("-c") + 1].split("; from grader.worker")[0]
    assert subprocess.run([sys.executable, "-I", "-B", "-c", code + has_spec]).returncode == 3
