"""Student text made harmless for each place the trusted side shows it.

A student controls every byte of their repo and of what their worker prints: a function name in
`grader.toml`, a traceback, a message. Each sink reads some bytes as instructions, so each has
its own neutraliser, applied where the text leaves the grader (not where it enters, so no
stage is trusted to have cleaned it):

- a terminal runs escape sequences (clear the screen, hide text, move the cursor, set the title):
  `for_terminal` shows every control character as a visible escape;
- GitHub renders a job summary, a release body or a Markdown report as Markdown with HTML:
  `for_markdown` escapes both, on one line;
- the Actions log runs workflow commands (`::error`, `::add-mask::`, `::stop-commands::`) from
  the start of any line on stdout or stderr (after leading white space; the older `##[command]`
  form too): `ActionsLog.quoted` (or `ActionsLog.stopped`, around a console's output) prints
  student text between
  `::stop-commands::<random token>` and `::<token>::`, and `for_annotation` escapes a command's
  own message and properties as the runner's toolkit does;
- a spreadsheet runs a cell that starts with `=`, `+`, `-`, `@` (or a tab or carriage return
  before one) as a formula: `for_csv_cell` makes such a cell text;
- every file and stream is written as UTF-8, which a lone surrogate cannot be: `writable` makes
  any text valid first, and `for_page` also shows the control characters an HTML page would
  carry to a terminal that `cat`s it; `strict_json` makes a result JSON that any parser takes
  (no NaN or Infinity, valid text), and `cut` bounds a text and says what it left out.

HTML pages need no escaping here (Jinja2 autoescapes every template), only `for_page`.
"""

from __future__ import annotations

import math
import re
import secrets
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

# C0 and C1 controls but newline and tab, DEL, and the invisible characters that reorder or hide
# text (bidi overrides and isolates, zero-width spaces, line and paragraph separators)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_MARKDOWN = re.compile(r"[\\`*_{}\[\]()<>#+\-.!|~:=@$&\"']")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")


def _escape_control(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: object, newlines: bool = True) -> str:
    """`text` with every control character shown as `\\xNN` (newlines kept unless `newlines` is
    False, then shown as `\\n` too): printed, it can only print."""
    text = _CONTROL.sub(_escape_control, str(text))
    return text if newlines else text.replace("\n", "\\n").replace("\t", "\\t")


def one_line(text: object, limit: int | None = None) -> str:
    """`for_terminal` on one line, cut to `limit` characters with an ellipsis."""
    text = for_terminal(text, newlines=False)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    return text


def for_markdown(text: object, limit: int | None = None) -> str:
    """One line of literal text inside Markdown: every character that Markdown or HTML gives a
    meaning to (emphasis, links, headings, tables, lists, code, tags, entities) written as a
    numeric character reference, which CommonMark and GitHub show as that character and never
    read as syntax; control characters shown as escapes. A table cell, a heading or a list
    item built from it cannot start, end or add a row, a heading, a link or a tag."""
    return _MARKDOWN.sub(lambda m: f"&#{ord(m.group())};", one_line(text, limit))


