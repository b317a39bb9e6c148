"""What the judge makes of a replay (grader.judge.replay_process), on fake replays: a wrong result is
a conclusive finding with its evidence, a refused record or changing launches the fallback, a
GPU shared with another process a retry, a replay that breaks a review; a replay's answer is read
as hostile data."""

from __future__ import annotations

import json

import pytest
import torch

from grader.judge import replay_process
from grader.judge.replay_process import Replayed, decide, launches_differ, mismatch

GOOD, REF = Replayed(ms=[1.2, 1.1, 1.3]), Replayed(ms=[1.0, 1.0, 1.0])


def test_a_right_replay_is_scored_on_the_replays_own_times():
    d = decide(GOOD, REF, wrong="")
    assert d.kind == "scored" and d.ratio == pytest.approx(1.2)


def test_a_wrong_replayed_result_is_conclusive_with_the_evidence():
    expected = [torch.arange(8.0)]
    got = [torch.arange(8.0)]
    got[0][5] = 99.0
    wrong = mismatch(got, expected, rtol=1e-3, atol=1e-3)
    assert wrong == "1 of 8 elements of result 0 are wrong (the first at flat index 5: 99 where 5 is expected)"
    d = decide(GOOD, REF, wrong)
    assert d.kind == "conclusive" and d.ratio is None
    assert "do not compute the result on their own" in d.message and "flat index 5" in d.message


def test_poison_left_in_the_result_is_wrong_and_a_nan_computed_alike_is_not():
    nan = float("nan")
    assert mismatch([torch.tensor([1.0, nan])], [torch.tensor([1.0, 2.0])], 1e-3, 1e-3).startswith("1 of 2 elements")
    assert mismatch([torch.tensor([1.0, nan])], [torch.tensor([1.0, nan])], 1e-3, 1e-3) == ""
    assert "shape [2], not [3]" in mismatch([torch.zeros(2)], [torch.zeros(3)], 1e-3, 1e-3)
    assert "1 results where 2 are expected" == mismatch([torch.zeros(2)], [torch.zeros(2)] * 2, 1e-3, 1e-3)


def test_a_refused_record_or_changing_launches_fall_back_and_accuse_no_one():
    d = decide(Replayed(refused="not replayable: launches on 2 streams"), REF, wrong="")
    assert d.kind == "fallback" and "launches on 2 streams" in d.message
    record = {"launches": [{"kernel": "k" * 64, "grid": [4, 1, 1], "args": [{"kind": "tensor", "role": "input", "ref": "x"}]}]}
    other = json.loads(json.dumps(record))
    assert launches_differ(record, other) == ""
    other["launches"][0]["grid"] = [8, 1, 1]
    differ = launches_differ(record, other)
    assert differ == "launch 0 differs between two calls (kernel, grid or arguments)"
    assert launches_differ(record, {"launches": []}) == "one call made 1 launches, another 0"
    assert decide(GOOD, REF, wrong="", differ=differ).kind == "fallback"
    assert decide(GOOD, Replayed(failed="TypeError"), wrong="").kind == "fallback"  # ours to fix, not the student's


def test_another_process_on_the_gpu_is_a_retry_and_a_broken_replay_a_review():
    assert decide(Replayed(ms=[1.0], others=[4242]), REF, wrong="").kind == "retry"
    d = decide(Replayed(failed="RuntimeError: an illegal memory access"), REF, wrong="")
    assert d.kind == "review" and "illegal memory access" in d.message


@pytest.mark.parametrize("answer, why", [
    ("[1, 2]", "not an object"),
    ('{"ms": [1.0, -1.0]}', "not positive numbers"),
    ('{"ms": [1.0, NaN]}', "not positive numbers"),
    ('{"ms": []}', "not positive numbers"),
    ("{" + " " * (replay_process.MAX_REPLY_BYTES + 1) + "}", "cannot be read"),
    ('{"ms": [1.0, 2.0]}', "sums are not one triple per result per rep"),
    ('{"ms": [1.0], "sums": [[[1.0, 2.0]]]}', "sums are not one triple per result per rep"),
    ('{"ms": [1.0], "sums": [[[1.0, 2.0, "x"]]]}', "sums are not one triple per result per rep"),
])
def test_a_replays_answer_is_read_as_hostile_data(tmp_path, answer, why):
    (tmp_path / "replay.json").write_text(answer)
    got = replay_process.read(tmp_path)
    assert why in got.failed and got.median_ms is None


