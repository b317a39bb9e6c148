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

`grader check` keeps one between runs on the student's machine (`check_cache_folder`): the
input sets of its fixed performance seed, the roofline and the reference's kernels, so a
second check skips what the first one built. Its input sets are trimmed to a size
(GRADER_CACHE_GB, least recently used first); the student's own compiled kernels are kept
beside it (`TritonKeep`), copied into each worker's private cache and back, never shared with
anyone else's worker, and so is the interpreter's bounds check of an unchanged repository
(`BoundsKeep`). A class batch never uses any of them: its cache lives for one run.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from grader.codec import write_inputs
from grader.judge.plan import derive_seed, make_inputs
from grader.safefiles import read_plain
from grader.sandbox.files import open_worker_file, place, private_folder
from grader.settings import Settings
from grader.spec import Assignment, Case


def write_perf_set(spec: Assignment, case: Case, dtype: str, seed: int, index: int, path: Path) -> dict:
    """Input set `index` of a performance case, from the run's seed; returns its layout."""
    return write_inputs(make_inputs(spec, case, dtype, derive_seed(seed, "perf", str(index))), path)


KEPT_JSON_LIMIT = 1 << 20  # a kept layout, roofline or timing figure; more is none of ours
DEFAULT_CHECK_CACHE_GB = 24.0  # vector_add's five scoring-size sets are 10 GiB; all eight assignments' about 21


class CacheSettingError(ValueError):
    """GRADER_CACHE_GB is not a number: said in one line before anything runs."""


def check_cache_limit(settings: Settings) -> int:
    """Bytes of input sets `grader check` may keep between runs (GRADER_CACHE_GB; 0: none)."""
    raw = settings.cache_gb
    try:
        gb = float(raw) if raw else DEFAULT_CHECK_CACHE_GB
    except ValueError:
        raise CacheSettingError(f"GRADER_CACHE_GB={raw!r} is not a number of GiB "
                                f"(0 keeps nothing between checks)") from None
    return max(0, int(gb * (1 << 30)))


def check_cache_folder(settings: Settings) -> Path | None:
    """Where `grader check` keeps what the next check on this machine reuses: GRADER_CACHE_DIR,
    else $XDG_CACHE_HOME/grader, else ~/.cache/grader; None when GRADER_CACHE_GB is 0."""
    if check_cache_limit(settings) == 0:
        return None
    return settings.check_cache_base


class RunCache:
    def __init__(self, folder: Path, limit: int | None = None) -> None:
        """`limit`: bytes of input sets kept (least recently used go first); None: no limit."""
        self.folder = private_folder(folder)
        self.limit = limit

    @classmethod
    def temporary(cls) -> "RunCache":
        return cls(Path(tempfile.mkdtemp(prefix="grader-run-cache-")))

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    @contextmanager
    def _entry(self, name: str, wait: bool = True) -> Iterator[Path | None]:
        """Entry `name` held alone; a second job waits for the first one's file (with `wait`;
        else None comes back at once while another holds it)."""
        path = self.folder / name
        fd = os.open(self.folder / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield None
                return
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
            assert path is not None  # _entry waits for it
            data, layout_file = path.with_suffix(".safetensors"), path.with_suffix(".layout.json")
            made = not (data.is_file() and layout_file.is_file())
            if made:
                tmp = data.with_name(f".{data.name}.tmp")
                layout = write_perf_set(spec, case, dtype, seed, index, tmp)
                os.replace(tmp, data)
                layout_file.write_text(json.dumps(layout))
            else:
                os.utime(data)  # used now: the last to be trimmed
            place(data, dest, link)
            layout = json.loads(read_plain(layout_file, KEPT_JSON_LIMIT))
        if made and self.limit is not None:
            self.trim(keep=data)
        return layout

    def input_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.folder.glob("inputs-*.safetensors"))

    def trim(self, keep: Path | None = None) -> list[Path]:
        """Remove the least recently used input sets until they fit the limit (never `keep`, nor
        one another process holds); returns what was removed. Files already linked into a job
        folder stay there until that job ends."""
        if self.limit is None:
            return []
        entries = sorted(self.folder.glob("inputs-*.safetensors"), key=lambda f: f.stat().st_mtime)
        total = sum(f.stat().st_size for f in entries)
        removed = []
        for data in entries:
            if total <= self.limit:
                break
            if keep is not None and data == keep:
                continue
            with self._entry(data.stem, wait=False) as held:
                if held is None:  # another check is placing it right now
                    continue
                try:
                    size = data.stat().st_size
                    data.unlink()
                    data.with_suffix(".layout.json").unlink(missing_ok=True)
                    total -= size
                    removed.append(data)
                except FileNotFoundError:
                    pass
        return removed

    def roofline(self, gpu: str, measure: Callable[[], dict]) -> dict:
        """GPU `gpu`'s roofline (devicelock.device_id), measured once for the run (under the
        caller's timing lock)."""
        safe = "".join(c if c.isalnum() else "_" for c in gpu)
        with self._entry(f"roofline-{safe}.json") as path:
            assert path is not None  # _entry waits for it
            try:  # kept by an earlier job of the run (or check): read back as input, bounded, no link
                kept = json.loads(read_plain(path, KEPT_JSON_LIMIT))
                if isinstance(kept, dict):
                    return kept
            except (OSError, ValueError):
                pass
            figures = measure()
            path.write_text(json.dumps(figures))
            return figures

    def kept_timing(self, key: str) -> dict | None:
        """A trusted figure kept for the run under `key` (grader.judge.replay_stage.reference_key)."""
        safe = "".join(c for c in key if c.isalnum())[:64]
        try:
            data = json.loads(read_plain(self.folder / f"timing-{safe}.json", KEPT_JSON_LIMIT))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def keep_timing(self, key: str, figures: dict) -> None:
        safe = "".join(c for c in key if c.isalnum())[:64]
        tmp = self.folder / f".timing-{safe}.{os.getpid()}.json"
        tmp.write_text(json.dumps(figures))
        tmp.replace(self.folder / f"timing-{safe}.json")

    @property
    def trusted_triton_cache(self) -> Path:
        path = self.folder / "triton-trusted"
        path.mkdir(exist_ok=True)
        return path


