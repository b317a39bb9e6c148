"""`grader course check` (grader.kit.coursecheck) on courses outside the grader's repo: a course
made by `grader course new` and `grader assignment new` passes as written, in each shape; each
breakage of an assignment is one line with its file and line, exit 1; and `grader release`
refuses to ship it, writing nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import run_cli
from grader import spec as specs
from grader.kit import coursecheck


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A course of one elementwise assignment, relu, made by the commands alone."""
    root = tmp_path_factory.mktemp("courses")
    assert run_cli(["course", "new", "mine"], root).returncode == 0
    made = run_cli(["assignment", "new", "relu", "--shape", "elementwise", "--course", "mine"], root)
    assert made.returncode == 0, made.stdout + made.stderr
    return root / "mine"


def _copy(course: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(course, tmp_path / "course")
    return tmp_path / "course"


def _check(course: Path, *more: str):
    return run_cli(["course", "check", "--course", str(course), *more], course.parent)


def test_a_new_course_has_what_the_issue_of_a_course_needs(made):
    for part in ("assignments", "reference", "solutions", "course.toml", "README.md",
                 ".github/workflows/course-check.yml"):
        assert (made / part).exists(), part
    assert "grader course check --course ." in (made / ".github/workflows/course-check.yml").read_text()
    assert "course.toml" in (made / "README.md").read_text()
    for part in ("assignments/relu/spec.py", "assignments/relu/hidden.py", "assignments/relu/README.md",
                 "assignments/relu/starter/kernels/relu.py", "reference/relu.py", "solutions/kernels/relu.py"):
        assert (made / part).is_file(), part
    assert ".grader/report.html" in (made / "assignments/relu/README.md").read_text()


def test_every_shape_passes_the_check_as_written(made, tmp_path):
    course = _copy(made, tmp_path)
    for name, shape in (("row_sum", "rowwise"), ("mm", "matmul")):
        run = run_cli(["assignment", "new", name, "--shape", shape, "--course", str(course)], tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
    run = _check(course)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ok: mm, relu, row_sum" in run.stdout
    assert run.stdout.count(coursecheck.NO_GPU_NOTE) == 1, run.stdout  # said once, not per assignment
    for name in ("relu", "row_sum", "mm"):  # each starter fails, with its one-line cause
        assert re.search(rf"{name}: the starter fails as it should: raised on \S+ \[float32\]: NotImplementedError",
                         run.stdout), run.stdout


def _break(course: Path, path: str, old: str, new: str) -> int:
    """Replace `old` in the course's `path`; the line where the change is."""
    file = course / path
    text = file.read_text()
    assert old in text, (path, old)
    file.write_text(text.replace(old, new, 1))
    return text[:text.index(old)].count("\n") + 1


def test_each_breakage_is_one_line_with_its_file_and_line_and_release_refuses_it(made, tmp_path):
    course = _copy(made, tmp_path)
    for name in ("add1", "add2"):
        assert run_cli(["assignment", "new", name, "--course", str(course)], tmp_path).returncode == 0
    _break(course, "reference/relu.py", "    return out\n", "    return x\n")  # the reference returns its input
    _break(course, "reference/add1.py", "def add1(", "def add_one(")  # it does not export the function
    line = _break(course, "assignments/add2/spec.py", '    n, stride = params["n"], params.get("stride", 1)\n',
                  '    n, stride = params["nn"], params.get("stride", 1)\n')  # make_inputs raises
    run = _check(course)
    assert run.returncode == 1, run.stdout + run.stderr
    relu_def = coursecheck.defines(course / "reference/relu.py", "relu")
    expected = [
        f"reference/relu.py:{relu_def}: the reference does not pass ",
        "reference/add1.py: the reference does not define add1() (SPEC.function)",
        f"assignments/add2/spec.py:{line}: make_inputs() raised KeyError: 'nn' on case n=1 [float32]: the assignment is "
        "broken",
    ]
    for words in expected:
        assert words in run.stderr, (words, run.stderr)
    assert "the result equals the input x" in run.stderr, run.stderr
    assert run.stderr.count("make_inputs() raised") == 1, run.stderr  # once, not once per role
    assert "3 problems" in run.stderr, run.stderr

    kit = tmp_path / "kit"
    released = run_cli(["--course", str(course), "release", "--out", str(kit), "--grader-requirement",
                        "grader==0.1.0"], tmp_path)
    assert released.returncode == 2 and not kit.exists(), released.stdout + released.stderr
    for words in expected:
        assert words in released.stderr, (words, released.stderr)
    assert "the kit was not written: 3 problem(s)" in released.stderr, released.stderr
    alone = run_cli(["--course", str(course), "release", "--out", str(kit), "-a", "relu"], tmp_path)
    assert alone.returncode == 2 and "add1" not in alone.stderr and not kit.exists(), alone.stderr  # only what ships


def test_function_signature_handout_and_ops_must_agree(made, tmp_path):
    course = _copy(made, tmp_path)
    spec_file = "assignments/relu/spec.py"
    line = _break(course, spec_file, 'function="relu"', 'function="relU"')
    ops = _break(course, spec_file, 'forbidden_ops=aten_ops("relu"',
                 'forbidden_ops=frozenset({"aten::relu_fast"}) | aten_ops("relu"')
    run = _check(course, "-a", "relu")
    assert run.returncode == 1
    assert (f"{spec_file}:{line}: SPEC.function is 'relU' but SPEC.signature names 'relu'") in run.stderr, run.stderr
    assert f"{spec_file}:{ops}: SPEC.forbidden_ops names 'aten::relu_fast', which is no aten op" in run.stderr
    assert "assignments/relu/README.md: the handout never names the function relU()" in run.stderr
    assert "assignments/relu/starter/kernels/relu.py: the starter does not define relU()" in run.stderr


def test_a_reference_that_calls_a_forbidden_op_and_a_timing_case_that_reads_more_than_it_names(made, tmp_path):
    course = _copy(made, tmp_path)
    _break(course, "reference/relu.py", "    return out\n", "    return torch.relu(x)\n")
    line = _break(course, "assignments/relu/spec.py", "bytes_moved=lambda p, dt: 2 * p[\"n\"]",
                  "bytes_moved=lambda p, dt: p[\"n\"] // 4")
    run = _check(course)
    assert run.returncode == 1
    assert "reference/relu.py: the reference calls aten::relu, which SPEC.forbidden_ops forbids" in run.stderr, \
        run.stderr
    assert f"assignments/relu/spec.py:{line}: the timing case n=2^26 reads 268435456 bytes of inputs but " \
           "Performance.bytes_moved says 67108864" in run.stderr, run.stderr


def test_a_spec_that_does_not_load_is_named_with_its_line(made, tmp_path):
    course = _copy(made, tmp_path)
    line = _break(course, "assignments/relu/spec.py", "def truth(", "raise RuntimeError('no data')\n\n\ndef truth(")
    run = _check(course)
    assert run.returncode == 1
    assert f"assignments/relu/spec.py:{line}: does not import: RuntimeError: no data (line {line})" in run.stderr, \
        run.stderr


def test_course_ops_prints_the_aten_ops_a_reference_calls(made, tmp_path):
    course = _copy(made, tmp_path)
    (tmp_path / "torch_relu.py").write_text("import torch\n\ndef relu(x):\n    return torch.relu(x)\n")
    run = run_cli(["course", "ops", "relu", "--course", str(course), "--module", str(tmp_path / "torch_relu.py")],
                  tmp_path)
    assert run.returncode == 0 and "aten::relu" in run.stdout.split(), run.stdout + run.stderr


def test_a_course_proved_once_is_not_run_again_while_unchanged(made, tmp_path, monkeypatch):
    course = specs.Course(_copy(made, tmp_path))
    calls = []
    real = coursecheck.check_course
    monkeypatch.setattr(coursecheck, "check_course", lambda c, n: calls.append(n) or real(c, n, run=False))
    assert coursecheck.proved(course, ["relu"], tmp_path / "stamps").ok
    assert coursecheck.proved(course, ["relu"], tmp_path / "stamps").ok and calls == [["relu"]]
    _break(course.root, "reference/relu.py", "    return out\n", "    return out  # changed\n")
    assert coursecheck.proved(course, ["relu"], tmp_path / "stamps").ok and len(calls) == 2  # changed: run again


def test_real_aten_op():
    assert coursecheck.real_aten_op("aten::add.Tensor") and coursecheck.real_aten_op("aten::relu")
    assert not coursecheck.real_aten_op("aten::relu_fast") and not coursecheck.real_aten_op("add.Tensor")
    assert not coursecheck.real_aten_op("aten::add.NoSuchOverload")


def test_new_course_and_assignment_refuse_what_they_cannot_write(made, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    run = run_cli(["course", "new", "full"], tmp_path)
    assert run.returncode == 2 and "is not an empty folder" in run.stderr
    for name, shape, words in (("relu", "elementwise", "relu exists already"), ("Bad-Name", "elementwise", "no assignment name"),
                               ("gelu", "conv", "--shape 'conv': one of elementwise, rowwise, matmul")):
        run = run_cli(["assignment", "new", name, "--shape", shape, "--course", str(made)], tmp_path)
        assert run.returncode == 2 and words in run.stderr, run.stderr


def test_a_new_course_is_released_checked_and_graded_by_grader_commands(made, tmp_path):
    """From the course the commands made: the kit (course check first), a student's check of the
    solution and of the starter, and a class of three graded."""
    import csv
    import shutil

    from tests.classbuild import commit, git

    kit = tmp_path / "kit"
    released = run_cli(["--course", str(made), "release", "--out", str(kit), "--grader-requirement",
                        "grader==0.1.0"], tmp_path)
    assert released.returncode == 0, released.stdout + released.stderr
    assert "Checking relu first" in released.stdout and (kit / "kernels" / "relu.py").is_file()
    assert not list(kit.rglob("hidden.py")) and not (kit / "solutions").exists() and not (kit / "reference").exists()
    repos = {}
    for student, source in (("alice", made / "solutions"), ("bob", kit), ("carol", made / "solutions")):
        repo = tmp_path / "repos" / student
        shutil.copytree(kit, repo)
        shutil.copytree(source / "kernels", repo / "kernels", dirs_exist_ok=True)
        git(repo, "init", "-q", "-b", "main")
        commit(repo, "submission", "2026-01-10T12:00:00+00:00")
        repos[student] = repo
    quick = ["--device", "cpu", "--case", "n=1", "--case", "n=1000", "--dtype", "float32", "--seed", "5"]
    good = run_cli(["--course", str(made), "check", str(repos["alice"]), "-a", "relu", *quick], tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    starter = run_cli(["--course", str(made), "check", str(repos["bob"]), "-a", "relu", *quick], tmp_path)
    assert starter.returncode == 1 and "NotImplementedError" in starter.stdout, starter.stdout
    (tmp_path / "roster.csv").write_text("student,repo\n" + "".join(f"{s},repos/{s}\n" for s in repos))
    graded = run_cli(["--course", str(made), "grade", "--roster", "roster.csv", "--out", "class", "-a", "relu",
                      "--jobs", "1", *quick], tmp_path)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "class" / "grades.csv").open())}
    assert set(rows) == {"alice", "bob", "carol"}, rows
    column = next(c for c in rows["alice"] if c.startswith("relu"))
    assert float(rows["alice"][column]) > float(rows["bob"][column]) == 0, rows


def test_every_command_takes_the_course_folder(made, tmp_path):
    listed = run_cli(["--course", str(made), "list"], tmp_path)
    assert listed.returncode == 0 and "relu" in listed.stdout and "vector_add" not in listed.stdout, listed.stdout
    (tmp_path / "empty").mkdir()
    refused = run_cli(["--course", str(tmp_path / "empty"), "list"], tmp_path)
    assert refused.returncode == 2 and "is no course folder" in refused.stderr, refused.stderr


def test_a_reference_that_raises_and_a_starter_that_passes(made, tmp_path):
    course = _copy(made, tmp_path)
    line = _break(course, "reference/relu.py", "    n = out.numel()\n", "    n = out.numel()\n    assert n > 1, 'too short'\n")
    (course / "assignments/relu/starter/kernels/relu.py").write_text((course / "solutions/kernels/relu.py").read_text())
    run = _check(course)
    assert run.returncode == 1
    assert f"reference/relu.py:{line + 1}: the reference raised on n=1 [float32]: AssertionError: too short" in \
        run.stderr, run.stderr
    starter = coursecheck.defines(course / "assignments/relu/starter/kernels/relu.py", "relu")
    assert f"assignments/relu/starter/kernels/relu.py:{starter}: the starter passes n=1 [float32]: students would " \
           "have nothing to write" in run.stderr, run.stderr


def _timed_course(made: Path, tmp_path: Path, against: str = "") -> specs.Course:
    """A copy of the course whose timing case is small enough to make here (the clock is faked)."""
    course = _copy(made, tmp_path)
    _break(course, "assignments/relu/spec.py", 'Case("n=2^26", {"n": 1 << 26})', 'Case("n=2^12", {"n": 1 << 12})')
    if against:
        _break(course, "assignments/relu/spec.py", "        dtype=\"float32\",\n", f"        dtype=\"float32\",\n"
               f"        against={against!r},\n")
    return specs.Course(course)


def _clock(reference_ms: float, baseline_ms: float, seen: list):
    """A fake GPU clock: the baseline is really called (on the CPU) so its inputs are the timing case's."""
    def clock(who, call):
        if who == "baseline":
            seen.append(call())
        return {"reference": reference_ms, "baseline": baseline_ms}[who]
    return clock


def test_a_reference_slower_than_torchs_baseline_is_named_with_its_file_and_line(made, tmp_path):
    catalogue = _timed_course(made, tmp_path)
    spec, seen = catalogue.get("relu"), []
    report = coursecheck.CourseReport(catalogue.root)
    found = coursecheck.reference_speed(catalogue, spec, report, _clock(3.0, 2.0, seen), device="cpu")
    line = coursecheck.defines(catalogue.root / "reference/relu.py", "relu")
    assert line > 0
    assert [f.shown(catalogue.root) for f in found] == [
        f"reference/relu.py:{line}: reference takes 3.000 ms, torch's baseline 2.000 ms (1.50x): students will be "
        "scored against a slower bar"]
    assert len(seen) == coursecheck.SPEED_ROUNDS and all(out.shape == (1 << 12,) for out in seen)


def test_a_reference_as_fast_as_the_baseline_or_within_the_margin_is_no_problem(made, tmp_path):
    catalogue = _timed_course(made, tmp_path)
    spec = catalogue.get("relu")
    for reference_ms in (1.0, 2.0, 2.0 * coursecheck.SLOWER_MARGIN - 0.01):
        report = coursecheck.CourseReport(catalogue.root)
        assert coursecheck.reference_speed(catalogue, spec, report, _clock(reference_ms, 2.0, []), device="cpu") == []
        assert report.notes and "relu: reference takes" in report.notes[0], report.notes


def test_a_slower_reference_where_the_faster_is_the_bar_is_a_note(made, tmp_path):
    catalogue = _timed_course(made, tmp_path, against="faster")
    spec = catalogue.get("relu")
    assert spec.performance is not None and spec.performance.against == "faster"
    report = coursecheck.CourseReport(catalogue.root)
    assert coursecheck.reference_speed(catalogue, spec, report, _clock(3.0, 2.0, []), device="cpu") == []
    assert report.notes == ["relu: reference takes 3.000 ms, torch's baseline 2.000 ms (1.50x): "
                            "Performance(against=\"faster\") scores students against the faster of the two"]


def test_a_baseline_that_raises_when_timed_is_the_courses_error_at_its_line(made, tmp_path):
    catalogue = _timed_course(made, tmp_path)
    line = _break(Path(catalogue.root), "assignments/relu/spec.py", "def baseline(x: torch.Tensor) -> torch.Tensor:\n",
                  "def baseline(x: torch.Tensor) -> torch.Tensor:\n    raise KeyError('n')\n")
    spec = catalogue.get("relu")
    found = coursecheck.reference_speed(catalogue, spec, coursecheck.CourseReport(catalogue.root),
                                        _clock(1.0, 1.0, []), device="cpu")
    assert [f.shown(catalogue.root).split(" on case ")[0] for f in found] == [
        f"assignments/relu/spec.py:{line + 1}: baseline() raised KeyError: 'n'"]


def test_course_check_refuses_device_cuda_without_a_gpu(made, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    run = _check(made, "--device", "cuda")
    assert run.returncode == 2 and "torch sees no CUDA GPU" in run.stderr, run.stderr
    run = _check(made, "--device", "tpu")
    assert run.returncode == 2 and "--device must be auto, cuda or cpu" in run.stderr, run.stderr


def test_where_a_gpu_is_found_the_course_check_times_each_reference_after_proving_it(made, tmp_path, monkeypatch):
    """check_course's wiring, the GPU stood in for (its device the CPU, the clock faked): the slower
    reference is one of the check's problems; an assignment already found broken is not timed."""
    catalogue = _timed_course(made, tmp_path)
    monkeypatch.setattr(coursecheck, "speed_device", lambda device: "cpu")
    timed: list = []
    report = coursecheck.check_course(catalogue, ["relu"], clock=_clock(3.0, 2.0, timed))
    assert [line.split(": ", 1)[1] for line in report.lines()] == [
        "reference takes 3.000 ms, torch's baseline 2.000 ms (1.50x): students will be scored against a slower bar"]
    assert coursecheck.NO_GPU_NOTE not in report.notes and len(timed) == coursecheck.SPEED_ROUNDS
    _break(Path(catalogue.root), "solutions/kernels/relu.py", "def relu(", "def relu_renamed(")
    timed.clear()
    report = coursecheck.check_course(specs.Course(catalogue.root), ["relu"], clock=_clock(3.0, 2.0, timed))
    assert report.findings and not timed and not any("slower bar" in line for line in report.lines()), report.lines()
