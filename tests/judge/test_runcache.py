"""The run cache: one performance input set per seed for the whole class, the roofline once."""

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from safetensors.torch import load_file

from grader import spec as specs
from grader.judge import plan
from grader.judge import runcache
from grader.codec import write_inputs
from grader.judge.plan import derive_seed, make_inputs
from grader.judge.runcache import RunCache
from tests.conftest import COURSE


def test_a_cached_input_set_is_the_one_the_seed_makes_and_is_made_once(tmp_path, monkeypatch):
    spec = COURSE.get("vector_add")
    case = spec.cases[4]  # n=98432
    cache = RunCache(tmp_path / "cache")
    assert stat.S_IMODE(os.stat(cache.folder).st_mode) == 0o700  # no worker uid may read another student's fresh set

    made = []
    real = runcache.make_inputs
    monkeypatch.setattr(runcache, "make_inputs", lambda *a: made.append(a) or real(*a))
    layouts = [cache.perf_inputs(spec, case, "float32", 7, 1, tmp_path / f"job{j}.safetensors") for j in range(3)]
    assert len(made) == 1  # three students, one set built
    assert layouts[0] == layouts[1] == layouts[2]

    direct = write_inputs(make_inputs(spec, case, "float32", derive_seed(7, "perf", "1")), tmp_path / "direct.safetensors")
    assert direct == layouts[0]
    want = load_file(tmp_path / "direct.safetensors")
    for j in range(3):
        got = load_file(tmp_path / f"job{j}.safetensors")
        assert set(got) == set(want) and all((got[k] == want[k]).all() for k in want)

    # each job gets its own copy: writing one cannot change what the next student is given
    with open(tmp_path / "job0.safetensors", "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\xff\xff\xff\xff")
    cache.perf_inputs(spec, case, "float32", 7, 1, tmp_path / "job3.safetensors")
    assert (load_file(tmp_path / "job3.safetensors")["y"] == want["y"]).all()


def test_another_seed_set_or_dtype_is_another_entry(tmp_path):
    spec = COURSE.get("vector_add")
    case = spec.cases[1]
    cache = RunCache(tmp_path / "cache")
    files = {}
    for key in [(7, 0, "float32"), (8, 0, "float32"), (7, 1, "float32"), (7, 0, "float16")]:
        seed, index, dtype = key
        out = tmp_path / f"out-{seed}-{index}-{dtype}.safetensors"
        cache.perf_inputs(spec, case, dtype, seed, index, out)
        files[key] = load_file(out)["x"]
    values = [tuple(t.float().tolist()) for t in files.values()]
    assert len(set(values)) == 4
    assert plan.derive_seed(7, "perf", "0") != plan.derive_seed(8, "perf", "0")


def test_the_roofline_is_measured_once_per_gpu(tmp_path):
    cache = RunCache(tmp_path / "cache")
    calls = []
    first = cache.roofline("0", lambda: calls.append(1) or {"gpu": "H", "copy_gbps": 1.0})
    again = RunCache(tmp_path / "cache").roofline("0", lambda: calls.append(1) or {"gpu": "H", "copy_gbps": 2.0})
    other = cache.roofline("1", lambda: calls.append(1) or {"gpu": "H", "copy_gbps": 3.0})
    assert first == again == {"gpu": "H", "copy_gbps": 1.0}
    assert other["copy_gbps"] == 3.0 and len(calls) == 2
    cache.remove()
    assert not cache.folder.exists()


