"""The `grader` command's entry, and a warm judge for a student's `grader check`.

Most of a second check's wait on a GPU machine is the judge's own start: importing torch (with
its CUDA libraries) and the grader takes seconds before anything is graded. So, as a check keeps
a warm worker start for the next one (grader.sandbox.zygote), it also leaves a judge behind that
has done its imports: a process that waits, for the same `GRADER_WARM_SECONDS`, on a socket in
the kept cache's folder (`resident/`, 0700, in a cache no other user may change:
grader.safefiles.trusted_folder), and forks a fresh judge for the next check there. It starts
with `python -P` in /, so no folder but its own installs is on its import path.
The fork runs the real command with the caller's arguments, folder, environment, standard output
and error; its exit code is the caller's. Nothing of one check stays in the process that forks
the next (each runs in its own fork; the waiting process only imports).

What makes a waiting judge the right one: the same Python and the same files of the grader (and
of the course: `grader --course PATH check`'s, else GRADER_COURSE's), the same environment (but
the terminal's own variables), its owner the caller (the socket's peer credentials). Anything
else, or any doubt (no socket, a refused connection, an older judge), and the command runs here
as it always did, and leaves a judge for the next check. Never in CI (`--ci`, CI or
GITHUB_ACTIONS set), never when nothing is kept (GRADER_CACHE_GB=0, GRADER_WARM=0,
GRADER_WARM_SECONDS=0), never for anything but `check`.
GRADER_RESIDENT=0 turns it off alone.

This module imports nothing heavy: the caller of a warm judge never imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from grader import proctable
from grader.safefiles import UnsafeFolderError, make_folder, peer_uid, trusted_folder
from grader.sandbox.interpreter import FROM_STDIN, code_identity
from grader.settings import Settings, from_environment

# variables of the caller's terminal session, not of the grading: a judge started from another
# terminal of the same machine still fits
VOLATILE = {"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES", "TERM_SESSION_ID", "WINDOWID", "SSH_TTY",
            "SSH_CLIENT", "SSH_CONNECTION", "TMUX_PANE", "STY", "WINDOW", "PS1", "PROMPT_COMMAND", "HISTFILE"}
HEADER = struct.Struct("!I")
MAX_REQUEST = 4 << 20


def main() -> None:
    """`grader ...`: a check through a warm judge where one fits, else the command here."""
    code = through_resident(sys.argv[1:])
    if code is None:
        from grader.cli import main as cli

        cli()
        return
    sys.exit(code)


def split_global(argv: list[str]) -> tuple[list[str], str | None]:
    """(the command and its arguments, the global `--course PATH` before it or None): `grader
    --course PATH check ...` is a check of that course. Another global option (--version) is no
    command a judge serves: ([], None)."""
    course = None
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        if rest[0] == "--course" and len(rest) > 1:
            course, rest = rest[1], rest[2:]
        elif rest[0].startswith("--course="):
            course, rest = rest[0].split("=", 1)[1], rest[1:]
        else:
            return [], None
    return rest, course


def course_named(argv: list[str], cwd: str, settings: Settings) -> Path | None:
    """The course a command grades: its global `--course PATH` (from `cwd`), else GRADER_COURSE's."""
    _, course = split_global(argv)
    return Path(cwd, course).resolve() if course else settings.course


def wanted(argv: list[str], settings: Settings) -> bool:
    """Whether this command may go through a warm judge (see the module's docstring)."""
    argv = split_global(argv)[0]
    if not argv or argv[0] != "check" or not sys.platform.startswith("linux"):
        return False
    if any(a in ("--help", "-h") or a == "--ci" or a.startswith("--ci=") for a in argv[1:]):
        return False
    if settings.in_ci or not settings.warm.resident or settings.warm.keep_seconds <= 0:
        return False
    try:
        return not settings.cache_gb or float(settings.cache_gb) > 0
    except ValueError:  # the command itself says what is wrong with it
        return False


def key(env: dict[str, str], settings: Settings, course: Path | None = None) -> str:
    """What a waiting judge must have been started with to serve this command: the same code
    (the grader's and the course's, interpreter.code_identity: `course`, the command's
    `--course`, else GRADER_COURSE's) and environment."""
    course = course if course is not None else settings.course
    digest = hashlib.sha256(code_identity(*([course] if course is not None else [])).encode())
    for name, value in sorted(env.items()):
        if name not in VOLATILE:
            digest.update(f"{name}={value}\n".encode())
    return digest.hexdigest()[:24]


def folder_of(settings: Settings) -> Path:
    return settings.check_cache_base / "resident"


def through_resident(argv: list[str]) -> int | None:
    """The command's exit code, run by a warm judge; None where it must run here (a judge is
    then started for the next check, where one may be)."""
    settings = from_environment()
    if not wanted(argv, settings):
        return None
    env = dict(os.environ)
    k = key(env, settings, course_named(argv, os.getcwd(), settings))
    folder = folder_of(settings)
    conn = _connect(folder, k)
    if conn is None:
        start(folder, k, settings.warm.keep_seconds)
        return None
    try:
        return _run_through(conn, argv, env)
    finally:
        conn.close()


