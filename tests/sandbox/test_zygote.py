"""Workers forked by the zygote (grader.sandbox.zygote) are contained exactly as workers started as fresh
interpreters: same uid, limits, namespaces, view of the files, environment and descriptors;
nothing of one worker reaches the next; nothing outlives its job process."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grader.sandbox import process as sandbox
from grader.sandbox import zygote
from grader.protocol import Contender, Load, Ok, Ping
from grader.resident import stop_warm
from grader.sandbox.interpreter import PACKAGE_PARENT
from grader.sandbox.process import WorkerProcess
from grader.settings import Settings, WarmStarts, from_environment
from grader.sandbox.zygote import SandboxState

SANDBOX = SandboxState()  # this test process's session: its workers fork from one zygote

ISOLATION = sandbox.detect("sandbox", settings=Settings(), sandbox=SANDBOX)
needs_namespaces = pytest.mark.skipif(not ISOLATION.namespaces, reason=f"no namespaces here: {ISOLATION.warnings}")

# what the worker reports of itself, at import (the load request's error carries it back)
FACTS = textwrap.dedent("""
    import json, os, resource, socket, sys
    def fd_target(fd):
        try:
            t = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return "?"
        return t.split(":")[0] if t.startswith(("pipe:", "socket:", "anon_inode:")) else t
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    mounts = sorted({(l.split()[4], "ro" in l.split()[5].split(",")) for l in open("/proc/self/mountinfo")})
    facts = {
        "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())],
        "pid": os.getpid(), "sid_is_pgid": os.getsid(0) == os.getpgid(0),
        "ns": {n: os.readlink(f"/proc/self/ns/{n}") for n in ("net", "pid", "mnt", "user")},
        "interfaces": sorted(name for _, name in socket.if_nameindex()),
        "limits": {n: resource.getrlimit(getattr(resource, n)) for n in ("RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE",
                                                                          "RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_CORE")},
        "no_new_privs": status["NoNewPrivs"].strip(), "caps": status["CapEff"].strip(),
        "env": dict(os.environ), "cwd": os.getcwd(), "isolated": sys.flags.isolated,
        "path": [p for p in sys.path if "job" not in p],
        "fds": sorted(fd_target(int(fd)) for fd in os.listdir("/proc/self/fd")),
        "mounts": mounts, "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "writable": {p: os.access(p, os.W_OK) for p in ("/usr", "/etc", "/tmp", os.path.expanduser("~"))},
        "student_modules": sorted(m for m in sys.modules if m.startswith("student_")),
    }
    raise RuntimeError("FACTS" + json.dumps(facts))
