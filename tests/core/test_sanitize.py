"""Each sink's neutraliser, attacked with the text a student would send it."""

from __future__ import annotations

import re

import pytest

from grader.sanitize import ActionsLog, for_annotation, for_csv_cell, for_markdown, for_markdown_code, for_terminal, one_line


def test_terminal_escapes_cannot_reach_the_terminal():
    attack = "\x1b[2J\x1b]0;pwned\x07\x1b[8mhidden\rover\u202eevil\x9b31m"
    shown = for_terminal(attack)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", shown)
    assert shown.startswith("\\x1b[2J") and "\\r" not in shown and "\\x0d" in shown and "\\u202e" in shown
    assert for_terminal("two\nlines") == "two\nlines"
    assert one_line("two\nlines\tand tab") == "two\\nlines\\tand tab"
    assert one_line("x" * 50, limit=10) == "x" * 9 + "…"


def test_markdown_cannot_add_rows_headings_links_or_tags():
    attack = "f | 6 / 6 |\n## Score: 100\n<img src=x onerror=alert(1)> [link](http://x) **bold** `code` &lt;"
    shown = for_markdown(attack)
    for char in "|\n#<>[]()*`&":
        assert char not in shown.replace("&#", "").replace(";", ""), char
    assert "&#124;" in shown and "&#60;img" in shown
    assert for_markdown("plain words 12") == "plain words 12"


def test_a_code_span_cannot_be_closed_from_inside():
    shown = for_markdown_code("grader check --case `x` ``y``")
    fence = re.match("`+", shown).group()
    assert len(fence) == 3 and shown.endswith(fence) and fence not in shown[len(fence):-len(fence)]


def test_annotation_text_cannot_end_the_command():
    assert for_annotation("50%\r\n::error::x") == "50%25%0D%0A::error::x"
    assert for_annotation("a.py,line=1:x", property=True) == "a.py%2Cline=1%3Ax"


def test_csv_formulas_become_text_and_numbers_stay_numbers():
    for attack in ("=HYPERLINK(\"http://x\")", "+1+1", "-2+3", "@SUM(A1)"):
        assert for_csv_cell(attack) == "'" + attack
    assert for_csv_cell("\t=1") == "'\t=1"
    assert for_csv_cell("\r=1") == "'\\x0d=1"  # the carriage return is shown as an escape, and the formula guarded
    assert for_csv_cell(-1.5) == -1.5 and for_csv_cell(3) == 3 and for_csv_cell(None) is None
    assert for_csv_cell("alice") == "alice"


def test_actions_log_block_stops_every_workflow_command():
    attack = ["::add-mask::secret", "::error file=a.py::forged", "::stop-commands::mine", "::mine::", "\x1b[2J"]
    block = ActionsLog.quoted(attack)
    lines = block.splitlines()
    token = lines[0].removeprefix("::stop-commands::")
    assert len(token) == 32 and lines[-1] == f"::{token}::"
    assert lines[1:-1] == attack[:4] + ["\\x1b[2J"]
    assert token not in "\n".join(attack)
    assert ActionsLog.quoted("x").splitlines()[0] != block.splitlines()[0]  # a fresh token per block


def test_a_table_cells_code_keeps_no_pipe_or_backslash():
    shown = for_markdown_code("kernels/x.py:f\\| 6 / 6 |`", table=True)
    assert shown.startswith("<code>") and shown.endswith("</code>")
    assert "|" not in shown and "\\" not in shown and "`" not in shown and "&#124;" in shown


def test_a_stopped_block_resumes_with_its_own_token_even_when_it_raises():
    written = []
    try:
        with ActionsLog.stopped(written.append):
            written.append("::error::inside\n")
            raise RuntimeError("printing failed")
    except RuntimeError:
        pass
    token = written[0].removeprefix("::stop-commands::").strip()
    assert len(token) == 32 and written[1:] == ["::error::inside\n", f"::{token}::\n"]


@pytest.mark.parametrize("lead", ["", " ", "   ", "\u00a0", "\u3000", "\u2007", "\u200b", "\ufeff", "\x01", " \u00a0 ",
                                  "\t", "\r", "\n"])
@pytest.mark.parametrize("sign", ["=", "+", "-", "@", "\uff1d", "\uff0b", "\uff0d", "\uff20", "\ufe66", "\ufe62"])
def test_a_formula_is_guarded_behind_any_lead_in_and_in_any_width(lead, sign):
    """Every formula lead-in (= + - @, their full-width and small forms) behind nothing, spaces,
    a no-break or ideographic space, a zero-width or control character, a tab, CR or LF: the cell
    starts with the apostrophe that makes it text."""
    cell = for_csv_cell(f"{lead}{sign}1+1")
    assert isinstance(cell, str) and cell.startswith("'"), (lead, sign, cell)


def test_text_that_is_no_formula_is_left_as_it_is():
    for text in ("alice", " alice", "\u00a0bob", "a=1", "1+1", "\uff21lice", "50%"):
        assert for_csv_cell(text) == text
