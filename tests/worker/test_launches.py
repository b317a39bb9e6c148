"""The launch record a worker makes of one call (grader.worker.launches): each launch's
arguments given their roles (input, result, scratch, value), the fills between launches, and
the reasons a call cannot be replayed. CPU tensors and launches made through the recorder's
own hook, as the worker's wrapped JITFunction.run makes them (no compiled kernel on a CPU)."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import torch

from grader.worker import launches, server


def _jit(name):
    def kernel(x_ptr, y_ptr, n, BLOCK=16):  # the parameters stand for a @triton.jit function's
        pass
    kernel.__name__ = name
    return SimpleNamespace(fn=kernel, __name__=name)


A, B = _jit("stage_a"), _jit("stage_b")


def _record(body, inputs: dict):
    """Run `body(**inputs)` as the worker runs a recorded call: aten ops seen by the dispatch
    mode, launches by the hook (`launch(fn, *args, **kwargs)` stands for a kernel[grid](...) call)."""
    recorder = launches.Recorder(inputs)

    def launch(fn, *args, **kwargs):
        recorder.launch(fn, None, args, kwargs)

    watch = server.Watch()
    watch.recorder = recorder
    with server._OpRecorder(Counter(), watch):
        out = body(launch, **inputs)
    return recorder.finish(out, None)


def test_a_two_kernel_pipeline_with_a_zeroed_scratch_buffer_is_described_role_by_role():
    def body(launch, x):
        out = torch.empty_like(x)
        partial = torch.zeros(8)
        launch(A, x, partial, x.numel(), grid=(4,), BLOCK=32)
        launch(B, partial, out, x.numel(), grid=lambda meta: (x.numel() // meta["BLOCK"],), BLOCK=64)
        return out

    record = _record(body, {"x": torch.ones(256)})
    assert record["why_not"] == ["no compiled kernel (Triton's CPU interpreter)"]
    first, second = record["launches"]
    assert first["name"] == "stage_a" and first["grid"] == [4, 1, 1]
    assert first["args"][0] == {"name": "x_ptr", "kind": "tensor", "role": "input", "ref": "x", "offset": 0}
    assert first["args"][1] == {"name": "y_ptr", "kind": "tensor", "role": "scratch", "ref": 0, "offset": 0}
    assert first["args"][2:] == [{"name": "n", "kind": "value", "value": 256}, {"name": "BLOCK", "kind": "value", "value": 32}]
    assert second["grid"] == [4, 1, 1]  # the grid function evaluated on the launch's own arguments
    assert second["args"][1] == {"name": "y_ptr", "kind": "tensor", "role": "output", "ref": 0, "offset": 0}
    assert record["scratch"] == [{"nbytes": 32, "init": 0.0}]
    # the zero fill comes before the first launch, as the call made it
    assert [list(s) for s in record["sequence"]] == [["fill"], ["launch"], ["launch"]]
    assert record["sequence"][0]["fill"]["role"] == "scratch" and record["sequence"][0]["fill"]["value"] == 0.0
    assert record["outputs"] == [{"dtype": "float32", "shape": [256], "stride": [1], "offset": 0, "nbytes": 1024}]
    json.dumps(record)  # it travels as JSON


def test_a_view_into_an_input_is_an_offset_into_its_storage():
    def body(launch, x):
        out = torch.empty(10)
        launch(A, x[10:], out, 10, grid=(1,))
        return out

    record = _record(body, {"x": torch.ones(64)})
    assert record["launches"][0]["args"][0]["offset"] == 40


def test_a_result_computed_by_torch_is_noted_as_torch_work_not_refused():
    def body(launch, x):
        scratch = torch.empty_like(x)
        launch(A, x, scratch, x.numel(), grid=(1,))
        return torch.softmax(x, 0)

    record = _record(body, {"x": torch.ones(16)})
    # the replay poisons what torch computed, so the result comes out wrong there: a finding, not a fallback
    assert not any("torch" in w for w in record["why_not"]), record["why_not"]
    assert any("result 0 was computed by torch (aten::_softmax)" in w for w in record["torch_work"]), record


def test_torch_writing_the_result_after_the_launches_is_noted():
    def add_in_place(launch, x):
        out = torch.empty_like(x)
        launch(A, x, out, x.numel(), grid=(1,))
        out.add_(1.0)
        return out

    why = _record(add_in_place, {"x": torch.ones(16)})["torch_work"]
    assert any("torch wrote output 0 (aten::add_" in w for w in why), why

    def body(launch, x):
        out = torch.empty_like(x)
        launch(A, x, out, x.numel(), grid=(1,))
        out.copy_(torch.softmax(x, 0))
        return out

    why = _record(body, {"x": torch.ones(16)})["torch_work"]
    # the copy into the result is kept as a copy, but what it copies torch computed
    assert any("computed by torch (aten::_softmax)" in w for w in why), why


def test_a_result_no_launch_writes_is_replayed_as_it_is_and_not_blamed_on_torch():
    def body(launch, x):
        out = torch.zeros_like(x)  # a fill: replayed, so the replay's result is zeros, as the call's was
        launch(A, x, x, 1, grid=(1,))
        return out

    record = _record(body, {"x": torch.ones(16)})
    assert record["torch_work"] == [] and record["why_not"] == ["no compiled kernel (Triton's CPU interpreter)"]
    assert [list(s)[0] for s in record["sequence"]] == ["fill", "launch"]


def test_a_buffer_from_elsewhere_and_a_host_tma_descriptor_are_not_described():
    kept = torch.zeros(16)  # allocated before the call (a cache kept between calls)

    def body(launch, x):
        out = torch.empty_like(x)
        launch(A, kept, out, 16, grid=(1,))
        return out

    why = _record(body, {"x": torch.ones(16)})["why_not"]
    assert any("x_ptr of stage_a is a tensor from elsewhere" in w for w in why), why

    TensorDescriptor = type("TensorDescriptor", (), {})

    def tma(launch, x):
        out = torch.empty_like(x)
        launch(A, TensorDescriptor(), out, 16, grid=(1,))
        return out

    why = _record(tma, {"x": torch.ones(16)})["why_not"]
    assert any("host-side TMA descriptor the replay cannot rebuild" in w for w in why), why


def test_a_host_tma_descriptor_over_the_result_is_kept_as_numbers_over_its_base():
    class TensorDescriptor:  # the fields of triton.tools.tensor_descriptor.TensorDescriptor
        def __init__(self, base, shape, strides, block_shape):
            self.base, self.shape, self.strides, self.block_shape = base, shape, strides, block_shape
            self.padding, self.round_f32_to_tf32 = "zero", False

    def body(launch, x):
        out = torch.empty(8, 16)
        launch(A, x, TensorDescriptor(out, [8, 16], [16, 1], [4, 16]), 16, grid=(2,))
        return out

    record = _record(body, {"x": torch.ones(16)})
    desc = record["launches"][0]["args"][1]
    assert desc == {"name": "y_ptr", "kind": "tensordesc", "role": "output", "ref": 0, "offset": 0, "dtype": "float32",
                    "shape": [8, 16], "strides": [16, 1], "block_shape": [4, 16], "padding": "zero", "round_f32_to_tf32": False}
    assert record["torch_work"] == []


def test_a_scratch_buffer_torch_computed_is_noted_as_torch_work():
    def body(launch, x):
        y = x * 2  # the wrapper's own torch work, read by the kernel
        out = torch.empty_like(x)
        launch(A, y, out, 16, grid=(1,))
        return out

    why = _record(body, {"x": torch.ones(16)})["torch_work"]
    assert any("computed by torch (aten::mul" in w for w in why), why


def test_a_fill_of_a_result_slice_is_kept_with_its_geometry():
    def body(launch, x):
        out = torch.empty(4, 8)
        out[:, 4:].fill_(1.5)
        launch(A, x, out, 16, grid=(1,))
        return out

    record = _record(body, {"x": torch.ones(16)})
    fill = record["sequence"][0]["fill"]
    assert fill == {"role": "output", "ref": 0, "offset": 16, "shape": [4, 4], "stride": [8, 1], "dtype": "float32", "value": 1.5}


def test_a_layout_or_dtype_copy_of_an_input_is_a_step_of_the_record():
    def body(launch, x):
        xt = x.t().contiguous()  # aten::clone of a transposed view
        half = xt.to(torch.float16)  # aten::_to_copy of that copy
        out = torch.empty(8, 4, dtype=torch.float16)
        launch(A, half, out, 32, grid=(1,))
        return out

    record = _record(body, {"x": torch.ones(4, 8)})
    assert record["why_not"] == ["no compiled kernel (Triton's CPU interpreter)"]
    copies = [s["copy"] for s in record["sequence"] if "copy" in s]
    assert [(c["from"]["role"], c["to"]["role"]) for c in copies] == [("input", "scratch"), ("scratch", "scratch")]
    assert copies[0]["from"]["stride"] == [1, 8] and copies[0]["to"]["stride"] == [4, 1]
    assert copies[1]["to"]["dtype"] == "float16" and copies[1]["from"]["ref"] == copies[0]["to"]["ref"]
    assert [list(s)[0] for s in record["sequence"]] == ["copy", "copy", "launch"]


def test_a_copy_from_a_buffer_torch_computed_is_noted_as_torch_work():
    def body(launch, x):
        y = (x * 3).t().contiguous()
        out = torch.empty_like(y)
        launch(A, y, out, 32, grid=(1,))
        return out

    why = _record(body, {"x": torch.ones(4, 8)})["torch_work"]
    assert any("computed by torch (aten::mul" in w for w in why), why


def test_a_stream_annotation_is_no_write(monkeypatch):
    recorder = launches.Recorder({"x": torch.ones(4)})
    func = SimpleNamespace(name=lambda: "aten::record_stream", _schema=None)  # never read: the name decides
    recorder.op(func, (torch.ones(4), None), {}, None)
    assert recorder.events == []


def test_a_pointer_handed_over_as_an_integer_is_not_replayable():
    def body(launch, x):
        out = torch.empty_like(x)
        launch(A, x, out, x.data_ptr() + 8, grid=(1,))
        return out

    why = _record(body, {"x": torch.ones(16)})["why_not"]
    assert "argument n of stage_a is an integer that holds a device address" in why
