"""Public and hidden cases, and where random shapes come from (the course secret, or the run's seed alone)."""

from __future__ import annotations

import hashlib
import random
import shutil
from dataclasses import replace

import pytest

from tests.conftest import SANDBOX, COURSE, REPO_ROOT
from grader.settings import Settings
from grader import spec as specs
from grader.judge.grade import hidden_note
from grader.judge.plan import cases_for, plan_calls
from grader.settings import from_environment


def _shape_seed(*parts: str) -> int:
    """sha256 of the parts joined by ':', first 8 bytes little-endian, top bit dropped (63 bits)."""
    return int.from_bytes(hashlib.sha256(":".join(parts).encode()).digest()[:8], "little") >> 1


def test_hidden_py_cases_are_graded_and_marked(monkeypatch):
    monkeypatch.delenv("GRADER_COURSE_SECRET", raising=False)
    spec = COURSE.get("vector_add")
    hidden = [c.name for c in spec.cases if c.hidden]
    assert hidden[:2] == ["n=4095", "strided-n=3001-stride=3"] and spec.hidden_count == len(hidden) == 6
    assert "n=4095" not in (spec.folder / "spec.py").read_text()  # they live in hidden.py alone
    assert [c.name for c in spec.public_cases] == [c.name for c in spec.cases if not c.hidden]
    calls = plan_calls(spec, 1, interpret=True)
    assert {c.case.name for c in calls if c.case.hidden} == set(hidden)  # the TA's runs include them
    assert "6 of these cases are hidden from students" in hidden_note(spec)
    assert hidden_note(COURSE.get("matmul_relu")) == ""


def test_random_shapes_come_from_the_secret_where_there_is_one(tmp_path):
    spec = COURSE.get("softmax")

    def randoms(course: specs.Course) -> list[str]:  # softmax's random cases, as loaded by `course`
        return [c.name for c in cases_for(specs._load_spec(spec.folder, course), 9) if c.name.startswith("random")]

    public = randoms(specs.Course(tmp_path))  # no assignments/course-secret.txt there
    assert public == [c.name for c in spec.random_cases(random.Random(_shape_seed("9", "softmax", "shapes")))]
    graded = randoms(specs.Course(tmp_path, secret="s3"))  # GRADER_COURSE_SECRET=s3
    assert graded == [c.name for c in spec.random_cases(random.Random(_shape_seed("9", "softmax", "shapes", "s3")))]
    assert graded != public  # a kit (no secret) cannot draw the graded shapes, even knowing the seed
    assert graded == randoms(specs.Course(tmp_path, secret="s3"))  # but they are replayable
    (tmp_path / "assignments").mkdir()
    (tmp_path / "assignments" / "course-secret.txt").write_text("s3\n")
    assert randoms(specs.Course(tmp_path)) == graded  # the file, same secret


def test_a_kit_knows_how_many_hidden_cases_it_lacks(tmp_path):
    kit = tmp_path / "kit"
    shutil.copytree(REPO_ROOT / "assignments" / "vector_add", kit / "assignments" / "vector_add",
                    ignore=shutil.ignore_patterns("hidden.py", "starter", "__pycache__"))
    (kit / "grader-kit.toml").write_text('grader = "0.1.0"\n\n[assignments.vector_add]\nhidden_cases = 6\n')
    spec = specs.Course(kit).get("vector_add")
    assert not any(c.hidden for c in spec.cases) and spec.withheld_cases == spec.hidden_count == 6
    assert hidden_note(spec).startswith("6 hidden case(s) of vector_add are not in this kit: they run at grading time")


def test_the_tas_course_wins_over_a_kit_around_the_working_directory(monkeypatch, tmp_path):
    """A submission is a clone of the kit (public specs, grader-kit.toml): grading from inside it
    must still use the course installed beside the grader, never the student's copy of the specs."""
    (tmp_path / "grader-kit.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    assert from_environment({}).course_folder() == REPO_ROOT
    assert from_environment({"GRADER_COURSE": str(tmp_path / "elsewhere")}).course_folder() == tmp_path / "elsewhere"


def test_a_hidden_py_of_the_wrong_shape_says_so(tmp_path):
    (tmp_path / "hidden.py").write_text("CASES = ({'name': 'n=5'},)\n")
    with pytest.raises(specs.SpecError) as refused:
        specs._load_hidden(tmp_path)
    assert refused.value.broken == {tmp_path / "hidden.py": ["CASES must be a tuple of Case(...)"]}


def test_resumed_grades_are_keyed_on_hidden_cases_and_the_secret(monkeypatch, tmp_path):
    from grader.batch.jobs import spec_fingerprint

    spec = specs._load_spec(COURSE.get("vector_add").folder, specs.Course(tmp_path))  # no secret there
    plain = spec_fingerprint(spec, spec.reference_module())
    one = spec_fingerprint(replace(spec, course=specs.Course(tmp_path, secret="one")), spec.reference_module())
    two = spec_fingerprint(replace(spec, course=specs.Course(tmp_path, secret="two")), spec.reference_module())
    assert len({plain, one, two}) == 3  # other random shapes: not the same grade
    folder = tmp_path / "vector_add"
    shutil.copytree(spec.folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    object.__setattr__(spec, "folder", folder)
    try:
        before = spec_fingerprint(spec, spec.reference_module())
        (folder / "hidden.py").write_text((folder / "hidden.py").read_text() + "\n# one more case later\n")
        assert spec_fingerprint(spec, spec.reference_module()) != before  # hidden.py changed: regrade
    finally:
        object.__setattr__(spec, "folder", REPO_ROOT / "assignments" / "vector_add")


def test_the_secret_never_reaches_a_worker(monkeypatch, tmp_path):
    from grader.sandbox.launch import worker_env
    from grader.sandbox.namespaces import sandbox_view

    monkeypatch.setenv("GRADER_COURSE_SECRET", "do-not-pass")
    env = worker_env(tmp_path, interpret=True, gpu=None)
    assert "do-not-pass" not in "".join(env.values()) and "GRADER_COURSE_SECRET" not in env
    bound = [path for path, _ in sandbox_view(tmp_path, [], [], settings=Settings(), code=SANDBOX.worker_code())["binds"]]
    assignments = str((COURSE.root / "assignments").resolve())
    # hidden.py files and the secret file: no bound folder holds them (the view is an allowlist)
    assert bound and not [b for b in bound if assignments == b or assignments.startswith(b.rstrip("/") + "/")], bound
