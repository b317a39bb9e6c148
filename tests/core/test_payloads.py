"""The typed payloads (grader.payloads): each kind's details read as fields, and written back as
the keys results.json and a batch's records always had, so old run folders still load."""

import dataclasses
import json
from pathlib import Path

import pytest

from grader.payloads import (
    PAYLOADS,
    Ceilings,
    CorrectnessPayload,
    Figures,
    FindingNote,
    IntegrityPayload,
    Kind,
    PerformancePayload,
    Record,
    ReplayDetails,
    ReplayInputs,
    ReplaySide,
    SubmissionPayload,
    Witnessed,
    payload_for,
)
from grader.results import AssignmentResult, Outcome, RunResult, Severity, TestResult

# an AssignmentResult as a batch's record held it before the payloads were typed: written by that
# version's to_json, its details taken from `grader check` runs on the catalogue's fixtures (and a
# timing's, as the timing stage wrote them on a GPU)
OLD_RECORD = Path(__file__).parent.parent / "fixtures" / "records" / "assignment_result_before_payloads.json"
# timings as that version wrote them before their replay, witness, roofline and findings were typed
# records: by replay, by the fallback (its witness eager and scaled, a finding with a newer key and
# one not a mapping), and a refused one whose replay holds a newer key and whose witness is no mapping
OLD_TIMINGS = OLD_RECORD.with_name("performance_payload_before_typed_records.json")


def test_a_record_written_before_the_payloads_loads_and_is_written_back_byte_for_byte():
    text = OLD_RECORD.read_text()
    a = AssignmentResult.from_json(json.loads(text))
    assert {t.kind for t in a.tests} == set(Kind)
    for t in a.tests:
        assert type(t.details) is PAYLOADS[t.kind], t.name
    assert json.dumps(a.to_json(), indent=1) + "\n" == text  # every key, value and order as it was stored
    run = RunResult("repo", 7, {}, [a])
    assert RunResult.from_json(json.loads(json.dumps(run.to_json()))).to_json() == run.to_json()


def test_timings_written_before_their_records_were_typed_load_and_are_written_back_byte_for_byte():
    text = OLD_TIMINGS.read_text()
    a = AssignmentResult.from_json(json.loads(text))
    assert json.dumps(a.to_json(), indent=1) + "\n" == text
    replayed, fallback, refused = (t.details for t in a.tests)
    assert isinstance(replayed.replay, ReplayDetails) and isinstance(replayed.roofline, Ceilings)
    assert replayed.replay.student.median_ms == 0.80123 and replayed.replay.reference.kept is True
    assert replayed.replay.student.kept is None and "kept" not in replayed.replay.student.to_json()
    assert replayed.replay.kept["student"] == "a" * 64 and replayed.replay.inputs.seed == 1846983196
    assert replayed.roofline.gemm_tflops == {"float16": 700.0, "bfloat16": 710.0} and replayed.findings == []
    assert isinstance(fallback.witness, Witnessed) and fallback.witness.confirmed is False
    assert fallback.witness.eager.startswith("it synchronizes") and fallback.witness.note
    assert fallback.witness.brackets_ms["reference"] == [16.0, 16.1]
    first, newer, odd = fallback.findings
    assert first == FindingNote(severity="review", text="held «x»")
    assert newer.severity == "conclusive" and newer.extra == {"later_key": 1} and odd == "not a finding"
    assert refused.replay.kept == {"student": "c" * 64} and refused.replay.extra == {"later": [1, 2]}
    assert refused.witness == "not a mapping"  # held as stored, never raised on
    assert refused.findings[0].to_json() == {"text": "x", "severity": "conclusive"}  # the order it was read in


