"""`--profile` where it runs: the real CLI without a GPU (one line, the check goes on), nothing of
the profile loaded without the flag, why a machine cannot profile, and the replay's entry point
that puts the replay process under ncu (a stand-in ncu here: no GPU, no Nsight Compute)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SANDBOX, REPO_ROOT, build_submission, has_gpu
from grader.device import Device
from grader.judge import profiling
from grader.profile import ncu
from grader.sandbox.launch import isolated_python
from grader.settings import Settings
from tests import ncu_fixtures as fx

CHECK = ["-a", "vector_add", "--case", "n=127", "--dtype", "float32"]


@pytest.mark.slow
@pytest.mark.skipif(has_gpu(), reason="the CPU's answer to --profile")
def test_profile_without_a_gpu_says_why_in_one_line_and_the_check_goes_on(tmp_path, cli):
    repo = build_submission(tmp_path / "good", "good")
    plain = cli(repo, *CHECK)
    first = json.loads((tmp_path / "out" / "results.json").read_text())
    run = cli(repo, *CHECK, "--profile")
    assert run.returncode == plain.returncode == 0, run.stderr
    said = [ln for ln in run.stderr.splitlines() if "--profile" in ln]
    assert said == ["--profile: no profile: it needs an NVIDIA GPU, and this ran in Triton's CPU interpreter"]
    def graded(results):
        return [(t["name"], t["outcome"], t["score"], t["max_score"]) for t in results["tests"]]

    assert run.results["score"] == first["score"] and graded(run.results) == graded(first)  # the grade unchanged
    assert "Profile (Nsight Compute)" not in run.report


IN_PROCESS = """
import sys
sys.argv = ["grader", "check", *sys.argv[1:]]
from grader.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print("LOADED", sorted(m for m in sys.modules if m.startswith("grader.profile") or m == "grader.judge.profiling"))
"""


@pytest.mark.slow
@pytest.mark.skipif(has_gpu(), reason="a CPU check: quick")
@pytest.mark.parametrize("flag", [[], ["--profile"]])
def test_nothing_of_the_profile_is_loaded_unless_asked_for(tmp_path, flag):
    repo = build_submission(tmp_path / "good", "good")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), GRADER_CACHE_GB="0")
    proc = subprocess.run([sys.executable, "-c", IN_PROCESS, str(repo), *CHECK, *flag, "--json",
                           str(out / "results.json"), "--html", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    loaded = [ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED")]
    assert loaded, proc.stdout + proc.stderr
    if flag:  # the probe sees the profile where it is asked for
        assert "grader.judge.profiling" in loaded[0]
    else:
        assert loaded == ["LOADED []"]


def _fake_ncu(folder: Path) -> Path:
    """A stand-in `ncu`: writes what it was asked into args.json and a fixture CSV into --log-file,
    then runs the command after its options, as ncu does."""
    script = folder / "ncu"
    script.write_text(f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
os.makedirs(os.path.dirname(log), exist_ok=True)
json.dump(args, open(os.path.join(os.path.dirname(log), "args.json"), "w"))
open(log, "w").write({fx.ncu_csv(fx.CORRECT)!r})
cmd = args[args.index("-I") - 1:]
os.execv(cmd[0], cmd)
""")
    script.chmod(0o755)
    return script


def test_the_replay_starts_under_ncu_with_its_own_arguments(tmp_path):
    fake = _fake_ncu(tmp_path)
    out = tmp_path / "result"
    log = out / ncu.LOG_NAME
    boot = profiling.boot(fake, ncu.options(["add_kernel"], 1, str(log)))
    argv = isolated_python(boot, str(tmp_path / "record"), str(tmp_path / "inputs.safetensors"),
                           str(tmp_path / "layout.json"), str(out), "--reps", "1", path=str(REPO_ROOT))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    args = json.loads((out / "args.json").read_text())
    assert args[args.index("--kernel-name") + 1] == "regex:^(add_kernel)$"
    assert args[args.index("--log-file") + 1] == str(log)
    assert args[-6:] == [str(tmp_path / "record"), str(tmp_path / "inputs.safetensors"), str(tmp_path / "layout.json"),
                         str(out), "--reps", "1"]  # the replay's own arguments, after ncu's
    # the replay itself ran (and stopped at its missing layout: no GPU, no record here)
    assert "grader/replay/__main__.py" in proc.stderr and "layout.json" in proc.stderr
    (launch,) = ncu.parse(profiling._read(log))
    assert launch.kernel == "softmax"