def test_a_replays_answer_is_kept_bounded(tmp_path):
    (tmp_path / "replay.json").write_text(json.dumps({"refused": "x" * 5000}))
    assert len(replay_process.read(tmp_path).refused) == 400
    (tmp_path / "replay.json").write_text(json.dumps({"ms": [2.0, 1.0, 3.0], "sums": [[[1.0, 1.0, 0]]] * 3,
                                                      "other_gpu_processes": [4242]}))
    got = replay_process.read(tmp_path)
    assert got.median_ms == 2.0 and got.folder == tmp_path
    assert got.others == []  # the process's word on who shared the GPU is not taken: run() looks itself


def test_a_rep_that_computed_something_else_than_the_checked_last_one_is_named():
    same = [[[10.0, 20.0, 0.0]]] * 3
    assert replay_process.reps_differ(Replayed(ms=[1.0] * 3, sums=same)) == ""
    atomics = [[[10.0 + 1e-9, 20.0, 0.0]], [[10.0, 20.0, 0.0]]]  # summed in another order: within the tolerance
    assert replay_process.reps_differ(Replayed(ms=[1.0] * 2, sums=atomics)) == ""
    skipped = [[[1.0, 2.0, 0.0]], [[10.0, 20.0, 0.0]], [[10.0, 20.0, 0.0]]]
    assert replay_process.reps_differ(Replayed(ms=[0.1, 1.0, 1.0], sums=skipped)).startswith(
        "rep 1 of 3 computed another result 0 than the last rep, which was checked against torch's")
    poisoned = [[[10.0, 20.0, 4.0]], [[10.0, 20.0, 0.0]]]  # NaN left where the rep did not write
    assert "4 and 0 non-finite" in replay_process.reps_differ(Replayed(ms=[1.0] * 2, sums=poisoned))


@pytest.mark.parametrize("result", [
    torch.randn(4096),
    torch.tensor([1.0, float("nan"), -2.0, float("inf"), float("-inf"), 0.5]),
    torch.randn(256).to(torch.bfloat16),
    torch.randn(64, 64).t(),  # a strided result
])
def test_a_reps_result_sums_are_the_finite_sum_magnitudes_and_non_finite_count_in_float64(result):
    from grader.replay.runner import result_sums

    as64 = result.double()
    finite = torch.isfinite(as64)
    expected = [float(as64[finite].sum()), float(as64[finite].abs().sum()), float((~finite).sum())]
    assert result_sums(result) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_the_input_sizes_come_from_the_header_alone_and_match_the_storages_a_load_rebuilds(tmp_path):
    """Each input's storage size, as a record is checked against, read from the set's header (a
    set of gigabytes is not loaded for it): the same sizes a whole load and rebuild give, views
    and plain values included; a header that lacks an input's storage is refused, not guessed."""
    from safetensors.torch import load_file, save_file

    from grader.codec import rebuild, write_inputs

    inputs = {"x": torch.randn(300)[::3], "y": torch.randn(7, 5).to(torch.bfloat16).t(), "eps": 1e-5, "seed": 3}
    layout = write_inputs(inputs, tmp_path / "set.safetensors")
    (tmp_path / "layout.json").write_text(json.dumps(layout))
    loaded = rebuild(load_file(str(tmp_path / "set.safetensors")), layout)
    whole = {k: v.untyped_storage().nbytes() for k, v in loaded.items() if isinstance(v, torch.Tensor)}
    assert replay_process.input_sizes(tmp_path / "set.safetensors", tmp_path / "layout.json") == whole == \
        {"x": 1200, "y": 70}
    save_file({"x": torch.zeros(3)}, str(tmp_path / "short.safetensors"))
    with pytest.raises(replay_process.LaunchRecordError, match="no storage for 'y'"):
        replay_process.input_sizes(tmp_path / "short.safetensors", tmp_path / "layout.json")
    # the header read as grader.codec reads a result's: bounded, JSON, an object, else refused with why
    (tmp_path / "long.safetensors").write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    (tmp_path / "list.safetensors").write_bytes((2).to_bytes(8, "little") + b"[]")
    for name, why in (("long", "header's length"), ("list", "not an object")):
        with pytest.raises(replay_process.LaunchRecordError, match=why):
            replay_process.input_sizes(tmp_path / f"{name}.safetensors", tmp_path / "layout.json")