def test_the_old_records_fields_are_read_by_name():
    tests = AssignmentResult.from_json(json.loads(OLD_RECORD.read_text())).tests
    timed = next(t for t in tests if t.kind == Kind.PERFORMANCE and t.outcome == Outcome.PASSED)
    assert isinstance(timed.details, PerformancePayload)
    assert timed.details.figures["student"].median_ms == 0.8 and timed.details.figures["torch"].host_median_ms is None
    assert timed.details.ratio_interval == [1.9123, 2.1099] and timed.details.score_fraction == 0.457
    assert timed.details.flops and timed.details.gemm_tflops is None and timed.details.witness.confirmed is True
    flagged = next(t for t in tests if t.kind == Kind.INTEGRITY and t.outcome == Outcome.FLAGGED)
    assert flagged.severity is Severity.REVIEW and flagged.details.concerns == ["n=1 [float32]"]
    shrunk = next(t for t in tests if isinstance(t.details, CorrectnessPayload) and t.details.largest_passing)
    small = shrunk.details.smallest_failing
    assert small.start and small.reproducer.startswith("grader check")
    assert shrunk.details.wrong_map and shrunk.details.pattern and shrunk.details.blocks is not None
    parts = next(t for t in tests if isinstance(t.details, CorrectnessPayload) and t.details.parts)
    assert set(parts.details.parts) == {"dx", "dweight", "dbias"}
    assert parts.details.parts["dx"].max_abs_error is not None
    spec_own = next(t for t in tests if isinstance(t.details, CorrectnessPayload) and "kept" in t.details.extra)
    assert spec_own.details.elements > 0 and set(spec_own.details.extra) == {"kept", "p"}  # the dropout spec's own
    missing = next(t for t in tests if isinstance(t.details, SubmissionPayload) and t.details.missing_function)
    assert missing.details.not_submitted is True and missing.details.module == "kernels/vector_add.py"
    newer = next(t for t in tests
                 if isinstance(t.details, CorrectnessPayload) and "later_grader_key" in t.details.extra)
    assert newer.details.max_abs_error == 0.0  # a newer grader's key is kept beside the fields it knows


# a value for each field type of the payloads, unlike its default; a field of a type not here fails
# the round trip below until it gets one (and with it, its serialisation is tested)
SAMPLES = {
    "float | None": 1.5,
    "int | None": 3,
    "str | None": "<s> «ü»",
    "bool | None": True,
    "list[int] | None": [1, 2],
    "list[float] | None": [0.5, 2.0],
    "list[str] | None": ["one", "two"],
    "dict[str, int] | None": {"k": 4},
    "dict[str, float] | None": {"inputs": 1.25},
    "dict[str, str] | None": {"student": "ab12"},
    "dict[str, list[float]] | None": {"student": [1.5, 2.0]},
    "dict[str, Any] | None": {"a": [1, {"b": None}]},
    "dict[str, dict[str, Any]] | None": {"kernel": {"registers": 32}},
}


def _sample_json(cls: type[Record]) -> dict:
    """The stored form of `cls` with every field set: each key a field's, nested records too."""
    data = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("inline"):
            continue
        key = f.metadata.get("key", f.name)
        if f.name in cls._nested:
            data[key] = _sample_json(cls._nested[f.name])
        elif f.name in cls._nested_maps:
            data[key] = {"student": _sample_json(cls._nested_maps[f.name])}
        elif f.name in cls._nested_lists:
            data[key] = [_sample_json(cls._nested_lists[f.name])] * 2
        elif f.type in SAMPLES:
            data[key] = SAMPLES[f.type]
        else:
            pytest.fail(f"{cls.__name__}.{f.name}: no sample for the type {f.type!r}: add one to SAMPLES")
    return data


RECORDS = {Figures, FindingNote, Witnessed, Ceilings, ReplaySide, ReplayInputs, ReplayDetails}


@pytest.mark.parametrize("cls", sorted(set(PAYLOADS.values()) | RECORDS, key=lambda c: c.__name__))
def test_every_field_of_every_payload_comes_back_from_its_stored_form(cls):
    data = _sample_json(cls)
    payload = cls.from_json(json.loads(json.dumps(data)))
    assert not payload.extra  # every key was a field's
    for f in dataclasses.fields(cls):
        if not f.metadata.get("inline"):
            assert getattr(payload, f.name) is not None, f"{cls.__name__}.{f.name} was not read"
    assert payload.to_json() == data and list(payload.to_json()) == list(data)
    assert cls.from_json(payload.to_json()) == payload
    for name, inner in {**cls._nested, **cls._nested_lists}.items():  # read as the typed record, not a dict
        value = getattr(payload, name)
        assert all(isinstance(v, inner) for v in (value if isinstance(value, list) else [value])), name
    fresh = dataclasses.replace(payload, key_order=())  # made by the grader, not read: the fields' own order
    assert fresh.to_json() == data


