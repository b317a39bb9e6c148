"""The speed view and the published leaderboard: only scored timings are ranked (fastest
first, equal ratios share a rank), flagged ones never are, and --anonymize shows pseudonyms
except for students who opted in."""

from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import run_cli
from grader.batch.leaderboard import LeaderboardError, pseudonym, rank, speed_row, write_leaderboard


def perf(outcome: str, ratio: float | None = None, message: str = "", roofline: float = 50.0) -> dict:
    details = {"figures": {"student": {"median_ms": 0.5, "roofline_pct": roofline}}, "roofline_kind": "copy bandwidth",
               "gpu": "NVIDIA H100"}
    if ratio is not None:
        details.update(ratio_to_reference=ratio, ratio_interval=[ratio * 0.98, ratio * 1.02])
    return {"tests": [{"kind": "correctness", "outcome": "passed"},
                      {"kind": "performance", "outcome": outcome, "message": message, "details": details}]}


def rows():
    return rank([
        speed_row("sven", perf("passed", 1.8, roofline=40)),
        speed_row("fatima", perf("passed", 0.9, roofline=88)),
        speed_row("tomas", perf("passed", 1.2)),
        speed_row("tara", perf("passed", 1.2)),
        speed_row("chen", perf("flagged", message="no speed credit: work outside the timed stream")),
        speed_row("cyd", perf("skipped", message="speed is measured on a GPU only")),
        speed_row("bruno", {"tests": [{"kind": "correctness", "outcome": "failed"}]}),
    ])


def test_only_scored_timings_are_ranked_fastest_first():
    table = rows()
    assert [(r.student, r.rank) for r in table[:4]] == [("fatima", 1), ("tara", 2), ("tomas", 2), ("sven", 4)]  # a tie: by name
    assert table[0].low == pytest.approx(0.882) and table[0].high == pytest.approx(0.918) and table[0].roofline_pct == 88
    rest = {r.student: r for r in table[4:]}
    assert rest["chen"].status == "flagged" and rest["chen"].rank is None and "outside the timed stream" in rest["chen"].note
    assert rest["cyd"].status == "not timed" and "GPU only" in rest["cyd"].note
    assert rest["bruno"].status == "not timed" and rest["bruno"].ratio is None


def summary(tmp_path, table) -> None:
    from dataclasses import asdict

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "summary.json").write_text(json.dumps({"created": "2025-02-02T00:00:00+00:00", "environment": {"gpu": "NVIDIA H100"},
                                                       "speed": {"softmax": [asdict(r) for r in table]}}))


def test_published_page_anonymized_except_opt_in(tmp_path):
    cls, pub = tmp_path / "class", tmp_path / "pub"
    summary(cls, rows())
    page = write_leaderboard(cls, pub, anonymize=True, named=frozenset({"sven"}), title="Kernels 101").read_text()
    key = (cls / ".leaderboard-key").read_bytes()
    for student in ("fatima", "tomas", "tara"):
        assert student not in page and pseudonym(key, student) in page
    assert "sven" in page  # opted in to their name
    for hidden in ("chen", "cyd", "bruno"):  # never on the public page, not even pseudonymously
        assert hidden not in page and pseudonym(key, hidden) not in page
    assert "3 more submission(s) graded without a ranked timing" in page
    assert page.index(pseudonym(key, "fatima")) < page.index(pseudonym(key, "tara")) < page.index(">sven<")
    assert "0.900x" in page and "0.882&ndash;0.918" in page and "Kernels 101" in page
    # the mapping stays with the TA, outside the published folder; pseudonyms are stable
    mapping = dict(csv.reader((cls / "leaderboard-pseudonyms.csv").read_text().splitlines()[1:]))
    assert mapping["fatima"] == pseudonym(key, "fatima") and mapping["sven"] == "sven"
    assert [p.name for p in pub.iterdir()] == ["index.html"]
    again = write_leaderboard(cls, pub, anonymize=True, named=frozenset({"sven"})).read_text()
    assert pseudonym(key, "fatima") in again
    assert pseudonym(key, "fatima") != pseudonym(b"another course's key", "fatima")


def test_leaderboard_command(tmp_path):
    cls = tmp_path / "class"
    summary(cls, rows())
    run = run_cli(["leaderboard", "--class", "class", "--out", "pub"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    page = (tmp_path / "pub" / "index.html").read_text()
    assert "fatima" in page and "chen" not in page and "--anonymize" in run.stdout
    missing = run_cli(["leaderboard", "--class", "nowhere", "--out", "pub"], tmp_path)
    assert missing.returncode == 2 and "grade the class first" in missing.stderr


def test_a_summary_from_before_the_speed_view_is_refused(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"students": []}))
    with pytest.raises(LeaderboardError, match="no speed section"):
        write_leaderboard(tmp_path, tmp_path / "pub", anonymize=False)


def test_the_page_never_replaces_the_dashboard(tmp_path):
    summary(tmp_path, rows())
    (tmp_path / "index.html").write_text("the dashboard")
    with pytest.raises(LeaderboardError, match="is the class folder"):
        write_leaderboard(tmp_path, tmp_path / ".", anonymize=True)
    assert (tmp_path / "index.html").read_text() == "the dashboard"