def test_a_kept_cache_trims_the_least_recently_used_input_sets_to_its_limit(tmp_path):
    spec = COURSE.get("vector_add")
    case = spec.cases[4]  # n=98432: two float32 tensors, about 0.75 MiB a set
    one = tmp_path / "probe.safetensors"
    RunCache(tmp_path / "sizing").perf_inputs(spec, case, "float32", 1, 0, one)
    size = one.stat().st_size
    cache = RunCache(tmp_path / "cache", limit=int(2.5 * size))  # room for two sets
    for index in (0, 1):
        cache.perf_inputs(spec, case, "float32", 7, index, tmp_path / f"a{index}.safetensors")
    first = sorted(cache.folder.glob("inputs-*.safetensors"), key=lambda f: f.stat().st_mtime)[0]
    past = first.stat().st_mtime - 60
    for f in cache.folder.glob("inputs-*.safetensors"):  # set 0 used a minute ago, set 1 now
        os.utime(f, (past, past) if f == first else None)
    cache.perf_inputs(spec, case, "float32", 7, 0, tmp_path / "again0.safetensors")  # used again: now the newest
    cache.perf_inputs(spec, case, "float32", 7, 2, tmp_path / "a2.safetensors")  # a third set: one must go
    kept = set(cache.folder.glob("inputs-*.safetensors"))
    assert len(kept) == 2 and first in kept  # set 1 (least recently used) went, set 0 (just used) stayed
    assert cache.input_bytes() <= cache.limit
    for f in cache.folder.glob("inputs-*.safetensors"):  # every kept set still has its layout
        assert f.with_suffix(".layout.json").is_file()
    # a set another check is placing right now (its entry's lock held) is not taken from under it
    import fcntl

    held = os.open(cache.folder / f".{first.stem}.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        cache.limit = 0
        assert first not in cache.trim() and first.is_file()
    finally:
        os.close(held)
        cache.limit = int(2.5 * size)
    # a job that linked a set keeps its file when the cache lets it go
    assert (tmp_path / "a1.safetensors").stat().st_size == size
    unlimited = RunCache(tmp_path / "batch")  # a batch's cache keeps everything for its one run
    for index in range(3):
        unlimited.perf_inputs(spec, case, "float32", 7, index, tmp_path / f"b{index}.safetensors")
    assert len(list(unlimited.folder.glob("inputs-*.safetensors"))) == 3 and unlimited.trim() == []


def test_where_a_check_keeps_its_cache_and_how_to_turn_it_off(tmp_path):
    from grader.settings import from_environment

    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert runcache.check_cache_folder(from_environment(env)) == tmp_path / "xdg" / "grader"
    assert runcache.check_cache_limit(from_environment(env)) == int(runcache.DEFAULT_CHECK_CACHE_GB * (1 << 30))
    env |= {"GRADER_CACHE_DIR": str(tmp_path / "mine"), "GRADER_CACHE_GB": "1.5"}
    mine = from_environment(env)
    assert runcache.check_cache_folder(mine) == tmp_path / "mine" and runcache.check_cache_limit(mine) == 3 << 29
    assert runcache.check_cache_folder(from_environment(env | {"GRADER_CACHE_GB": "0"})) is None
    with pytest.raises(runcache.CacheSettingError, match="GRADER_CACHE_GB='lots' is not a number of GiB"):
        runcache.check_cache_folder(from_environment(env | {"GRADER_CACHE_GB": "lots"}))


def _entry(folder: Path, name: str, files: dict[str, bytes]) -> Path:
    entry = folder / name
    entry.mkdir(parents=True)
    for f, data in files.items():
        (entry / f).write_bytes(data)
    return entry


def test_a_students_compiled_kernels_go_back_and_forth_as_plain_files_only(tmp_path):
    keep = runcache.TritonKeep(tmp_path / "kept", limit=1 << 20)
    worker = tmp_path / "worker1" / "triton-cache"
    _entry(worker, "HASHA", {"k.cubin": b"\x7fELF" + b"0" * 100, "k.json": b"{}"})
    secret = tmp_path / "grader-secret.txt"
    secret.write_text("the fresh input set")
    planted = worker / "HASHB"
    planted.mkdir()
    (planted / "k.cubin").symlink_to(secret)  # a worker that plants a link to the grader's files
    (worker / "HASHC").symlink_to(tmp_path)  # or links a whole entry
    _entry(worker, "HASHD", {"big.bin": b"x" * (runcache.TritonKeep.ENTRY_LIMIT + 1)})
    assert keep.keep(worker) == 1
    assert sorted(p.name for p in keep.folder.iterdir()) == ["HASHA"]
    assert (keep.folder / "HASHA" / "k.cubin").read_bytes().startswith(b"\x7fELF")
    assert stat.S_IMODE(os.stat(keep.folder).st_mode) == 0o700

    second = tmp_path / "worker2" / "triton-cache"
    keep.seed(second)  # the next check's worker starts with what the first compiled
    assert (second / "HASHA" / "k.json").read_bytes() == b"{}"
    _entry(second, "HASHE", {"k.cubin": b"1" * 600_000})
    _entry(second, "HASHF", {"k.cubin": b"2" * 600_000})
    os.utime(keep.folder / "HASHA", (1, 1))  # the oldest
    assert keep.keep(second) == 2
    kept = {p.name for p in keep.folder.iterdir()}
    assert "HASHA" not in kept and len(kept) == 1  # over 1 MiB: the oldest went first, then the next
    assert runcache.TritonKeep(tmp_path / "none").keep(tmp_path / "missing") == 0


def test_input_sets_are_made_side_by_side_only_as_far_as_memory_allows(monkeypatch):
    from grader.judge import perf

    pages = {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": (48 << 30) // 4096}  # 48 GiB free
    monkeypatch.setattr(perf.os, "sysconf", lambda name: pages[name])
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 16)
    assert perf.parallel_sets(3, 2 << 30) == 3  # vector_add's 2 GiB sets: 6 GiB each while made, 24 GiB to spend
    assert perf.parallel_sets(3, 5 << 30) == 1  # one at a time when memory is short
    pages["SC_AVPHYS_PAGES"] = 0
    assert perf.parallel_sets(3, 1) == 1  # never none
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 2)
    pages["SC_AVPHYS_PAGES"] = (48 << 30) // 4096
    assert perf.parallel_sets(3, 1 << 20) == 2  # a core each


