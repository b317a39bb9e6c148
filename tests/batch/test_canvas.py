"""`grader publish canvas` against a stand-in Canvas: the `responses` library answers canvasapi's
requests (canvasapi speaks through requests) from a small in-memory course, so every answer a
real Canvas gives (a 401 with WWW-Authenticate, a 429, a dropped connection) is produced on
demand, with no server to start and no port to share with other tests; the requests made are
checked as Canvas's API documents them. The class is tests/e2e/test_one_grade.py's: scaling, a
late penalty, a review, a held flag and CPU-only grades."""

from __future__ import annotations

import json
import re
import sys
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests
import responses
from typer.testing import CliRunner

from grader.batch import canvas as lms
from grader.batch import reviews
from grader.batch.course import load_course
from grader.batch.store import read_record, record_path
from tests.conftest import COURSE
from tests.e2e.test_one_grade import build, rebuild

URL, TOKEN, COURSE_ID = "https://canvas.test", "t0ken", 7
USERS = {"alice": 100, "bob": 101, "carol": 102, "dan": 103}  # the roster's canvas_user_id (test_one_grade)
SENT_FIRST = {("alice", "vector_add"): 16, ("alice", "softmax"): 20, ("bob", "vector_add"): 7.2,
              ("bob", "softmax"): 9, ("carol", "vector_add"): 10}  # carol's softmax is held, dan's are CPU only


class StandIn:
    """A Canvas course: its students, its assignments and the grades posted, over `responses`."""

    def __init__(self, rsps, students=tuple(USERS.values())):
        self.students, self.assignments, self.grades, self.puts = list(students), [], {}, []
        self.comments: list = []
        self.fail_put: dict[int, list] = {}  # user id -> answers to give first (a status, or an exception)
        base = f"{URL}/api/v1/courses/{COURSE_ID}"
        rsps.add_callback("GET", re.compile(rf"{base}(\?.*)?$"), self.auth(lambda r: (200, {"id": COURSE_ID,
                                                                                           "workflow_state": "available"})))
        rsps.add_callback("GET", re.compile(rf"{URL}/api/v1/courses/(?!{COURSE_ID}\b)\d+(\?.*)?$"), self.auth(lambda r: (404, {})))
        rsps.add_callback("GET", re.compile(rf"{base}/search_users.*"), self.auth(self.users))
        rsps.add_callback("GET", re.compile(rf"{base}/assignments(\?.*)?$"), self.auth(lambda r: (200, self.assignments)))
        rsps.add_callback("POST", re.compile(rf"{base}/assignments.*"), self.auth(self.create))
        rsps.add_callback("PUT", re.compile(rf"{base}/assignments/\d+/submissions/\d+.*"), self.auth(self.grade))
        rsps.add_callback("PUT", re.compile(rf"{base}/assignments/\d+(\?.*)?$"), self.auth(self.edit))

    def auth(self, answer):
        def callback(request):
            if request.headers.get("Authorization") != f"Bearer {TOKEN}":
                return 401, {"WWW-Authenticate": 'Bearer realm="canvas-lms"'}, json.dumps(
                    {"errors": [{"message": "Invalid access token."}]})
            status, body = answer(request)
            return status, {}, json.dumps(body)
        return callback

    def users(self, request):
        assert ("enrollment_type[]", "student") in parse_qsl(urlsplit(request.url).query)
        return 200, [{"id": u, "name": f"user {u}"} for u in self.students]

    @staticmethod
    def form(request) -> dict:
        body = request.body.decode() if isinstance(request.body, bytes) else (request.body or "")
        return dict(parse_qsl(urlsplit(request.url).query) + parse_qsl(body))

    def create(self, request):
        data = self.form(request)
        made = {"id": 500 + len(self.assignments), "name": data["assignment[name]"],
                "integration_id": data.get("assignment[integration_id]"),
                "points_possible": float(data["assignment[points_possible]"]), "course_id": COURSE_ID}
        self.assignments.append(made)
        return 201, made

    def edit(self, request):
        aid = int(re.search(r"assignments/(\d+)", request.url).group(1))
        [made] = [a for a in self.assignments if a["id"] == aid]
        made["points_possible"] = float(self.form(request)["assignment[points_possible]"])
        return 200, made

    def grade(self, request):
        aid, uid = map(int, re.search(r"assignments/(\d+)/submissions/(\d+)", request.url).groups())
        queued = self.fail_put.get(uid) or []
        if queued:
            answer = queued.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer, {"errors": "Rate Limit Exceeded"} if answer == 429 else {}
        if uid not in self.students:
            return 404, {}
        form = self.form(request)
        grade = float(form["submission[posted_grade]"])
        self.grades[(aid, uid)] = grade
        if "comment[text_comment]" in form:
            self.comments.append((aid, uid, form["comment[text_comment]"]))
        self.puts.append((aid, uid, grade))
        return 200, {"id": 1, "user_id": uid, "assignment_id": aid, "grade": str(grade)}

    def by_name(self) -> dict:
        names = {a["id"]: a["name"] for a in self.assignments}
        users = {v: k for k, v in USERS.items()}
        return {(users[u], names[a]): g for (a, u), g in self.grades.items()}