def for_markdown_code(text: object, limit: int | None = None, table: bool = False) -> str:
    """Literal text inside an inline code span (a reproducer, a path): a code span cannot be
    closed from inside when its fence is longer than any run of backticks in it; HTML is not
    rendered in a code span, so only control characters and newlines need care. In a table cell
    (`table`), GitHub splits cells at a `|` even inside a code span (and a backslash before it
    does not reliably keep it): the text is then `for_markdown`'s inside `<code>`, where no `|`
    or backslash is left and GitHub still shows it as code."""
    if table:
        return f"<code>{for_markdown(text, limit)}</code>"
    text = one_line(text, limit)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def for_annotation(text: object, property: bool = False) -> str:
    """A workflow command's message (or, with `property`, a property value such as
    `file=`), escaped as the runner's toolkit escapes it: `%`, CR and LF (and `:` and `,` in a
    property), so the text cannot end the command or start another."""
    text = _CONTROL.sub(_escape_control, str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))
    if property:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def for_csv_cell(value: object) -> object:
    """A gradebook cell: numbers as they are; a string that a spreadsheet would run as a formula
    gets a leading apostrophe, which spreadsheets take as "this is text" and do not show; control
    characters are shown as escapes. A formula is looked for as a spreadsheet may read the cell:
    after Unicode normalisation (NFKC: a full-width `＝` is `=`) and past every leading space and
    control (`' =1+1'`, a no-break space first), or a tab, CR or LF first."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = _CONTROL.sub(_escape_control, str(value))
    if str(value).startswith(_FORMULA_START) or _formula_lead(str(value)):
        text = "'" + text
    return text


def _formula_lead(text: str) -> bool:
    """Whether `text`, normalised (NFKC) and past its leading spaces and controls, starts a formula."""
    probe = unicodedata.normalize("NFKC", text)
    start = 0
    while start < len(probe) and (probe[start].isspace() or unicodedata.category(probe[start]).startswith("C")):
        start += 1
    return probe.startswith(_FORMULA_START[:4], start)


class ActionsLog:
    """The GitHub Actions log as a sink: workflow commands are read from the start of any line
    on stdout, so text we did not write goes out between `::stop-commands::TOKEN` and
    `::TOKEN::`, with a token nobody can guess (a fresh one per block). Inside, no line runs as
    a command."""

    @staticmethod
    def quoted(lines: Iterable[str] | str) -> str:
        text = lines if isinstance(lines, str) else "\n".join(lines)
        token = secrets.token_hex(16)
        while token in text:  # a token the text itself holds could end the block early
            token = secrets.token_hex(16)
        body = _CONTROL.sub(_escape_control, text)
        return f"::stop-commands::{token}\n{body}\n::{token}::\n"

    @staticmethod
    @contextmanager
    def stopped(write: Callable[[str], object]) -> Iterator[None]:
        """What is printed inside goes out with workflow commands stopped: `write` gets the
        `::stop-commands::TOKEN` line first and `::TOKEN::` last (also when the block raises).
        For output that a console lays out itself (tables, wrapped lines: a wrapped line can
        start with any word of the text). The token is drawn when the block opens, after the
        text it quotes was decided (every worker is dead by then), so nothing in it can know it."""
        token = secrets.token_hex(16)
        write(f"::stop-commands::{token}\n")
        try:
            yield
        finally:
            write(f"::{token}::\n")


def writable(text: object) -> str:
    """`text` as valid Unicode: a lone surrogate (which no UTF-8 writer accepts) becomes U+FFFD."""
    text = str(text)
    if text.isascii():
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace") if _has_surrogate(text) else text


def _has_surrogate(text: str) -> bool:
    return any("\ud800" <= ch <= "\udfff" for ch in text)


def for_page(text: object) -> str:
    """Student text for an HTML page (which the template then escapes): valid Unicode, and every
    control character but newline and tab shown as an escape, so a page `cat` in a terminal
    runs nothing of the student's."""
    return _CONTROL.sub(_escape_control, writable(text))


_CUT_NOTE = 120  # room for cut()'s note, so that a text it cut is not cut again


def cut(text: str, limit: int, what: str = "text") -> str:
    """`text` at most about `limit` characters: its head and (the larger part) its tail kept, and
    how much was cut between said in place. Applying it again changes nothing."""
    if len(text) <= limit + _CUT_NOTE:
        return text
    head, tail = limit // 4, limit - limit // 4
    return (f"{text[:head]}\n[... {len(text) - head - tail} characters of {what} cut here: "
            f"at most {limit} are kept ...]\n{text[-tail:]}")


def strict_json(value):
    """`value` (JSON's types) as strict JSON holds it: a non-finite number becomes the string
    "nan", "inf" or "-inf" (json.dump would write NaN, which Gradescope's parser refuses), every
    string and key valid Unicode."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return writable(value)
    if isinstance(value, dict):
        return {writable(k) if isinstance(k, str) else k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value
