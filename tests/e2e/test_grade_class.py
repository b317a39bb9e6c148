"""grader grade end to end on a small class in Triton's CPU interpreter: per-student folders,
the dashboard and gradebooks, a regrade of one student, and a batch killed at any moment
(Ctrl-C, SIGKILL) that --resume completes with every earlier result intact."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.classbuild import commit, make_class, overlay, unmarked
from tests.conftest import REPO_ROOT, run_cli

DEADLINE = "2025-02-01T00:00:00+00:00"
QUICK = ["--device", "cpu", "--jobs", "2", "-a", "vector_add", "-a", "softmax", "--case", "n=1", "--case", "1x1", "--dtype", "float32",
         "--seed", "3"]


def grades(out: Path) -> dict[str, dict]:
    """grades.csv by student; QUICK grades a few cases on a CPU, so every assignment's column is marked
    partial and CPU only, and so are the totals."""
    header, *rows = list(csv.reader(io.StringIO((out / "grades.csv").read_text())))
    marked = [h for h in header if h.endswith(" (partial run, CPU only)")]
    assert len(header) - len(marked) == 6, header  # student, commit, late, hours_late, penalty, note
    assert {"total (partial run, CPU only)", "final (partial run, CPU only)"} < set(marked), header
    names = [unmarked(h) for h in header]
    return {row[0]: dict(zip(names, row)) for row in rows}


def records(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.glob("students/*/jobs/*.json"))}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """alice: right on time, then a late broken commit; bob: no mask in vector_add; carol:
    torch's softmax (an integrity flag); dan: no repo; erin: an empty repo."""
    root = tmp_path_factory.mktemp("class")
    roster = make_class(root, {"alice": "good", "bob": "missing_mask", "carol": "torch_softmax"},
                        ["dan,repos/nowhere", "erin,empty"])
    (root / "empty").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root / "empty", check=True)
    overlay(root / "repos" / "alice", "missing_mask")
    commit(root / "repos" / "alice", "after the deadline", "2025-02-03T00:00:00+00:00")
    fetched = run_cli(["fetch", "--roster", str(roster), "--out", "ws", "--deadline", DEADLINE], root)
    assert fetched.returncode == 1 and "2 unfetched" in fetched.stdout, fetched.stdout + fetched.stderr
    run = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", *QUICK], root)
    return root, run


