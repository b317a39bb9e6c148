"""What each kind of check records beside its outcome: one typed payload per result kind.

A `TestResult` is a correctness, performance, integrity or submission check (`Kind`); its
`details` is that kind's payload below, so a reader reads fields a type checker knows, never a
key it hopes is there. Each payload has the matched pair the results have (`to_json`,
`from_json`): `to_json` writes exactly the keys results.json always had, a field that is None
left out (one marked `null` is written as null; one marked `with` is written whenever the field
it names is), and `from_json` reads any results.json or batch record written before, a key no
field names kept in `extra` (a spec's own verdict figures, or a newer grader's) and written back
as it came. A payload never raises on a value of the wrong type: it holds what was stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, TypeVar


class Kind(str, Enum):
    """What a check checks. A member is a `str` equal to its value (as `Outcome` is), so
    results.json, records read back and comparisons with plain strings are unchanged."""

    def __str__(self) -> str:  # the value, not "Kind.X", in templates, f-strings and CSV
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    CORRECTNESS = "correctness"  # one case x dtype against the float64 truth
    PERFORMANCE = "performance"  # the timing stage (grader.judge.perf)
    INTEGRITY = "integrity"  # the student's own kernel did the work; its loads and stores stay in bounds
    SUBMISSION = "submission"  # the assignment as a whole: its module missing, unloadable, not gradable


_R = TypeVar("_R", bound="Record")


@dataclass
class Record:
    """The matched serialisation of a payload and of the records inside one. `_nested`: fields
    holding another record type; `_nested_maps`: fields holding a dict of them (by name);
    `_nested_lists`: fields holding a list of them."""

    _nested: ClassVar[dict[str, type[Record]]] = {}
    _nested_maps: ClassVar[dict[str, type[Record]]] = {}
    _nested_lists: ClassVar[dict[str, type[Record]]] = {}

    extra: dict[str, Any] = field(default_factory=dict, repr=False, metadata={"inline": True})  # keys no field names
    # the keys in the order they were read (a stored record, a spec's verdict): written back in it
    key_order: tuple[str, ...] = field(default=(), repr=False, compare=False, metadata={"inline": True})

    def to_json(self) -> dict[str, Any]:
        """The stored keys in the order results.json always had them: as they were read, where
        they were; else what a spec's own verdict wrote first, the fields, then what scoring
        added (points_if_run)."""
        data: dict[str, Any] = dict(self.extra)
        for f in sorted(fields(self), key=lambda f: f.name == "points_if_run"):  # the declared order, that one last
            value = getattr(self, f.name)
            if f.metadata.get("inline") or (value is None and not _written_as_null(self, f.metadata)):
                continue
            if isinstance(value, Record):
                value = value.to_json()
            elif f.name in self._nested_maps and isinstance(value, dict):
                value = {k: v.to_json() if isinstance(v, Record) else v for k, v in value.items()}
            elif f.name in self._nested_lists and isinstance(value, list):
                value = [v.to_json() if isinstance(v, Record) else v for v in value]
            data[f.metadata.get("key", f.name)] = value
        if not self.key_order:
            return data
        return {**{k: data[k] for k in self.key_order if k in data}, **data}

    @classmethod
    def from_json(cls: type[_R], data: dict[str, Any] | None) -> _R:
        if not isinstance(data, dict):  # nothing, or not a mapping: an empty payload
            return cls()
        keys = {f.metadata.get("key", f.name): f.name for f in fields(cls) if not f.metadata.get("inline")}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            name = keys.get(key)
            if name is None:
                extra[key] = value
            elif name in cls._nested and isinstance(value, dict):
                kwargs[name] = cls._nested[name].from_json(value)
            elif name in cls._nested_maps and isinstance(value, dict):
                inner = cls._nested_maps[name]
                kwargs[name] = {k: inner.from_json(v) if isinstance(v, dict) else v for k, v in value.items()}
            elif name in cls._nested_lists and isinstance(value, list):
                inner = cls._nested_lists[name]
                kwargs[name] = [inner.from_json(v) if isinstance(v, dict) else v for v in value]
            else:
                kwargs[name] = value
        return cls(extra=extra, key_order=tuple(data), **kwargs)


def _written_as_null(payload: Record, metadata) -> bool:
    """A None field that results.json has always written as null: always (`null`), or whenever
    the field named by `with` has a value."""
    return bool(metadata.get("null")) or ("with" in metadata and getattr(payload, metadata["with"]) is not None)


@dataclass
class Payload(Record):
    """What every kind's payload holds."""

    # a skipped check: the points it is worth where it can run (grader.judge.scoring), earned nowhere here
    points_if_run: float | None = None


NULL = {"null": True}


