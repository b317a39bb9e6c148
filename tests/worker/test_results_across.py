"""A result crossing a process (grader.codec.write_tensors, read_tensor): the student's worker
writes its result's elements at the judge's indices, a replay its last rep's, and the trusted
worker reads them back and compares them (grader.worker.server.Worker.compare). What it reads
was written by student code, so every malformed file is a Failure that says why: never a crash,
a hang on a FIFO, a link followed, or more read than the sample's size allows."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from grader.codec import ResultFileError, read_tensor, write_tensors
from grader.judge.picks import picks
from grader.protocol import Compare, CompareReply, Failure, ProtocolError, Sample, decode_reply, encode
from grader.worker.server import Worker


def _read(path, name="output.0", limit=1 << 20):
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_tensor(fd, name, limit)
    finally:
        os.close(fd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_a_written_result_is_a_safetensors_file_read_back_bit_for_bit(tmp_path, dtype):
    t = (torch.randn(37, 5) * 100).to(dtype)
    write_tensors({"output.0": t, "output.1": t[:, 1]}, tmp_path / "r.safetensors")
    theirs = load_file(str(tmp_path / "r.safetensors"))  # safetensors' own reader takes it as it is
    assert torch.equal(theirs["output.0"], t) and torch.equal(theirs["output.1"], t[:, 1])
    assert torch.equal(_read(tmp_path / "r.safetensors"), t)
    assert torch.equal(_read(tmp_path / "r.safetensors", "output.1"), t[:, 1])
    save_file({"output.0": t}, str(tmp_path / "s.safetensors"))  # and a file safetensors wrote is read alike
    assert torch.equal(_read(tmp_path / "s.safetensors"), t)


def _raw(path, header, body=b""):
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(len(text).to_bytes(8, "little") + text + body)


@pytest.mark.parametrize("make, why", [
    (lambda p: p.write_bytes(b"\x00" * 3), "header's length"),
    (lambda p: p.write_bytes((1 << 40).to_bytes(8, "little") + b"{}"), "header's length"),
    (lambda p: _raw(p, b"{not json"), "not JSON"),
    (lambda p: _raw(p, b"[" * 5000 + b"]" * 5000), "not JSON"),  # nested past the parser's depth
    (lambda p: _raw(p, {"other": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "no tensor"),
    (lambda p: _raw(p, {"output.0": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
     "not described"),
    (lambda p: _raw(p, {"output.0": {"dtype": "F32", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4),
     "does not fit"),
    (lambda p: _raw(p, {"output.0": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}}, b"\0" * 8),
     "does not fit"),  # the header promises more than the file holds
    (lambda p: _raw(p, {"output.0": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [0, 4 << 30]}}),
     "larger than"),
])
def test_a_malformed_result_file_is_refused_with_the_reason(tmp_path, make, why):
    path = tmp_path / "r.safetensors"
    make(path)
    limit = 1 << 20 if why != "larger than" else 16
    with pytest.raises(ResultFileError, match=why):
        _read(path, limit=limit)


@pytest.fixture
def trusted(tmp_path):
    """A trusted worker keeping torch's result (the truth) and the reference's, as after its calls;
    and the judge's indices into a result of its size, in the judge's own file."""
    worker = Worker()
    truth = torch.linspace(-3, 3, 1000)
    worker.retained[("torch", "truth")] = truth
    worker.retained[("reference", "rec0")] = truth + 1e-7
    save_file({"idx": picks(truth.numel())}, str(tmp_path / "picks.safetensors"))
    return worker, truth


def _compare(worker, path, limit=0):
    return worker.compare(Compare(str(path), "rec0", limit, "truth", "rec0", 1e-5, 1e-5,
                                  indices=str(path.parent / "picks.safetensors")))


def _with_size(tensor):
    """A sample file's tensors as a worker writes them: the elements, and the result's size."""
    return {"rec0": tensor, "numel.rec0": torch.tensor([tensor.numel()])}


def test_a_students_result_sampled_at_the_judges_indices_is_compared_by_the_trusted_worker(tmp_path, trusted):
    worker, truth = trusted
    student = Worker()
    wrong = truth.clone()
    student.retained[("student", "rec0")] = wrong
    indices = str(tmp_path / "picks.safetensors")
    assert student.sample(Sample("student", ["rec0"], indices, str(tmp_path / "sample.safetensors"))).ok
    got = _compare(worker, tmp_path / "sample.safetensors")
    assert isinstance(got, CompareReply) and (got.numel, got.wrong, got.sampled) == (1000, 0, 1000)
    wrong[417] = 99.0
    student.sample(Sample("student", ["rec0"], indices, str(tmp_path / "sample.safetensors")))
    got = _compare(worker, tmp_path / "sample.safetensors")
    assert isinstance(got, CompareReply) and (got.wrong, got.first, got.got) == (1, 417, "99")


def test_a_hostile_result_file_is_a_failure_not_a_crash_a_hang_or_a_link_followed(tmp_path, trusted):
    worker, truth = trusted
    secret = tmp_path / "secret.safetensors"
    write_tensors(_with_size(truth), secret)  # right bytes, but not the worker's file: a link to it is not read
    os.symlink(secret, tmp_path / "link.safetensors")
    got = _compare(worker, tmp_path / "link.safetensors")
    assert isinstance(got, Failure) and "cannot be read" in got.message
    os.mkfifo(tmp_path / "fifo.safetensors")
    got = _compare(worker, tmp_path / "fifo.safetensors")
    assert isinstance(got, Failure) and "not a regular file" in got.message
    write_tensors(_with_size(torch.zeros(1 << 16)), tmp_path / "big.safetensors")  # past the sample's size allows
    got = _compare(worker, tmp_path / "big.safetensors")  # bounded by the sample's size (and a header)
    assert isinstance(got, Failure) and "cannot be read (the file is larger than" in got.message
    write_tensors(_with_size(torch.arange(1000)), tmp_path / "ints.safetensors")
    got = _compare(worker, tmp_path / "ints.safetensors")
    assert isinstance(got, Failure) and "not one floating-point tensor" in got.message
    _raw(tmp_path / "bad.safetensors", b"[" * 5000 + b"]" * 5000)
    got = _compare(worker, tmp_path / "bad.safetensors")
    assert isinstance(got, Failure) and "not JSON" in got.message


def test_the_trusted_workers_own_failure_while_comparing_is_ours_never_the_students(tmp_path, trusted, monkeypatch):
    """Out of GPU memory while comparing (several jobs on one GPU): an infra_error, which the stage
    reports as not scored (grader.judge.replay_stage), never a finding against the student's result."""
    worker, truth = trusted
    write_tensors(_with_size(truth), tmp_path / "r.safetensors")

    def no_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(worker, "_sampled", no_memory)
    got = _compare(worker, tmp_path / "r.safetensors")
    assert isinstance(got, CompareReply) and got.wrong == 0 and got.ours == (
        "the trusted worker could not compare the result: OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 2.00 GiB")
    # a reply, not an infra_error Failure, which no worker may send (a student's could claim one): it crosses the pipe
    request = Compare(str(tmp_path / "r.safetensors"), "rec0", 0, "truth", "rec0", 1e-5, 1e-5, "picks.safetensors")
    assert decode_reply(request, encode(got)) == got
    with pytest.raises(ProtocolError, match="not one a worker may report"):
        decode_reply(request, encode(Failure("infra_error", "claimed")))


def test_a_sample_at_the_judges_indices_is_read_back_as_the_judge_reads_one(tmp_path):
    """The fallback's samples of the timed outputs (grader.judge.perf._check_outputs reads them with
    safetensors' own loader): the elements at the judge's indices, per input set, bit for bit."""
    from safetensors.torch import load

    worker = Worker()
    outs = {f"set{i}": torch.randn(5000) + i for i in range(2)}
    for key, out in outs.items():
        worker.retained[("student", key)] = out
    idx = torch.tensor([0, 4999, 17, 17, 2500])
    save_file({"idx": idx}, str(tmp_path / "indices.safetensors"))
    assert worker.sample(Sample("student", list(outs), str(tmp_path / "indices.safetensors"),
                                str(tmp_path / "sample.safetensors"))).ok
    got = load((tmp_path / "sample.safetensors").read_bytes())
    assert sorted(got) == ["numel.set0", "numel.set1", "set0", "set1"]
    assert all(torch.equal(got[k], outs[k][idx]) and got[f"numel.{k}"].tolist() == [5000] for k in outs)
