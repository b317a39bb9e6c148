"""The speed view of a graded class, and the leaderboard page a TA may publish.

Each graded student's performance check gives the ratio of their kernel's time to the
reference kernel's (with its 95% interval) and the share of the measured roofline. Only
timings that were scored are ranked: a flagged timing (integrity evidence), a skipped one
(no GPU, no reference) or one never run (correctness failed) is listed with the reason in
the TA's dashboard and left off the published page.

`grader leaderboard --class OUT --out DIR [--anonymize]` reads OUT/summary.json (written by
`grader grade`) and writes DIR/index.html, a self-contained page. With --anonymize every
student appears under a pseudonym (an HMAC of the name with a key kept in OUT, so it is stable
across runs and cannot be guessed from the name) unless course.toml lists them under
[leaderboard] named; OUT/leaderboard-pseudonyms.csv (private: it stays in OUT) maps them back.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from grader.payloads import Figures, PerformancePayload
from grader.results import Outcome
from grader.safefiles import read_plain
from grader.sanitize import for_csv_cell

KEY_FILE = ".leaderboard-key"
PSEUDONYMS = "leaderboard-pseudonyms.csv"
_ENV = Environment(loader=PackageLoader("grader", "templates"), autoescape=select_autoescape(["html", "j2"]),
                   trim_blocks=True, lstrip_blocks=True)


@dataclass
class SpeedRow:
    student: str
    status: str  # ranked | flagged | not timed
    rank: int | None = None
    ratio: float | None = None  # the student's time / the reference's
    low: float | None = None  # the ratio's 95% interval
    high: float | None = None
    roofline_pct: float | None = None
    median_ms: float | None = None
    roofline_kind: str = ""
    gpu: str = ""
    note: str = ""
    link: str = ""


def speed_row(student: str, result: dict | None, link: str = "") -> SpeedRow:
    """One student's row from their stored AssignmentResult (a dict)."""
    perf = [t for t in (result or {}).get("tests", []) if t.get("kind") == "performance"]
    if not perf:
        return SpeedRow(student, "not timed", note="no performance check in this grade", link=link)
    t = perf[0]
    d = PerformancePayload.from_json(t.get("details"))
    me = (d.figures or {}).get("student")
    me = me if isinstance(me, Figures) else Figures()
    row = SpeedRow(student, "not timed", roofline_pct=me.roofline_pct, median_ms=me.median_ms,
                   roofline_kind=d.roofline_kind or "", gpu=d.gpu or "", link=link)
    if t["outcome"] == Outcome.FLAGGED:  # the row's status (ranked | flagged | not timed) is named after the outcome
        row.status, row.note = "flagged", t.get("message", "")
    elif d.ratio_to_reference is not None:
        row.status, row.ratio = "ranked", d.ratio_to_reference
        if d.ratio_interval:
            row.low, row.high = d.ratio_interval[:2]
    else:
        row.note = f"{t['outcome']}: {t.get('message', '')}"
    return row


def rank(rows: list[SpeedRow]) -> list[SpeedRow]:
    """Ranked rows by ratio (fastest first; equal ratios share a rank), then the others."""
    ranked = sorted((r for r in rows if r.status == "ranked"), key=lambda r: (r.ratio, r.student))
    previous, place = None, 0
    for i, r in enumerate(ranked, 1):
        if r.ratio != previous:
            place, previous = i, r.ratio
        r.rank = place
    others = sorted((r for r in rows if r.status != "ranked"), key=lambda r: (r.status, r.student))
    return ranked + others


def speed_rows(view, out: Path, assignment: str) -> list[SpeedRow]:
    """The dashboard's speed view of one assignment, from the stored records."""
    from grader.batch.store import read_records

    rows = []
    for r in view.rows:
        if r.status != "fetched" or assignment not in r.cells or r.cells[assignment].status != "graded":
            continue
        record = read_records(out, r.folder).get(assignment)
        rows.append(speed_row(r.student, record.result if record is not None else None, r.cells[assignment].link))
    return rank(rows)


# -- the published page -----------------------------------------------------------------------

ADJECTIVES = ("amber", "bold", "brisk", "calm", "clever", "crisp", "daring", "eager", "fleet", "gentle", "golden",
              "keen",
              "lively", "lucid", "mellow", "nimble", "quiet", "rapid", "serene", "silver", "steady", "swift", "vivid",
              "witty")
ANIMALS = ("otter", "falcon", "lynx", "heron", "panda", "gecko", "orca", "puffin", "ibex", "koala", "marten", "osprey",
           "quokka", "raven", "stoat", "tapir", "walrus", "wombat", "yak", "zebra", "badger", "bison", "crane", "dingo")


def _key(folder: Path) -> bytes:
    path = Path(folder) / KEY_FILE
    if not path.is_file():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path.read_text().strip().encode()


def pseudonym(key: bytes, student: str) -> str:
    digest = hmac.new(key, student.encode(), hashlib.sha256).digest()
    return f"{ADJECTIVES[digest[0] % len(ADJECTIVES)]}-{ANIMALS[digest[1] % len(ANIMALS)]}-{digest[2:4].hex()}"


class LeaderboardError(Exception):
    pass


def write_leaderboard(class_dir: Path, dest: Path, anonymize: bool, named: frozenset[str] = frozenset(),
                      title: str = "") -> Path:
    """DIR/index.html from CLASS/summary.json; with `anonymize`, pseudonyms except `named`."""
    if Path(dest).resolve() == Path(class_dir).resolve():
        raise LeaderboardError(f"--out {dest} is the class folder, whose index.html is the dashboard (names, grades, "
                               "the pseudonym key): write the page to publish elsewhere")
    summary_path = Path(class_dir) / "summary.json"
    try:
        summary = json.loads(read_plain(summary_path, 64 << 20))  # read as input: bounded, never a link
    except (OSError, ValueError) as exc:
        raise LeaderboardError(f"{summary_path}: no readable class summary ({exc}): grade the class first with grader "
                               f"grade") from None
    speed = summary.get("speed")
    if speed is None:
        raise LeaderboardError(f"{summary_path} has no speed section: regrade or rebuild it with this grader (grader "
                               f"grade --resume)")
    key = _key(class_dir) if anonymize else b""
    shown: dict[str, str] = {}
    boards = {}
    for assignment, rows in speed.items():
        ranked = [SpeedRow(**r) for r in rows if r["status"] == "ranked"]
        for r in ranked:
            shown[r.student] = r.student if (not anonymize or r.student in named) else pseudonym(key, r.student)
        boards[assignment] = {"rows": ranked, "unranked": sum(r["status"] != "ranked" for r in rows)}
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    html = _ENV.get_template("leaderboard.html.j2").render(boards=boards, shown=shown, anonymize=anonymize, title=title,
                                                          created=summary.get("created", ""),
                                                           environment=summary.get("environment") or {})
    (dest / "index.html").write_text(html)
    if anonymize:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["student", "shown_as"])
        writer.writerows([[for_csv_cell(student), for_csv_cell(alias)] for student, alias in sorted(shown.items())])
        (Path(class_dir) / PSEUDONYMS).write_text(buffer.getvalue())
    return dest / "index.html"
