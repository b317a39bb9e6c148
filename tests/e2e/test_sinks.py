"""Student text at every sink: each place the trusted side shows a student's text, attacked with
the text that place would run, through the code that writes it (and the real CLI for the slow
ones). Each test also checks that the honest part of the output is still there.

The Actions log is read as the runner reads it (`commands`): a line is a workflow command when,
after its leading white space, it starts with `::` (or holds the older `##[` form), unless
commands are stopped by `::stop-commands::TOKEN` until `::TOKEN::`.
"""

from __future__ import annotations

import csv
import html
import io
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import COURSE, build_submission, run_cli
from grader.kit import github as ci
from grader.results import AssignmentResult, RunResult, TestResult

HOSTILE = ("f | 6 / 6 |\n## Score: 100 / 100\n<img src=x onerror=alert(1)><script>alert(2)</script>\n"
           "::add-mask::x\n::error::forged\n  ::warning::indented\n::stop-commands::abc\n##[error]legacy\n"
           "\x1b[2J\x1b[8mhidden\x1b]0;pwned\x07 [bold red]markup[/] :smile: =HYPERLINK(\"http://x\")")
FORMULA = '=HYPERLINK("http://evil.example","click")'
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # newline and tab are text
ANNOTATION = re.compile(r"::error file=[^,:\n]*,line=\d+,title=[^:\n]*::[^\n]*"
                        # the Points notice: numbers and our words alone, no student text
                        # (github.score_words: the cpu-gradable basis, the whole one, the course's points)
                        r"|::notice title=Points::[\d.]+ / [\d.]+ points( gradable here)?"
                        r"( in the course's points \(no late penalty here: the course applies it at grading\))?"
                        r"( \(of [\d.]+ at grading: [\d.]+ need a GPU, graded on the course's GPU after the deadline\)"
                        r"| \([\d.]+ of them need a GPU: graded on the course's GPU after the deadline\))?")


def commands(log: str) -> list[str]:
    """The lines of `log` that GitHub's runner would run as workflow commands."""
    ran, stopped = [], None
    for line in log.splitlines():
        text = line.lstrip()
        if stopped is not None:
            if text == f"::{stopped}::":
                stopped = None
            continue
        if text.startswith("::") or "##[" in text:
            ran.append(text)
            if m := re.fullmatch(r"::stop-commands::(\S+)", text):
                stopped = m.group(1)
    assert stopped is None, f"commands stopped and never resumed: {stopped}"
    return ran


def only_our_commands(log: str) -> list[str]:
    """The commands of `log` other than our stop/resume pairs and the Points notice, each asserted
    to be one of our own annotations (the notice too: numbers and our words alone)."""
    ran = [c for c in commands(log) if not re.fullmatch(r"::stop-commands::[0-9a-f]{32}|::[0-9a-f]{32}::", c)]
    for c in ran:
        assert ANNOTATION.fullmatch(c) and "forged" not in c.split("::")[1], c
    ran = [c for c in ran if not c.startswith("::notice title=Points::")]
    return ran


def markdown_text(summary: str) -> str:
    """The summary less our own `<code>` tags and its code spans (where `<` and `|` are text, but
    not in a table row: rows are checked cell by cell)."""
    return re.sub(r"(`+).*?\1", "", summary.replace("<code>", "").replace("</code>", ""))


def cells(row: str) -> list[str]:
    """A GitHub table row's cells: split at every `|` (GitHub splits there even inside a code span)."""
    return row.strip().strip("|").split("|")


def no_controls(*texts: str) -> None:
    for text in texts:
        assert not CONTROL.search(text), repr(CONTROL.search(text).group())


