"""The worker's container: capped output, timeouts that kill the whole group, crashes."""

import io
import os
import time

import pytest
from safetensors.torch import save_file

from grader.sandbox import CappedOutput, WorkerFailure, WorkerProcess


def test_capped_output_keeps_head_and_tail():
    stream = io.BufferedReader(io.BytesIO(b"HEAD" + b"x" * 1_000_000 + b"TAIL"))
    text = CappedOutput(stream, keep=100).text()
    assert text.startswith("HEAD") and text.endswith("TAIL")
    assert "bytes of output elided" in text and len(text) < 400


def test_timeout_kills_the_worker_and_its_children(tmp_path):
    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    marker = tmp_path / "child.pid"
    (repo / "kernels" / "slow.py").write_text(
        "import subprocess, time\n"
        f"p = subprocess.Popen(['sleep', '300'])\nopen({str(marker)!r}, 'w').write(str(p.pid))\n"
        "def f():\n    time.sleep(300)\n"
    )
    inputs = tmp_path / "none.safetensors"
    save_file({}, str(inputs))
    worker = WorkerProcess(repo, tmp_path / "scratch", interpret=True)
    try:
        loaded = worker.request({"op": "load", "contenders": {"s": {"root": str(repo), "module": "kernels/slow.py", "function": "f"}}}, 60)
        assert loaded["ok"], loaded
        start = time.monotonic()
        with pytest.raises(WorkerFailure) as info:
            worker.request({"op": "run", "contender": "s", "inputs": str(inputs), "layout": {}, "device": "cpu",
                            "output": str(tmp_path / "out.safetensors")}, timeout=1)
        assert info.value.outcome == "timeout" and "no answer within 1 s" in info.value.message
        assert time.monotonic() - start < 10
    finally:
        worker.close()
    child = int(marker.read_text())
    time.sleep(0.2)
    assert not _alive(child), "a child of the worker outlived it"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    state = open(f"/proc/{pid}/stat").read().split()[2] if os.path.exists(f"/proc/{pid}/stat") else "X"
    return state not in ("Z", "X")


def test_worker_death_is_reported_with_its_status(tmp_path):
    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "dies.py").write_text("import os\nos._exit(7)\n")
    worker = WorkerProcess(repo, tmp_path / "scratch", interpret=True)
    try:
        with pytest.raises(WorkerFailure) as info:
            worker.request({"op": "load", "contenders": {"s": {"root": str(repo), "module": "kernels/dies.py", "function": "f"}}}, 60)
        assert info.value.outcome == "crashed" and "exited with status 7" in info.value.message
    finally:
        worker.close()