@pytest.fixture
def graded(tmp_path):
    return build(tmp_path)


def publish(out, sleeps=None, **options):
    return lms.publish(out, COURSE_ID, URL, TOKEN, sleep=(sleeps.append if sleeps is not None else lambda s: None),
                       **options)


def test_first_publish_sends_every_whole_grade_once_and_a_rerun_sends_nothing(graded):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps)
        changes, result = publish(out)
        assert result.failed == []
        assert canvas.by_name() == SENT_FIRST
        # one assignment each, found again by its key; course.toml's points
        assert sorted((a["name"], a["integration_id"], a["points_possible"]) for a in canvas.assignments) == [
            ("softmax", "grader:softmax", 20.0), ("vector_add", "grader:vector_add", 20.0)]
        held = {(c.student, c.assignment): c.action for c in changes if c.action != "send"}
        assert held == {("carol", "softmax"): "held for review", ("dan", "vector_add"): "incomplete: CPU only",
                        ("dan", "softmax"): "incomplete: CPU only"}
        record = json.loads(lms.record_path(out, COURSE_ID).read_text())
        assert {(s, a): v["grade"] for s, g in record["sent"].items() for a, v in g.items()} == SENT_FIRST

        before = len(canvas.puts)
        changes, result = publish(out)
        assert len(canvas.puts) == before and result.sent == [] and len(canvas.assignments) == 2
        assert sum(c.action == "unchanged" for c in changes) == 5


def test_a_regrade_sends_one_grade(graded):
    out, view, lock = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps)
        publish(out)
        bob = read_record(record_path(out, "bob", "softmax"))
        reviews.append(out, reviews.make("bob", "bob", "softmax", bob, "points", 15, "regrade request", "ta-ann"))
        rebuild(out, lock, view.course)
        canvas.puts.clear()
        _, result = publish(out)
        # 15 of 20 points, less bob's 10% late penalty
        assert [(c.student, c.assignment, c.before, c.grade) for c in result.sent] == [("bob", "softmax", 9, 13.5)]
        assert [g for _, _, g in canvas.puts] == [13.5] and len(canvas.assignments) == 2


def test_incomplete_and_held_grades_are_sent_only_when_asked(graded):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps)
        publish(out, include_incomplete=True)
        assert canvas.by_name() == {**SENT_FIRST, ("carol", "softmax"): 12, ("dan", "vector_add"): 12,
                                    ("dan", "softmax"): 12}
        assert canvas.comments == []  # none unless asked


def test_a_comment_says_the_grade_where_asked(graded):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps)
        publish(out, comment=True)
        bob = [text for _, uid, text in canvas.comments if uid == 101]
        assert len(canvas.comments) == len(SENT_FIRST) and any(t.startswith("vector_add: 7.2 / 20 points") for t in bob)


def test_a_rate_limit_is_waited_out_and_retried(graded):
    out, _, _ = graded
    sleeps: list[float] = []
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps)
        canvas.fail_put[101] = [429, 429]  # bob's first grade: two rate-limit answers
        _, result = publish(out, sleeps)
        assert result.failed == [] and canvas.by_name() == SENT_FIRST
        assert sleeps == [lms.WAIT_S, lms.WAIT_S * 2]


def test_a_rate_limit_that_holds_costs_only_its_grade(graded):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps)
        canvas.fail_put[101] = [429] * lms.RETRIES
        _, result = publish(out, [])
        assert len(result.failed) == 1 and result.failed[0].startswith("bob/")
        assert "rate limit held" in result.failed[0]
        assert len(canvas.by_name()) == len(SENT_FIRST) - 1
        _, again = publish(out)  # the next run finishes it
        assert [(c.student) for c in again.sent] == ["bob"] and canvas.by_name() == SENT_FIRST


def test_a_bad_token_is_one_line_and_sends_nothing(graded, monkeypatch):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps)
        with pytest.raises(lms.PublishError, match=r"refused the token \(401") as caught:
            lms.publish(out, COURSE_ID, URL, "b4d-t0k3n", sleep=lambda s: None)
        assert "\n" not in str(caught.value) and "b4d-t0k3n" not in str(caught.value)  # the token is never said
        assert canvas.puts == [] and not lms.record_path(out, COURSE_ID).exists()

        from grader.cli import app
        monkeypatch.setenv("CANVAS_API_TOKEN", "b4d-t0k3n")
        run = CliRunner().invoke(app, ["publish", "canvas", str(out), "--course-id", str(COURSE_ID), "--url", URL])
        assert run.exit_code == 2 and "refused the token (401" in run.output and "b4d-t0k3n" not in run.output