@pytest.mark.slow
def test_class_is_graded_into_reports_gradebooks_and_a_summary(graded_class):
    root, run = graded_class
    out = root / "out"
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Grading 6 jobs" in run.stdout and "6 jobs graded, 0 infra errors" in run.stdout
    assert "unfetched dan: no such folder" in run.stdout
    # per student: results.json (Gradescope), report.html, logs, one record per job
    for student in ("alice", "bob", "carol"):
        folder = out / "students" / student
        data = json.loads((folder / "results.json").read_text())
        assert {t["tags"][0] for t in data["tests"]} == {"vector_add", "softmax"}
        assert (folder / "report.html").is_file() and (folder / "logs" / "softmax.log").is_file()
        # every record and results.json says which isolation ran (the default: the sandbox, or what was left of it here)
        record = json.loads((folder / "jobs" / "softmax.json").read_text())
        assert record["environment"]["isolation"]["mode"] in ("sandbox", "none")
        assert data["extra_data"]["environment"]["isolation"] == record["environment"]["isolation"]
    assert json.loads((out / "batch.json").read_text())["runs"][-1]["isolation"] == "sandbox"
    g = grades(out)
    # alice is graded at the commit before the deadline (the late one broke vector_add), flagged late
    # QUICK is a partial run: each case earns its share of the assignment's points, as grader check gives it
    assert (g["alice"]["vector_add"], g["alice"]["softmax"], g["alice"]["total"], g["alice"]["late"]) == ("0.13", "0.25", "0.38", "yes")
    assert g["bob"]["vector_add"] == "0" and g["bob"]["softmax"] == "0.25" and g["bob"]["late"] == "no"
    assert g["carol"]["softmax"] == "0" and g["carol"]["vector_add"] == "0.13"  # flagged: no points
    assert "partial run: 1 of" in g["alice"]["note"]
    assert g["dan"]["total"] == "" and "unfetched: no such folder" in g["dan"]["note"]
    assert "the repository is empty" in g["erin"]["note"]
    lock = json.loads((root / "ws" / "lock.json").read_text())
    assert g["alice"]["commit"] == lock["students"][0]["commit"] != lock["students"][0]["head"]
    bob_log = (out / "students" / "bob" / "logs" / "vector_add.log").read_text()
    assert "failed: n=1 [float32]: " in bob_log and "out-of-bounds load" in bob_log
    # the deadline note reaches the student's own report
    assert "can be forged" in (out / "students" / "alice" / "report.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == {"students": 5, "unfetched": 2, "late": 1, "jobs": 6, "graded": 6, "infra_error": 0,
                                 "not graded": 0, "flagged": 1}
    carol = next(s for s in summary["students"] if s["student"] == "carol")
    assert carol["assignments"]["softmax"]["flagged"] is True
    # Classroom- and Gradescope-shaped exports
    classroom = list(csv.DictReader(io.StringIO((out / "classroom.csv").read_text())))
    bob = {"assignment_name": "vector_add (partial run, CPU only)", "roster_identifier": "bob", "points_awarded": "0",
           "points_available": "10"}
    assert bob.items() <= next(r for r in classroom if r["roster_identifier"] == "bob"
                               and r["assignment_name"] == "vector_add (partial run, CPU only)").items()
    assert next(csv.reader(io.StringIO((out / "gradescope.csv").read_text()))) == [
        "Name", "SID", "Email", "vector_add (partial run, CPU only)", "softmax (partial run, CPU only)",
        "Total Score (partial run, CPU only)", "Note"]
    canvas = (out / "canvas.csv").read_text().splitlines()
    assert canvas[:2] == ['Student,ID,SIS User ID,SIS Login ID,Section,"vector_add (partial run, CPU only)",'
                          '"softmax (partial run, CPU only)"',
                          "Points Possible,,,,,10,20"]
    assert "alice,,,alice,,0.13,0.25" in canvas  # graded on the deadline's commit, as in grades.csv


@pytest.mark.slow
def test_dashboard_shows_the_class_and_stands_alone(graded_class):
    root, _ = graded_class
    html = (root / "out" / "index.html").read_text()
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html
    assert "<script src" not in html and "<link" not in html
    assert 'href="students/alice/report.html#vector_add"' in html
    assert html.count('aria-label="score histogram"') == 2
    # pass rates per check: bob's out-of-bounds n=1 and carol's integrity flag are the checks the class fails
    checks = re.findall(r"<tr><td>(\w+)</td><td>([^<]+)</td><td data-sort=\"(\d+)\">(\d+) / (\d+)</td>", html)
    rates = {(a, c): (int(p), int(n)) for a, c, _, p, n in checks}
    assert rates[("vector_add", "n=1 [float32]")] == (2, 3)
    assert rates[("softmax", "uses its own Triton kernel")] == (2, 3)
    assert checks[0][1] in ("n=1 [float32]", "uses its own Triton kernel")  # the most failed come first
    # told first by what the students must change, each with the students it concerns, not one row per case
    told = html.split('<table id="diagnoses">')[1].split("</table>")[0]
    rows = re.findall(r"<tr><td>(\w+)</td>\s*<td>(.*?)</td>\s*<td class=\"what\">(.*?)</td></tr>", told, re.S)
    by_words = {(a, re.sub(r"<[^>]+>", "", words).strip()): re.sub(r"<[^>]+>", "", who) for a, who, words in rows}
    mask = [who for (a, words), who in by_words.items() if a == "vector_add" and "mask this load" in words]
    assert len(mask) == 1 and mask[0].startswith("bob"), by_words
    flagged = [who for (a, words), who in by_words.items() if a == "softmax" and "aten::_softmax" in words]
    assert len(flagged) == 1 and flagged[0].strip() == "carol", by_words
    assert len([k for k in by_words if k[0] == "vector_add" and "mask this load" in k[1]]) == 1
    flags = html.split("Integrity flags awaiting review")[1].split("<h2>")[0]
    assert "carol" in flags and "aten::_softmax ran inside softmax()" in flags
    late = html.split("<h2>Late submissions")[1]
    assert "alice" in late and "bob" not in late
    assert "no such folder" in html and "the repository is empty" in html
    assert "can be forged" in html
    assert 'class="sortable"' in html and "addEventListener(\"click\"" in html


