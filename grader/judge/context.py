"""The grading context: everything that decides how a submission is graded, fixed before any
grading starts.

`resolve()` is the one way in, for `grader check` and `grader grade` alike: it checks the
options, finds the device and the reference kernels, and returns a frozen `GradingContext`.
A class batch carries the same context whole to every job (as JSON); only the GPU a pool slot
owns is filled in there. Nothing writes to it while grading: what grading measures (the
roofline, phase times) comes back in the results. Adding an option is one field here plus
its flag in the CLI.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Sequence

from grader import environment
from grader.device import Device
from grader.judge.plan import PlannedCall, plan_calls
from grader.sandbox.backend import ISOLATION_MODES
from grader.settings import Settings
from grader.spec import DTYPES, Assignment, Course, CourseSecretError

CHECK_PERF_SEED = 20260101  # a check's performance inputs without --seed: the same every run, so they are kept


class ContextError(ValueError):
    """An option that cannot be graded with: said in one line, before anything runs."""


@dataclass(frozen=True)
class GradingContext:
    device: Device  # CUDA runs kernels on the GPU; CPU in Triton's interpreter
    seed: int
    cases: tuple[str, ...] | None = None  # only these named cases (a reproducer, a dry run)
    dtypes: tuple[str, ...] | None = None
    call_timeout: float | None = None  # seconds per call, overriding each spec's
    import_timeout: float | None = None  # seconds for the student's import, overriding each spec's
    isolation: str = "sandbox"  # how workers are contained: sandbox | docker | none (grader.sandbox)
    hide: tuple[str, ...] = ()  # more folders no worker may see (the output folder, the references)
    reference_dir: str | None = None  # the private reference kernels (None: the course's reference/)
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for the workers (a batch's pool slot sets it)
    cache: str | None = None  # the run cache folder (grader.judge.runcache): a batch's, or a check's kept one
    cache_limit: int | None = None  # bytes of input sets that cache keeps, least recently used out (a check's)
    perf_seed: int | None = None  # the performance input sets' seed (None: `seed`); a check's is fixed, so kept
    scratch_root: str | None = None  # where a grade's job folders go (None: the system's temp): a check puts
    #                                  them beside its kept cache, on one file system, so input sets are linked
    kept_kernels: str | None = None  # a check only: the student's compiled kernels kept between runs
    kept_bounds: str | None = None  # a check only: the interpreter's bounds check of an unchanged repository
    durations: str | None = None  # a check only: each assignment's seconds last time (a file of the kept cache),
    #                               so assignments graded at once start the longest first
    reproducer: str = "grader check ."  # the command a failure's one-line reproducer starts with
    partial_points: bool = False  # with cases/dtypes: each case earns its share of the full run
    perf_reps: int = 30  # timed calls per contender per round (rounds: see grader.judge.perf)
    perf_input_sets: int = 3
    perf_budget_s: float = 60.0  # per assignment, for extra rounds when the verdict is close
    replay_store: str | None = None  # where the replay's records are kept for `grader verify` (a batch's OUT/replay)

    def __post_init__(self) -> None:  # "cuda" or "cpu" as given (a stored context, a test's): the type
        object.__setattr__(self, "device", Device(self.device))

    @property
    def interpret(self) -> bool:
        return self.device == Device.CPU

    @property
    def partial(self) -> bool:
        """Only some cases or dtypes run, and each keeps its share of the full run's points."""
        return self.partial_points and bool(self.cases or self.dtypes)

    def calls(self, spec: Assignment) -> list[PlannedCall]:
        """This run's calls of `spec` (a fresh list: materializing fills them in)."""
        return plan_calls(spec, self.seed, self.interpret, list(self.cases or []) or None, list(self.dtypes or [])
                          or None)

    def unmatched(self, specs: list[Assignment]) -> list[str]:
        """What of --case and --dtype chooses no call of any of `specs`, each said with what it
        could have been: a typo, a hidden case's name where the kit has none, a dtype no
        assignment here takes. Empty: each chooses something."""
        from grader.judge.shrink import example_name

        missing = []
        for c in self.cases or ():
            if not any(plan_calls(s, self.seed, self.interpret, [c]) for s in specs):
                named = list(dict.fromkeys(case.name for s in specs for case in s.cases))
                # an example each assignment takes: its own way of naming sizes
                examples = [f"{e} ({s.name})" if len(specs) > 1 else e for s in specs if (e := example_name(s))]
                by_shape = f"; a random one by its shape, e.g. {', '.join(examples[:3])}" if examples else ""
                missing.append(f"--case {c}: no such case in {', '.join(s.name for s in specs)} (named cases: "
                               f"{', '.join(named[:20]) or 'none'}{by_shape})")
        for d in self.dtypes or ():
            if not any(plan_calls(s, self.seed, self.interpret, None, [d]) for s in specs):
                taken = list(dict.fromkeys(t for s in specs for t in s.dtypes))
                missing.append(f"--dtype {d}: no case of {', '.join(s.name for s in specs)} is in it (their dtypes: "
                               f"{', '.join(taken)})")
        return missing

    def full_plan(self, spec: Assignment) -> list[PlannedCall]:
        """Every call a run without --case/--dtype would make: what a partial run's shares come from."""
        return plan_calls(spec, self.seed, self.interpret)

    def call_timeout_for(self, spec: Assignment) -> float:
        return self.call_timeout or spec.call_timeout_s

    def import_timeout_for(self, spec: Assignment) -> float:
        return self.import_timeout or spec.import_timeout_s

    def reference_module(self, spec: Assignment) -> Path:
        return spec.reference_module(Path(self.reference_dir) if self.reference_dir else None)

    @property
    def performance_seed(self) -> int:
        return self.seed if self.perf_seed is None else self.perf_seed

    def kept_between_checks(self, folder: Path, limit: int, seed_given: bool, own_uid: bool,
                            kernels_of: str | None = None) -> "GradingContext":
        """This check with what the next check on this machine reuses kept in `folder`
        (grader.judge.runcache.check_cache_folder): the performance input sets of a fixed seed
        (the run's, when --seed was given), the roofline, the reference's compiled kernels,
        and with `kernels_of` (the repository's identity: Submission.identity) that
        repository's own compiled kernels and its bounds check (runcache.BoundsKeep), kept apart
        from every other's. The folder is hidden
        from every worker. `own_uid`: workers run as this user, so their job folders can live
        beside the cache and be linked into."""
        folder = Path(folder)
        return replace(self, cache=str(folder / "run"), cache_limit=limit, perf_seed=self.seed if seed_given
                       else CHECK_PERF_SEED,
                       scratch_root=str(folder / "jobs") if own_uid else None,
                       kept_kernels=str(folder / "kernels" / kernels_of) if kernels_of else None,
                       kept_bounds=str(folder / "bounds" / kernels_of) if kernels_of else None,
                       hide=tuple(dict.fromkeys((*self.hide, str(folder.resolve())))))

    def for_slot(self, gpu: str | None, cache: str | None = None) -> "GradingContext":
        """The same context on one pool slot's GPU, with the batch's run cache."""
        return replace(self, gpu=gpu, cache=cache)

    def key(self) -> dict:
        """What a stored grade must have been graded with to be reused (`grader grade --resume`)."""
        return {"device": self.device, "cases": _listed(self.cases), "dtypes": _listed(self.dtypes),
                "timeout": self.call_timeout, "seed": self.seed, "isolation": self.isolation}

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "GradingContext":
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return cls(**values)