""")


def _facts(tmp_path: Path, name: str, monkeypatch, forked: bool, module: str = "student_facts",
           sandbox: SandboxState = SANDBOX) -> dict:
    job = tmp_path / name
    repo = job / "repo"
    repo.mkdir(parents=True)
    (repo / f"{module}.py").write_text(FACTS)
    worker = WorkerProcess(repo, job / "scratch", interpret=True, writable=[job / "outputs"], job=job,
                           settings=Settings() if forked else Settings(warm=WarmStarts(fork_server=False)),
                           sandbox=sandbox)
    try:
        assert isinstance(worker.proc, zygote.Forked) == forked
        reply = worker.request(Load({"s": Contender(str(repo), f"{module}.py", "f")}), 120)
    finally:
        worker.close()
    message = reply.message  # the module raises its facts: a Failure
    facts = json.loads(message[message.index("FACTS") + 5:])
    # what differs by design between two workers: their own paths, and each one's new namespaces
    facts["env"] = {k: v.replace(name, "JOB") for k, v in facts["env"].items()}
    facts["cwd"] = facts["cwd"].replace(name, "JOB")
    facts["writable"] = {k.replace(name, "JOB"): v for k, v in facts["writable"].items()}
    facts["mounts"] = sorted((p.replace(name, "JOB"), ro) for p, ro in facts["mounts"])
    facts["fds"] = sorted(f.replace(name, "JOB") for f in facts["fds"])
    return facts


@needs_namespaces
def test_a_forked_worker_is_contained_exactly_as_a_fresh_one(tmp_path, monkeypatch):
    fresh = _facts(tmp_path, "jobQQfresh", monkeypatch, forked=False)
    forked = _facts(tmp_path, "jobQQforked", monkeypatch, forked=True)
    ours = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("net", "pid", "mnt", "user")}
    for facts in (fresh, forked):  # new network, PID and mount namespaces, never the grader's
        assert all(facts["ns"][n] != ours[n] for n in ("net", "pid", "mnt"))
        assert facts["interfaces"] == ["lo"] and facts["no_new_privs"] == "1"
        assert facts["processes"] == [1, facts["pid"]]  # the init and the worker: nothing of the zygote
        assert not [f for f in facts["fds"] if f == "socket"]  # the zygote's socket is not the worker's
        if ISOLATION.user_switch:  # a job's own uid and gid, no groups, no capabilities
            uid = facts["ids"][0]
            assert 60100 <= uid and facts["ids"] == [uid, uid, uid, uid, []] and facts["caps"] == "0000000000000000"
    for key in fresh:
        if key not in ("ns", "pid", "processes", "ids"):  # which pid and uid numbers are free is the machine's business
            assert forked[key] == fresh[key], key


@needs_namespaces
def test_nothing_of_one_forked_worker_reaches_the_next(tmp_path, monkeypatch):
    first = _facts(tmp_path, "jobQQfirst", monkeypatch, forked=True, module="student_first")
    second = _facts(tmp_path, "jobQQsecond", monkeypatch, forked=True, module="student_second")
    # the second is a fresh fork of the zygote: the first's module is not in it, nor its files
    assert first["student_modules"] == ["student_first"] and second["student_modules"] == ["student_second"]
    assert not [f for f in second["fds"] if "jobQQfirst" in f]


def test_the_zygote_holds_no_cuda_context_and_no_grader_secrets():
    code = zygote.PRELOAD
    assert "torch.cuda.is_initialized()" in code  # checked there, after every import (raises if it holds one)
    for private in ("grader.spec", "grader.judge", "grader.batch", "reference", "course_secret"):
        assert private not in code


def test_the_zygote_and_its_workers_die_with_the_job_process(tmp_path):
    """A job process that starts a forked worker and is then killed (SIGKILL: no cleanup) leaves
    no zygote and no worker behind."""
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {PACKAGE_PARENT!r})
        from pathlib import Path
        from grader.sandbox.process import WorkerProcess
        from grader.settings import Settings
        from grader.sandbox.zygote import SandboxState
        job = Path({str(tmp_path / "job")!r})
        w = WorkerProcess(job / "repo", job / "scratch", interpret=True, settings=Settings(), sandbox=SandboxState())
        from grader.protocol import Ping
        w.request(Ping(), 120)
        print(w.proc.zygote.proc.pid, w.proc.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        zygote_pid, worker_pid = map(int, proc.stdout.readline().split())
        assert _alive(zygote_pid) and _alive(worker_pid)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while (_alive(zygote_pid) or _alive(worker_pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(zygote_pid) and not _alive(worker_pid)


def test_a_zygote_that_cannot_start_costs_speed_not_the_worker(tmp_path, monkeypatch):
    """A zygote that fails turns warm starts off for the rest of its session (once, said on
    stderr), and only that session's: another session still forks."""
    monkeypatch.setattr(zygote.Zygote, "__init__", lambda self, env, warm=None: (_ for _ in ()).throw(zygote.ZygoteError("no fork here")))
    failed = SandboxState()
    worker = WorkerProcess(tmp_path / "job" / "repo", tmp_path / "job" / "scratch", interpret=True, settings=Settings(), sandbox=failed)
    try:
        assert isinstance(worker.proc, subprocess.Popen)  # a fresh interpreter, as before
        assert worker.request(Ping(), 120) == Ok()
        assert not zygote.enabled(WarmStarts(), failed) and failed.disabled == "no fork here"
        assert zygote.enabled(WarmStarts(), SandboxState())  # another session's is its own
    finally:
        worker.close()
        failed.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- the warm zygote of `grader check`, which outlives one command ------------------------------