def test_why_a_machine_cannot_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(ncu, "NCU_DEFAULT", tmp_path / "cuda" / "bin" / "ncu")
    assert profiling.unavailable(Device.CPU, "sandbox").startswith("no profile: it needs an NVIDIA GPU")
    assert "Nsight Compute (ncu) is not installed here" in profiling.unavailable(Device.CUDA, "sandbox")
    monkeypatch.setattr(ncu, "OPT_ROOT", tmp_path / "nowhere")
    launcher, install = fx.install_ncu(tmp_path / "host", "#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(launcher.parent))
    params = tmp_path / "params"
    params.write_text("RmProfilingAdminOnly: 1\n")
    assert "NVreg_RestrictProfilingToAdminUsers=0" in profiling.unavailable(Device.CUDA, "sandbox", params)
    params.write_text("RmProfilingAdminOnly: 0\n")
    assert profiling.unavailable(Device.CUDA, "sandbox", params) == ""
    shutil.rmtree(install)  # the toolkit's launcher left behind without the install it runs
    why = profiling.unavailable(Device.CUDA, "sandbox", params)
    assert why.startswith("no profile: Nsight Compute's install folder, which the profiled replay must see, was not "
                          f"found: {launcher} is a launcher script, and no Nsight Compute install"), why
    assert "\n" not in why and str(install.parent) in why, why


def test_an_assignment_not_timed_by_replay_says_why(tmp_path):
    from tests.conftest import COURSE

    spec = COURSE.get("vector_add")
    p = profiling.profile_assignment(spec, {"timed_by": "fallback", "replay_refused": "launches.json: \x1b[2Jbad"},
                                     tmp_path, "sandbox", None, None)
    assert p.explanation is None and p.why_not == "no profile of vector_add: launches.json: \\x1b[2Jbad"
    kept = {"timed_by": "replay", "replay": {"kept": {"student": "ab", "reference": "cd"},
                                            "inputs": {"case": spec.performance.case.name,
                                                       "dtype": spec.performance.dtype, "seed": 1}}}
    p = profiling.profile_assignment(spec, kept, tmp_path, "sandbox", None, None)
    assert p.why_not == "no profile of vector_add: the replay's records were not kept"


def test_the_report_shows_the_profile_under_its_assignment():
    from grader.profile.explain import explain
    from grader.report import render
    from grader.results import AssignmentResult, RunResult

    hostile = [("<script>alert(1)</script>\x1b[31m", fx.READS_TWICE[0][1], fx.READS_TWICE[0][2])]
    e = explain(ncu.parse(fx.ncu_csv(hostile)), ncu.parse(fx.ncu_csv(fx.REFERENCE)), fx.MUST_MOVE)
    run = RunResult("/student/repo", 0, {"mode": "gpu", "torch": "x", "triton": "y", "python": "z"})
    run.assignments = [AssignmentResult("softmax", "Row-wise softmax", "kernels/softmax.py:softmax()", []),
                       AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()", [])]
    html = render(run, [profiling.Profile("softmax", e),
                        profiling.Profile("vector_add", why_not="no profile of vector_add: its speed was not timed")])
    assert '<h3 id="profile-softmax">Profile (Nsight Compute)</h3>' in html
    assert "<li>your kernel moves 2.0x the bytes the reference moves (1.07 GB against 537.00 MB; " in html
    assert "<td>DRAM read</td><td>805.44 MB</td><td>268.57 MB</td>" in html
    assert "no profile of vector_add: its speed was not timed" in html
    assert "<script>alert" not in html and "\x1b" not in html
    assert "Profile (Nsight Compute)" not in render(run)  # none asked for: no section


def test_grade_profile_without_a_gpu_says_why_once(tmp_path, capsys):
    from types import SimpleNamespace

    from grader.cli.grade import _profile_class

    _profile_class(tmp_path, ["vector_add"], None, SimpleNamespace(device="cpu", isolation="sandbox", gpu=None), None)
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert said == ["--profile: no profile: it needs an NVIDIA GPU, and this ran in Triton's CPU interpreter"]


LATE_NCU = '''#!{python}
import json, os, sys, time
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
cmd = args[args.index("-I") - 1:]
code = cmd.index("-c")
record, inputs, layout, out = cmd[code + 2:code + 6]
def flag(name):
    return cmd[cmd.index(name) + 1]
def wait(path):
    while not os.path.exists(path):
        time.sleep(0.01)
wait(flag("--ready")); open(flag("--loaded"), "w").close()
wait(flag("--arm")); open(flag("--armed"), "w").close()
wait(flag("--go"))
with open(os.path.join(out, ".replay.json.tmp"), "w") as f:  # whole before it appears, as the replay writes it
    json.dump({{"ms": [0.5], "placements": [[0.5]], "sums": [[[1.0, 1.0, 0.0]]], "median_ms": 0.5, "launches": 1}}, f)
os.replace(os.path.join(out, ".replay.json.tmp"), os.path.join(out, "replay.json"))
open(os.path.join(out, "last.safetensors"), "wb").write(b"x")
time.sleep(1.0)  # ncu writes its results as the profiled process exits: after the replay's answer
open(log, "w").write({csv!r})
'''


def test_the_profiled_replay_is_waited_for_until_ncu_has_written(tmp_path):
    """Unlike a timed replay, stopped once its last result is written, the profiled one runs until
    ncu ends (a stand-in here, writing its CSV a second after the replay's answer)."""
    from tests.judge.test_replay_sandbox import _call

    fake = tmp_path / "ncu"
    fake.write_text(LATE_NCU.format(python=sys.executable, csv=fx.ncu_csv(fx.TINY_BLOCK)))
    fake.chmod(0o755)
    _, rec, inputs, layout = _call(tmp_path / "call")
    work = inputs.parent
    log = work / "profiled" / "result" / ncu.LOG_NAME
    entry = profiling.boot(fake, ncu.options(["add_kernel"], 1, str(log)))
    run = profiling._under_ncu(rec, work, work / "profiled", entry, "none", None, Settings(), sandbox=SANDBOX)
    assert not run.failed and run.ms == [0.5], run
    (launch,) = ncu.parse(profiling._read(log))
    assert launch.kernel == "softmax_one_warp"


def _namespaces() -> bool:
    from grader.sandbox.process import detect

    return detect("sandbox", settings=Settings(), sandbox=SANDBOX).namespaces


@pytest.mark.skipif(not _namespaces(), reason="no namespaces here: the sandbox's view is what this tests")
def test_the_sandboxed_replay_runs_under_ncu_only_with_its_install_folder_shown_read_only(tmp_path):
    """The `ncu` on PATH is the CUDA toolkit's launcher (a stand-in of it here, as NVIDIA ships it),
    which looks for Nsight Compute's install folder (under /opt) and fails without it: so it did
    in the sandbox, whose view holds no /opt. Resolved here, the install is shown to the profiled
    replay read-only, and the install's own ncu runs it there, its loopback up (ncu's local socket)."""
    from tests.judge.test_replay_sandbox import _call

    writes = ("import json, os, sys, time\ntry:\n    open(os.path.realpath(__file__) + '.written', 'w').close()\n"
              "except OSError:\n    pass\n"
              # ncu talks to the process it profiles over a local socket: the namespace's loopback must be up
              "import socket\nserver = socket.socket()\nserver.bind(('127.0.0.1', 0))\nserver.listen(1)\n"
              "socket.create_connection(server.getsockname(), timeout=5).close()\n")
    binary = LATE_NCU.format(python=sys.executable, csv=fx.ncu_csv(fx.TINY_BLOCK)).replace(
        "import json, os, sys, time\n", writes, 1)
    launcher, install = fx.install_ncu(tmp_path / "host", binary)
    _, rec, inputs, layout = _call(tmp_path / "call")
    work = inputs.parent

    def profiled(name: str, command: Path, readable: tuple[Path, ...]):
        log = work / name / "result" / ncu.LOG_NAME
        entry = profiling.boot(command, ncu.options(["add_kernel"], 1, str(log)))
        return profiling._under_ncu(rec, work, work / name, entry, "sandbox", None, Settings(), SANDBOX, readable), log

    # as before: the launcher run in the sandbox, its own folder seen (as /usr/local/cuda is), the install not
    bare, _ = profiled("bare", launcher, (launcher.parent.parent,))
    assert "nsight-compute directory is not found" in bare.failed and not bare.ms, bare
    found = ncu.locate(launcher)
    assert found == ncu.Install(install / "ncu", install)
    run, log = profiled("shown", found.command, (found.folder,))
    assert not run.failed and run.ms == [0.5], run
    (launch,) = ncu.parse(profiling._read(log))
    assert launch.kernel == "softmax_one_warp"
    assert not (install / fx.PLATFORM / "ncu.written").exists()  # shown read-only: the profiled side wrote nothing there
    assert os.access(install / fx.PLATFORM, os.W_OK)  # the control: outside the view the folder is writable