@dataclass
class SmallestFailing(Record):
    """The least failing case the shrinking search found (grader.judge.grade._shrink_failures)."""

    case: str | None = None
    shape: str | None = None
    message: str | None = None
    reproducer: str | None = None
    start: str | None = field(default=None, metadata={"key": "from"})  # the case the search started from
    runs: int | None = None


@dataclass
class LargestPassing(Record):
    """The case just below the smallest failing one, which passes, and the boundary between them."""

    case: str | None = None
    boundary: str | None = None


@dataclass
class CorrectnessPayload(Payload):
    """One case's verdict (grader.judge.verdict) and what the call did (grader.judge.grade). A
    function with several results that all passed: each result's own payload in `parts`, under
    its name (written at the top level, as results.json always had them)."""

    _nested: ClassVar[dict[str, type[Record]]] = {"smallest_failing": SmallestFailing,
                                                  "largest_passing": LargestPassing}

    max_abs_error: float | None = None  # over the finite values
    max_rel_error: float | None = None
    torch_abs_error: float | None = None  # torch's own error in this dtype: the error model's yardstick
    allowed_abs_error: str | None = None  # the error model, in words
    bad_elements: int | None = None
    elements: int | None = None
    nan_elements: int | None = None  # computed NaN and inf where the truth is finite
    inf_elements: int | None = None
    unwritten_elements: int | None = None  # still the poison of memory never written
    first_bad_index: list[int] | None = None
    first_bad_value: str | None = None
    computed_nonfinite: dict[str, Any] | None = None  # grader.judge.nonfinite.first_computed
    pattern: str | None = None  # the shape of the mismatch, in words: what groups failures
    wrong_map: dict[str, Any] | None = None  # grader.judge.picture.wrong_map
    wrong_output: str | None = None  # of several results, the first wrong one
    seconds: float | None = None  # the call's wall time
    kernels: dict[str, int] | None = None  # Triton launches by kernel name (the worker's word)
    blocks: dict[str, int] | None = None  # the launches' BLOCK* sizes, for the picture's boundaries
    smallest_failing: SmallestFailing | None = None
    largest_passing: LargestPassing | None = None
    parts: dict[str, CorrectnessPayload] = field(default_factory=dict, metadata={"inline": True})

    def to_json(self) -> dict[str, Any]:
        data = {**{name: part.to_json() for name, part in self.parts.items()}, **super().to_json()}
        return {**{k: data[k] for k in self.key_order if k in data}, **data}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> CorrectnessPayload:
        payload = super().from_json(data)
        for key in [k for k, v in payload.extra.items() if isinstance(v, dict) and "max_abs_error" in v]:
            payload.parts[key] = cls.from_json(payload.extra.pop(key))  # one result's verdict, by its name
        return payload


@dataclass
class Figures(Record):
    """One contender's timing figures (student, reference, torch)."""

    median_ms: float | None = None
    q1_ms: float | None = None
    q3_ms: float | None = None
    event_median_ms: float | None = None
    host_median_ms: float | None = field(default=None, metadata=NULL)  # null: no host clock figures
    gbps: float | None = field(default=None, metadata=NULL)  # null: no GPU work at all
    roofline_pct: float | None = field(default=None, metadata=NULL)
    first_call_ms: float | None = None
    tflops: float | None = None  # a compute-bound assignment's only


@dataclass
class FindingNote(Record):
    """One timing finding as results.json records it (grader.judge.perf.Finding, in words)."""

    severity: str | None = None  # a `Severity` value: "review" or "conclusive"
    text: str | None = None


@dataclass
class Witnessed(Record):
    """What the grader's own clock said of the worker's figures (grader.judge.witness, recorded
    by grader.judge.perf._witnessed)."""

    calls: int | None = None  # per burst
    cost_s: float | None = None
    prepare_s: float | None = None
    agreement: float | None = None  # the grader's clock over the worker's figure: 1.0 honest
    confirmed: bool | None = None
    graph: bool | None = None  # the student's burst was a CUDA graph
    student_ms: list[float] | None = None  # per round, by the grader's clock
    worker_ms: list[float] | None = None  # per round, the worker's own figure
    brackets_ms: dict[str, list[float]] | None = None  # by contender, each burst's bracket
    eager: str | None = None  # why the student's burst is not a CUDA graph
    note: str | None = None  # for the student, where the score moved to the grader's clock


@dataclass
class Ceilings(Record):
    """The GPU's measured ceilings (grader.protocol.RooflineReply), for the run to reuse and record."""

    gpu: str | None = None
    copy_gbps: float | None = None
    gemm_tflops: dict[str, float] | None = None  # by dtype


@dataclass
class ReplaySide(Record):
    """One contender's replay figures (grader.judge.replay_stage.describe)."""

    median_ms: float | None = field(default=None, metadata=NULL)  # null: no rep timed
    reps: int | None = None
    launches: int | None = None  # kernel launches per rep
    placements_ms: list[float] | None = None  # the median of each placement of its buffers
    kept: bool | None = None  # the reference's only: its figure came from the run's cache