def test_a_field_left_none_is_no_key_unless_results_json_always_wrote_it():
    assert CorrectnessPayload(max_abs_error=0.0).to_json() == {"max_abs_error": 0.0}
    assert IntegrityPayload(kernels_launched={}, evidence=[]).to_json() == {"kernels_launched": {}, "evidence": []}
    # a contender's rates are written as null when there are none (no GPU work recorded)
    assert Figures(median_ms=0.0).to_json() == {"median_ms": 0.0, "host_median_ms": None, "gbps": None,
                                                "roofline_pct": None}
    # the GEMM peak is written whenever the FLOPs are, null where no GEMM probe ran; neither otherwise
    assert PerformancePayload(flops=10).to_json() == {"flops": 10, "gemm_tflops": None}
    assert PerformancePayload(gpu="x").to_json() == {"gpu": "x"}
    assert SubmissionPayload(points_if_run=2.5).to_json() == {"points_if_run": 2.5}
    # a replay that timed no rep: its median is written as null; only the reference's side says if it was kept
    assert ReplaySide(reps=0).to_json() == {"median_ms": None, "reps": 0}
    assert ReplaySide(median_ms=1.0, kept=False).to_json() == {"median_ms": 1.0, "kept": False}


def test_a_result_reads_a_dict_as_its_kinds_payload():
    t = TestResult("softmax", "integrity", "uses its own Triton kernel", "flagged", "x", details={"concerns": ["a"]},
                   severity="review")
    assert t.kind is Kind.INTEGRITY and t.severity is Severity.REVIEW and t.details == IntegrityPayload(concerns=["a"])
    assert t.to_json()["kind"] == "integrity" and t.to_json()["severity"] == "review"
    assert f"{t.kind} {t.severity}" == "integrity review"  # in templates, f-strings and CSV: the plain value
    assert isinstance(TestResult("s", "submission", "n", "failed").details, SubmissionPayload)
    moved = payload_for(Kind.PERFORMANCE, CorrectnessPayload(points_if_run=1.0))  # another kind's payload: read anew
    assert moved == PerformancePayload(points_if_run=1.0)


@pytest.mark.parametrize("stored", [None, [], "text", 3])
def test_details_that_are_not_a_mapping_read_as_an_empty_payload(stored):
    record = {"assignment": "a", "kind": "performance", "name": "perf", "outcome": "failed", "details": stored}
    t = TestResult.from_json(record)
    assert t.details == PerformancePayload() and t.details.to_json() == {}


def test_an_unknown_kind_or_severity_is_refused_when_read():
    with pytest.raises(ValueError, match="Kind"):
        TestResult("a", "speed", "n", "failed")
    with pytest.raises(ValueError, match="Severity"):
        TestResult("a", "integrity", "n", "flagged", severity="maybe")


def test_the_report_reads_each_payloads_fields():
    from grader.report import render

    a = AssignmentResult.from_json(json.loads(OLD_RECORD.read_text()))
    page = render(RunResult("repo", 7, {}, [a]))
    timed = next(t.details for t in a.tests if t.kind == Kind.PERFORMANCE and t.outcome == Outcome.PASSED)
    assert page.count("Performance on NVIDIA H100 80GB HBM3") == 2  # the scored timing and the flagged one
    assert ("Your time is <b>2.000x</b> the reference kernel's\n(95% interval 1.912&ndash;2.110, 7 interleaved rounds)"
            in page)
    assert page.count("Your time is") == 1  # the flagged timing has no ratio: none is shown
    student = timed.figures["student"]
    assert f"<tr><td>student</td><td>{student.median_ms}</td><td>{student.q1_ms} &ndash; {student.q3_ms}</td>" in page
    assert "<li>late work</li>" in page and "<li>no Triton kernel was launched in n=1</li>" in page  # the evidence
    shrunk = next(t.details for t in a.tests if isinstance(t.details, CorrectnessPayload) and t.details.largest_passing)
    assert f"Smallest failing case found: <code>{shrunk.smallest_failing.case}</code>" in page
    wrong = next(t.details for t in a.tests if isinstance(t.details, CorrectnessPayload) and t.details.nan_elements)
    assert f"{wrong.bad_elements} of {wrong.elements} elements wrong" in page and 'class="wrongmap"' in page


def test_the_replays_figures_are_written_as_results_json_always_had_them():
    from grader.judge import replay_stage
    from grader.judge.replay_process import Decision, Replayed

    student = Replayed(ms=[0.5, 0.7, 0.6], placements=[[0.5, 0.7, 0.6]], launches=2)
    r = replay_stage.Replays(Decision("scored", ""), student, Replayed(), reference_kept=True)
    data = replay_stage.describe(r).to_json()
    assert list(data) == ["student", "reference", "placements"]
    assert list(data["student"]) == ["median_ms", "reps", "launches", "placements_ms"]
    assert data["reference"] == {"median_ms": None, "reps": 0, "launches": 0, "placements_ms": [], "kept": True}
