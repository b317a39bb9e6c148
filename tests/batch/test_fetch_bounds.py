"""`grader fetch` is bounded: a repo small on the wire and huge on disk (one blob of hundreds of
megabytes of one byte, compressed to a few hundred kilobytes) is refused from its objects, before
anything is checked out, with the reason; the others are fetched as before. The limits are
course.toml's [fetch], with defaults no course's kernels come near."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.classbuild import make_class
from tests.conftest import COURSE, run_cli
from grader.batch.course import CourseError, FetchLimits, load_course


def folder_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def add_blob_of_one_byte(repo: Path, mib: int, name: str = "weights.bin") -> None:
    """A commit on top adding `name`: `mib` MiB of the letter a, written straight into git's
    objects (never to the disk as a file)."""
    sha = subprocess.run(f"head -c {mib << 20} /dev/zero | tr '\\0' a | git hash-object -w --stdin", shell=True, cwd=repo,
                         capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"100644,{sha},{name}"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=m", "-c", "user.email=m@x", "commit", "-q", "-m", "weights"], cwd=repo, check=True)


@pytest.mark.slow
def test_a_repo_huge_on_disk_is_not_graded_and_costs_no_one_else_disk(tmp_path):
    roster = make_class(tmp_path, {"alice": "good", "mallory": "good"})
    add_blob_of_one_byte(tmp_path / "repos" / "mallory", 300)
    run = run_cli(["fetch", "--roster", str(roster), "--out", "ws"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    lock = {p["student"]: p for p in json.loads((tmp_path / "ws" / "lock.json").read_text())["students"]}
    assert lock["alice"]["status"] == "fetched"
    assert lock["mallory"]["status"] == "unfetched"
    assert lock["mallory"]["reason"] == ("not graded: the repository is larger than the course allows (a file of 300 MiB; "
                                         "at most 256 MiB per file; course.toml's [fetch] sets the limits)")
    assert "not graded: the repository is larger than the course allows" in " ".join(run.stdout.split())
    assert not (tmp_path / "ws" / "repos" / "mallory" / "weights.bin").exists()
    assert folder_bytes(tmp_path / "ws") < 20 << 20  # the blob's pack only, never its 300 MiB
    # a course that allows it: fetched as any other
    course = tmp_path / "course.toml"
    course.write_text("[fetch]\nmax_file_mb = 400\nmax_checkout_mb = 400\n")
    run = run_cli(["fetch", "--roster", str(roster), "--out", "ws2", "--course", str(course)], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "ws2" / "repos" / "mallory" / "weights.bin").stat().st_size == 300 << 20


@pytest.mark.slow
def test_the_count_of_files_and_the_whole_checkout_are_bounded_too(tmp_path):
    roster = make_class(tmp_path, {"alice": "good"})
    course = tmp_path / "course.toml"
    course.write_text("[fetch]\nmax_files = 3\n")
    run = run_cli(["fetch", "--roster", str(roster), "--out", "ws", "--course", str(course)], tmp_path)
    lock = json.loads((tmp_path / "ws" / "lock.json").read_text())["students"][0]
    assert run.returncode == 1 and lock["reason"].startswith("not graded: the repository is larger than the course allows "
                                                             "(more than 3 files;"), lock
    assert not list((tmp_path / "ws" / "repos" / "alice").glob("kernels"))


def test_course_toml_sets_the_fetch_limits_and_refuses_nonsense(tmp_path):
    course = tmp_path / "course.toml"
    course.write_text("[fetch]\nmax_checkout_mb = 10\nmax_files = 7\nmax_file_mb = 2\n")
    assert load_course(course, COURSE).fetch == FetchLimits(10 << 20, 7, 2 << 20)
    course.write_text("[course]\nname = 'x'\n")
    assert load_course(course, COURSE).fetch == FetchLimits()
    for bad, words in (("max_files = 0", "max_files must be a number at least 1"), ("max_file_mb = 'big'", "max_file_mb must"),
                       ("max_inodes = 3", "unknown key 'max_inodes' in [fetch]")):
        course.write_text(f"[fetch]\n{bad}\n")
        with pytest.raises(CourseError, match=words.replace("[", r"\[").replace("]", r"\]")):
            load_course(course, COURSE)


def test_history_the_head_deleted_is_bounded_too_and_costs_no_more_disk_than_the_limit(tmp_path):
    """#47: a repository whose history holds 60 MiB of random data, deleted at its head, passes
    every checkout limit; the whole clone is bounded (course.toml's max_clone_mb): it is refused
    with the reason and its folder removed (its pack stopped at the limit: the write failed, not the disk)."""
    roster = make_class(tmp_path, {"alice": "good", "mallory": "good"})
    repo = tmp_path / "repos" / "mallory"
    (repo / "noise.bin").write_bytes(__import__("os").urandom(60 << 20))
    git = ["git", "-c", "user.name=m", "-c", "user.email=m@x"]
    subprocess.run([*git, "add", "noise.bin"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "noise"], cwd=repo, check=True)
    subprocess.run([*git, "rm", "-q", "noise.bin"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "gone"], cwd=repo, check=True)
    course = tmp_path / "course.toml"
    course.write_text("[fetch]\nmax_clone_mb = 20\n")
    # a deadline: the pin needs the history (without one only the head is fetched, and costs nothing)
    run = run_cli(["fetch", "--roster", str(roster), "--out", "ws", "--course", str(course),
                   "--deadline", "2100-01-01T00:00:00+00:00"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    lock = {p["student"]: p for p in json.loads((tmp_path / "ws" / "lock.json").read_text())["students"]}
    assert lock["alice"]["status"] == "fetched"
    assert lock["mallory"]["status"] == "unfetched"
    assert lock["mallory"]["reason"] == ("not graded: the repository is larger than the course allows (more than "
                                         "20 MiB of git history; course.toml's [fetch] max_clone_mb sets the limit)")
    assert not (tmp_path / "ws" / "repos" / "mallory").exists()
    assert folder_bytes(tmp_path / "ws") < 20 << 20
    run = run_cli(["fetch", "--roster", str(roster), "--out", "ws2"], tmp_path)  # the default allows it
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.slow
def test_the_class_is_bounded_as_a_whole_and_says_who_was_not_fetched_and_why(tmp_path):
    """Three students of 3 MiB of history each under a class budget of 8 MiB (each clone's own
    bound far above): the class never takes more than the budget, and whoever the budget left
    out is named with the reason; the budget is course.toml's or the command line's."""
    roster = make_class(tmp_path, {"alice": "good", "bob": "good", "carol": "good"})
    for name in ("alice", "bob", "carol"):
        subprocess.run(f"head -c {3 << 20} /dev/urandom > noise.bin && git add noise.bin && git -c user.name=m "
                       f"-c user.email=m@x commit -q -m noise", shell=True, cwd=tmp_path / "repos" / name, check=True)
    course = tmp_path / "course.toml"
    course.write_text("[fetch]\nmax_class_mb = 8\nmax_checkout_mb = 4\n")
    for ws, flags in (("ws", ["--course", str(course)]), ("ws2", ["--max-class-mb", "8", "--jobs", "1"])):
        run = run_cli(["fetch", "--roster", str(roster), "--out", ws, *flags], tmp_path)
        lock = {p["student"]: p for p in json.loads((tmp_path / ws / "lock.json").read_text())["students"]}
        left_out = [p for p in lock.values() if p["status"] == "unfetched"]
        assert run.returncode == 1 and len(left_out) >= 1, run.stdout + run.stderr
        for p in left_out:
            assert p["reason"].startswith("not fetched: the class's disk budget (8 MiB, course.toml's [fetch] "
                                          "max_class_mb or --max-class-mb) is used by the students fetched before"), p
            assert p["reason"] in " ".join(run.stdout.split())
        assert folder_bytes(tmp_path / ws / "repos") <= 8 << 20
        assert any(p["status"] == "fetched" for p in lock.values())


@pytest.mark.slow
def test_only_the_history_the_pin_needs_is_fetched(tmp_path):
    """A 6 MiB history behind a small tree (a blob added, then deleted): with no deadline and no
    commit of the roster's the pin is the head, and only the head is fetched (shallow); with a
    deadline the history is fetched, made whole from the shallow clone, to find the commit to pin."""
    roster = make_class(tmp_path, {"alice": "good", "bob": "good"})
    for name in ("alice", "bob"):
        subprocess.run(f"head -c {6 << 20} /dev/urandom > noise.bin && git add noise.bin && git -c user.name=m "
                       f"-c user.email=m@x commit -q -m noise && git rm -q noise.bin && git -c user.name=m "
                       f"-c user.email=m@x commit -q -m gone", shell=True, cwd=tmp_path / "repos" / name, check=True)
    run = run_cli(["fetch", "--roster", str(roster), "--out", "ws"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    for name in ("alice", "bob"):
        assert folder_bytes(tmp_path / "ws" / "repos" / name / ".git") < 2 << 20, name  # the head's objects alone
    lock = json.loads((tmp_path / "ws" / "lock.json").read_text())["students"]
    heads = {p["student"]: p["commit"] for p in lock}
    for name in ("alice", "bob"):
        assert heads[name] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path / "repos" / name,
                                             capture_output=True, text=True, check=True).stdout.strip()
    run = run_cli(["fetch", "--roster", str(roster), "--out", "ws", "--deadline", "2100-01-01T00:00:00+00:00"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert folder_bytes(tmp_path / "ws" / "repos" / "alice" / ".git") > 6 << 20  # the whole history, to pin by date
    assert not (tmp_path / "ws" / "repos" / "alice" / ".git" / "shallow").exists()