class TritonKeep:
    """The student's own compiled kernels, kept between `grader check` runs on their machine.

    A worker compiles into its private Triton cache (its scratch folder). Before it starts,
    what earlier checks compiled is copied in; after it ends, what it added is copied back:
    only regular files, read without following links, at most `limit` bytes kept (oldest
    first out). Triton finds an entry by the hash of the kernel's source and settings, so a
    changed kernel compiles anew. Only `grader check` keeps one: a class batch never carries
    one student's files into another's worker."""

    ENTRY_LIMIT = 64 << 20  # one kernel's compiled files; more is not a Triton cache entry
    GROUP_LIMIT = 1 << 16  # a group file (Triton's list of one kernel's files), read as data

    def __init__(self, folder: Path, limit: int = 512 << 20) -> None:
        self.folder = Path(folder)
        self.limit = limit

    def seed(self, dest: Path) -> None:
        """Copy every kept kernel into a worker's (not yet started) Triton cache folder."""
        if not self.folder.is_dir():
            return
        dest.mkdir(parents=True, exist_ok=True)
        for entry in self.folder.iterdir():
            if (entry.is_dir() and not entry.is_symlink() and not entry.name.startswith(".")
                    and not (dest / entry.name).exists()):
                try:
                    shutil.copytree(entry, dest / entry.name, symlinks=True)
                    self._repoint(dest / entry.name)
                except (OSError, shutil.Error):  # trimmed by another check meanwhile: compiled anew
                    shutil.rmtree(dest / entry.name, ignore_errors=True)

    def _repoint(self, entry: Path) -> None:
        """Triton finds a compiled kernel through its group file (`__grp__<name>.json`), which
        names each of the kernel's files by absolute path: in the cache of the worker that
        compiled it, gone by the next check. Copied into a new worker's cache, each path is made
        the copy's own (the same file name in `entry`), or the group file is dropped (Triton then
        compiles anew). The group file was a worker's: read bounded, as data; only names of
        plain files in `entry` are written back."""
        import json

        for group in entry.glob("__grp__*.json"):
            try:
                if group.is_symlink() or group.stat().st_size > self.GROUP_LIMIT:
                    raise ValueError("not a group file")
                paths = json.loads(group.read_bytes()).get("child_paths")
                if not isinstance(paths, dict):
                    raise ValueError("no child paths")
                here = {}
                for child, path in paths.items():
                    name = Path(path).name if isinstance(path, str) else ""
                    mine = entry / name
                    if not (isinstance(child, str) and name and not name.startswith(".")
                            and mine.is_file() and not mine.is_symlink()):
                        raise ValueError("a child path that is not a file of the entry")
                    here[child] = str(mine)
                group.write_text(json.dumps({"child_paths": here}))
            except (OSError, ValueError, AttributeError, RecursionError):
                group.unlink(missing_ok=True)

    def keep(self, source: Path) -> int:
        """Copy back the entries a finished worker added; returns how many were kept."""
        try:  # the worker's own folder: never through a link it put in its place
            top = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return 0
        try:
            with os.scandir(top) as listing:
                names = [e.name for e in listing if e.is_dir(follow_symlinks=False)]
        except OSError:
            names = []
        private_folder(self.folder)
        kept = 0
        for name in names:
            target = self.folder / name
            if target.exists() or name.startswith("."):
                continue
            files = _regular_files(top, name, self.ENTRY_LIMIT)
            if not files:
                continue
            tmp = Path(tempfile.mkdtemp(prefix=".keep-", dir=self.folder))
            try:
                for name, data in files.items():
                    (tmp / name).write_bytes(data)
                os.replace(tmp, target)
                kept += 1
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        os.close(top)
        self._trim()
        return kept

    def _trim(self) -> None:
        entries = [(e.stat().st_mtime, e) for e in self.folder.iterdir() if e.is_dir() and not e.name.startswith(".")]
        sizes = {e: sum(f.stat().st_size for f in e.iterdir()) for _, e in entries}
        total = sum(sizes.values())
        for _, e in sorted(entries, key=lambda x: x[0]):
            if total <= self.limit:
                break
            shutil.rmtree(e, ignore_errors=True)
            total -= sizes[e]


