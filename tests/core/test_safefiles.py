"""What the grader keeps on a shared machine cannot be planted by another user (grader.safefiles):
a kept cache another user may change is refused with the reason and the fix (exit 2) before the
warm judge or a warm worker start could import from it, as root and as an ordinary user; the
warm judge serves only a check of its own environment; the durations hint is written through
the folder's descriptor, never through a link."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, as_nobody, as_user
from grader import resident
from grader.judge import durations
from grader.safefiles import UnsafeFolderError, trusted_folder, write_atomic

NOBODY = 65534
TA = 65533  # an ordinary user other than the attacker
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="acting as other users needs root")



def _refused(path: Path) -> str:
    try:
        os.close(trusted_folder(path))
    except UnsafeFolderError as exc:
        return f"refused: {exc}"
    return "trusted"


@root_only
def test_a_folder_another_user_may_change_is_refused_for_root_and_for_an_ordinary_user(shared_tmp):
    theirs = shared_tmp / "theirs"  # made by the attacker before the TA's first check
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    open_to_all = shared_tmp / "open"  # world-writable, not sticky: anyone may rename what lies in it
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    (shared_tmp / "link").symlink_to(shared_tmp / "mine")  # a link in place of a folder, made by the attacker
    os.lchown(shared_tmp / "link", NOBODY, NOBODY)
    ta_home = shared_tmp / "ta"
    ta_home.mkdir()
    os.chown(ta_home, TA, TA)
    for who in (0, TA):
        for path, words in ((theirs, "belongs to nobody"), (theirs / "cache", "belongs to nobody"),
                            (open_to_all / "cache", "other users may write (mode 777, not sticky)"),
                            (shared_tmp / "link" / "cache", "belongs to nobody")):
            got = _refused(path) if who == 0 else as_user(who, lambda p=path: _refused(p))
            assert words in got, (who, path, got)
        assert not (open_to_all / "cache").exists(), "nothing is made where it is refused"
    # sticky /tmp, ours all the way down: trusted, and made 0700
    assert _refused(shared_tmp / "root-cache" / "grader") == "trusted"
    assert stat.S_IMODE((shared_tmp / "root-cache").stat().st_mode) == 0o700
    ta_tmp = Path("/tmp") / f"grader-kept-ta-{os.getpid()}"
    assert as_user(TA, lambda: _refused(ta_tmp / "grader")) == "'trusted'"
    assert ta_tmp.stat().st_uid == TA and stat.S_IMODE(ta_tmp.stat().st_mode) == 0o700
    shutil.rmtree(ta_tmp)
    # the TA's own folder with the attacker's folder inside it: refused for the TA (and for root)
    inner = ta_home / "cache"
    inner.mkdir()
    os.chown(inner, NOBODY, NOBODY)
    assert "belongs to nobody" in as_user(TA, lambda: _refused(inner / "grader"))
    # root's folder seen by the TA: another user's, refused
    (shared_tmp / "root-cache").chmod(0o755)
    assert "belongs to root" in as_user(TA, lambda: _refused(shared_tmp / "root-cache"))


def test_a_link_the_user_made_is_followed_and_a_group_others_share_is_no_private_folder(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "via").symlink_to(tmp_path / "real")
    fd = trusted_folder(tmp_path / "via" / "cache")
    assert os.fstat(fd).st_ino == (tmp_path / "real" / "cache").stat().st_ino
    os.close(fd)
    shared = tmp_path / "group"
    shared.mkdir()
    shared.chmod(0o770)
    os.chown(shared, os.getuid(), 65534 if os.geteuid() == 0 else os.getgid())  # nogroup: others' group
    if os.geteuid() == 0:
        assert "other users may write (mode 770" in _refused(shared / "cache")


# The attacker's loop: swap the judge's folder with one that holds a `grader` package, as fast
# as it can (renameat2 with RENAME_EXCHANGE), until it is stopped.
SWAP = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = (os.fsencode(p) for p in sys.argv[1:3])
open(sys.argv[3], "w").close()
while True:
    libc.renameat2(-100, a, -100, b, 2)
"""