def _hostile_run(tmp_path: Path) -> RunResult:
    """A run as the judge leaves it when a grader.toml names a hostile module and function and
    the kernel raises and prints hostile text."""
    (tmp_path / "kernels").mkdir(exist_ok=True)
    (tmp_path / "kernels" / "softmax.py").write_text("# the student's module\n" * 20)
    run = RunResult(str(tmp_path), 7, {})
    a = AssignmentResult("softmax", "Row-wise softmax", f"kernels/softmax.py:{HOSTILE}()", notes=[HOSTILE], headline=HOSTILE)
    traceback = (f'Traceback (most recent call last):\n  File "/tmp/grader-x/softmax/repo/kernels/softmax.py", line 12, in softmax\n'
                 f"    raise ValueError(HOSTILE)\nValueError: {HOSTILE}\n")
    a.tests += [
        TestResult("softmax", "correctness", "1x1 [float32]", "error", f"softmax() raised ValueError: {HOSTILE}", max_score=2.0,
                   case="1x1", dtype="float32", shape="1x1", traceback=traceback,
                   reproducer=f"grader check . -a softmax --case '1x1' `{HOSTILE}`"),
        TestResult("softmax", "correctness", "4x8191 [float32]", "crashed", "the worker died (status 3)", max_score=2.0,
                   case="4x8191", dtype="float32", shape="4x8191", output=HOSTILE),
        TestResult("softmax", "correctness", "2x2 [float32]", "passed", "ok", max_score=2.0, score=2.0, case="2x2",
                   dtype="float32", shape="2x2"),
    ]
    run.assignments.append(a)
    return run


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def live_tags(page: str) -> list:
    """Tags of `page` that a student's text could have made: images, event handlers,
    javascript: links, or a script holding the attack."""
    parser = _Tags()
    parser.feed(page)
    bad = [(t, a) for t, a in parser.tags if t in ("img", "iframe", "object", "embed") or any(k.startswith("on") for k in a)
           or any("javascript:" in (v or "") for v in a.values())]
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)
    return bad + [s for s in scripts if "alert(" in s]


# --- the GitHub job summary, annotations and Classroom's payload -------------------------------


def test_a_hostile_module_name_and_message_add_no_row_heading_or_tag_to_the_job_summary(tmp_path):
    text = ci.step_summary(_hostile_run(tmp_path), "cpu", {"softmax": 0})
    lines = text.splitlines()
    assert [x for x in lines if x.startswith("#")] == ["## Triton kernels: 2 / 6 points", "### Failing checks", "### Notes"]
    rows = [x for x in lines if x.lstrip().startswith("|")]
    assert len(rows) == 3 and all(len(cells(r)) == 6 for r in rows)  # the header, its rule, one assignment: six cells each
    assert "<" not in markdown_text(text) and "](" not in markdown_text(text) and "\x1b" not in text
    no_controls(text)
    shown = html.unescape(text)  # what GitHub renders: the student's words, as words
    assert "| softmax (<code>kernels/softmax.py:f | 6 / 6 |\\n## Score: 100 / 100" in shown
    assert "softmax() raised ValueError: f | 6 / 6 |\\n## Score" in shown
    fence, body = re.search(r"reproduce: (`+)(.*)$", text, re.M).groups()  # the code span outlasts every backtick run in it
    assert len(fence) == 2 and body.endswith(fence) and fence not in body[:-2]
    assert "| 2 / 6 | 1 | 2 | 0 | 0 |" in text  # the honest figures of the row