def test_a_kept_kernel_is_found_by_triton_in_the_next_workers_cache(tmp_path, monkeypatch):
    """Triton finds a compiled kernel through its group file, which names the kernel's files by
    absolute path in the cache that compiled it: copied as it was into the next check's worker,
    every kept kernel missed and was compiled anew (2.9 s for the grader's own redraw kernel on an
    H200, in every check). Seeded, the paths are the copy's own, and Triton's own cache manager
    finds the kernel there; a hostile group file is dropped (compiled anew), never followed."""
    from triton.runtime.cache import FileCacheManager

    keep = runcache.TritonKeep(tmp_path / "kept")
    first = tmp_path / "check1" / "worker-1" / "triton-cache"
    entry = _entry(first, "HASHA", {"k.cubin": b"\x7fELF", "k.json": b"{}"})
    group = {"k.cubin": str(entry / "k.cubin"), "k.json": str(entry / "k.json")}
    (entry / "__grp__k.json").write_text(json.dumps({"child_paths": group}))
    hostile = _entry(first, "HASHB", {"k.cubin": b"\x7fELF", "k.json": b"{}"})
    (hostile / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": "/etc/passwd"}}))
    assert keep.keep(first) == 2
    shutil.rmtree(tmp_path / "check1")  # the first check's folders are gone when the next one starts

    second = tmp_path / "check2" / "worker-1" / "triton-cache"
    keep.seed(second)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(second))
    found = FileCacheManager("HASHA").get_group("k.json")
    assert found == {"k.cubin": str(second / "HASHA" / "k.cubin"), "k.json": str(second / "HASHA" / "k.json")}
    assert FileCacheManager("HASHB").get_group("k.json") is None  # a name not in its entry: compiled anew
    assert not (second / "HASHB" / "__grp__k.json").exists() and (second / "HASHB" / "k.cubin").is_file()


def test_the_bounds_checks_key_is_every_byte_of_the_repository_and_the_calls(tmp_path):
    from grader.judge.runcache import BoundsKeep

    keep = BoundsKeep(tmp_path / "kept")
    repo, spec = tmp_path / "repo", tmp_path / "spec"
    (repo / "kernels").mkdir(parents=True)
    spec.mkdir()
    (spec / "spec.py").write_text("SPEC = 1\n")
    (repo / "kernels" / "k.py").write_text("x = 1\n")
    calls = [("n=127", "{'n': 127}", "float32", 11, "")]
    key = keep.key(repo, spec, calls)
    assert key is not None and keep.key(repo, spec, calls) == key
    assert keep.key(repo, spec, [("n=127", "{'n': 127}", "float32", 12, "")]) != key  # another seed
    (repo / "kernels" / "k.py").write_text("x = 2\n")
    assert keep.key(repo, spec, calls) not in (None, key)  # one byte of the student's
    (repo / "kernels" / "k.py").write_text("x = 1\n")
    (spec / "spec.py").write_text("SPEC = 2\n")
    assert keep.key(repo, spec, calls) not in (None, key)  # the assignment's spec
    (spec / "spec.py").write_text("SPEC = 1\n")
    assert keep.key(repo, spec, calls) == key
    (repo / "kernels" / "link.py").symlink_to("/etc/passwd")  # a link is its target's name, never followed
    linked = keep.key(repo, spec, calls)
    assert linked not in (None, key)
    keep.put(linked, {"outcome": "passed"})
    assert keep.get(linked) == {"outcome": "passed"} and keep.get(key) is None
    (keep.folder / f"{key}.json").symlink_to(keep.folder / f"{linked}.json")  # a kept entry is never read through a link
    assert keep.get(key) is None
    keep.MAX_FILES = 1
    assert keep.key(repo, spec, calls) is None  # too large to hash: checked every time
