"""The replay process contained (grader.judge.replay_process.run): started through the sandbox backend
as a worker is, its view holds the grader's own code, the record checked and copied (read-only),
the call's inputs and its own folders; nothing of the course, nothing else of the student's. A
hostile record is refused before it starts; what it writes back is read bounded. On the CPU (no
GPU here): the real replay process checks the record in its view and says it has no GPU. The view
is probed as root (each namespace mode) and as an ordinary user (uid 65534)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import SANDBOX, REPO_ROOT, as_nobody
from grader import proctable
from grader.codec import write_inputs
from grader.judge import replay_process
from grader.sandbox.isolation import Isolation
from grader.sandbox.process import detect
from grader.settings import Settings
from tests.replay.test_launchrecord import _record

ISOLATION = detect("sandbox", settings=Settings(), sandbox=SANDBOX)
ROOT = os.geteuid() == 0
needs_namespaces = pytest.mark.skipif(not ISOLATION.namespaces, reason=f"no namespaces here: {ISOLATION.warnings}")
MODES = {  # as tests/sandbox/test_namespaces.py: each way the namespaces backend may run
    "uid switch": Isolation("sandbox", namespaces=True, user_switch=True),
    "user namespace": Isolation("sandbox", namespaces=True, user_namespace=True),
    "root in its namespaces": Isolation("sandbox", namespaces=True),
}

# the entry point swapped for a probe of what the replay process can reach, with its arguments
PROBE = """import sys; sys.path.insert(0, {path!r})
import json, os, socket
import grader.replay.__main__, grader.replay.runner  # its own code is there (runner: torch and Triton too)
record, inputs, layout, out = sys.argv[1:5]
course, student = sys.argv[-2:]
def attempt(fn):
    try:
        fn()
        return "yes"
    except OSError as exc:
        return "no: " + type(exc).__name__
def write(path):
    with open(path, "w") as f:
        f.write("x")
def connect():
    socket.create_connection(("1.1.1.1", 53), timeout=3).close()
report = dict(
    uid=os.getuid(), record=sorted(os.listdir(record)),
    read_record=attempt(lambda: open(os.path.join(record, "launches.json")).read()),
    read_inputs=attempt(lambda: open(inputs, "rb").read()),
    write_record=attempt(lambda: write(os.path.join(record, "launches.json"))),
    add_to_record=attempt(lambda: write(os.path.join(record, "more"))),
    write_inputs=attempt(lambda: write(inputs)),
    write_out=attempt(lambda: write(os.path.join(out, "probe"))),
    course=sorted(os.listdir(course)) if os.path.isdir(course) else [], course_git=os.path.exists(os.path.join(course, ".git")),
    reference=os.path.exists(os.path.join(course, "reference")), student=os.path.exists(student),
    spec=os.path.exists(os.path.join({path!r}, "grader", "spec.py")), network=attempt(connect),
)
with open(os.path.join(out, "probe.json"), "w") as f:
    json.dump(report, f)
"""


def _call(folder: Path):
    """A student's job folder: a launch record that passes every check (its compiled files fake:
    nothing here runs a kernel) with a file it planted beside them, and the call's inputs."""
    student = folder / "student"
    rec = student / "record"
    rec.mkdir(parents=True)
    (rec / "launches.json").write_text(json.dumps(_record(rec)))
    (rec / "planted.py").write_text("print('the student's own file')")
    layout = write_inputs({"x": torch.arange(4096, dtype=torch.float32)}, folder / "inputs.safetensors")
    (folder / "layout.json").write_text(json.dumps(layout))
    return student, rec, folder / "inputs.safetensors", folder / "layout.json"


