"""The order a check grades its assignments in at once: the longest last time first, from a file
of the kept cache that is only ever a hint (grader.judge.durations)."""

from __future__ import annotations

import json
import os

from grader.judge import durations, session
from grader.judge.context import GradingContext
from grader.settings import Settings
from tests.conftest import COURSE


def test_the_longest_last_time_starts_first_and_the_seconds_are_kept(tmp_path, monkeypatch):
    started = []

    def fake(sess, sub, spec, workdir, progress, roofline, phases):
        started.append(spec.name)
        phases["correctness_calls"] = {"vector_add": 1.0, "softmax": 9.0, "rmsnorm": 4.0}[spec.name]
        return spec.name

    monkeypatch.setattr(session.pipeline, "grade_assignment", fake)
    monkeypatch.setattr(session.GradingSession, "warm_up", lambda self: None)
    specs = [COURSE.get(n) for n in ("vector_add", "softmax", "rmsnorm")]
    file = tmp_path / "durations.json"
    ctx = GradingContext("cpu", 1, durations=str(file))
    key = durations.key_of(ctx)
    file.write_text(json.dumps({key("vector_add"): 30.0, key("rmsnorm"): 20.0}))  # softmax: never timed
    got = session.open_session(ctx, Settings(), COURSE)._grade_at_once(None, specs, tmp_path, None, None, jobs=1)
    assert got == ["vector_add", "softmax", "rmsnorm"], "results in the catalogue's order, whatever ran first"
    assert started == ["vector_add", "rmsnorm", "softmax"]
    kept = json.loads(file.read_text())
    assert kept[key("softmax")] == 9.0 and kept[key("vector_add")] == 1.0 and kept[key("rmsnorm")] == 4.0
    started.clear()
    session.open_session(ctx, Settings(), COURSE)._grade_at_once(None, specs, tmp_path, None, None, jobs=1)
    assert started == ["softmax", "rmsnorm", "vector_add"]  # this time's seconds decide the next order


def test_an_unreadable_file_is_no_hint_and_never_an_error(tmp_path):
    file = tmp_path / "durations.json"
    for content in (b"{not json", b"[1, 2]", json.dumps({"cpu:a:|": "fast", "cpu:b:|": -1, "cpu:c:|": 10 ** 400,
                                                          "cpu:d:|": 2.5}).encode(),
                    b" " * (durations.MAX_BYTES + 1)):
        file.write_bytes(content)
        got = durations.read(str(file))
        assert got in ({}, {"cpu:d:|": 2.5}), got
    file.unlink()
    os.mkfifo(file)  # never a hang
    assert durations.read(str(file)) == {}
    file.unlink()
    file.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"cpu:x:|": 1.0}))
    assert durations.read(str(file)) == {}, "a link is not followed"
    assert durations.read(None) == {} and durations.read(str(tmp_path / "missing.json")) == {}