@root_only
@pytest.mark.parametrize("planted", ["cache owned by the attacker", "cache in a folder the attacker may write"])
def test_a_rename_exchange_race_never_gets_the_attackers_code_imported(submission, shared_tmp, planted):
    """The red team's attack on the warm judge: the kept cache lies where uid 65534 may change it
    (the cache is its own, or lies in a folder it may write); it swaps the judge's folder (or the
    whole cache) with its own folder holding a `grader` package, in a loop. The check refuses that
    cache with the reason and the fix, and nothing of the attacker's is imported (now, or by a
    judge started in the background)."""
    marker = shared_tmp / "imported"
    if planted.startswith("cache owned"):
        cache = shared_tmp / "cache"  # made by the attacker before the TA's first check
        swapped, evil = cache / "resident", cache / "evil"  # resident/ as the grader makes it, swapped once there
        package = evil / "grader"
        made = [cache, evil, package]
    else:
        room = shared_tmp / "open"  # root's, but anyone may write in it (not sticky)
        room.mkdir()
        room.chmod(0o777)
        cache = room / "cache"  # the TA's own
        cache.mkdir(mode=0o700)
        swapped, evil = cache, room / "evil"
        package = evil / "resident" / "grader"
        made = [evil, evil / "resident", package]
    for folder in made:
        folder.mkdir(exist_ok=True)
        os.chown(folder, NOBODY, NOBODY)
    for name in ("__init__.py", "resident.py"):
        (package / name).write_text(f"open({str(marker)!r}, 'a').write('imported {name}\\n')\n")
    ready = shared_tmp / "swapping"
    shared_tmp.chmod(0o777)  # where the attacker says it has started
    swapper = subprocess.Popen(as_nobody(shared_tmp, {"PATH": "/usr/bin:/bin"}, "-c", SWAP, str(swapped), str(evil),
                                         str(ready)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert swapper.poll() is None and time.monotonic() < deadline, swapper.stderr.read()
            time.sleep(0.05)
        shared_tmp.chmod(0o755)
        env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS", "GRADER_RESIDENT")}
        env.update(GRADER_CACHE_DIR=str(cache), GRADER_WARM_SECONDS="30",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        out, repo = shared_tmp / "out", submission("good")
        said = []
        for _ in range(3):
            got = subprocess.run([sys.executable, "-m", "grader", "check", str(repo), "-a", "vector_add",
                                  "--device", "cpu", "--case", "n=1", "--dtype", "float32",
                                  "--json", str(out / "results.json"), "--html", str(out)],
                                 env=env, cwd=shared_tmp, capture_output=True, text=True, timeout=600)
            said.append((got.returncode, " ".join((got.stdout + got.stderr).split())))
        time.sleep(3)  # a judge started in the background would have imported by now
        assert not marker.exists(), marker.read_text()
        for code, text in said:
            assert code == 2, text[-3000:]
            assert "GRADER_CACHE_DIR" in text and ("belongs to nobody" in text or "other users may write" in text), text
    finally:
        swapper.kill()
        swapper.wait()
        for folder in (cache / "resident", evil / "resident", evil):
            resident.stop_warm(folder)


def test_the_judge_serves_only_a_check_of_its_own_environment():
    env = {"HOME": "/home/a", "PATH": "/usr/bin"}
    settings = resident.from_environment(env)
    k = resident.key(env, settings)
    ok = {"argv": ["check", "."], "cwd": "/", "env": env}
    assert resident.refusal(ok, k) is None
    for request in ({**ok, "argv": ["list"]}, {**ok, "argv": ["review", "x"]},
                    {**ok, "env": {**env, "CI": "true", "GRADER_WARM_SECONDS": "0"}},
                    {**ok, "env": {**env, "GRADER_WARM_SECONDS": "0"}},
                    {**ok, "env": {**env, "LANG": "C"}}, {**ok, "argv": "check"}, {**ok, "env": {"A": 1}}, [1]):
        assert resident.refusal(request, k), request


def test_the_durations_hint_is_never_written_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    kept = tmp_path / "kept"
    kept.mkdir(mode=0o700)
    for name in ("durations.json", f"durations.json.{os.getpid()}.tmp", f".durations.json.{os.getpid()}.tmp"):
        (kept / name).symlink_to(victim)
    durations.write(str(kept / "durations.json"), {"cpu:a:|": 1.5})
    assert victim.read_text() == "precious"
    assert not (kept / "durations.json").is_symlink()
    assert json.loads((kept / "durations.json").read_text()) == {"cpu:a:|": 1.5}
    fd = os.open(kept, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (kept / "fifo").unlink(missing_ok=True)
        write_atomic(fd, "hint", b"x")
        assert (kept / "hint").read_bytes() == b"x" and stat.S_IMODE((kept / "hint").stat().st_mode) == 0o600
    finally:
        os.close(fd)


def test_kept_figures_are_read_back_as_input(tmp_path):
    """A kept timing figure or roofline that is a link, a FIFO or too large is none: no hang, no
    file outside the cache read, the roofline measured again."""
    from grader.judge.runcache import KEPT_JSON_LIMIT, RunCache

    cache = RunCache(tmp_path / "cache")
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"median_ms": 1.0}))
    (cache.folder / "timing-abc.json").symlink_to(secret)
    assert cache.kept_timing("abc") is None
    os.mkfifo(cache.folder / "timing-fifo.json")
    assert cache.kept_timing("fifo") is None
    (cache.folder / "timing-big.json").write_text(json.dumps({"x": "y" * KEPT_JSON_LIMIT}))
    assert cache.kept_timing("big") is None
    cache.keep_timing("ok", {"median_ms": 2.0})
    assert cache.kept_timing("ok") == {"median_ms": 2.0}
    (cache.folder / "roofline-gpu.json").symlink_to(secret)
    assert cache.roofline("gpu", lambda: {"measured": True}) == {"measured": True}


# POSIX ACLs set through the kernel's xattr interface (no setfacl needed): version 2, then
# (tag u16, perm u16, id u32) entries. Tags: user_obj 1, user 2, group_obj 4, group 8, mask 16, other 32.
ANY = 0xFFFFFFFF


def _set_acl(path: Path, *named: tuple[int, int, int], default: bool = False, mask: int = 7) -> None:
    entries = sorted([(1, 7, ANY), *named, (4, 5, ANY), (16, mask, ANY), (32, 5, ANY)])  # the kernel's order
    raw = (2).to_bytes(4, "little") + b"".join(t.to_bytes(2, "little") + p.to_bytes(2, "little") +
                                               i.to_bytes(4, "little") for t, p, i in entries)
    os.setxattr(path, "system.posix_acl_default" if default else "system.posix_acl_access", raw)


def _acl_folders(base: Path) -> dict[str, Path]:
    """Folders of the current user, 0700 or 0770 by mode, shared with uid 65534 through an ACL alone."""
    made = {}
    for name, entry, default, mask in (("access", (2, 7, NOBODY), False, 7), ("default", (2, 7, NOBODY), True, 7),
                                       ("group", (8, 7, NOBODY), False, 7),
                                       ("read-only", (2, 5, NOBODY), False, 7),
                                       ("masked", (2, 7, NOBODY), False, 5)):
        folder = base / name
        folder.mkdir(mode=0o700)
        _set_acl(folder, entry, default=default, mask=mask)
        made[name] = folder
    return made


def test_an_acl_that_lets_another_user_write_is_refused_like_a_mode_bit(tmp_path):
    """A folder of mode 700 (770 once an ACL's mask is set) with an ACL entry user:65534:rwx (or
    group:65534:rwx, or a default ACL that every folder made in it inherits) is one that user may
    change: refused as a kept cache's parent and as an output folder; an ACL granting read alone,
    or one whose mask takes write away, is no way in."""
    from grader.safefiles import OWN

    folders = _acl_folders(tmp_path)
    for name in ("access", "default", "group"):
        got = _refused(folders[name] / "cache")
        assert "other users may write" in got and "an ACL entry grants others write" in got, (name, got)
        assert not (folders[name] / "cache").exists(), "nothing is made where it is refused"
        with pytest.raises(UnsafeFolderError, match="ACL entry grants others write"):
            trusted_folder(folders[name], "output folder", kind=OWN)
    for name in ("read-only", "masked"):
        assert _refused(folders[name] / "cache") == "trusted", name


@root_only
def test_an_acl_is_read_for_an_ordinary_user_too(shared_tmp):
    """The same attack on a TA's own folders (uid 65533), the attacker being uid 65534."""
    ta = shared_tmp / "ta"
    ta.mkdir()
    os.chown(ta, TA, TA)
    got = as_user(TA, lambda: repr([_refused(f / "cache") for f in _acl_folders(ta).values()]))
    assert got.count("an ACL entry grants others write") == 3 and got.count("trusted") == 2, got


def test_an_acl_that_cannot_be_read_is_refused_not_guessed(tmp_path, monkeypatch):
    def unreadable(fd, name, *a, **k):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "getxattr", unreadable)
    got = _refused(tmp_path / "cache")
    assert "its ACL cannot be read (Input/output error)" in got and "cannot tell who may write" in got, got

    def no_acls(fd, name, *a, **k):  # a file system that keeps none: nothing to read, nothing refused
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "getxattr", no_acls)
    assert _refused(tmp_path / "cache") == "trusted"


def test_a_folder_the_grader_makes_inherits_no_acl(tmp_path):
    """A default ACL above (one granting read alone, so the folder itself is trusted) is not copied
    into the folders the grader makes: their mode bits alone say who may use them."""
    from grader.cli.outputs import output_folder

    parent = tmp_path / "course"
    parent.mkdir(mode=0o755)
    _set_acl(parent, (2, 5, NOBODY), default=True)
    os.close(trusted_folder(parent / "cache" / "grader"))
    os.close(output_folder(parent / "out"))
    for made, mode in ((parent / "cache", 0o700), (parent / "cache" / "grader", 0o700), (parent / "out", 0o755)):
        assert os.listxattr(made) == [] or not {"system.posix_acl_access", "system.posix_acl_default"} & set(
            os.listxattr(made)), made
        assert stat.S_IMODE(made.stat().st_mode) == mode, made