def _private(folder: Path) -> int:
    """The judge's folder, ours alone: a descriptor on it, or OSError (UnsafeFolderError). Its
    parent (the kept cache) is a `trusted_folder`: no other user may rename, replace or link
    anything on the way to it (grader.safefiles); the folder itself is ours, 0700, no link,
    checked on the descriptor that every later use goes through (a socket path under
    /proc/self/fd also stays short however deep the folder is)."""
    parent = trusted_folder(folder.parent, "kept cache")
    try:
        try:
            fd = make_folder(folder.name, 0o700, parent)
        except FileExistsError:
            fd = os.open(folder.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    finally:
        os.close(parent)
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        os.close(fd)
        raise OSError(f"{folder} is not this user's alone")
    return fd


def _connect(folder: Path, k: str) -> socket.socket | None:
    try:
        fd = _private(folder)
    except (OSError, UnsafeFolderError):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(2)
        conn.connect(f"/proc/self/fd/{fd}/judge-{k}.sock")
        uid = peer_uid(conn)
        if uid != os.getuid():
            raise OSError("the judge's socket belongs to another user")
        conn.settimeout(None)
        return conn
    except OSError:
        conn.close()
        return None
    finally:
        os.close(fd)


def _run_through(conn: socket.socket, argv: list[str], env: dict[str, str]) -> int | None:
    """Hand the command to the judge with our standard output and error; forward an interrupt;
    its exit code. None if the judge fails before the command starts (it then runs here)."""
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": env}).encode()
    try:
        socket.send_fds(conn, [HEADER.pack(len(request))], [sys.stdout.fileno(), sys.stderr.fileno()])
        conn.sendall(request)
        started = _line(conn)
    except OSError:
        return None
    if not started.startswith(b"started "):
        return None
    sys.stdout.flush()

    def forward(signum, frame):  # the terminal's Ctrl-C reaches us, not the judge's fork
        try:
            conn.sendall(b"INT\n" if signum == signal.SIGINT else b"TERM\n")
        except OSError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        ended = _line(conn)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if not ended.startswith(b"exit "):
        print("error: the warm judge ended before the check did (GRADER_RESIDENT=0 runs it without one)",
              file=sys.stderr)
        return 2
    return int(ended.split()[1])


def _line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(64)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    return data.strip()


def start(folder: Path, k: str, idle_s: float) -> None:
    """A judge for the next check, started in the background (it imports while this command runs).
    Its import path is its own: `-P` keeps the folder it starts in off it (the caller's, a
    student's repo, must never be where the judge imports from, for this check or the next), and
    it starts in / (Python 3.10 has no -P: no judge there, a check is only slower)."""
    if sys.version_info < (3, 11):
        return
    try:
        fd = _private(folder)
    except (OSError, UnsafeFolderError):
        return
    try:  # created in the pinned folder, never through a link put in its place
        log = os.open(f"judge-{k}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=fd)
    except OSError:
        return
    finally:
        os.close(fd)
    with os.fdopen(log, "ab") as out:
        subprocess.Popen([sys.executable, "-P", "-m", "grader.resident", "serve", str(folder), k, str(idle_s)],
                         stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                         close_fds=True, env=dict(os.environ), cwd="/")


def stop_warm(folder: Path) -> int:
    """Stop now every process a check keeps warm in `folder` (a kept cache, or a folder in it);
    returns how many: the judges waiting there (`grader.resident serve`, their folder on their
    command line) and the zygotes (a zygote's command line names no path, see
    interpreter.FROM_STDIN: its HOME, a folder of its own there, tells it). A test's or a
    benchmark's cleanup: they end by themselves when idle."""
    inside = os.fsencode(Path(folder))

    def within(value: bytes) -> bool:
        return value == inside or value.startswith(inside + b"/")

    stopped = 0
    for pid in proctable.pids():
        argv = proctable.command_line(pid) or []
        if b"grader.resident" in argv and b"serve" in argv:
            ours = any(within(a) for a in argv)
        elif FROM_STDIN.encode() in argv:
            ours = any(e.startswith(b"HOME=") and within(e[5:]) for e in proctable.environment(pid) or [])
        else:
            continue
        if ours:
            try:
                os.kill(pid, signal.SIGKILL)
                stopped += 1
            except OSError:
                pass
    return stopped


# -- the waiting judge --------------------------------------------------------------------------

def serve(folder: Path, k: str, idle_s: float) -> None:
    """Import what a check needs, then fork a judge for each caller until none comes for
    `idle_s` seconds. One process, no threads: each fork starts from this clean state."""
    import grader.cli  # noqa: F401 - the imports this process is kept for
    import grader.cli.common  # noqa: F401

    try:
        fd = _private(folder)
    except (OSError, UnsafeFolderError) as exc:  # changed since the check that started it: not served from there
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} not started: {exc}", flush=True)
        return
    name = f"judge-{k}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = f"/proc/self/fd/{fd}/{name}"
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    old_umask = os.umask(0o077)
    try:
        listener.bind(path)
    except OSError:  # another judge of the same key won the race
        return
    finally:
        os.umask(old_umask)
    listener.listen(8)
    _retire_others(fd, name)
    running: dict[int, socket.socket] = {}  # the fork's pid -> its caller's connection
    last = time.monotonic()
    try:
        while running or time.monotonic() - last < idle_s:
            ready, _, _ = select.select([listener, *running.values()], [], [], 0.2)
            for conn in ready:
                if conn is listener:
                    _accept(listener, running, k)
                    last = time.monotonic()
                else:
                    _signal_from(conn, running)
            for pid in list(running):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    conn = running.pop(pid)
                    code = os.waitstatus_to_exitcode(status) % 256
                    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {pid} exited {code}", flush=True)
                    try:
                        conn.sendall(f"exit {code}\n".encode())
                    except OSError:
                        pass
                    conn.close()
                    last = time.monotonic()
            if not running and not os.path.exists(f"/proc/self/fd/{fd}/{name}"):  # retired by a newer judge
                break
    finally:
        listener.close()
        os.close(fd)


def _retire_others(fd: int, mine: str) -> None:
    """Judges of other keys (an older grader, another environment) are no longer reached: their
    sockets are removed, and each ends once it sees its socket gone and nothing running."""
    for other in os.listdir(fd):
        if other.startswith("judge-") and other.endswith(".sock") and other != mine:
            try:
                os.unlink(other, dir_fd=fd)
            except OSError:
                pass


def _accept(listener: socket.socket, running: dict[int, socket.socket], k: str) -> None:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        if peer_uid(conn) != os.getuid():
            raise OSError("another user")
        conn.settimeout(5)
        header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 2)
        if len(header) != HEADER.size or len(fds) != 2:
            raise OSError("a malformed request")
        size = HEADER.unpack(header)[0]
        if size > MAX_REQUEST:
            raise OSError("a request too large")
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise OSError("a request cut short")
            data += chunk
        request = json.loads(data)
        refused = refusal(request, k)
        if refused:
            print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} refused: {refused}", flush=True)
            conn.sendall(f"refused {refused}\n".encode())
            raise OSError(refused)
        conn.settimeout(None)
    except (OSError, ValueError):
        for f in fds:
            os.close(f)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _child(listener, conn, fds, request)
    for f in fds:
        os.close(f)
    conn.sendall(f"started {pid}\n".encode())
    running[pid] = conn
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} serving grader check as pid {pid}", flush=True)


