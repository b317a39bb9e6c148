"""Workers forked by the zygote (grader.zygote) are contained exactly as workers started as fresh
interpreters: same uid, limits, namespaces, view of the files, environment and descriptors;
nothing of one worker reaches the next; nothing outlives its job process."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grader import sandbox, zygote
from grader.sandbox import WorkerProcess

ISOLATION = sandbox.detect("sandbox")
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


def _facts(tmp_path: Path, name: str, monkeypatch, forked: bool, module: str = "student_facts") -> dict:
    monkeypatch.setenv("GRADER_ZYGOTE", "1" if forked else "0")
    job = tmp_path / name
    repo = job / "repo"
    repo.mkdir(parents=True)
    (repo / f"{module}.py").write_text(FACTS)
    worker = WorkerProcess(repo, job / "scratch", interpret=True, writable=[job / "outputs"], job=job)
    try:
        assert isinstance(worker.proc, zygote.Forked) == forked
        reply = worker.request({"op": "load", "contenders": {"s": {"root": str(repo), "module": f"{module}.py",
                                                                    "function": "f"}}}, 120)
    finally:
        worker.close()
    message = reply["message"]
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
    monkeypatch.setenv("GRADER_ZYGOTE", "1")
    first = _facts(tmp_path, "jobQQfirst", monkeypatch, forked=True, module="student_first")
    second = _facts(tmp_path, "jobQQsecond", monkeypatch, forked=True, module="student_second")
    # the second is a fresh fork of the zygote: the first's module is not in it, nor its files
    assert first["student_modules"] == ["student_first"] and second["student_modules"] == ["student_second"]
    assert not [f for f in second["fds"] if "jobQQfirst" in f]


def test_the_zygote_holds_no_cuda_context_and_no_grader_secrets():
    code = zygote.PRELOAD
    assert "torch.cuda.is_initialized()" in code  # checked there, after every import (raises if it holds one)
    for private in ("grader.spec", "grader.runcache", "reference", "course_secret"):
        assert f"import {private}" not in code and private not in code.replace("grader.plan", "")


def test_the_zygote_and_its_workers_die_with_the_job_process(tmp_path):
    """A job process that starts a forked worker and is then killed (SIGKILL: no cleanup) leaves
    no zygote and no worker behind."""
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(sandbox.PACKAGE_PARENT))!r})
        from pathlib import Path
        from grader.sandbox import WorkerProcess
        job = Path({str(tmp_path / "job")!r})
        w = WorkerProcess(job / "repo", job / "scratch", interpret=True)
        w.request({{"op": "ping"}}, 120)
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
    monkeypatch.setattr(zygote, "_DISABLED", [])
    monkeypatch.setattr(zygote.Zygote, "__init__", lambda self, env: (_ for _ in ()).throw(zygote.ZygoteError("no fork here")))
    monkeypatch.setattr(zygote, "_ZYGOTES", {})
    worker = WorkerProcess(tmp_path / "job" / "repo", tmp_path / "job" / "scratch", interpret=True)
    try:
        assert isinstance(worker.proc, subprocess.Popen)  # a fresh interpreter, as before
        assert worker.request({"op": "ping"}, 120) == {"ok": True}
        assert not zygote.enabled()
    finally:
        worker.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