def test_a_course_not_found_is_one_line(graded):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        StandIn(rsps)
        with pytest.raises(lms.PublishError, match="has no course 8 that this token can see"):
            lms.publish(out, 8, URL, TOKEN, sleep=lambda s: None)


def test_a_student_not_in_the_course_costs_no_other_student(graded):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps, students=[100, 101, 103])  # carol is not enrolled
        _, result = publish(out)
        assert result.failed == [f"carol/vector_add: not sent: no student of course {COURSE_ID} has the roster's "
                                 "canvas_user_id 102 (not enrolled, or a typo in the roster)"]
        assert canvas.by_name() == {k: v for k, v in SENT_FIRST.items() if k[0] != "carol"}


def test_a_network_error_mid_way_is_recorded_and_the_rerun_finishes(graded):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps)
        canvas.fail_put[101] = [requests.ConnectionError("connection reset"), requests.ConnectionError("reset")]
        _, result = publish(out)
        assert len(result.failed) == 2 and all(line.startswith("bob/") and "network error" in line
                                               for line in result.failed)
        sent = json.loads(lms.record_path(out, COURSE_ID).read_text())["sent"]
        assert "bob" not in sent and set(sent) == {"alice", "carol"}
        canvas.puts.clear()
        _, again = publish(out)
        assert sorted((c.student, c.assignment) for c in again.sent) == [("bob", "softmax"), ("bob", "vector_add")]
        assert canvas.by_name() == SENT_FIRST and len(canvas.puts) == 2


def test_dry_run_shows_the_change_and_contacts_nothing(graded, monkeypatch):
    out, _, _ = graded
    from grader.cli import app

    monkeypatch.delenv("CANVAS_API_TOKEN", raising=False)
    with responses.RequestsMock(assert_all_requests_are_fired=False):  # any request would fail: none is registered
        run = CliRunner().invoke(app, ["publish", "canvas", str(out), "--course-id", "7", "--dry-run"])
    assert run.exit_code == 0, run.output
    assert "5 grade(s) to send, 0 unchanged" in run.output
    assert re.search(r"bob\s*│\s*vector_add\s*│\s*│\s*7\.2\s*│\s*20\s*│\s*send", run.output), run.output
    assert re.search(r"dan\s*│\s*softmax.*incomplete: CPU only", run.output)
    missing = CliRunner().invoke(app, ["publish", "canvas", str(out), "--course-id", "7", "--url", URL])
    assert missing.exit_code == 2 and "no Canvas token: set CANVAS_API_TOKEN" in missing.output


def test_without_canvasapi_the_message_names_the_extra(graded, monkeypatch):
    out, _, _ = graded
    for name in [m for m in sys.modules if m == "canvasapi" or m.startswith("canvasapi.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(lms.PublishError, match=r"pip install 'grader\[lms\]'"):
        lms.publish(out, COURSE_ID, URL, TOKEN)


def test_a_student_without_canvas_ids_is_said_and_not_sent(graded):
    out, _, _ = graded
    summary = json.loads((out / "summary.json").read_text())
    summary["students"][0]["lms"] = {}
    (out / "summary.json").write_text(json.dumps(summary))
    changes = lms.plan(out, COURSE_ID)
    assert {c.action for c in changes if c.student == "alice"} == {"no Canvas id"}


@pytest.mark.parametrize("url, message", [("http://canvas.example.edu", "unencrypted: use https://"),
                                          ("canvas.example.edu", "is not a Canvas address")])
def test_the_token_never_crosses_the_network_in_the_clear(graded, url, message):
    out, _, _ = graded
    with pytest.raises(lms.PublishError, match=message):
        lms.publish(out, COURSE_ID, url, TOKEN)


def test_an_assignment_made_before_is_found_by_its_key_and_takes_the_course_s_points(graded):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        canvas = StandIn(rsps)
        canvas.assignments.append({"id": 900, "name": "Vector add (renamed by the TA)", "integration_id": "grader:vector_add",
                                   "points_possible": 10.0, "course_id": COURSE_ID})
        canvas.assignments.append({"id": 901, "name": "vector_add", "integration_id": None, "points_possible": 5.0,
                                   "course_id": COURSE_ID})  # the TA's own column of that name: never ours
        _, result = publish(out)
        ours = {a["id"]: a for a in canvas.assignments}
        assert len(canvas.assignments) == 3 and ours[900]["points_possible"] == 20.0 and ours[901]["points_possible"] == 5
        assert {(a, u) for a, u, _ in canvas.puts if a == 900} == {(900, 100), (900, 101), (900, 102)}
        assert not any(a == 901 for a, _, _ in canvas.puts)
        assert any("now out of 20 points" in line for line in result.said)


def test_a_record_of_another_canvas_is_not_taken_for_this_one(graded):
    out, _, _ = graded
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        StandIn(rsps)
        publish(out)
    with pytest.raises(lms.PublishError, match="records grades sent to course 7 of https://canvas.test"):
        lms.publish(out, COURSE_ID, "https://other.test", TOKEN)
