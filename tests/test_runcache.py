"""The run cache: one performance input set per seed for the whole class, the roofline once."""

import os
import stat

from safetensors.torch import load_file

from grader import spec as specs
from grader.judge import plan
from grader.judge import runcache
from grader.codec import write_inputs
from grader.judge.plan import derive_seed, make_inputs
from grader.judge.runcache import RunCache


def test_a_cached_input_set_is_the_one_the_seed_makes_and_is_made_once(tmp_path, monkeypatch):
    spec = specs.get("vector_add")
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
    spec = specs.get("vector_add")
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