@needs_namespaces
@pytest.mark.parametrize("mode", list(MODES))
def test_the_replay_process_sees_its_record_and_nothing_of_the_course_or_the_student(tmp_path, mode):
    if mode != "user namespace" and not ROOT:
        pytest.skip("as root only (the uid switch, or root in its namespaces)")
    student, rec, inputs, layout = _call(tmp_path)
    assert (REPO_ROOT / "reference").is_dir() and (rec / "planted.py").is_file()  # the controls: there outside
    job = tmp_path / "job"
    boot = PROBE.replace("sys.argv[-2:]", f"{str(REPO_ROOT.resolve())!r}, {str(student)!r}")
    got = replay_process.run(rec, inputs, layout, job, 5, 120, isolation=MODES[mode], boot=boot, settings=Settings(), sandbox=SANDBOX)
    assert got.failed == "the replay process ended without an answer (exit 0: no output)", got
    report = json.loads((job / "result" / "probe.json").read_text())
    digests = json.loads((rec / "launches.json").read_text())["kernels"]["a" * 64]["files"].values()
    assert report["record"] == sorted(["launches.json", *digests]), report  # the checked copy: no planted file
    assert report["read_record"] == "yes" and report["read_inputs"] == "yes" and report["write_out"] == "yes", report
    for what in ("write_record", "add_to_record", "write_inputs", "network"):
        assert report[what].startswith("no: "), (what, report)
    for what in ("course_git", "reference", "student", "spec"):
        assert report[what] is False, (what, report)
    assert set(report["course"]) <= {".venv"}, report  # at most the path down to the Python it runs (the course's own venv)
    if MODES[mode].user_switch:
        assert report["uid"] not in (0, os.getuid()), report


# the same probe run by an ordinary user (uid 65534): the grader's own process as that user
AS_USER = """
import json, sys
from pathlib import Path
sys.path[:0] = [{root!r}, {tests!r}]
from grader.judge import replay_process
from grader.sandbox.process import detect
from grader.settings import Settings
import tests.judge.test_replay_sandbox as t
home = Path({home!r})
student, rec, inputs, layout = t._call(home / "call")
boot = t.PROBE.replace("sys.argv[-2:]", repr({course!r}) + ", " + repr(str(student)))
iso = detect("sandbox", settings=Settings(), sandbox=t.SANDBOX)
got = replay_process.run(rec, inputs, layout, home / "job", 5, 120, isolation=iso, boot=boot, settings=Settings(), sandbox=t.SANDBOX)
report = json.loads((home / "job" / "result" / "probe.json").read_text())
files = json.loads((rec / "launches.json").read_text())["kernels"]["a" * 64]["files"].values()
report.update(isolation=[iso.namespaces, iso.user_namespace, iso.user_switch], failed=got.failed,
              expected_record=sorted(["launches.json", *files]))
(home / "report.json").write_text(json.dumps(report))
"""


@needs_namespaces
def test_as_an_ordinary_user_the_replay_process_is_contained_alike():
    from tests.sandbox.test_namespaces import NOBODY, _nobody_can_use_namespaces

    why = _nobody_can_use_namespaces()
    if why:
        pytest.skip(why)
    home = Path(tempfile.mkdtemp(prefix="grader-nobody-replay-"))
    try:
        (home / "tmp").mkdir()
        for folder in (home, home / "tmp"):
            os.chown(folder, NOBODY, NOBODY)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home / "tmp"),
               "GRADER_CACHE_DIR": str(home / "cache"), "GRADER_WARM_SECONDS": "0", "LANG": "C.UTF-8"}
        code = AS_USER.format(root=str(REPO_ROOT), tests=str(REPO_ROOT / "tests"), home=str(home), course=str(REPO_ROOT.resolve()))
        run = subprocess.run(as_nobody(home, env, "-c", code), capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-5000:]
        report = json.loads((home / "report.json").read_text())
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert report["isolation"] == [True, True, False], report  # unshare --user --map-root-user
    assert report["record"] == report["expected_record"], report
    assert report["read_record"] == "yes" and report["read_inputs"] == "yes" and report["write_out"] == "yes", report
    for what in ("write_record", "add_to_record", "write_inputs", "network"):
        assert report[what].startswith("no: "), (what, report)
    for what in ("course_git", "reference", "student", "spec"):
        assert report[what] is False, (what, report)
    assert set(report["course"]) <= {".venv"}, report