def test_a_check_that_cannot_run_reports_hostile_text_as_text(tmp_path):
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    ci.report_error(f"grader.toml: [assignments.{HOSTILE}] may only set module and function",
                    {"GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output)})
    text = summary.read_text()
    assert [x for x in text.splitlines() if x.startswith("#")] == ["## Triton kernels: the check could not run"]
    assert "<" not in text and "|" not in text
    no_controls(text)
    import base64
    import json

    payload = json.loads(base64.b64decode(output.read_text().split("=", 1)[1]))
    assert "\n" not in payload["tests"][0]["message"] and "may only set module" in payload["tests"][0]["message"]


def test_annotations_escape_the_students_message_and_keep_pointing_at_their_line(tmp_path):
    lines = ci.annotations(_hostile_run(tmp_path), tmp_path, tmp_path)
    assert len(lines) == 1 and "\n" not in lines[0] and "\r" not in lines[0]
    assert lines[0].startswith("::error file=kernels/softmax.py,line=12,title=softmax 1x1 [float32]%3A error::")
    assert "%0A::error::forged%0A" in lines[0] and "\\x1b[2J" in lines[0]
    no_controls(lines[0])
    assert only_our_commands("\n".join(lines)) == lines



def test_the_annotation_writer_escapes_every_property_and_the_message():
    """One writer of `::error`/`::warning`/`::notice` (grader.kit.annotations): a property value
    cannot end its property or the command, the message cannot end the command or start a line."""
    from grader.kit.annotations import command

    line = command("error", "m%\n::error::forged\r", file="a,b:c.py", line=12, title="t\n::warning::x")
    assert line == "::error file=a%2Cb%3Ac.py,line=12,title=t%0A%3A%3Awarning%3A%3Ax::m%25%0A::error::forged%0D"
    assert only_our_commands(line) == [line]
    assert command("notice", "2 / 6 points", title="Points") == "::notice title=Points::2 / 6 points"
    assert command("warning", "no properties") == "::warning::no properties"


def test_every_annotation_is_written_by_the_one_annotation_writer():
    """No module but grader/kit/annotations.py starts a `::error`, `::warning` or `::notice` line
    itself (a string or f-string that begins with one), so none can skip its escaping. The
    autograder.py that `release --classroom50` writes is a script of its own (it runs before the
    grader is installed): its template is one string, not a command of ours."""
    import ast

    import grader

    root = Path(grader.__file__).parent
    start = re.compile(r"\s*::(error|warning|notice)\b")
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "kit" / "annotations.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            first = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and start.match(first.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []

def test_the_classroom_payload_keeps_student_text_off_the_start_of_a_log_line(tmp_path):
    """The reporter prints each test's name and message in the job log: every line of a message
    starts with the grader's words."""
    payload = ci.classroom_payload(_hostile_run(tmp_path), tmp_path)
    for t in payload["tests"]:
        no_controls(t["name"], t["message"], t["test_code"])
        assert "\n" not in t["name"] and "\n" not in t["test_code"]
        for line in t["message"].splitlines():
            assert line.startswith(("[", "Reproduce: ", "ok")), line
    bad = next(t for t in payload["tests"] if t["name"] == "softmax: 1x1 [float32]")
    assert bad["status"] == "fail" and (bad["filename"], bad["line_no"]) == ("kernels/softmax.py", 12)
    assert bad["message"].startswith("[error] softmax() raised ValueError: f | 6 / 6 |\\n## Score")


# --- the terminal ----------------------------------------------------------------------------


def test_the_terminal_summary_shows_student_text_without_escapes_or_markup(tmp_path):
    from grader.cli import outputs
    from grader.cli.common import console

    with console.capture() as captured:
        outputs.print_summary(_hostile_run(tmp_path))
    out = captured.get()
    no_controls(out)
    assert "\\x1b[2J\\x1b[8mhidden" in out  # shown, not run
    assert "[bold red]markup[/]" in out and ":smile:" in out  # not read as rich markup or an emoji code
    assert "error softmax 1x1 [float32]: softmax() raised ValueError: f | 6 / 6 |\\n## Score" in out
    assert "reproduce: grader check . -a softmax --case '1x1'" in out and "Score: 2 / 6" in out


def test_commands_stay_stopped_around_what_a_console_prints(tmp_path):
    from rich.console import Console

    from grader.cli.common import commands_stopped, say, shown

    buffer = io.StringIO()
    console = Console(file=buffer, width=40, highlight=False, emoji=False)
    with commands_stopped(console, active=True):
        console.print(shown("word " * 7 + "::error::forged-by-wrapping", 500))  # a 40-column console wraps it to a line start
    say(console, f"warning: {shown(HOSTILE)}", active=True)
    log = buffer.getvalue()
    assert any(line.startswith("::error::forged") for line in log.splitlines())  # the attack is real here...
    assert only_our_commands(log) == []  # ...and runs nothing
    with commands_stopped(console, active=False):
        pass
    assert buffer.getvalue() == log  # outside Actions: nothing added


# --- the gradebooks, the report, Gradescope ------------------------------------------------------


def _view(hostile_note: str):
    from grader.batch.classview import Cell, Row

    rows = [
        Row(FORMULA, "HYPERLINK", "fetched", name="+SUM(A1:A9)", github_username="@evil", repo="-1+1", commit="abc",
            cells={"vector_add": Cell("vector_add", "graded", 4.5, 10.0), "softmax": Cell("softmax", "infra_error", note=hostile_note)}),
        Row("\x1b[2Jmallory", "mallory", "unfetched", reason=hostile_note, cells={"vector_add": Cell("vector_add", "unfetched"),
                                                                                   "softmax": Cell("softmax", "unfetched")}),
        Row("alice", "alice", "fetched", name="Alice", commit="def",
            cells={"vector_add": Cell("vector_add", "graded", 10.0, 10.0), "softmax": Cell("softmax", "graded", 0.0, 20.0)}),
    ]
    return SimpleNamespace(assignments=["vector_add", "softmax"], rows=rows, late={}, course=None, catalogue=COURSE)


def assert_safe_csv(text: str) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(text)))
    for row in rows:
        for cell in row:
            no_controls(cell)
            if cell[:1] in ("=", "+", "-", "@", "\t", "\r"):
                assert re.fullmatch(r"-?\d+(\.\d+)?", cell), f"a formula cell: {cell!r}"
    return rows