@dataclass
class ReplayInputs(Record):
    """The input set the replay timed, for `grader verify` and `--profile` to draw again."""

    seed: int | None = None
    set: int | None = None
    case: str | None = None
    dtype: str | None = None


@dataclass
class ReplayDetails(Record):
    """The replay's figures and the records kept for `grader verify` (grader.judge.replay_stage)."""

    _nested: ClassVar[dict[str, type[Record]]] = {"student": ReplaySide, "reference": ReplaySide,
                                                  "inputs": ReplayInputs}

    student: ReplaySide | None = None
    reference: ReplaySide | None = None
    placements: int | None = None  # placements of each contender's buffers
    kept: dict[str, str] | None = None  # by contender, the SHA-256 naming its kept record's folder
    inputs: ReplayInputs | None = None


@dataclass
class PerformancePayload(Payload):
    """The timing stage's record (grader.judge.perf): the figures, the roofline, the ratio and
    its interval, the findings, and what the grader's own clock and the compiler said. Every
    field optional: a check that stopped early records only what it reached."""

    _nested: ClassVar[dict[str, type[Record]]] = {"witness": Witnessed, "roofline": Ceilings, "replay": ReplayDetails}
    _nested_maps: ClassVar[dict[str, type[Record]]] = {"figures": Figures}
    _nested_lists: ClassVar[dict[str, type[Record]]] = {"findings": FindingNote}

    figures: dict[str, Figures] | None = None  # by contender
    bytes: int | None = None  # the bytes one call must move
    copy_gbps: float | None = None
    gpu: str | None = None
    rounds: int | None = None
    samples: int | None = None
    score_on: str | None = None  # "gpu" or "wall"
    floor_ms: float | None = None  # the least time the roofline allows
    roofline_kind: str | None = None  # which ceiling sets the floor: "copy bandwidth" or "cuBLAS GEMM peak"
    evidence: list[str] | None = None  # the findings' words
    findings: list[FindingNote] | None = None
    flops: int | None = None
    gemm_tflops: float | None = field(default=None, metadata={"with": "flops"})
    ratio_to_torch: float | None = None
    ratio_to_reference: float | None = None
    ratio_interval: list[float] | None = None  # 95%
    score_fraction: float | None = None  # of the performance points, from the ratio
    scored_against: str | None = None  # "faster": the faster of reference and torch, round by round
    rounds_vendor_faster: int | None = None
    witness: Witnessed | None = None  # what the grader's own clock said (grader.judge.witness)
    phase_seconds: dict[str, float] | None = None
    roofline: Ceilings | None = None  # the GPU's measured ceilings, for the run to reuse and record
    compiled: dict[str, dict[str, Any]] | None = None  # what the compiler made of each kernel
    why_slow: dict[str, Any] | None = None  # grader.judge.slowness.why_slow
    timed_by: str | None = None  # "replay" (grader.judge.replay_stage), "fallback" (the worker's rounds) or "rounds"
    replay_refused: str | None = None  # why the fallback timed it
    replay: ReplayDetails | None = None  # the replay's figures and the records kept for `grader verify`
    # the function's own calls by the grader's clock against its replayed figure (grader.judge.timing.confirmation)
    confirmation: dict[str, Any] | None = None
    held: str | None = None  # why the figure's points wait for a TA's review (a figure the grader could not verify)


@dataclass
class IntegrityPayload(Payload):
    """Whether the student's own kernel did the work (grader.judge.integrity)."""

    kernels_launched: dict[str, int] | None = None
    evidence: list[str] | None = None
    concerns: list[str] | None = None  # the tests a finding for review withholds the points of


@dataclass
class SubmissionPayload(Payload):
    """Why the assignment as a whole was not checked (grader.judge.grade): which one fact."""

    not_submitted: bool | None = None
    not_gradable: bool | None = None
    infra_error: bool | None = None
    import_failed: bool | None = None
    missing_function: str | None = None
    module: str | None = None


PAYLOADS: dict[Kind, type[Payload]] = {
    Kind.CORRECTNESS: CorrectnessPayload,
    Kind.PERFORMANCE: PerformancePayload,
    Kind.INTEGRITY: IntegrityPayload,
    Kind.SUBMISSION: SubmissionPayload,
}


def payload_for(kind: Kind, data: Payload | dict[str, Any] | None) -> Payload:
    """`data` as the payload of `kind`: a payload of that type as it is, anything else read."""
    cls = PAYLOADS[kind]
    if isinstance(data, cls):
        return data
    return cls.from_json(data.to_json() if isinstance(data, Payload) else data)
