"""Similarity across a class: every pair of students' kernel modules per assignment, with
copydetect's winnowing (the MOSS algorithm: tokens normalised so that renamed names do not
matter, k-gram hashes, a window's minimum kept as a fingerprint).

A pair's score is the lower of the two shares (copydetect's "similarity" of each file: its
tokens covered by fingerprints found in the other), so one short file inside a long one does
not score high. The assignment's starter file is boilerplate (its fingerprints never count),
and, where course.toml asks for it, so is a fingerprint found in more than `common_share` of the
class (an idiom everybody writes, as MOSS's -m). Pairs are found through an inverted index of
fingerprints, so only students who share something are compared, and tokenizing (the slow part)
runs on every core: a class of 500 (125,000 pairs) takes under a minute per assignment on 2
cores (docs/performance.md, benchmarks/similarity_scale.py).

Nothing here decides anything: the pairs above the TA's threshold are leads, each with a
side-by-side page of the matching regions (OUT/similarity/<assignment>/<a>--<b>.html).

A student's files are read as hostile (`read_in_repo`): never through a link out of the repo,
never a FIFO or a device, at most MAX_BYTES. A module (or grader.toml) that cannot be read is
that student's line under `not_compared` ("could not be read: ..."); the others are compared.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import multiprocessing
import os
import shutil
import stat
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

try:  # the `ta` extra (pip install "grader[ta]"); where it is missing, the class view lists no pairs and says why
    from copydetect import CodeFingerprint, compare_files
    from copydetect.utils import filter_code, get_document_fingerprints, get_token_coverage, highlight_overlap
    MISSING: ImportError | None = None
except ImportError as exc:
    MISSING = exc

K = 40  # characters of normalised code per k-gram (copydetect's noise threshold)
WINDOW = 6  # winnowing window: any match of K + WINDOW - 1 characters is found
DEFAULT_THRESHOLD = 0.6
# MOSS's -m: a fingerprint in more than this share of a class (of 10 or more) is dropped as the
# course's common code. Off unless course.toml sets [similarity] common_share: it would also hide a
# solution copied by that many (a public repo), and independent solutions stay under the threshold without it.
COMMON_SHARE: float | None = None
PARALLEL_FROM = 40  # files: from this many on, tokenizing (the slow part) is spread over the CPU cores
PARALLEL_PAIRS = 5000  # candidate pairs: from this many on, so is comparing them
MAX_PAIRS = 200  # per assignment, the most similar first
MAX_BYTES = 256 * 1024  # a larger module is not compared (it is not a kernel)
FOLDER = "similarity"


@dataclass
class Pair:
    assignment: str
    a: str
    b: str
    score: float  # min(share of a found in b, share of b found in a)
    share_a: float
    share_b: float
    page: str = ""  # the side-by-side view, relative to OUT

    def to_json(self) -> dict:
        return asdict(self)


def fingerprint(text: str, name: str, boilerplate: np.ndarray | None = None) -> CodeFingerprint:
    return CodeFingerprint(name, K, WINDOW, boilerplate, fp=io.StringIO(text), language="python")


def _tokenize(item: tuple[str, str]) -> tuple[str, str, np.ndarray]:
    name, text = item
    filtered, offsets = filter_code(text, f"{name}.py", "python")
    return name, filtered, offsets


def fingerprint_all(files: dict[str, str], boilerplate: np.ndarray,
                    jobs: int | None = None) -> dict[str, CodeFingerprint]:
    """Every file's CodeFingerprint. Tokenizing (pygments) is most of the time, so for a class
    it runs on all cores; the k-gram hashes are taken here, in one process (Python's string
    hash differs between processes)."""
    jobs = jobs or os.cpu_count() or 1
    if len(files) < PARALLEL_FROM or jobs < 2:
        return {s: fingerprint(text, s, boilerplate) for s, text in files.items()}
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            tokenized = list(pool.map(_tokenize, files.items(), chunksize=max(1, len(files) // (4 * jobs))))
    except (BrokenProcessPool, OSError):  # no processes to be had here: the same work, one core
        tokenized = [_tokenize(item) for item in files.items()]
    fps = {}
    for name, filtered, offsets in tokenized:
        fp = CodeFingerprint.__new__(CodeFingerprint)  # what its __init__ sets, from the parts made above
        fp.filename, fp.raw_code, fp.filtered_code, fp.offsets, fp.k = name, files[name], filtered, offsets, K
        fp.hashes, fp.hash_idx = get_document_fingerprints(filtered, K, WINDOW, boilerplate)
        fp.token_coverage = get_token_coverage(fp.hash_idx, K, len(filtered))
        fps[name] = fp
    return fps


def boilerplate_of(starter: str | None) -> np.ndarray:
    """Every k-gram of the starter (window 1, as copydetect does for boilerplate)."""
    if not starter:
        return np.array([], dtype=np.int64)
    return np.array(sorted(CodeFingerprint("starter.py", K, 1, fp=io.StringIO(starter), language="python").hashes))


def _drop(fp: CodeFingerprint, hashes: set) -> None:
    """Remove fingerprints (idioms of the class) from one file's, keeping copydetect's bookkeeping."""
    gone = fp.hashes & hashes
    if gone:
        fp.hashes = fp.hashes - gone
        fp.hash_idx = {h: i for h, i in fp.hash_idx.items() if h not in gone}
        fp.token_coverage = get_token_coverage(fp.hash_idx, fp.k, len(fp.filtered_code))


_FPS: dict[str, CodeFingerprint] = {}


def _init_worker(fps: dict[str, CodeFingerprint]) -> None:
    global _FPS
    _FPS = fps


def _compare_chunk(chunk: list[tuple[str, str]],
                   fps: dict[str, CodeFingerprint] | None = None) -> list[tuple[str, str, float, float]]:
    fps = fps or _FPS
    shares = []
    for a, b in chunk:
        _, (sa, sb), _ = compare_files(fps[a], fps[b])
        shares.append((a, b, float(sa), float(sb)))
    return shares


def _shares(fps: dict[str, CodeFingerprint], candidates: list[tuple[str, str]], jobs: int | None = None):
    """copydetect's two shares for every candidate pair; a class's worth on every core (the
    fingerprints are plain numbers by now, the same in any process)."""
    jobs = jobs or os.cpu_count() or 1
    if len(candidates) < PARALLEL_PAIRS or jobs < 2:
        return _compare_chunk(candidates, fps)
    size = max(200, len(candidates) // (8 * jobs))
    chunks = [candidates[i:i + size] for i in range(0, len(candidates), size)]
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                                 initargs=(fps,)) as pool:
            return [s for part in pool.map(_compare_chunk, chunks) for s in part]
    except (BrokenProcessPool, OSError):
        return _compare_chunk(candidates, fps)


def compare_class(files: dict[str, str], starter: str | None, assignment: str, threshold: float = DEFAULT_THRESHOLD,
                  common_share: float | None = COMMON_SHARE) -> tuple[list[Pair], dict[str, "CodeFingerprint"], dict]:
    """All pairs of `files` (student -> source) at or above `threshold`, most similar first;
    with the fingerprints (for the side-by-side pages) and counts of what was done."""
    if MISSING is not None:
        raise ImportError(f"copydetect is not installed here ({MISSING}): it comes with the TA's extra, pip install "
                          f"\"grader[ta]\"")
    started = time.perf_counter()
    boilerplate = boilerplate_of(starter)
    fps = fingerprint_all(files, boilerplate)
    fingerprinted = time.perf_counter()
    index: dict[int, list[str]] = defaultdict(list)
    for s, fp in fps.items():
        for h in fp.hashes:
            index[h].append(s)
    common = set()
    if common_share is not None and len(fps) >= 10:
        limit = max(2, int(common_share * len(fps)))
        common = {h for h, owners in index.items() if len(owners) > limit}
        for fp in fps.values():
            _drop(fp, common)
    candidates: set[tuple[str, str]] = set()
    for h, owners in index.items():
        if h not in common and len(owners) > 1:
            candidates.update(combinations(sorted(owners), 2))
    pairs = [Pair(assignment, a, b, round(min(sa, sb), 4), round(sa, 4), round(sb, 4))
             for a, b, sa, sb in _shares(fps, sorted(candidates)) if min(sa, sb) >= threshold]
    pairs.sort(key=lambda p: (-p.score, p.a, p.b))
    n = len(fps)
    return pairs, fps, {"files": n, "pairs": n * (n - 1) // 2, "compared": len(candidates),
                        "idioms_dropped": len(common),
                        "fingerprint_s": round(fingerprinted - started, 2),
                        "compare_s": round(time.perf_counter() - fingerprinted, 2)}


def side_by_side(pair: Pair, fps: dict[str, CodeFingerprint], context: dict) -> str:
    """A self-contained page: the two files, matching regions marked in both."""
    fa, fb = fps[pair.a], fps[pair.b]
    _, _, (sa, sb) = compare_files(fa, fb)
    left = _marked(fa.raw_code, sa)
    right = _marked(fb.raw_code, sb)
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(loader=PackageLoader("grader", "templates"), autoescape=select_autoescape(["html", "j2"]))
    return env.get_template("similarity_pair.html.j2").render(pair=pair, left=left, right=right, **context)


def _marked(code: str, slices) -> str:
    """The code as HTML with every matching region in a <mark>."""
    slices = np.asarray(slices)
    if slices.size == 0:
        return html.escape(code)
    marked, _ = highlight_overlap(code, slices, "<mark>", "</mark>", escape_html=True)
    return marked


class Unreadable(Exception):
    """A student's file that is not compared, and why (one line, for the dashboard's row)."""


def read_in_repo(root: Path, rel: str, limit: int = MAX_BYTES) -> str | None:
    """The text of the file `rel` names inside the repo at `root`; None if there is none.
    Never through a link that leads out of the repo (a link to a file inside it is followed),
    never a FIFO or a device (opened without blocking, then only a regular file is read),
    never more than `limit` bytes: anything else is Unreadable, with the reason."""
    try:
        root = Path(os.path.realpath(root))
        if "\0" in rel:
            raise Unreadable(f"{rel!r} is not a path")
        target = Path(os.path.realpath(root / rel))
        if target == root or not target.is_relative_to(root):
            raise Unreadable(f"{rel} is a link out of the repository")
        parts = target.relative_to(root).parts
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:  # each component opened without following a link: nothing swapped in since can lead out
            for part in parts[:-1]:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = inner
            file = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                           dir_fd=fd)
        finally:
            os.close(fd)
        with os.fdopen(file, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise Unreadable(f"{rel} is not a regular file")
            data = f.read(limit + 1) if info.st_size <= limit else b""
            if info.st_size > limit or len(data) > limit:
                raise Unreadable(f"{rel} is larger than {limit // 1024} KiB (not a kernel module)")
        return data.decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None  # not submitted: nothing to compare, nothing wrong
    except OSError as exc:
        raise Unreadable(f"{rel}: {exc.strerror or exc}") from None


def _module_text(lock, p, spec) -> str | None:
    """The student's module for `spec` (where grader.toml points it), or None if there is none;
    Unreadable when it is there but is not compared."""
    from grader.submission import open_submission

    root = lock.checkout(p)
    if os.path.lexists(root / "grader.toml"):  # read safely first: open_submission reads it as it is
        read_in_repo(root, "grader.toml", 64 * 1024)
    try:
        sub = open_submission(root)
        module = sub.target(spec)[0]
        problem = sub.problem(spec)  # an entry that names no module the grader may read (grader.submission)
    except Exception as exc:  # a grader.toml that names no readable module: this student's reason alone
        text = " ".join(str(exc).split())
        raise Unreadable(text if text.startswith("grader.toml")
                         else f"grader.toml: {type(exc).__name__}: {text}") from None
    if problem:
        raise Unreadable(" ".join(problem.split()))
    return read_in_repo(root, str(module))


def _starter_text(spec) -> str | None:
    path = Path(spec.folder) / "starter" / spec.module
    return path.read_text() if path.is_file() else None


def update_similarity(view, out: Path, lock, threshold: float | None = None) -> None:
    """The view's similar pairs per assignment, with their pages under OUT/similarity/. A
    result is reused while the files, the starter and the settings are the same (a regrade of
    one student's other assignment costs nothing here)."""
    course = getattr(view, "course", None)
    threshold = threshold or (course.similarity_threshold if course is not None else None) or DEFAULT_THRESHOLD
    common = course.similarity_common_share if course is not None else COMMON_SHARE
    out = Path(out)
    view.similarity_meta = {"threshold": threshold, "k": K, "window": WINDOW, "score": "min of the two shares",
                            "common_share": common, "per_assignment": {}}
    known = view.catalogue.catalogue()
    for a in view.assignments:
        if a not in known:
            continue
        spec = known[a]
        files, not_compared = {}, {}
        for p in lock.students:
            if p.status == "fetched" and p.path:
                try:
                    text = _module_text(lock, p, spec)
                except Unreadable as exc:
                    not_compared[p.student] = f"could not be read: {' '.join(str(exc).split())[:300]}"
                    continue
                except Exception as exc:  # one student's repo never costs the class its comparison
                    not_compared[p.student] = (f"could not be read: {type(exc).__name__}: "
                                               f"{' '.join(str(exc).split())[:300]}")
                    continue
                if text is not None and text.strip():
                    files[p.student] = text
        starter = _starter_text(spec)
        key = hashlib.sha256(json.dumps([sorted(files.items()), starter, threshold, K, WINDOW, common,
                                         MAX_PAIRS]).encode()).hexdigest()
        folder = out / FOLDER / a
        stored = _read(folder / "pairs.json")
        if stored and stored.get("key") == key:
            view.similarity[a] = [Pair(**d) for d in stored["pairs"]]
            view.similarity_meta["per_assignment"][a] = dict(stored["counts"], not_compared=not_compared)
            continue
        try:
            pairs, fps, counts = compare_class(files, starter, a, threshold, common)
        except Exception as exc:  # a review aid: its failure must not cost the grades, the dashboard or the gradebooks
            view.similarity[a] = []
            view.similarity_meta["per_assignment"][a] = {"files": len(files), "error": f"{type(exc).__name__}: {exc}",
                                                         "not_compared": not_compared}
            continue
        counts["above_threshold"] = len(pairs)
        pairs = pairs[:MAX_PAIRS]
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        commits = {p.student: p.commit for p in lock.students}
        for pair in pairs:
            name = f"{_safe(pair.a)}--{_safe(pair.b)}.html"
            try:
                (folder / name).write_text(side_by_side(pair, fps,
                                                        {"commits": commits, "module": spec.module, "title": spec.title,
                                                                     "threshold": threshold}))
                pair.page = f"{FOLDER}/{a}/{name}"
            except Exception:  # the pair stays listed, without its page
                pair.page = ""
        (folder / "pairs.json").write_text(json.dumps({"key": key, "counts": counts,
                                                       "pairs": [p.to_json() for p in pairs]}, indent=1))
        view.similarity[a] = pairs
        view.similarity_meta["per_assignment"][a] = dict(counts, not_compared=not_compared)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _safe(name: str) -> str:
    from grader.batch.roster import safe_name

    return safe_name(name)