def test_the_real_replay_process_checks_the_record_in_its_sandbox_and_answers(tmp_path, monkeypatch):
    """The replay itself (no probe), as a grade would start it: it imports its code from its view,
    checks the copied record again, and, with no GPU here, says so; who held the GPU is the
    judge's own observation."""
    monkeypatch.setattr(replay_process, "gpu_processes", lambda: [os.getpid(), 4242])
    _, rec, inputs, layout = _call(tmp_path)
    got = replay_process.run(rec, inputs, layout, tmp_path / "job", 5, 300, settings=Settings(), sandbox=SANDBOX)
    if torch.cuda.is_available():  # its fake binary is loaded there, and fails to: a failed replay, said in one line
        assert got.failed and not got.ms, got
    else:
        assert got.failed == "no GPU is visible to the replay process", got
    assert got.others == [4242]
    assert not list((tmp_path / "job" / "result").glob("*.safetensors"))


@pytest.mark.parametrize("change, reason", [
    (lambda rec, raw: (rec / raw["kernels"]["a" * 64]["files"]["add_kernel.cubin"]).write_bytes(b"another binary"),
     "add_kernel.cubin is not the file its hash names"),
    (lambda rec, raw: (os.unlink(rec / raw["kernels"]["a" * 64]["files"]["add_kernel.cubin"]),
                       os.symlink("/etc/passwd", rec / raw["kernels"]["a" * 64]["files"]["add_kernel.cubin"])),
     "cannot be opened (Too many levels of symbolic links)"),
    (lambda rec, raw: (rec / "launches.json").write_text(json.dumps({**raw, "why_not": ["launches on 2 streams"]})),
     "not replayable: launches on 2 streams"),
    (lambda rec, raw: (rec / "launches.json").write_text("{not json"), "the record is not JSON"),
])
def test_a_hostile_record_is_refused_with_the_reason_before_any_process_starts(tmp_path, monkeypatch, change, reason):
    def no_start(*args, **kwargs):
        raise AssertionError("a replay process was started for a refused record")

    monkeypatch.setattr(replay_process, "WorkerProcess", no_start)
    _, rec, inputs, layout = _call(tmp_path)
    change(rec, json.loads((rec / "launches.json").read_text()))
    got = replay_process.run(rec, inputs, layout, tmp_path / "job", 5, 60, settings=Settings(), sandbox=SANDBOX)
    assert reason in got.refused and not got.failed and got.median_ms is None, got
    assert replay_process.decide(got, replay_process.Replayed(ms=[1.0]), wrong="").kind == "fallback"


ARMED_THEN_HANGS = ("import sys, time, pathlib; a = sys.argv[1:]; "
                    "pathlib.Path(a[a.index('--armed') + 1]).touch(); time.sleep(600)")


def test_a_replay_that_overruns_is_killed_and_fails(tmp_path):
    """Hanging while it sets up (before any kernel of its record ran) is ours; hanging once told
    to go fails the replay."""
    _, rec, inputs, layout = _call(tmp_path)
    start = time.monotonic()
    got = replay_process.run(rec, inputs, layout, tmp_path / "job", 5, 5, boot="import time; time.sleep(600)", settings=Settings(), sandbox=SANDBOX)
    assert got.failed == "the replay was not set up in 5 s" and got.ours and time.monotonic() - start < 60, got
    assert replay_process.decide(got, replay_process.Replayed(ms=[1.0]), wrong="").kind == "retry"
    start = time.monotonic()
    got = replay_process.run(rec, inputs, layout, tmp_path / "job2", 5, 5, boot=ARMED_THEN_HANGS, settings=Settings(), sandbox=SANDBOX)
    assert got.failed == "the replay did not finish in 5 s" and not got.ours and time.monotonic() - start < 60, got


