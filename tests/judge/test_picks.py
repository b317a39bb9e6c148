"""The judge's indices into a result at the timing size (grader.judge.picks) and the trusted
worker's comparison at them (grader.worker.server.Worker.compare with `indices`): a result's
ends always checked, a wrong stripe anywhere found, a result of another size wrong, a sample
larger than asked refused unread; and the replay's side (grader.replay.runner.Placements.picked)
hands back exactly the elements asked for."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from grader.judge import picks
from grader.protocol import Compare, CompareReply, Failure
from grader.replay.runner import Placements
from grader.worker.server import Worker

BIG = 3 * picks.WHOLE  # past what is read whole


def test_a_small_result_is_read_whole_and_a_large_one_at_its_ends_and_fresh_random_indices():
    assert torch.equal(picks.picks(4096), torch.arange(4096))
    a, b = picks.picks(BIG), picks.picks(BIG)
    assert a.numel() == 2 * picks.EDGE + picks.RANDOM and a.dtype == torch.int64
    assert int(a.min()) == 0 and int(a.max()) == BIG - 1 and bool((a[1:] >= a[:-1]).all())
    ends = set(range(picks.EDGE)) | set(range(BIG - picks.EDGE, BIG))
    assert ends <= set(a.tolist())
    assert not torch.equal(a, b), "each draw is new: nobody can know the indices before they are told"


def _compare(tmp_path, got: torch.Tensor, truth: torch.Tensor, numel: int | None = None, idx=None, **kw):
    """The trusted worker's comparison of `got` (the whole result) sampled at the judge's indices,
    as a replay or the student's worker hands the sample back."""
    worker = Worker.__new__(Worker)  # only its comparison: no torch set-up
    worker.torch, worker.retained = torch, {("torch", "truth"): truth, ("reference", "rec0"): truth.clone()}
    idx = picks.picks(truth.numel()) if idx is None else idx
    save_file({"idx": idx}, str(tmp_path / "picks.safetensors"))
    flat = got.reshape(-1)
    save_file({"output.0": flat[idx[idx < flat.numel()]].contiguous(),
               "numel.output.0": torch.tensor([flat.numel() if numel is None else numel])},
              str(tmp_path / "last.safetensors"))
    return worker.compare(Compare(str(tmp_path / "last.safetensors"), "output.0", 0, "truth", "rec0", 1e-5, 1e-5,
                                  indices=str(tmp_path / "picks.safetensors"), **kw))


def test_a_right_result_passes_and_one_wrong_element_at_its_end_is_found(tmp_path):
    truth = torch.randn(BIG)
    right = _compare(tmp_path, truth.clone(), truth)
    assert isinstance(right, CompareReply) and right.wrong == 0 and right.numel == BIG
    assert right.sampled == 2 * picks.EDGE + picks.RANDOM
    last = truth.clone()
    last[-1] += 1.0  # the last partial block of a kernel's grid
    got = _compare(tmp_path, last, truth)
    assert isinstance(got, CompareReply) and got.wrong == 1 and got.first == BIG - 1


def test_a_stripe_skipped_anywhere_and_half_the_work_skipped_are_found(tmp_path):
    truth = torch.randn(BIG)
    stripe = truth.clone()
    stripe[BIG // 2:BIG // 2 + 256] = 0.0  # one block of 256 elements never written
    got = _compare(tmp_path, stripe, truth)
    assert isinstance(got, CompareReply) and got.wrong > 0 and BIG // 2 <= got.first < BIG // 2 + 256
    half = truth.clone()
    half[::2] = 0.0
    got = _compare(tmp_path, half, truth)
    assert isinstance(got, CompareReply) and got.wrong > picks.RANDOM // 4


def test_a_result_of_another_size_is_wrong_and_a_sample_not_of_the_asked_size_is_refused(tmp_path):
    truth = torch.randn(BIG)
    got = _compare(tmp_path, truth.clone(), truth, numel=BIG + 1)  # the right elements, a claimed size not the truth's
    assert isinstance(got, CompareReply) and got.wrong == BIG + 1 and got.first == -1
    short = _compare(tmp_path, truth[:BIG // 2].clone(), truth, numel=BIG)  # fewer elements than asked for
    assert isinstance(short, Failure) and "elements where" in short.message


def test_a_sample_larger_than_the_indices_ask_is_refused_unread(tmp_path):
    truth = torch.randn(BIG)
    worker = Worker.__new__(Worker)
    worker.torch, worker.retained = torch, {("torch", "truth"): truth, ("reference", "rec0"): truth}
    save_file({"idx": torch.arange(16)}, str(tmp_path / "picks.safetensors"))
    save_file({"output.0": torch.zeros(BIG), "numel.output.0": torch.tensor([BIG])}, str(tmp_path / "last.safetensors"))
    got = worker.compare(Compare(str(tmp_path / "last.safetensors"), "output.0", 0, "truth", "rec0", 1e-5, 1e-5,
                                 indices=str(tmp_path / "picks.safetensors")))
    assert isinstance(got, Failure) and "larger than" in got.message


def test_the_replay_hands_back_the_elements_asked_for_and_its_results_size():
    result = torch.arange(10_000, dtype=torch.float32).reshape(100, 100)
    ready = Placements.__new__(Placements)
    ready.final = SimpleNamespace(views=lambda: [result.t()])  # a strided result: flat in its own order
    idx = torch.tensor([0, 1, 9_999, 5_000])
    got = ready.picked(idx)
    assert torch.equal(got["output.0"], result.t().reshape(-1)[idx])
    assert got["numel.output.0"].tolist() == [10_000]
    small = ready.picked(torch.tensor([0, 20_000]))  # asked past its end: no elements, its size says why
    assert small["output.0"].numel() == 0 and small["numel.output.0"].tolist() == [10_000]
