"""Student code that attacks the worker's view and its capabilities, run in a sandboxed worker:
shared by tests/sandbox/test_namespaces.py (as root) and the ordinary user's run it starts
(`python tests/sandbox_attack.py OUT`, as uid 65534), so both attack alike.

The attack is a module that does everything at import and raises its report (a Load's failure
carries it back), so it runs in a forked worker (the zygote) as in a fresh interpreter."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"

ATTACK = textwrap.dedent("""
    import ctypes, json, os, subprocess
    COURSE, ROSTER, BESIDE = {course!r}, {roster!r}, {beside!r}
    if os.readlink("/proc/self/ns/mnt") == {outer!r}:  # never undo the host's own mounts
        raise RuntimeError("REPORT" + json.dumps({{"refused": "not in a mount namespace of its own"}}))
    report = {{}}

    def attempt(name, fn):
        try:
            out = fn()
            report[name] = "yes" + (": " + str(out)[:60] if out else "")
        except Exception as exc:
            report[name] = ("no: " + type(exc).__name__ + ": " + str(exc))[:200]

    def read(path):
        with open(path, "rb") as f:
            return f.read(40).decode(errors="replace") or "(empty)"

    def write(path):
        with open(path, "w") as f:
            f.write("pwned")

    git = os.path.join(COURSE, ".git")
    attempt("course .git", lambda: read(git if os.path.isfile(git) else os.path.join(git, "HEAD")))
    attempt("git show", lambda: subprocess.run(["git", "-C", COURSE, "show", "HEAD:reference/softmax.py"], capture_output=True,
                                               text=True, timeout=60, check=True).stdout[:40] or "(empty)")
    attempt("good solution", lambda: read(os.path.join(COURSE, "tests", "fixtures", "good", "kernels", "softmax.py")))
    attempt("hidden cases", lambda: read(os.path.join(COURSE, "assignments", "softmax", "hidden.py")))
    attempt("reference", lambda: read(os.path.join(COURSE, "reference", "softmax.py")))
    attempt("roster", lambda: read(ROSTER))
    attempt("beside", lambda: read(BESIDE))
    attempt("list course", lambda: os.listdir(COURSE) or None)

    libc = ctypes.CDLL(None, use_errno=True)
    points = []
    for line in open("/proc/self/mountinfo"):
        point = line.split()[4].encode().decode("unicode_escape")
        if point not in points:
            points.append(point)
    report["mounts"] = len(points)
    report["umounted"] = [p for p in reversed(points) if libc.umount2(p.encode(), 2) == 0]  # MNT_DETACH
    report["remounted rw"] = [p for p in ("/", "/usr") if libc.mount(None, p.encode(), None, 32 | 4096, None) == 0]
    for name, cmd in (("umount command", ["umount", "/usr"]), ("mount command", ["mount", "-o", "remount,rw", "/"])):
        run = subprocess.run(cmd, capture_output=True, text=True)
        report[name] = run.returncode
    # a user namespace of its own (a child, no exec): every capability there, over a locked copy of this view
    rx, tx = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(rx)
        nested = {{"unshare": libc.unshare(0x10000000 | 0x00020000)}}  # CLONE_NEWUSER | CLONE_NEWNS
        nested["caps"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
        nested["umounted"] = [p for p in reversed(points) if libc.umount2(p.encode(), 2) == 0]
        nested["remounted rw"] = [p for p in ("/", "/usr") if libc.mount(None, p.encode(), None, 32 | 4096, None) == 0]
        try:
            write("/pwned-by-unshare")
            nested["wrote"] = True
        except OSError:
            nested["wrote"] = False
        os.write(tx, json.dumps(nested).encode())
        os._exit(0)
    os.close(tx)
    os.waitpid(child, 0)
    report["unshare"] = json.loads(os.read(rx, 1 << 16) or b"{{}}")
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    report["caps"] = {{k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")}}
    import grader
    for name, path in (("/", "/pwned-by-view"), ("/usr", "/usr/pwned-by-view"), ("/etc", "/etc/pwned-by-view"),
                       ("the worker's code", os.path.join(os.path.dirname(grader.__file__), "pwned-by-view.py")),
                       ("the job folder", os.path.join(os.path.dirname(os.getcwd()), "pwned-by-view")),
                       ("the course", os.path.join(COURSE, "pwned-by-view")), ("its repo", "mine.txt")):
        attempt("write " + name, lambda: write(path))
    raise RuntimeError("REPORT" + json.dumps(report))
""")

WRITE_TARGETS = ("/pwned-by-view", "/usr/pwned-by-view", "/etc/pwned-by-view", "/pwned-by-unshare")


def attack(job: Path, isolation, course: Path, roster: Path, beside: Path, forked: bool | None = None,
           sandbox=None) -> dict:
    """Run the attack in one worker (`forked`: by the zygote, or as a fresh interpreter) and
    return its report; `sandbox`: the session's SandboxState (default: one of its own)."""
    from grader.protocol import Contender, Load
    from grader.sandbox.process import WorkerProcess
    from grader.sandbox.zygote import SandboxState

    from grader.settings import Settings, WarmStarts

    repo = job / "repo"
    repo.mkdir(parents=True)
    (repo / "attack.py").write_text(ATTACK.format(course=str(course), roster=str(roster), beside=str(beside),
                                                    outer=os.readlink("/proc/self/ns/mnt")))
    settings = Settings(warm=WarmStarts(fork_server=forked is not False))
    worker = WorkerProcess(repo, job / "scratch", interpret=True, isolation=isolation, writable=[job / "outputs"], job=job,
                           settings=settings, sandbox=sandbox if sandbox is not None else SandboxState())
    try:
        reply = worker.request(Load({"s": Contender(str(repo), "attack.py", "f")}), 300)
    finally:
        worker.close()
    message = getattr(reply, "message", "")
    assert "REPORT" in message, (reply, worker.output.text()[-3000:])
    report = json.loads(message[message.index("REPORT") + 6:])
    report["wrote its repo"] = (repo / "mine.txt").is_file()
    report["left outside"] = [t for t in WRITE_TARGETS if os.path.lexists(t)]
    report["left in the course"] = os.path.lexists(course / "pwned-by-view")
    return report


def own_reads(course: Path, roster: Path, beside: Path) -> dict:
    """What this process itself reads of the same files (outside any sandbox): the control."""
    good = course / "tests" / "fixtures" / "good" / "kernels" / "softmax.py"
    git = course / ".git"
    return {name: os.access(path, os.R_OK) for name, path in (("course .git", git), ("good solution", good),
                                                              ("roster", roster), ("beside", beside))}


def build(dest: Path, overlay: str | None = None) -> Path:
    """A submission: the good one (its helpers as tests/conftest.py builds it), with `overlay`."""
    shutil.copytree(FIXTURES / "good", dest)
    shutil.copy(FIXTURES / "good" / "kernels" / "vector_add.py", dest / "kernels" / "_good_add.py")
    if overlay:
        shutil.copytree(FIXTURES / overlay, dest, dirs_exist_ok=True)
    return dest


def grade(repo: Path, cases: tuple[str, ...], assignments: tuple[str, ...] = ("softmax", "vector_add")) -> dict:
    """Grade `repo` in the interpreter; each test's outcome and message by name, and the time."""
    from grader import spec as specs
    from grader.judge.context import GradingContext
    from grader.judge.session import open_session
    from grader.submission import open_submission

    start = time.monotonic()
    from grader.settings import from_environment

    # a process of its own: its settings are its environment's (the course secret, the cache, no warm start)
    session = open_session(GradingContext("cpu", 424242, cases, ("float32",), 20), from_environment())
    run = session.grade(open_submission(repo), [session.course.get(a) for a in assignments])
    results = run.to_gradescope()
    return {"seconds": time.monotonic() - start, "isolation": run.environment["isolation"],
            "tests": {t["name"]: [t["outcome"], t["output"][:600]] for t in results["tests"]}}


def link_to_the_good_solution(repo: Path, course: Path) -> None:
    """The symlink trick: the student's module is a link to the course's correct solution."""
    module = repo / "kernels" / "softmax.py"
    module.unlink()
    module.symlink_to(course / "tests" / "fixtures" / "good" / "kernels" / "softmax.py")


def main(out: Path) -> None:
    """The ordinary user's run (tests/sandbox/test_namespaces.py starts it as uid 65534): the sandbox
    it detects, the attack forked and fresh, its own reads, and three grades."""
    from grader.sandbox import process
    from grader.sandbox.zygote import SandboxState
    from grader.settings import Settings

    course, roster, beside = (Path(p) for p in sys.argv[2:5])
    sandbox = SandboxState()
    isolation = process.detect("sandbox", Settings(), sandbox=sandbox)
    report: dict = {"uid": os.getuid(), "isolation": [isolation.namespaces, isolation.user_namespace, isolation.user_switch,
                                                      list(isolation.warnings)]}
    work = Path(tempfile.mkdtemp(prefix="attack-"))
    for forked in (False, True):
        report[f"attack forked={forked}"] = attack(work / f"job-{forked}", isolation, course, roster, beside, forked, sandbox)
    report["own reads"] = own_reads(course, roster, beside)
    report["good"] = grade(build(work / "good"), ("1x1", "n=1"))
    trick = build(work / "trick")
    link_to_the_good_solution(trick, course)
    report["trick"] = grade(trick, ("1x1",), ("softmax",))
    report["outputs"] = grade(build(work / "outputs", "hostile/outputs"), ("n=1", "n=127", "n=98432"), ("vector_add",))
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    main(Path(sys.argv[1]))