WARM_COMMAND = textwrap.dedent("""
    import json, os, socket, struct, sys, time
    sys.path.insert(0, {parent!r})
    from pathlib import Path
    from grader.sandbox.zygote import SandboxState
    from grader.sandbox.process import WorkerProcess
    from grader.settings import Settings
    from grader.protocol import Ping
    sandbox = SandboxState()
    sandbox.keep_warm(Path({folder!r}), {idle!r})
    job = Path({job!r})
    began = time.monotonic()
    w = WorkerProcess(job / "repo", job / "scratch", interpret=True, settings=Settings(), sandbox=sandbox)
    w.request(Ping(), 300)
    z = w.proc.zygote
    peer = struct.unpack("3i", z.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    print(json.dumps({{"started_here": z.started_here, "zygote": peer, "worker": w.proc.pid,
                      "seconds": time.monotonic() - began}}), flush=True)
    if {hold!r}:
        time.sleep(600)
    w.close()
""")


def _warm_command(folder: Path, job: Path, idle: float = 30, hold: bool = False) -> subprocess.Popen:
    code = WARM_COMMAND.format(parent=PACKAGE_PARENT, folder=str(folder), idle=idle, job=str(job), hold=hold)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)


@needs_namespaces
def test_a_warm_zygote_serves_the_next_command_and_ends_when_idle(tmp_path):
    folder = tmp_path / "kept" / "warm"
    try:
        seen = []
        for n in range(2):  # two commands, one after the other
            proc = _warm_command(folder, tmp_path / f"job{n}", idle=4)
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0
            seen.append(json.loads(out))
        first, second = seen
        assert first["started_here"] and not second["started_here"]
        assert first["zygote"] == second["zygote"] and _alive(first["zygote"])  # the same zygote, still there
        assert not _alive(first["worker"]) and not _alive(second["worker"])  # each worker ended with its command
        assert oct(folder.stat().st_mode & 0o777) == "0o700"  # the socket's folder is this user's alone
        deadline = time.monotonic() + 30
        while _alive(first["zygote"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(first["zygote"])  # idle for 4 s: gone, and its socket and home with it
        assert not list(folder.glob("*.sock")) and not list(folder.glob("*.home-*"))
        third = _warm_command(folder, tmp_path / "job2", idle=4)  # the next command starts a new one
        out, _ = third.communicate(timeout=300)
        assert json.loads(out)["started_here"]
    finally:
        stop_warm(folder)


@needs_namespaces
def test_a_command_killed_takes_its_workers_but_not_the_warm_zygote(tmp_path):
    folder = tmp_path / "kept" / "warm"
    try:
        holder = _warm_command(folder, tmp_path / "job0", hold=True)
        facts = json.loads(holder.stdout.readline())
        assert _alive(facts["worker"])
        holder.kill()  # SIGKILL: no cleanup in the command
        holder.wait()
        deadline = time.monotonic() + 30
        while _alive(facts["worker"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(facts["worker"]) and _alive(facts["zygote"])
        nxt = _warm_command(folder, tmp_path / "job1")
        out, _ = nxt.communicate(timeout=300)
        assert json.loads(out)["zygote"] == facts["zygote"]  # still serving the next command
        assert stop_warm(folder) == 1
        deadline = time.monotonic() + 10
        while _alive(facts["zygote"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(facts["zygote"])
    finally:
        stop_warm(folder)


@needs_namespaces
def test_a_warm_forked_worker_is_contained_exactly_as_a_fresh_one(tmp_path, monkeypatch):
    kept = SandboxState()  # one session: the fresh worker imports from the same copy of the code
    fresh = _facts(tmp_path, "jobQQfresh", monkeypatch, forked=False, sandbox=kept)
    kept.keep_warm(tmp_path / "kept" / "warm", 30)
    try:
        warm = _facts(tmp_path, "jobQQwarm", monkeypatch, forked=True, sandbox=kept)
    finally:
        kept.close()
        stop_warm(tmp_path / "kept" / "warm")
    assert warm["processes"] == [1, warm["pid"]] and not [f for f in warm["fds"] if f == "socket"]
    for key in fresh:
        if key not in ("ns", "pid", "processes", "ids"):
            assert warm[key] == fresh[key], key


def test_the_warm_zygote_is_new_when_the_grader_or_its_environment_changes(tmp_path, monkeypatch):
    import shutil

    from grader.sandbox import interpreter

    copy = tmp_path / "pkg"
    shutil.copytree(Path(PACKAGE_PARENT) / "grader", copy / "grader", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(interpreter, "PACKAGE_PARENT", str(copy))
    env = {"PATH": "/usr/bin", "TRITON_INTERPRET": "1"}
    before = zygote.warm_name(env)
    assert zygote.warm_name(env) == before
    assert zygote.warm_name(dict(env, CUDA_VISIBLE_DEVICES="1")) != before
    worker = copy / "grader" / "worker" / "server.py"
    worker.write_text(worker.read_text() + "\n# changed\n")
    assert zygote.warm_name(env) != before  # a worker forked from the old code would speak the old protocol


def test_how_long_a_warm_zygote_waits():
    def seconds(env: dict) -> float:
        return from_environment(env).warm.keep_seconds

    assert seconds({}) == 600
    assert seconds({"GITHUB_ACTIONS": "true"}) == 0  # a CI job is one command on a fresh machine: nothing lingers
    assert seconds({"GITHUB_ACTIONS": "true", "GRADER_WARM_SECONDS": "90"}) == 90
    assert seconds({"GRADER_WARM_SECONDS": "soon"}) == 0


def test_a_job_process_closing_its_zygote_ends_it_at_once(tmp_path, monkeypatch):
    """The zygote must see its socket close: closing the descriptor alone (our reader thread
    blocked in recv on it) kept the socket open, and every command waited 5 s for its zygote to
    end, then killed it."""
    own = SandboxState()
    worker = WorkerProcess(tmp_path / "job" / "repo", tmp_path / "job" / "scratch", interpret=True, settings=Settings(), sandbox=own)
    try:
        assert worker.request(Ping(), 120) == Ok()
        z = worker.proc.zygote
    finally:
        worker.close()
    began = time.monotonic()
    own.close()
    assert time.monotonic() - began < 3 and z.proc.returncode == 0  # it ended by itself, not killed after 5 s


def test_the_reference_side_keeps_its_autotuning_and_a_batch_student_does_not(tmp_path):
    """The trusted worker (a run's shared Triton cache) keeps @triton.autotune's choice, so the
    reference is tuned once per run and every student times against the same configuration; a
    batch student's worker keeps nothing (its cache is its own and new). Both fork from one zygote."""
    seen = {}
    for name, options in (("trusted", {"triton_cache": tmp_path / "tc", "isolation": "none"}), ("student", {})):
        repo = tmp_path / name / "repo"
        repo.mkdir(parents=True)
        (repo / "mod.py").write_text("import os\nprint('autotune cache', os.environ.get('TRITON_CACHE_AUTOTUNING'))\n")
        worker = WorkerProcess(repo, tmp_path / name / "scratch", interpret=True, command=[sys.executable, "mod.py"], **options, settings=Settings(), sandbox=SANDBOX)
        try:
            worker.proc.wait(timeout=60)
            seen[name] = worker.output.text()
        finally:
            worker.close()
    assert "autotune cache 1" in seen["trusted"] and "autotune cache None" in seen["student"]
    env = {"PATH": "/usr/bin", "TRITON_CACHE_AUTOTUNING": "1", "TRITON_CACHE_DIR": "/a"}
    assert zygote.zygote_key(env)[0] == zygote.zygote_key({"PATH": "/usr/bin"})[0]  # no second zygote for it


def test_a_forked_worker_keeps_site_packages_when_the_grader_lies_there(tmp_path):
    """Installed from its wheel, the folder above grader/ is site-packages: the fork drops only the
    copy the zygote's boot put first, and keeps the interpreter's own entry (torch, triton, numpy)."""
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {PACKAGE_PARENT!r})
        sys.path.append({PACKAGE_PARENT!r})  # where site-packages stands in an install from the wheel
        import grader, grader.worker
        from grader.sandbox.launch import copy_worker_code
        from grader.sandbox.zygote.server import _use_worker_code
        code = str(copy_worker_code())
        _use_worker_code(code)
        print(json.dumps([code, sys.path]))
    """)
    code, path = json.loads(subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True,
                                           check=True).stdout)
    assert path[0] == code and path.count(PACKAGE_PARENT) == 1 and path[-1] == PACKAGE_PARENT


# -- the warm zygotes' folder on a shared machine: reached through its pinned descriptor ---------

WARM_ENV = {"PATH": "/usr/bin", "TRITON_INTERPRET": "1"}
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")


@root_only
def test_a_socket_another_user_answers_is_never_sent_a_worker(tmp_path):
    """uid 65534's process listening at the warm zygote's socket (bound there, then the uid
    dropped before listen: SO_PEERCRED tells the listener's) gets no worker launch: the client
    checks its peer's uid before it sends anything."""
    import socket

    folder = tmp_path / "kept" / "warm"
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "kept").chmod(0o700)
    heard = tmp_path / "heard"
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            listener.bind(str(folder / f"{zygote.warm_name(WARM_ENV)}.sock"))
            out = os.open(heard, os.O_WRONLY | os.O_CREAT, 0o666)
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            listener.listen(4)
            os.write(ready_w, b"x")
            conn, _ = listener.accept()
            conn.settimeout(10)
            os.write(out, conn.recv(1 << 20))
        finally:
            os._exit(0)
    os.close(ready_w)
    os.read(ready_r, 1)
    try:
        with pytest.raises(zygote.ZygoteError, match="answered by uid 65534, not by this user: nothing sent"):
            zygote.Zygote(WARM_ENV, (folder, 30))
    finally:
        os.waitpid(pid, 0)
    assert heard.read_bytes() == b""


@root_only
def test_the_warm_folder_is_never_reached_through_a_link(tmp_path):
    """`warm` a link to a folder of uid 65534's: no socket, lock or log is made there and its
    mode is left as it was (mkdir and chmod by path followed the link, as root)."""
    kept = tmp_path / "kept"
    kept.mkdir(mode=0o700)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    os.chown(theirs, 65534, 65534)
    (kept / "warm").symlink_to(theirs)
    os.lchown(kept / "warm", 65534, 65534)
    with pytest.raises(zygote.ZygoteError, match="belongs to nobody"):
        zygote.Zygote(WARM_ENV, (kept / "warm", 30))
    assert list(theirs.iterdir()) == [] and (theirs.stat().st_mode & 0o777) == 0o777


def test_the_warm_zygotes_lock_is_never_opened_through_a_link(tmp_path):
    folder = tmp_path / "kept" / "warm"
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "kept").chmod(0o700)
    planted = tmp_path / "made-through-the-link"
    (folder / f"{zygote.warm_name(WARM_ENV)}.lock").symlink_to(planted)
    with pytest.raises(zygote.ZygoteError, match="lock"):
        zygote.Zygote(WARM_ENV, (folder, 30))
    assert not planted.exists()