def test_no_gradebook_cell_is_a_formula_or_holds_a_control_character():
    from grader.batch.exporters import EXPORTS

    view = _view(f"grader.toml: [assignments.{HOSTILE}] may only set module and function")
    for name, export in EXPORTS.items():
        rows = assert_safe_csv(export(view))
        text = "\n".join(",".join(r) for r in rows)
        assert "'" + FORMULA in text or "'+SUM(A1:A9)" in text, name  # the student is there, as text
    grades = {r[0]: r for r in assert_safe_csv(EXPORTS["grades.csv"](view))}
    assert grades["'" + FORMULA][2] == "4.5" and grades["alice"][2:5] == ["10", "0", "10"]  # scores stay numbers
    assert "\\x1b[2Jmallory" in grades


def test_the_html_report_shows_a_script_function_name_as_text(tmp_path):
    from grader.report import render

    page = render(_hostile_run(tmp_path))
    assert live_tags(page) == []
    assert "&lt;img src=x onerror=alert(1)&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in page  # shown, escaped
    assert "1x1" in page and "softmax" in page


def test_every_template_is_autoescaped_and_marks_no_student_text_safe():
    from grader.batch import classview, leaderboard
    from grader import report

    templates = sorted(p.name for p in (Path(report.__file__).parent / "templates").glob("*.html.j2"))
    for env in (report._ENV, classview._ENV, leaderboard._ENV):
        for name in templates:
            assert env.get_template(name).environment.autoescape(name), name
    # what the pages do mark safe is the grader's own markup: CSS, SVG drawn from numbers, code escaped first
    safe = {m for name in templates
            for m in re.findall(r"\{\{\s*([^}|]+?)\s*\|\s*safe", (Path(report.__file__).parent / "templates" / name).read_text())}
    assert safe == {"outcome_css", "histograms[a]", "perf_chart(t.details)", "wrong_svg(t.details.wrong_map, t.details.blocks)",
                    "left", "right"}, safe


def test_the_leaderboard_page_and_its_pseudonyms_show_hostile_names_as_text(tmp_path):
    """summary.json's consumer: a name that is a tag and one that is a formula, on the published
    page (named, so shown) and in the TA's private pseudonym list."""
    import json
    from dataclasses import asdict

    from grader.batch.leaderboard import rank, speed_row, write_leaderboard

    tag = "eve<img src=x onerror=alert(1)>"
    details = {"figures": {"student": {"median_ms": 0.5, "roofline_pct": 50.0}}, "roofline_kind": "copy bandwidth",
               "gpu": "NVIDIA H100", "ratio_to_reference": 1.1, "ratio_interval": [1.0, 1.2]}
    result = {"tests": [{"kind": "performance", "outcome": "passed", "message": HOSTILE, "details": details}]}
    table = rank([speed_row(tag, result), speed_row(FORMULA, result)])
    cls = tmp_path / "class"
    cls.mkdir()
    (cls / "summary.json").write_text(json.dumps({"created": "2025-02-02T00:00:00+00:00", "environment": {"gpu": "NVIDIA H100"},
                                                  "speed": {"softmax": [asdict(r) for r in table]}}))
    page = write_leaderboard(cls, tmp_path / "pub", anonymize=True, named=frozenset({tag})).read_text()
    assert live_tags(page) == [] and "eve&lt;img src=x onerror=alert(1)&gt;" in page  # named: shown, as text
    mapping = assert_safe_csv((cls / "leaderboard-pseudonyms.csv").read_text())
    assert ["'" + FORMULA] in [row[:1] for row in mapping] and [tag, tag] in mapping


def test_similarity_pages_escape_the_students_code():
    from grader.batch.similarity import _marked

    assert "<script>" not in _marked("x = '<script>alert(1)</script>'", [])
    assert "<script>" not in _marked("x = '<script>alert(1)</script>'\n" * 3, [[0], [40]]).replace("<mark>", "")
    assert "<mark>" in _marked("x = '<script>alert(1)</script>'\n" * 3, [[0], [40]])