@pytest.mark.slow
def test_regrading_one_student_touches_only_that_student(graded_class, tmp_path):
    root, _ = graded_class
    work = tmp_path / "class"
    shutil.copytree(root, work, symlinks=True)
    out = work / "out"
    (work / "roster.csv").write_text((root / "roster.csv").read_text().replace(str(root), str(work)))
    # bob fixes his kernel; the TA re-fetches and regrades only bob
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "good", work / "repos" / "bob", dirs_exist_ok=True)
    commit(work / "repos" / "bob", "fixed", "2025-01-20T00:00:00+00:00")
    assert run_cli(["fetch", "--roster", "roster.csv", "--out", "ws", "--deadline", DEADLINE], work).returncode == 1
    others = {p: out.joinpath(p).read_bytes() for p in ("students/alice/results.json", "students/carol/report.html",
                                                         "students/alice/jobs/softmax.json", "students/carol/jobs/vector_add.json")}
    before = grades(out)
    run = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--only", "bob", *QUICK], work)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Grading 2 jobs" in run.stdout
    after = grades(out)
    assert after["bob"]["vector_add"] == "0.13" and after["bob"]["total"] == "0.38" and before["bob"]["total"] == "0.25"
    assert after["bob"]["commit"] != before["bob"]["commit"]
    assert [after[s] for s in ("alice", "carol")] == [before[s] for s in ("alice", "carol")]
    assert all(out.joinpath(p).read_bytes() == data for p, data in others.items())
    row = re.search(r'<tr>\s*<td data-sort="bob">.*?</tr>', (out / "index.html").read_text(), re.S).group(0)
    assert "<b>0.38 / 30</b>" in row and after["bob"]["commit"][:10] in row  # out of the specs' totals: 10 + 20
    # --resume with nothing left to do changes nothing and says so
    again = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--resume", *QUICK], work)
    assert again.returncode == 0 and "Grading 0 jobs (6 already graded, kept)" in again.stdout
    # an unknown student is a usage error
    bad = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--only", "zoe", *QUICK], work)
    assert bad.returncode == 2 and "no student 'zoe'" in bad.stderr


def _start(args: list[str], cwd: Path, sigint_ignored: bool = False) -> subprocess.Popen:
    """sigint_ignored: started as a shell script's background job is (SIGINT inherited ignored)."""
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(REPO_ROOT), TMPDIR=str(cwd / "tmp"))
    (cwd / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "grader", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None)


