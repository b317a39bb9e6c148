"""What the grades of one run share: made once, reused by every job of the run.

A class graded with one seed times every student on the same performance inputs, on the
same GPU, against the same reference. Building a scoring-size input set costs seconds of CPU
(vector_add's is 2 GB of random numbers, written to disk), and the reference's autotuning as
long again, so doing it once per run and not once per student is most of a batch's time
outside the timed loops. Kept here:

- the performance input sets, keyed by assignment, case, dtype, seed and set index, each
  hard-linked into a job's folder where the worker cannot write it (its own uid, or a
  read-only view of the job folder; the sandbox never hands a linked file to a worker's uid),
  else copied: a worker that could write the shared file would change the next student's
  inputs. Links keep a class's disk use at one copy of the inputs, not one per job in flight;
- the roofline of each GPU, measured by the first timing phase on it;
- the trusted worker's Triton cache (reference kernels only: a student's worker always has
  its own, private cache).

The folder is the grader's, mode 0700, never inside a job folder, so no worker sees the
fresh input set of a later student or the hidden ones. Several job processes may fill it at
once: each entry is made under its own flock and published by a rename.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from grader.codec import write_inputs
from grader.judge.plan import derive_seed, make_inputs
from grader.sandbox.files import place
from grader.spec import Assignment, Case


def write_perf_set(spec: Assignment, case: Case, dtype: str, seed: int, index: int, path: Path) -> dict:
    """Input set `index` of a performance case, from the run's seed; returns its layout."""
    return write_inputs(make_inputs(spec, case, dtype, derive_seed(seed, "perf", str(index))), path)


class RunCache:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)

    @classmethod
    def temporary(cls) -> "RunCache":
        return cls(Path(tempfile.mkdtemp(prefix="grader-run-cache-")))

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    @contextmanager
    def _entry(self, name: str) -> Iterator[Path]:
        path = self.folder / name
        fd = os.open(self.folder / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a second job waits for the first one's file
            yield path
        finally:
            os.close(fd)

    def perf_inputs(self, spec: Assignment, case: Case, dtype: str, seed: int, index: int, dest: Path,
                    link: bool = False) -> dict:
        """Input set `index` of the performance case at `dest` (a hard link with `link`, else a
        copy); returns its layout."""
        key = derive_seed(seed, "perf", str(index), case.name, json.dumps(case.params, sort_keys=True), dtype)
        name = f"inputs-{spec.name}-{key}"
        with self._entry(name) as path:
            data, layout_file = path.with_suffix(".safetensors"), path.with_suffix(".layout.json")
            if not (data.is_file() and layout_file.is_file()):
                tmp = data.with_name(f".{data.name}.tmp")
                layout = write_perf_set(spec, case, dtype, seed, index, tmp)
                os.replace(tmp, data)
                layout_file.write_text(json.dumps(layout))
            place(data, dest, link)
            return json.loads(layout_file.read_text())

    def roofline(self, gpu: str, measure: Callable[[], dict]) -> dict:
        """GPU `gpu`'s roofline (devicelock.device_id), measured once for the run (under the
        caller's timing lock)."""
        safe = "".join(c if c.isalnum() else "_" for c in gpu)
        with self._entry(f"roofline-{safe}.json") as path:
            if path.is_file():
                return json.loads(path.read_text())
            figures = measure()
            path.write_text(json.dumps(figures))
            return figures

    @property
    def trusted_triton_cache(self) -> Path:
        path = self.folder / "triton-trusted"
        path.mkdir(exist_ok=True)
        return path