def _listed(values: tuple[str, ...] | None) -> list[str] | None:
    return list(values) if values else None


def resolve(device: str = "auto", seed: int | None = None, cases: list[str] | None = None,
            dtypes: list[str] | None = None, timeout: float | None = None, isolation: str = "sandbox",
            hide: Sequence[Path] = (), reference_dir: Path | None = None, remote_gpu: bool = False,
            course: Course | None = None, **more: Any) -> GradingContext:
    """Check the options and fix the context. `device` auto picks the GPU when one is visible;
    a missing GPU, an unknown dtype or isolation mode, or a reference folder that does not
    exist is a ContextError (the CLI prints it and exits 2). `remote_gpu`: the jobs run on
    another machine's GPUs (a Ray cluster), so this one need not have one. `course`: the
    command's (default: the one the default settings imply)."""
    course = course if course is not None else Course.find(Settings())
    if device not in ("auto", *(d.value for d in Device)):
        raise ContextError(f"--device must be auto, cuda or cpu, not {device!r}")
    if device == Device.CUDA and not remote_gpu and not environment.has_gpu():
        raise ContextError("--device cuda: no CUDA GPU is visible here (use --device cpu for the interpreter)")
    resolved = (Device.CUDA if environment.has_gpu() else Device.CPU) if device == "auto" else Device(device)
    for d in dtypes or []:
        if d not in DTYPES:
            raise ContextError(f"unknown dtype {d!r} (known: {', '.join(DTYPES)})")
    if isolation not in ISOLATION_MODES:
        raise ContextError(f"--isolation must be one of {', '.join(ISOLATION_MODES)}, not {isolation!r}")
    if timeout is not None and timeout <= 0:
        raise ContextError("--timeout must be a positive number of seconds")
    try:  # read now, so a secret this user cannot read is one line here, not a traceback mid-grade
        course.secret()
    except CourseSecretError as exc:
        raise ContextError(str(exc)) from None
    private = [str(Path(h).resolve()) for h in hide]
    if reference_dir is not None:
        if not Path(reference_dir).is_dir():
            raise ContextError(f"--reference-dir {reference_dir}: no such folder")
        reference_dir = Path(reference_dir).resolve()
        private.append(str(reference_dir))  # the solutions: out of every worker's sight, wherever they are
    elif course.reference.is_dir():
        private.append(str(course.reference.resolve()))
    return GradingContext(resolved, seed if seed is not None else secrets.randbelow(2**31),
                          tuple(cases) if cases else None, tuple(dtypes) if dtypes else None, timeout,
                          isolation=isolation, hide=tuple(dict.fromkeys(private)),
                          reference_dir=str(reference_dir) if reference_dir else None, **more)