def test_gradescope_shows_the_output_as_text_without_control_characters(tmp_path):
    data = _hostile_run(tmp_path).to_gradescope()
    assert data["output_format"] == data["test_output_format"] == "text"
    for t in data["tests"]:
        assert t["output_format"] == "text"
        no_controls(t["output"])
    cause, error = data["tests"][0]["output"].split("\n", 1)  # the assignment's one cause first, on one line
    assert cause.startswith("Cause: ") and "\\x1b[2J" in cause
    assert error.startswith("[error] softmax() raised ValueError: f | 6 / 6 |\n## Score") and "\\x1b[2J" in error


# --- through the real CLI ------------------------------------------------------------------------


def _in_actions(tmp_path: Path, repo: Path, *args: str):
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output), "GITHUB_WORKSPACE": str(repo)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        run = run_cli(["check", str(repo), *args, "--device", "cpu", "--seed", "5", "--dtype", "float32",
                       "--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out")], tmp_path)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return run, summary.read_text() if summary.exists() else "", output.read_text() if output.exists() else ""


@pytest.mark.slow
def test_a_hostile_kernel_in_github_actions_runs_no_command_and_adds_no_row(tmp_path):
    """The kernel prints workflow commands, escapes and Markdown, raises with them (1x1) and dies
    after printing them (4x8191); vector_add is honest and passes."""
    repo = build_submission(tmp_path / "repo", "hostile/sinks")
    run, summary, output = _in_actions(tmp_path, repo, "-a", "softmax", "-a", "vector_add", "--case", "1x1", "--case", "4x8191",
                                       "--case", "n=1")
    assert run.returncode == 1, run.stdout + run.stderr
    no_controls(run.stdout, run.stderr, summary, output)
    raised = next(i for i, line in enumerate((repo / "kernels" / "softmax.py").read_text().splitlines(), 1) if "raise ValueError" in line)
    ours = only_our_commands(run.stdout)  # the student's lines run nothing: only our annotation is a command
    assert len(ours) == 1 and ours[0].startswith(f"::error file=kernels/softmax.py,line={raised},title=softmax 1x1 [float32]%3A error::")
    assert only_our_commands(run.stderr) == []
    assert "::add-mask::x" in run.stdout and "\\x1b[2J" in run.stdout  # the output was shown, inside a stopped block
    # the summary: our headings and one row per assignment, the student's words as words
    lines = summary.splitlines()
    headings = [x for x in lines if x.startswith("#")]
    assert headings[0].startswith("## Triton kernels: ") and "### Failing checks" in headings, headings
    assert all(x.startswith(("## Triton kernels: ", "### Failing checks", "### Notes")) for x in headings), headings
    rows = [x for x in lines if x.startswith("|")]
    assert len(rows) == 4 and all(len(cells(r)) == 6 for r in rows)
    assert "<" not in markdown_text(summary) and "ValueError: f | 6 / 6 |\\n## Score" in html.unescape(summary)
    assert re.search(r"^\| vector&#95;add .*\| 2 \| 0 \|", summary, re.M), summary  # the honest row: 2 passed, none failed
    # the report: no live tag; results.json: the error and the crash, for the right reasons
    assert live_tags(run.report) == []
    assert run.test("softmax", "1x1 [float32]")["outcome"] == "error"
    assert run.test("softmax", "4x8191 [float32]")["outcome"] == "crashed"
    assert run.test("vector_add", "n=1 [float32]")["outcome"] == "passed"


