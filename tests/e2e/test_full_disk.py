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
