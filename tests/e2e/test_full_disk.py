"""A full disk, an exhausted memory or a lost GPU is the machine's fault, not the student's:
`grader check` ends with an infra error that names what ran out (exit 2), never a traceback,
and the terminal still shows what was graded (#47)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


def test_what_ran_out_is_named_and_nothing_else_is_taken_for_it():
    from grader.judge.grade import exhausted

    assert exhausted(OSError(errno.ENOSPC, "No space left on device")) == "disk space"
    assert exhausted(OSError(errno.EDQUOT, "Disk quota exceeded")) == "disk quota"
    assert exhausted(MemoryError()) == "memory"
    assert exhausted(RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")) == \
        "disk space"
    assert exhausted(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "GPU memory"
    assert exhausted(RuntimeError("CUDA error: unspecified launch failure")) == "a working GPU"
    for honest in (OSError(errno.ENOENT, "gone"), ValueError("bad"), RuntimeError("shape mismatch")):
        assert exhausted(honest) is None, honest


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a small tmpfs needs root")
def test_a_full_disk_ends_a_check_in_an_infra_error_that_says_so(submission, tmp_path):
    repo = submission("good")
    full = tmp_path / "full"
    full.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS")}
    env.update(GRADER_WARM="0", TMPDIR=str(full), GRADER_CACHE_DIR=str(full / "cache"), COLUMNS="200",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    check = [sys.executable, "-m", "grader", "check", str(repo), "-a", "vector_add", "--device", "cpu", "--case", "n=1",
             "--dtype", "float32", "--json", str(full / "out" / "results.json"), "--html", str(full / "out")]
    script = f"mount -t tmpfs -o size=40k tmpfs {full} && exec \"$@\""
    got = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *check], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    said = " ".join((got.stdout + got.stderr).split())
    assert got.returncode == 2, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert "the machine ran out of disk space" in said, said[-3000:]
    assert "vector_add (kernels/vector_add.py:vector_add())" in said  # the terminal still shows what was graded


def test_a_refused_write_is_one_line_naming_the_file_its_folder_and_what_to_do():
    from grader.cli import out_of_room

    for code, words in ((errno.ENOSPC, "the disk is full"), (errno.EDQUOT, "the disk quota is used up"),
                        (errno.EROFS, "read-only file system")):
        line = out_of_room(OSError(code, os.strerror(code), "/class/out/batch.json"))
        assert line is not None and words in line and "writing batch.json in /class/out" in line, line
        assert "--resume" in line and "\n" not in line
    assert out_of_room(OSError(errno.ENOENT, "gone", "/x")) is None  # any other error is no full disk


def test_a_write_refused_leaves_the_file_as_it_was_and_no_temp_behind(tmp_path, monkeypatch):
    from grader import results

    kept = tmp_path / "batch.json"
    results.write_json_atomic({"seed": 1}, kept)
    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as caught:
        results.write_json_atomic({"seed": 2}, kept)
    monkeypatch.setattr(os, "fsync", real)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(kept)
    assert kept.read_text().count('"seed": 1') == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["batch.json"]


# The class run on a small tmpfs: alice graded, then the disk filled, then bob's run refused in
# one line (exit 2) with alice's grade kept; once the filler is gone, --resume grades bob and
# keeps alice's. Each step's exit code, output and what the folder holds go to files outside it.
FULL_CLASS = r"""
set -u
mount -t tmpfs -o size=4m tmpfs "$FULL" || exit 97
run() {{ name=$1; shift; "$PY" -m grader grade --lock "$WS" --out "$FULL/out" -a vector_add --device cpu \
  --case n=1 --dtype float32 --seed 3 --jobs 1 "$@" >"$LOGS/$name.out" 2>&1; echo $? >"$LOGS/$name.rc";
  ls -R "$FULL/out" >"$LOGS/$name.ls" 2>&1; cat "$FULL/out/students/alice/jobs/vector_add.json" >"$LOGS/$name.alice" 2>&1; }}
run first --only alice
dd if=/dev/zero of="$FULL/filler" bs=4k >/dev/null 2>&1
run full
rm -f "$FULL/filler"
run resume --resume
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a small tmpfs needs root")
def test_a_full_disk_mid_class_is_one_line_and_resume_finishes_the_class(tmp_path):
    import json

    from tests.classbuild import make_class

    roster = make_class(tmp_path, {"alice": "good", "bob": "good"})
    env = dict(os.environ, COLUMNS="200", GRADER_WARM="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    fetched = subprocess.run([sys.executable, "-m", "grader", "fetch", "--roster", str(roster), "--out", "ws"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    (tmp_path / "full").mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    env.update(FULL=str(tmp_path / "full"), WS=str(tmp_path / "ws"), LOGS=str(logs), PY=sys.executable)
    done = subprocess.run(["unshare", "-m", "sh", "-c", FULL_CLASS.format()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    said = {n: (logs / f"{n}.out").read_text() for n in ("first", "full", "resume")}
    rc = {n: int((logs / f"{n}.rc").read_text()) for n in said}
    assert rc["first"] == 0, said["first"][-3000:]
    assert rc["full"] == 2, said["full"][-3000:]
    assert "Traceback" not in said["full"], said["full"][-3000:]
    one = " ".join(said["full"].split())
    assert "the disk is full (No space left on device) writing" in one and f"{tmp_path / 'full' / 'out'}" in one, one
    assert "--resume" in one
    first_alice = json.loads((logs / "first.alice").read_text())
    assert json.loads((logs / "full.alice").read_text()) == first_alice  # nothing earlier lost
    assert rc["resume"] == 0, said["resume"][-3000:]
    assert "(1 already graded, kept)" in " ".join(said["resume"].split()), said["resume"][-3000:]
    assert json.loads((logs / "resume.alice").read_text()) == first_alice
    assert "bob" in (logs / "resume.ls").read_text()
