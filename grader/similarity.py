"""Similarity across a class: every pair of students' kernel modules per assignment, with
copydetect's winnowing (the MOSS algorithm: tokens normalised so that renamed names do not
matter, k-gram hashes, a window's minimum kept as a fingerprint).

A pair's score is the lower of the two shares (copydetect's "similarity" of each file: its
tokens covered by fingerprints found in the other), so one short file inside a long one does
not score high. The assignment's starter file is boilerplate (its fingerprints never count),
and so is a fingerprint found in more than `common_share` of the class (an idiom everybody
writes, as MOSS's -m). Pairs are found through an inverted index of fingerprints, so only
students who share something are compared: a class of 500 (125,000 pairs) takes seconds.

Nothing here decides anything: the pairs above the TA's threshold are leads, each with a
side-by-side page of the matching regions (OUT/similarity/<assignment>/<a>--<b>.html).
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import shutil
from collections import defaultdict
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
from copydetect import CodeFingerprint, compare_files
from copydetect.utils import get_token_coverage, highlight_overlap

K = 40  # characters of normalised code per k-gram (copydetect's noise threshold)
WINDOW = 6  # winnowing window: any match of K + WINDOW - 1 characters is found
DEFAULT_THRESHOLD = 0.6
COMMON_SHARE = 0.2  # a fingerprint in more than this share of the class is an idiom, not evidence (classes of 10+)
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


def compare_class(files: dict[str, str], starter: str | None, assignment: str, threshold: float = DEFAULT_THRESHOLD,
                  common_share: float = COMMON_SHARE) -> tuple[list[Pair], dict[str, CodeFingerprint], dict]:
    """All pairs of `files` (student -> source) at or above `threshold`, most similar first;
    with the fingerprints (for the side-by-side pages) and counts of what was done."""
    boilerplate = boilerplate_of(starter)
    fps = {s: fingerprint(text, f"{s}.py", boilerplate) for s, text in files.items()}
    index: dict[int, list[str]] = defaultdict(list)
    for s, fp in fps.items():
        for h in fp.hashes:
            index[h].append(s)
    common = set()
    if len(fps) >= 10:
        limit = max(2, int(common_share * len(fps)))
        common = {h for h, owners in index.items() if len(owners) > limit}
        for fp in fps.values():
            _drop(fp, common)
    candidates: set[tuple[str, str]] = set()
    for h, owners in index.items():
        if h not in common and len(owners) > 1:
            candidates.update(combinations(sorted(owners), 2))
    pairs = []
    for a, b in candidates:
        _, (sa, sb), _ = compare_files(fps[a], fps[b])
        score = min(sa, sb)
        if score >= threshold:
            pairs.append(Pair(assignment, a, b, round(float(score), 4), round(float(sa), 4), round(float(sb), 4)))
    pairs.sort(key=lambda p: (-p.score, p.a, p.b))
    n = len(fps)
    return pairs, fps, {"files": n, "pairs": n * (n - 1) // 2, "compared": len(candidates), "idioms_dropped": len(common)}


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


def _module_text(lock, p, spec) -> str | None:
    from grader.submission import SubmissionError, open_submission

    try:
        root = lock.checkout(p)
        path = root / open_submission(root).target(spec)[0]
        if not path.resolve().is_relative_to(root) or not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        return path.read_text(errors="replace")
    except (OSError, SubmissionError, AssertionError):
        return None


def _starter_text(spec) -> str | None:
    path = Path(spec.folder) / "starter" / spec.module
    return path.read_text() if path.is_file() else None


def update_similarity(view, out: Path, lock, threshold: float | None = None) -> None:
    """The view's similar pairs per assignment, with their pages under OUT/similarity/. A
    result is reused while the files, the starter and the settings are the same (a regrade of
    one student's other assignment costs nothing here)."""
    from grader import spec as specs

    course = getattr(view, "course", None)
    threshold = threshold or (course.similarity_threshold if course is not None else None) or DEFAULT_THRESHOLD
    out = Path(out)
    view.similarity_meta = {"threshold": threshold, "k": K, "window": WINDOW, "score": "min of the two shares",
                            "common_share": COMMON_SHARE, "per_assignment": {}}
    known = specs.catalogue()
    for a in view.assignments:
        if a not in known:
            continue
        spec = known[a]
        files = {}
        for p in lock.students:
            if p.status == "fetched" and p.path:
                text = _module_text(lock, p, spec)
                if text is not None and text.strip():
                    files[p.student] = text
        starter = _starter_text(spec)
        key = hashlib.sha256(json.dumps([sorted(files.items()), starter, threshold, K, WINDOW, COMMON_SHARE, MAX_PAIRS]).encode()).hexdigest()
        folder = out / FOLDER / a
        stored = _read(folder / "pairs.json")
        if stored and stored.get("key") == key:
            view.similarity[a] = [Pair(**d) for d in stored["pairs"]]
            view.similarity_meta["per_assignment"][a] = stored["counts"]
            continue
        pairs, fps, counts = compare_class(files, starter, a, threshold)
        counts["above_threshold"] = len(pairs)
        pairs = pairs[:MAX_PAIRS]
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        commits = {p.student: p.commit for p in lock.students}
        for pair in pairs:
            name = f"{_safe(pair.a)}--{_safe(pair.b)}.html"
            pair.page = f"{FOLDER}/{a}/{name}"
            (folder / name).write_text(side_by_side(pair, fps, {"commits": commits, "module": spec.module, "title": spec.title,
                                                                 "threshold": threshold}))
        (folder / "pairs.json").write_text(json.dumps({"key": key, "counts": counts, "pairs": [p.to_json() for p in pairs]}, indent=1))
        view.similarity[a] = pairs
        view.similarity_meta["per_assignment"][a] = counts


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _safe(name: str) -> str:
    from grader.roster import safe_name

    return safe_name(name)
