"""Similarity across a class: a disguised copy is the top pair, independent correct solutions
stay under the default threshold, the starter and the class's idioms do not count, and the
side-by-side page marks the matching regions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.disguise import disguise
from grader.batch.similarity import DEFAULT_THRESHOLD, Pair, compare_class, side_by_side
from tests.conftest import COURSE

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
ASSIGNMENTS = ["vector_add", "softmax", "layernorm", "rmsnorm", "matmul_relu", "conv2d", "flash_attention", "dropout"]


def starter(a: str) -> str:
    return (ROOT / "assignments" / a / "starter" / "kernels" / f"{a}.py").read_text()


def good(a: str) -> str:
    return (FIXTURES / "good" / "kernels" / f"{a}.py").read_text()


def test_renamed_and_reordered_copy_is_the_top_pair_and_independent_solutions_are_not_listed():
    files = {
        "alice": good("softmax"),
        "bob": (FIXTURES / "softmax_renamed" / "kernels" / "softmax.py").read_text(),  # alice's, every name changed, reordered
        "carol": (FIXTURES / "softmax_independent" / "kernels" / "softmax.py").read_text(),  # written apart, also correct
        "dan": (ROOT / "reference" / "softmax.py").read_text(),  # the instructor's: a third independent solution
    }
    everything, _, counts = compare_class(files, starter("softmax"), "softmax", threshold=0.0)
    assert (everything[0].a, everything[0].b) == ("alice", "bob")
    assert everything[0].score >= DEFAULT_THRESHOLD
    assert all(p.score < DEFAULT_THRESHOLD for p in everything[1:]), everything
    listed, _, _ = compare_class(files, starter("softmax"), "softmax")
    assert [(p.a, p.b) for p in listed] == [("alice", "bob")]
    assert counts["files"] == 4 and counts["pairs"] == 6


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_assignment_a_disguised_copy_is_caught_and_the_reference_is_not(assignment):
    files = {"alice": good(assignment), "bob": disguise(good(assignment)), "carol": (ROOT / "reference" / f"{assignment}.py").read_text()}
    pairs, _, _ = compare_class(files, starter(assignment), assignment, threshold=0.0)
    assert (pairs[0].a, pairs[0].b) == ("alice", "bob") and pairs[0].score >= DEFAULT_THRESHOLD, pairs
    assert all(p.score < DEFAULT_THRESHOLD for p in pairs[1:]), pairs


def test_the_starter_is_boilerplate():
    # two students who handed in the starter untouched share nothing of their own
    pairs, fps, _ = compare_class({"a": starter("softmax"), "b": starter("softmax")}, starter("softmax"), "softmax", threshold=0.0)
    assert pairs == [] and all(not fp.hashes for fp in fps.values())
    # without the starter as boilerplate the same two are identical
    pairs, _, _ = compare_class({"a": starter("softmax"), "b": starter("softmax")}, None, "softmax", threshold=0.0)
    assert pairs and pairs[0].score == 1.0


def test_with_common_share_code_shared_by_much_of_the_class_is_an_idiom_not_evidence():
    idiom = '''
def grid_for(n_rows: int, n_cols: int, block: int) -> tuple:
    """The launch grid every student copied from the lecture notes."""
    rows_per_program = max(1, block // max(1, n_cols))
    programs = (n_rows + rows_per_program - 1) // rows_per_program
    return (programs, rows_per_program, min(block, triton.next_power_of_2(n_cols)))
'''
    # 12 unrelated modules (different kernels; the references of the last four, which share little with `good`)
    bodies = [good(a) for a in ASSIGNMENTS] + [(ROOT / "reference" / f"{a}.py").read_text() for a in ASSIGNMENTS[4:]]
    files = {f"s{i:02d}": body + idiom for i, body in enumerate(bodies)}
    files["copy"] = disguise(good("conv2d")) + idiom
    pairs, _, counts = compare_class(files, None, "mixed", threshold=0.0, common_share=0.2)
    assert counts["files"] == 13 and counts["idioms_dropped"] > 0
    assert (pairs[0].a, pairs[0].b) == ("copy", "s05") and pairs[0].score >= DEFAULT_THRESHOLD  # conv2d is the 6th body
    assert all(p.score < DEFAULT_THRESHOLD for p in pairs[1:]), pairs[:3]
    # counted as evidence, the shared function would lift every pair (and MOSS's -m exists for this)
    kept, _, counts = compare_class(files, None, "mixed", threshold=0.0)  # the default: off
    assert counts["idioms_dropped"] == 0
    assert sum(p.score for p in kept[1:]) > 2 * sum(p.score for p in pairs[1:])


def test_side_by_side_marks_both_files_and_escapes_them():
    a = good("softmax") + '\n# <script>alert("x")</script>\n'
    b = (FIXTURES / "softmax_renamed" / "kernels" / "softmax.py").read_text()
    pairs, fps, _ = compare_class({"alice": a, "bob": b}, starter("softmax"), "softmax")
    page = side_by_side(pairs[0], fps, {"commits": {"alice": "a" * 40}, "module": "kernels/softmax.py", "title": "Softmax",
                                        "threshold": DEFAULT_THRESHOLD})
    left, right = page.split("<pre>")[1], page.split("<pre>")[2]
    assert left.count("<mark>") >= 2 and right.count("<mark>") >= 2  # the kernel and the wrapper, in either order
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<link" not in page and "http" not in page.replace("http-equiv", "")
    marked = "".join(re.findall(r"<mark>(.*?)</mark>", right, re.S))
    assert "tl.maximum(biggest, tl.max(v, axis=0))" in marked  # bob's own names, found as alice's code
    assert "not a finding" in page and "aaaaaaaaaaaa" in page


def test_pair_json_round_trip():
    p = Pair("softmax", "a", "b", 0.9, 0.95, 0.9, "similarity/softmax/a--b.html")
    assert Pair(**p.to_json()) == p


def test_tokenizing_on_several_cores_gives_the_same_fingerprints():
    from grader.batch.similarity import PARALLEL_FROM, boilerplate_of, fingerprint_all

    sources = [good(a) for a in ASSIGNMENTS] + [disguise(good(a)) for a in ASSIGNMENTS]
    files = {f"s{i:02d}": sources[i % len(sources)] + f"\n# student {i}\n" for i in range(PARALLEL_FROM)}
    bp = boilerplate_of(starter("softmax"))
    serial, parallel = fingerprint_all(files, bp, jobs=1), fingerprint_all(files, bp, jobs=2)
    for s in files:
        a, b = serial[s], parallel[s]
        assert (a.hashes, a.filtered_code, a.token_coverage, a.raw_code) == (b.hashes, b.filtered_code, b.token_coverage, b.raw_code)
        assert (a.offsets == b.offsets).all() and a.hash_idx.keys() == b.hash_idx.keys()


def _class(tmp_path, modules: dict[str, str]):
    from types import SimpleNamespace

    from grader.batch.workspace import Lock, Pinned

    students = []
    for name, text in modules.items():
        (tmp_path / "repos" / name / "kernels").mkdir(parents=True)
        (tmp_path / "repos" / name / "kernels" / "softmax.py").write_text(text)
        students.append(Pinned(name, None, "fetched", path=f"repos/{name}", commit=name[0] * 40))
    view = SimpleNamespace(assignments=["softmax"], course=None, catalogue=COURSE, similarity={}, similarity_meta={})
    return view, Lock(students, "now", root=tmp_path)


def test_class_pages_are_written_and_reused_and_a_failure_costs_only_the_list(tmp_path, monkeypatch):
    import grader.batch.similarity as similarity

    view, lock = _class(tmp_path, {"alice": good("softmax"), "bob": (FIXTURES / "softmax_renamed" / "kernels" / "softmax.py").read_text(),
                                   "carol": (FIXTURES / "softmax_independent" / "kernels" / "softmax.py").read_text()})
    out = tmp_path / "out"
    similarity.update_similarity(view, out, lock)
    [pair] = view.similarity["softmax"]
    assert (pair.a, pair.b, pair.page) == ("alice", "bob", "similarity/softmax/alice--bob.html")
    assert "aaaaaaaaaaaa" in (out / pair.page).read_text()
    # nothing changed: the stored result is used, nothing is compared again
    monkeypatch.setattr(similarity, "compare_class", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("pygments choked")))
    similarity.update_similarity(view, out, lock)
    assert [p.page for p in view.similarity["softmax"]] == [pair.page]
    # a changed file is compared again; if that fails, the dashboard says so and goes on
    (tmp_path / "repos" / "carol" / "kernels" / "softmax.py").write_text(good("softmax"))
    similarity.update_similarity(view, out, lock)
    assert view.similarity["softmax"] == []
    assert view.similarity_meta["per_assignment"]["softmax"]["error"] == "RuntimeError: pygments choked"


def test_a_module_outside_the_checkout_is_not_read(tmp_path):
    secret = tmp_path / "secret.py"
    secret.write_text(good("softmax"))
    view, lock = _class(tmp_path, {"alice": good("softmax"), "bob": "x = 1\n"})
    target = tmp_path / "repos" / "bob" / "kernels" / "softmax.py"
    target.unlink()
    target.symlink_to(secret)  # a student's symlink to a file of the grading machine
    from grader.batch.similarity import update_similarity

    update_similarity(view, tmp_path / "out", lock)
    assert view.similarity_meta["per_assignment"]["softmax"]["files"] == 1 and view.similarity["softmax"] == []


def test_comparing_on_several_cores_gives_the_same_shares():
    from grader.batch.similarity import _shares, boilerplate_of, fingerprint_all

    sources = [good(a) for a in ASSIGNMENTS] + [disguise(good(a)) for a in ASSIGNMENTS]
    fps = fingerprint_all({f"s{i:02d}": text for i, text in enumerate(sources)}, boilerplate_of(None), jobs=1)
    pairs = [(a, b) for a in sorted(fps) for b in sorted(fps) if a < b]
    from grader.batch.similarity import PARALLEL_PAIRS

    many = pairs * (PARALLEL_PAIRS // len(pairs) + 1)  # enough to go to the pool
    assert _shares(fps, pairs, jobs=1) == _shares(fps, many, jobs=2)[:len(pairs)]


def test_without_copydetect_the_class_view_says_so_and_keeps_everything_else(tmp_path, monkeypatch):
    """A machine without copydetect (a declared dependency) grades the class all the same: the
    module imports, and each assignment's list says why it is empty."""
    import subprocess
    import sys
    import textwrap

    from tests.conftest import REPO_ROOT

    blocked = textwrap.dedent(f"""
        import sys
        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "copydetect":
                    raise ModuleNotFoundError("No module named 'copydetect'")
        sys.meta_path.insert(0, Missing())
        sys.path.insert(0, {str(REPO_ROOT)!r})
        import grader.batch.similarity as s
        import grader.batch.classview
        print("imported", type(s.MISSING).__name__)
    """)
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "imported ModuleNotFoundError", proc.stderr

    import grader.batch.similarity as similarity

    monkeypatch.setattr(similarity, "MISSING", ModuleNotFoundError("No module named 'copydetect'"))
    view, lock = _class(tmp_path, {"alice": good("softmax"), "bob": good("softmax")})
    similarity.update_similarity(view, tmp_path / "out", lock)
    assert view.similarity["softmax"] == []
    assert "copydetect is not installed here" in view.similarity_meta["per_assignment"]["softmax"]["error"]
    # the dashboard's section says it did not run, alone: no counts under it that read as if it ran
    from grader.batch.classview import _ENV
    from grader.batch.run import not_compared

    view.speed, view.titles = {}, {"softmax": "Row-wise softmax"}
    page = _ENV.get_template("class_review.html.j2").render(view=view).split("<h2>Similar submissions</h2>")[1]
    assert "Not compared: ImportError: copydetect is not installed here" in page
    assert "No pair of this assignment was looked at" in page
    assert "pairs," not in page and "at or above the threshold" not in page.split("Not compared")[1]
    # and the console of grader grade says so too (grader.cli.grade prints each line as a warning)
    (line,) = not_compared(view)
    assert line.startswith("similarity of softmax not compared: ImportError: copydetect is not installed here")


def test_similarity_without_the_ta_extra_says_how_to_get_it(monkeypatch, tmp_path):
    """copydetect is the TA's extra (grader[ta]), not installed with a student's grader."""
    from typer.testing import CliRunner

    from grader.batch import similarity as compare
    from grader.cli import app

    monkeypatch.setattr(compare, "MISSING", ImportError("No module named 'copydetect'"))
    result = CliRunner().invoke(app, ["similarity", "--class", str(tmp_path)])
    assert result.exit_code == 2 and 'pip install "grader[ta]"' in " ".join(result.output.split()), result.output