@pytest.mark.slow
def test_a_hostile_grader_toml_reaches_no_terminal_summary_or_log_raw(tmp_path):
    """A table name with escapes, Markdown, HTML and workflow commands, and a function name with
    a fake table row: whether the function is refused (that assignment cannot be graded) or the
    table only warned of (a key of its own in a table that is no assignment), nothing runs anywhere."""
    name = HOSTILE.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\x1b", "\\u001b").replace("\x07", "\\u0007")
    runs = []
    for label, toml in (("graded", f'[assignments."{name}"]\nmodule = "kernels/x.py"\n\n[assignments.vector_add]\nfunction = "{name}"\n'),
                        ("warned", f'[assignments."{name}"]\nfoo = 1\n')):
        repo = tmp_path / label / "repo"
        (repo / "kernels").mkdir(parents=True)
        (repo / "grader.toml").write_text(toml)
        (repo / "kernels" / "vector_add.py").write_text("def vector_add(x, y):\n    return x + y\n")
        run, summary, output = _in_actions(tmp_path / label, repo, "--case", "n=1")
        runs.append(run)
        assert run.returncode in (1, 2), run.stdout + run.stderr
        no_controls(run.stdout, run.stderr, summary, output)
        assert only_our_commands(run.stdout) == [] and only_our_commands(run.stderr) == []
        headings = [x for x in summary.splitlines() if x.startswith("#")]
        assert len(headings) >= 1 and all(x.startswith(("## Triton kernels", "### Failing checks", "### Notes")) for x in headings)
        rows = [x for x in summary.splitlines() if x.startswith("|")]
        assert len(rows) in (0, 3) and all(len(cells(r)) == 6 for r in rows) and "<" not in markdown_text(summary)
        if label == "graded":  # the refusal's reason, as text
            assert "cannot be graded" in html.unescape(summary), summary
        assert "6 / 6" in run.stdout + run.stderr  # and on the terminal, in a block where it runs nothing
    graded, warned = runs
    # a function name that is no Python name: the student's own outcome, refused before any worker
    assert graded.returncode == 1 and graded.test("vector_add", "cannot be graded")["outcome"] == "failed"
    assert "is not a Python function name" in graded.stdout
    assert "which is not an assignment" in warned.stderr and warned.test("vector_add", "n=1 [float32]")["outcome"] == "passed"


@pytest.mark.slow
def test_a_class_with_hostile_names_writes_gradebooks_without_formulas(tmp_path):
    """Roster names that are formulas or escapes, and a repo whose grader.toml names a hostile
    table: the TA's terminal, the four gradebooks and the dashboard show them as text."""
    from tests.classbuild import commit, make_repo

    repos = {n: make_repo(tmp_path / "repos" / n) for n in ("a", "b", "c")}
    (repos["c"] / "grader.toml").write_text('[assignments."\\u001b[2J=x"]\nfoo = 1\n')
    commit(repos["c"], "a hostile grader.toml", "2025-01-11T12:00:00+00:00")
    roster = tmp_path / "roster.csv"
    wraps = "x " * 94 + "::error::forged-by-wrapping"  # fetch's line of it, wrapped at 200 columns, would start with it
    with roster.open("w", newline="") as f:
        csv.writer(f).writerows([["student", "repo"], [FORMULA, "repos/a"], ["\x1b[2J\x1b]0;pwned\x07mallory", "repos/b"],
                                 ["carol <img src=x onerror=alert(1)>", "repos/c"], [wraps, "repos/nowhere"]])
    os.environ["GITHUB_ACTIONS"] = "true"  # a TA's class run in Actions: the log runs nothing of theirs either
    try:
        run = run_cli(["grade", "--roster", str(roster), "--out", "out", "--device", "cpu", "--jobs", "1", "-a", "vector_add",
                       "--case", "n=1", "--dtype", "float32", "--seed", "3", "--retries", "0"], tmp_path)
    finally:
        del os.environ["GITHUB_ACTIONS"]
    no_controls(run.stdout, run.stderr)
    assert only_our_commands(run.stdout) == [] and only_our_commands(run.stderr) == []
    assert "forged-by-wrapping" in run.stdout  # the unfetched student is named, on a line of ours
    out = tmp_path / "out"
    for name in ("grades.csv", "classroom.csv", "gradescope.csv", "canvas.csv"):
        assert_safe_csv((out / name).read_text())
    grades = {r["student"]: r for r in csv.DictReader(io.StringIO((out / "grades.csv").read_text()))}
    # honest code, graded (the one case's share: a partial run), its name shown as text
    assert float(grades["'" + FORMULA]["vector_add (partial run, CPU only)"]) > 0, grades
    assert float(grades["\\x1b[2J\\x1b]0;pwned\\x07mallory"]["vector_add (partial run, CPU only)"]) > 0
    assert "carol <img src=x onerror=alert(1)>" in grades
    logs = list(out.glob("students/*/logs/*"))
    assert logs and any("mallory" in p.read_text() for p in logs)
    no_controls(*(p.read_text() for p in logs))  # a job's log, read by a TA in a terminal
    assert live_tags((out / "index.html").read_text()) == []
    assert "carol &lt;img src=x onerror=alert(1)&gt;" in (out / "index.html").read_text()