def _wait_for(condition, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _processes_under(folder: Path) -> list[int]:
    """Our job processes (--out in their argv) and sandbox workers (their cwd is under TMPDIR)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if str(folder) in argv or cwd.startswith(str(folder)):
            found.append(int(proc.name))
    return found


@pytest.mark.slow
def test_killed_batch_resumes_to_completion_with_earlier_results_intact(tmp_path):
    roster = make_class(tmp_path, {"s1": "good", "s2": "missing_mask", "s3": "writes_nothing", "s4": "good"})
    args = ["grade", "--roster", str(roster), "--out", "out", "--device", "cpu", "--jobs", "2", "-a", "vector_add",
            "--case", "n=1", "--dtype", "float32", "--seed", "3"]
    out = tmp_path / "out"

    # 1. Ctrl-C after the first job is stored: a clean stop, the finished jobs kept, the dashboard
    # written; even where the grader was started with SIGINT ignored, as from a script's `&`
    proc = _start(args, tmp_path, sigint_ignored=True)
    # the first record stored: jobs 3 and 4 cannot both start and finish before the signal lands
    _wait_for(lambda: len(records(out)) >= 1)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, output
    assert "Interrupted" in output and "--resume" in output
    first = records(out)
    assert 1 <= len(first) < 4, output
    assert (out / "index.html").is_file() and len(grades(out)) == 4, output
    _wait_for(lambda: not _processes_under(tmp_path), 120)

    # 2. SIGKILL while resuming: no chance to clean up; its job processes die with it
    proc = _start([*args, "--resume"], tmp_path)
    _wait_for(lambda: len(records(out)) > len(first) or proc.poll() is not None)
    proc.kill()
    output = proc.communicate(timeout=120)[0]
    _wait_for(lambda: not _processes_under(tmp_path), 120)
    second = records(out)
    assert all(second[k] == v for k, v in first.items()), output
    # a job cut off by the kill may have stored "not graded" (its worker died under it): retried below
    graded = {k: v for k, v in second.items() if json.loads(v)["status"] == "graded"}
    assert all(json.loads(v)["status"] == "infra_error" for k, v in second.items() if k not in graded), second

    # 3. resume completes the class; nothing graded before is graded again or changed
    run = run_cli([*args, "--resume"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Grading {4 - len(graded)} jobs ({len(graded)} already graded, kept)" in run.stdout
    final = records(out)
    assert len(final) == 4 and all(final[k] == v for k, v in graded.items()), run.stdout
    g = grades(out)
    assert [g[s]["vector_add"] for s in ("s1", "s2", "s3", "s4")] == ["0.13", "0", "0", "0.13"], run.stdout
    s3 = json.loads((out / "students" / "s3" / "results.json").read_text())
    assert "never written" in s3["tests"][0]["output"]
    runs = json.loads((out / "batch.json").read_text())["runs"]
    assert runs[0]["interrupted"] is True and runs[-1].get("interrupted") is None
    assert len({r["seed"] for r in [json.loads(v) for v in final.values()]}) == 1  # one seed for the class


@pytest.mark.parametrize("args,message", [
    (["--lock", "lock.json", "--roster", "roster.csv"], "give either --roster ROSTER or --lock LOCK"),
    (["--lock", "lock.json", "--reference-dir", "nowhere"], "--reference-dir nowhere: no such folder"),
    (["--lock", "nowhere.json"], "lock file nowhere.json: no such file (write one with `grader fetch`)"),
])
def test_grade_usage_errors_exit_2_with_one_line(tmp_path, args, message):
    run = run_cli(["grade", *args, "--device", "cpu"], tmp_path)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_grade_takes_the_isolation_and_every_record_says_it(tmp_path):
    """`grader grade --isolation none` grades as `grader check --isolation none` does, and says so."""
    roster = make_class(tmp_path, {"alice": "good"})
    run = run_cli(["grade", "--roster", str(roster), "--out", "out", "--device", "cpu", "--jobs", "1", "-a", "vector_add",
                   "--case", "n=1", "--dtype", "float32", "--isolation", "none"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "isolation none" in run.stdout and "--isolation none: the worker runs as you" in run.stderr
    record = json.loads((tmp_path / "out" / "students" / "alice" / "jobs" / "vector_add.json").read_text())
    assert record["environment"]["isolation"]["mode"] == "none" and record["key"]["options"]["isolation"] == "none"
    assert record["result"]["tests"][0]["outcome"] == "passed"
    bad = run_cli(["grade", "--roster", str(roster), "--out", "out2", "--device", "cpu", "--isolation", "chroot"], tmp_path)
    assert bad.returncode == 2 and "--isolation must be one of sandbox, docker, none, not 'chroot'" in bad.stderr