def _regular_files(parent: int, name: str, limit: int) -> dict[str, bytes]:
    """The plain files directly in the worker-written folder `name` of `parent` (a descriptor):
    no link followed, no FIFO or device opened for long (grader.sandbox.files.open_worker_file);
    {} when any is not plain, or together they are over `limit`."""
    files, total = {}, 0
    try:
        folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return {}
    try:
        for entry in os.listdir(folder):
            fd = open_worker_file(Path(name) / entry, dir_fd=parent)
            with os.fdopen(fd, "rb") as f:
                files[entry] = f.read(limit - total + 1)  # bounded, though it may grow meanwhile
            total += len(files[entry])
            if total > limit:
                return {}
    except OSError:  # a link, a FIFO, a device, a folder, a file gone meanwhile
        return {}
    finally:
        os.close(folder)
    return files


class BoundsKeep:
    """The interpreter's bounds check (grader.judge.grade._bounds_check) of a repository, kept
    between `grader check` runs on the student's machine: the check replays the small cases in
    Triton's CPU interpreter (seconds of CPU), and its answer is a function of the repository's
    files, the assignment's spec folder, the grader's and the worker's code and installs, and the
    calls it replays (case, dtype, seed). Kept by the hash of all of them, a check of an unchanged
    repository reads it back; any changed byte checks again. Only a verdict is kept (no access out of
    bounds, or the first one found), never a check that could not run. The folder is the check's own
    kept cache (the student's, hidden from every worker), beside the repository's kept kernels; a
    batch or a CI run keeps none."""

    MAX_FILES = 4096  # a repository larger than this, or MAX_BYTES, is checked every time
    MAX_BYTES = 64 << 20
    MAX_ENTRY_BYTES = 1 << 20

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def key(self, repo: Path, spec_folder: Path, calls: list[tuple]) -> str | None:
        """The hash of what decides the check's answer; None where the repository is too large to
        hash (or cannot be read whole): then it is checked again."""
        from grader.sandbox.interpreter import code_identity

        h = hashlib.sha256(code_identity().encode())
        h.update(json.dumps(calls, sort_keys=True).encode())
        total = 0
        for label, root in (("spec", Path(spec_folder)), ("repo", Path(repo))):
            files = []
            for folder, dirs, names in os.walk(root):  # never through a link: a link is hashed as its target's name
                dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", ".git"))
                files += [Path(folder) / n for n in names]
                if len(files) > self.MAX_FILES:
                    return None
            for path in sorted(files):
                rel = str(path.relative_to(root))
                try:
                    if path.is_symlink():
                        data = b"link:" + os.readlink(path).encode("utf-8", "surrogateescape")
                    else:
                        data = read_plain(path, self.MAX_BYTES - total + 1)
                except OSError:
                    return None
                total += len(data)
                if total > self.MAX_BYTES:
                    return None
                h.update(f"{label}\0{rel}\0{len(data)}\0".encode("utf-8", "surrogateescape"))
                h.update(data)
        return h.hexdigest()[:32]

    def get(self, key: str) -> dict | None:
        """The kept check's result (a TestResult's JSON), or None."""
        try:
            data = json.loads(read_plain(self.folder / f"{key}.json", self.MAX_ENTRY_BYTES))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def put(self, key: str, result: dict) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".bounds-")
            with os.fdopen(fd, "w") as f:
                json.dump(result, f)
            os.replace(tmp, self.folder / f"{key}.json")
        except OSError:
            pass  # not kept: the next check checks again