def refusal(request: object, k: str) -> str | None:
    """Why this judge must not run `request` (None: it may). It serves a student's `check` alone,
    and only one whose environment is the one it was started for (its key): a check in CI, with
    nothing kept, or in another environment runs on its own, sees its own settings and detects
    its own sandbox, whatever a judge left by an earlier check holds."""
    if not isinstance(request, dict):
        return "a malformed request"
    argv, cwd, env = request.get("argv"), request.get("cwd"), request.get("env")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and isinstance(cwd, str)
            and isinstance(env, dict) and all(isinstance(n, str) and isinstance(v, str) for n, v in env.items())):
        return "a malformed request"
    settings = from_environment(env)
    if not wanted(argv, settings):
        return "not a check a warm judge may run (only `grader check` on a student's machine, never in CI)"
    if key(env, settings, course_named(argv, cwd, settings)) != k:
        return "another environment or another grader than this judge's"
    return None


def _signal_from(conn: socket.socket, running: dict[int, socket.socket]) -> None:
    """The caller's interrupt passed to its fork's process group; the caller gone: the fork stopped."""
    pid = next(p for p, c in running.items() if c is conn)
    try:
        data = conn.recv(64)
    except OSError:
        data = b""
    signum = signal.SIGINT if b"INT" in data else signal.SIGTERM if data else signal.SIGKILL
    try:
        os.killpg(pid, signum)
    except OSError:
        pass


def run_as_cold(command) -> int:
    """`command()`'s exit code and what it prints, exactly as the same command started cold prints
    and exits (`python -m grader`): a SystemExit's code (its message, if it has one, on stderr as
    Python prints it), an interrupt's 130, and any other exception printed by the interpreter's
    hook (typer's, where it installed one) with exit 1, never a silent 2."""
    try:
        command()
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return 130
    except BaseException:  # noqa: BLE001 - whatever it is, said as the cold command says it
        sys.excepthook(*sys.exc_info())
        return 1


def _child(listener: socket.socket, conn: socket.socket, fds: list[int], request: dict) -> None:
    """The fork: the caller's command, as if it had started it."""
    code = 2
    try:
        os.setpgid(0, 0)
        listener.close()
        conn.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for f in (devnull, *fds):
            os.close(f)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["grader", *request["argv"]]
        from grader.cli import common
        from grader.cli import main as cli

        common.attach_terminal()
        code = run_as_cold(cli)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "serve":
        serve(Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
    else:
        main()
