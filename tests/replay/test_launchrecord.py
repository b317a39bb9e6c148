"""The trusted side's reading of a launch record (grader.replay.launchrecord): a well-formed record
becomes a plan in the call's order; every hostile variation is refused, before any binary is
loaded, with the reason. Fake records and fake compiled files (nothing here runs on a GPU)."""

from __future__ import annotations

import copy
import hashlib
import json
import os

import pytest

from grader.replay import launchrecord
from grader.replay.launchrecord import Fill, LaunchRecordError, RecordedLaunch

CUBIN = b"\x7fELF not really a cubin"


def _files(folder, name="add_kernel", warps=4, shared=0, arch=90):
    meta = json.dumps({"name": name, "num_warps": warps, "shared": shared, "num_ctas": 1,
                       "target": {"backend": "cuda", "arch": arch, "warp_size": 32}}).encode()
    digests = {}
    for label, data in ((f"{name}.json", meta), (f"{name}.cubin", CUBIN)):
        digest = hashlib.sha256(data).hexdigest()
        (folder / digest).unlink(missing_ok=True)  # never written through a link a test left there
        (folder / digest).write_bytes(data)
        digests[label] = digest
    return digests


def _record(folder) -> dict:
    key = "a" * 64
    return {
        "kernels": {key: {"name": "add_kernel", "files": _files(folder), "signature": {"x_ptr": "*fp32", "o_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                          "constants": [[[3], 1024]], "arg_names": ["x_ptr", "o_ptr", "n", "BLOCK"]}},
        "launches": [{"name": "add_kernel", "kernel": key, "grid": [4, 1, 1], "stream": 0, "num_warps": 4, "num_ctas": 1, "shared": 0,
                      "args": [{"name": "x_ptr", "kind": "tensor", "role": "input", "ref": "x", "offset": 0},
                               {"name": "o_ptr", "kind": "tensor", "role": "output", "ref": 0, "offset": 0},
                               {"name": "n", "kind": "value", "value": 4096},
                               {"name": "BLOCK", "kind": "value", "value": 1024}]}],
        "sequence": [{"fill": {"role": "output", "ref": 0, "offset": 0, "shape": [4096], "stride": [1], "dtype": "float32", "value": 0.0}},
                     {"launch": 0}],
        "scratch": [],
        "outputs": [{"dtype": "float32", "shape": [4096], "stride": [1], "offset": 0, "nbytes": 16384}],
        "why_not": [],
    }


INPUTS = {"x": 16384}


def test_a_well_formed_record_becomes_the_plan_in_the_calls_order(tmp_path):
    raw = _record(tmp_path)
    (tmp_path / "launches.json").write_text(json.dumps(raw))
    plan = launchrecord.load(tmp_path, INPUTS, arch=90)
    assert [type(s) for s in plan.steps] == [Fill, RecordedLaunch]
    launch = plan.steps[1]
    assert launch.grid == (4, 1, 1) and launch.kernel.name == "add_kernel"
    assert [(a.role, a.ref, a.offset) for a in launch.args[:2]] == [("input", "x", 0), ("output", 0, 0)]
    assert launch.kernel.files["add_kernel.cubin"].read_bytes() == CUBIN


def test_launches_on_several_streams_are_accepted_and_replayed_in_the_records_order(tmp_path):
    """A call that splits its work over streams (joined back to the caller's) is replayed: every
    launch on one stream, in the order the call made them, so its overlap is not credited."""
    raw = _record(tmp_path)
    second = json.loads(json.dumps(_launch(raw)))
    second["stream"] = 1
    raw["launches"].append(second)
    raw["sequence"].append({"launch": 1})
    plan = launchrecord.check(raw, tmp_path, INPUTS, 90)
    launches = [s for s in plan.steps if isinstance(s, RecordedLaunch)]
    assert len(launches) == 2 and isinstance(plan.steps[0], Fill)  # the fill, then both launches, in order


def _refused(tmp_path, change, inputs=INPUTS, arch=90) -> str:
    raw = _record(tmp_path)
    change(raw)
    with pytest.raises(LaunchRecordError) as info:
        launchrecord.check(raw, tmp_path, inputs, arch)
    return str(info.value)


def _launch(raw):
    return raw["launches"][0]


def _kernel(raw):
    return next(iter(raw["kernels"].values()))


@pytest.mark.parametrize("change, reason", [
    (lambda r: r.update(why_not=["launches on 2 streams"]), "not replayable: launches on 2 streams"),
    (lambda r: _launch(r).update(grid=[0, 1, 1]), "grid is not an integer"),
    (lambda r: _launch(r).update(grid=[2**31, 1, 1]), "grid is not an integer"),
    (lambda r: _launch(r).update(grid=[4, 1]), "grid is not three numbers"),
    (lambda r: _launch(r)["args"][0].update(offset=16384), "x_ptr's offset is not an integer in [0, 16383]"),
    (lambda r: _launch(r)["args"][0].update(ref="y"), "input 'y' is not one of the call's"),
    (lambda r: _launch(r)["args"][1].update(role="somewhere"), "role 'somewhere' is not input, output or scratch"),
    (lambda r: _launch(r)["args"][1].update(role="scratch"), "scratch '0' is not one of the call's"),
    (lambda r: _launch(r)["args"][2].update(value=2**40), "n does not fit i32"),
    (lambda r: _launch(r)["args"][2].update(kind="tensor", role="input", ref="x", offset=0), "n is a tensor where the kernel takes i32"),
    (lambda r: _launch(r).update(num_warps=8), "warps or shared memory differ"),
    (lambda r: _launch(r).update(stream=launchrecord.MAX_STREAMS), "stream is not an integer"),
    (lambda r: _launch(r).update(stream=-1), "stream is not an integer"),
    (lambda r: _launch(r).update(stream="1"), "stream is not an integer"),
    (lambda r: _kernel(r)["signature"].update(n="i32); system(\"sh\""), "signature has a type the replay refuses"),
    (lambda r: _kernel(r).update(name="../../etc"), "name is not an identifier"),
    (lambda r: r["outputs"][0].update(dtype="complex128"), "dtype 'complex128' is not one the replay knows"),
    (lambda r: r["outputs"][0].update(shape=[8192]), "output 0: the view runs past its buffer"),
    (lambda r: r["sequence"].reverse(), None),  # a fill after the launch is fine; a launch twice is not
    (lambda r: r["sequence"].append({"launch": 0}), "launches out of order"),
    (lambda r: r["sequence"].pop(), "the sequence does not hold every launch once"),
    (lambda r: r["sequence"][0]["fill"].update(role="input", ref="x"), "the call wrote an input"),
    (lambda r: r["sequence"][0]["fill"].update(value=float("nan")), "not a finite number"),
    (lambda r: r.update(launches=[copy.deepcopy(r["launches"][0]) for _ in range(launchrecord.MAX_LAUNCHES + 1)]), "launches is not a list of at most"),
    (lambda r: r.update(scratch=[{"nbytes": 1 << 34, "init": None}]), "scratch 0: nbytes"),
])
def test_a_hostile_record_is_refused_with_the_reason(tmp_path, change, reason):
    if reason is None:
        raw = _record(tmp_path)
        change(raw)
        assert [type(s) for s in launchrecord.check(raw, tmp_path, INPUTS, 90).steps] == [RecordedLaunch, Fill]
        return
    assert reason in _refused(tmp_path, change)


def _with_descriptor(raw, **change):
    _kernel(raw)["signature"]["o_ptr"] = "tensordesc<fp32[64, 64]>"
    desc = {"name": "o_ptr", "kind": "tensordesc", "role": "output", "ref": 0, "offset": 0, "dtype": "float32",
            "shape": [64, 64], "strides": [64, 1], "block_shape": [64, 64], "padding": "zero", "round_f32_to_tf32": False}
    desc.update(change)
    _launch(raw)["args"][1] = desc


def test_a_host_tma_descriptor_is_bounded_by_its_buffer(tmp_path):
    raw = _record(tmp_path)
    _with_descriptor(raw)
    arg = launchrecord.check(raw, tmp_path, INPUTS, 90).steps[1].args[1]
    assert arg.kind == "tensordesc" and arg.desc["shape"] == [64, 64]
    assert "reaches past its buffer" in _refused(tmp_path, lambda r: _with_descriptor(r, shape=[65, 64]))
    assert "reaches past its buffer" in _refused(tmp_path, lambda r: _with_descriptor(r, strides=[128, 1]))
    assert "not 16-byte aligned" in _refused(tmp_path, lambda r: _with_descriptor(r, offset=4))
    assert "shape, strides and block shape disagree" in _refused(tmp_path, lambda r: _with_descriptor(r, strides=[1, 64]))


def test_a_copy_step_stays_inside_its_buffers_and_never_writes_an_input(tmp_path):
    def copying(**change):
        def apply(raw):
            step = {"to": {"role": "output", "ref": 0, "offset": 0, "shape": [64, 64], "stride": [64, 1], "dtype": "float32"},
                    "from": {"role": "input", "ref": "x", "offset": 0, "shape": [64, 64], "stride": [1, 64], "dtype": "float32"}}
            for end, fields in change.items():
                step[end].update(fields)
            raw["sequence"].insert(0, {"copy": step})
        return apply

    raw = _record(tmp_path)
    copying()(raw)
    steps = launchrecord.check(raw, tmp_path, INPUTS, 90).steps
    assert isinstance(steps[0], launchrecord.Copy) and steps[0].source.stride == [1, 64]
    assert "from runs past its buffer" in _refused(tmp_path, copying(**{"from": {"offset": 4}}))
    assert "the call wrote an input" in _refused(tmp_path, copying(to={"role": "input", "ref": "x"}))
    assert "the shapes differ" in _refused(tmp_path, copying(to={"shape": [32, 64]}))
    assert "not aligned to its dtype" in _refused(tmp_path, copying(to={"offset": 2, "shape": [1], "stride": [1]}, **{"from": {"shape": [1]}}))


def test_compiled_files_are_checked_before_anything_is_loaded(tmp_path):
    # a file that is not what its hash names
    def swapped(raw):
        digest = _kernel(raw)["files"]["add_kernel.cubin"]
        (tmp_path / digest).write_bytes(b"something else")
    assert "add_kernel.cubin is not the file its hash names" in _refused(tmp_path, swapped)

    # a link out of the record's folder (to a file of the test's own, with the same bytes)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.write_bytes(CUBIN)

    def linked(raw):
        digest = _kernel(raw)["files"]["add_kernel.cubin"]
        (tmp_path / digest).unlink()
        os.symlink(outside, tmp_path / digest)
    assert "cannot be opened" in _refused(tmp_path, linked)
    assert outside.read_bytes() == CUBIN

    # metadata of another kernel, a binary for another GPU, a label that climbs out
    assert "built for sm_90, this GPU is sm_80" in _refused(tmp_path, lambda r: None, arch=80)

    def renamed(raw):
        _kernel(raw)["files"] = _files(tmp_path, name="other_kernel")
    assert "no metadata and binary named add_kernel" in _refused(tmp_path, renamed)

    def climbing(raw):
        files = _kernel(raw)["files"]
        files["../add_kernel.cubin"] = files.pop("add_kernel.cubin")
    assert "file name '../add_kernel.cubin' refused" in _refused(tmp_path, climbing)

    def big_shared(raw):
        _kernel(raw)["files"] = _files(tmp_path, shared=10**7)
        _launch(raw)["shared"] = 10**7
    assert "shared memory is not an integer" in _refused(tmp_path, big_shared)


def test_a_record_that_is_not_json_or_too_large_is_refused(tmp_path):
    (tmp_path / "launches.json").write_text("{not json")
    with pytest.raises(LaunchRecordError, match="not JSON"):
        launchrecord.load(tmp_path, INPUTS)
    (tmp_path / "launches.json").write_bytes(b" " * (launchrecord.MAX_RECORD_BYTES + 1))
    with pytest.raises(LaunchRecordError, match="over"):
        launchrecord.load(tmp_path, INPUTS)