def test_what_the_replay_writes_back_is_read_bounded(tmp_path):
    out = tmp_path / "result"
    out.mkdir()
    os.mkfifo(out / "replay.json")
    start = time.monotonic()
    assert "is a FIFO" in replay_process.read(out).failed and time.monotonic() - start < 5
    (out / "replay.json").unlink()
    (out / "replay.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"ms": [1.0], "sums": [[[1.0, 1.0, 0]]]}))
    assert "a symbolic link" in replay_process.read(out).failed
    (out / "replay.json").unlink()
    (out / "replay.json").write_text(json.dumps({"ms": [1.0], "refused": "\x1b[2Jcleared"}))
    assert replay_process.read(out).refused == "\\x1b[2Jcleared"  # shown, never obeyed, in a terminal

    expected = [torch.zeros(4096)]
    done = replay_process.Replayed(ms=[1.0], folder=out)
    save_file({"output.0": torch.ones(4096)}, str(out / "last.safetensors"))
    assert torch.equal(replay_process.results(done, expected)[0], torch.ones(4096))
    save_file({"output.0": torch.ones(4096 * 20)}, str(out / "last.safetensors"))  # far more than the result
    with pytest.raises(replay_process.ReplyError, match="larger than"):
        replay_process.results(done, expected)
    save_file({"output.0": torch.ones(4096), "output.1": torch.ones(2)}, str(out / "last.safetensors"))
    with pytest.raises(replay_process.ReplyError, match="holds 2 tensors where 1 are expected"):
        replay_process.results(done, expected)
    save_file({"output.0": torch.ones(4096, dtype=torch.float64)[:2048]}, str(out / "last.safetensors"))
    with pytest.raises(replay_process.ReplyError, match="is float64, not float32"):
        replay_process.results(done, expected)
    (out / "last.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(replay_process.ReplyError, match="cannot be read"):
        replay_process.results(done, expected)
    (out / "last.safetensors").unlink()
    os.mkfifo(out / "last.safetensors")
    with pytest.raises(replay_process.ReplyError, match="is a FIFO"):
        replay_process.results(done, expected)


def test_a_replay_started_early_waits_for_its_record_and_a_cancelled_one_is_gone(tmp_path):
    """Started before its record exists (its imports overlap the recorded calls), the replay waits:
    it answers nothing until its record is placed and it is told to go; one not needed after all
    is stopped and leaves no process."""
    import time as clock

    _, rec, inputs, layout = _call(tmp_path)
    pending = replay_process.spawn(tmp_path / "early", 5, 300, settings=Settings(), sandbox=SANDBOX)
    clock.sleep(3)
    assert pending.proc.proc.poll() is None and not (tmp_path / "early" / "result" / "replay.json").exists()
    got = replay_process.go(replay_process.place(pending, rec, inputs, layout))
    assert got.failed or got.ms, got  # on this machine's CPU: "no GPU is visible"; on a GPU its times
    unused = replay_process.spawn(tmp_path / "unused", 5, 300, settings=Settings(), sandbox=SANDBOX)
    pid = unused.proc.proc.pid
    replay_process.cancel(unused)
    clock.sleep(0.5)
    assert unused.proc.proc.poll() is not None and not Path(f"/proc/{pid}/cmdline").exists() or \
        Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_the_replay_itself_on_the_gpu_is_not_another_process_sharing_it(tmp_path, monkeypatch):
    """The replay holds the GPU from its set-up on, and is still writing its last result when its
    times are read: its own processes are never counted as others sharing the GPU."""
    _, rec, inputs, layout = _call(tmp_path)
    pending = replay_process.spawn(tmp_path / "own", 5, 300, boot=TIMES_THEN_LAST, settings=Settings(), sandbox=SANDBOX)
    monkeypatch.setattr(replay_process, "gpu_processes",
                        lambda: [4242, *proctable.tree(pending.proc.proc.pid)])
    got = replay_process.settle(replay_process.go(replay_process.place(pending, rec, inputs, layout)))
    assert got.ms == [1.0] and not got.failed and got.others == [4242], got
    assert (got.folder / "last.safetensors").read_bytes() == b"x", "settle waited for the last result"


# a replay as a GPU's: set up, told to go, its times answered, its last result written a while later
TIMES_THEN_LAST = ("import sys, time, json, pathlib\n"
                   "a = sys.argv[1:]; out = pathlib.Path(a[3])\n"
                   "pathlib.Path(a[a.index('--armed') + 1]).touch()\n"
                   "while not pathlib.Path(a[a.index('--go') + 1]).exists(): time.sleep(0.01)\n"
                   "(out / '.t').write_text(json.dumps(dict(ms=[1.0], sums=[[[1.0, 1.0, 0]]])))\n"
                   "(out / '.t').replace(out / 'replay.json'); time.sleep(2)\n"
                   "(out / 'last.safetensors').write_bytes(b'x')\n")


def test_a_stage_shows_its_files_beside_anothers_without_taking_them_away(tmp_path):
    """The bounds check shows its inputs in the job's inputs/ folder while the correctness calls
    show theirs there: the same file name, each stage's own copy, neither removed by the other."""
    from grader.sandbox.files import shown_to_worker

    source = tmp_path / "1x1_float32.safetensors"
    source.write_bytes(b"inputs")
    with shown_to_worker(source, tmp_path / "job") as calls:
        with shown_to_worker(source, tmp_path / "job", prefix="bounds-") as bounds:
            assert bounds != calls and bounds.read_bytes() == b"inputs"
        assert calls.read_bytes() == b"inputs", "the correctness call's file is still there"


# a replay as the stage starts one (picked): its times answered, then the judge's indices awaited; it tries to
# change them in place, then hands back the elements "at" them (here the indices themselves, as numbers)
PICKED = ("import sys, time, json, pathlib\n"
          "from safetensors.torch import load_file, save_file\n"
          "import torch\n"
          "a = sys.argv[1:]; out = pathlib.Path(a[3]); pick = pathlib.Path(a[a.index('--pick') + 1])\n"
          "pathlib.Path(a[a.index('--armed') + 1]).touch()\n"
          "while not pathlib.Path(a[a.index('--go') + 1]).exists(): time.sleep(0.01)\n"
          "(out / '.t').write_text(json.dumps(dict(ms=[1.0], sums=[[[1.0, 1.0, 0]]])))\n"
          "(out / '.t').replace(out / 'replay.json')\n"
          "while not pick.exists(): time.sleep(0.01)\n"
          "idx = load_file(str(pick))['idx']\n"
          "try:\n"
          "    pick.write_bytes(b'changed'); changed = 'yes'\n"
          "except OSError as exc:\n"
          "    changed = 'no: ' + type(exc).__name__\n"
          "(out / 'changed').write_text(changed)\n"
          "save_file({{'output.0': idx.float(), 'numel.output.0': torch.tensor([4096])}}, str(out / '.l'))\n"
          "(out / '.l').replace(out / 'last.safetensors')\n")


def test_a_replay_is_told_the_judges_indices_only_after_its_times_and_cannot_change_them(tmp_path):
    """The stage's replays hand back only their last result's elements at the judge's indices: told
    once the times are in (never before: it waits for them), copied into its job folder, which it
    reads and cannot write; the judge's own copy, which the trusted worker reads, stays the judge's."""
    from safetensors.torch import load_file

    from grader.codec import write_tensors

    _, rec, inputs, layout = _call(tmp_path)
    pending = replay_process.spawn(tmp_path / "picked", 5, 300, boot=PICKED, picked=True, settings=Settings(),
                                   sandbox=SANDBOX)
    got = replay_process.go(replay_process.place(pending, rec, inputs, layout))
    assert got.ms == [1.0] and not got.failed, got
    time.sleep(0.5)
    assert not (got.folder / "last.safetensors").exists(), "nothing handed back before the indices are told"
    ours = tmp_path / "picks.safetensors"
    idx = torch.tensor([0, 7, 4095], dtype=torch.int64)
    write_tensors({"idx": idx}, ours)
    got = replay_process.settle(got, ours)
    assert not got.failed, got
    assert torch.equal(load_file(str(got.folder / "last.safetensors"))["output.0"], idx.float())
    assert torch.equal(load_file(str(ours))["idx"], idx), "the judge's own copy is never the replay's to change"
    if ISOLATION.namespaces:
        assert (got.folder / "changed").read_text().startswith("no"), "its job folder is read-only to it"
