"""Planning: seeds, skips and the safetensors round trip that keeps views."""

from grader import spec as specs
from grader.judge.plan import derive_seed, load_inputs, make_inputs, materialize, plan_calls
from tests.conftest import COURSE


def test_views_survive_the_round_trip(tmp_path):
    spec = COURSE.get("softmax")
    calls = plan_calls(spec, 3, interpret=True, case_filter=["sliced-97x300", "transposed-300x129"], dtype_filter=["float16"])
    materialize(spec, calls, tmp_path)
    for call in calls:
        original = make_inputs(spec, call.case, call.dtype, call.seed)["x"]
        loaded = load_inputs(call)["x"]
        assert loaded.stride() == original.stride() and not loaded.is_contiguous()
        assert loaded.equal(original)


def test_bf16_is_skipped_only_in_the_interpreter():
    spec = COURSE.get("vector_add")
    interp = plan_calls(spec, 1, interpret=True)
    gpu = plan_calls(spec, 1, interpret=False)
    assert {c.dtype for c in interp if c.skip} == {"bfloat16"}
    assert not any(c.skip for c in gpu)
    assert len(interp) == len(gpu) == (len(spec.cases) + 3) * 3


def test_random_shapes_follow_the_seed():
    spec = COURSE.get("softmax")
    names = lambda seed: [c.case.name for c in plan_calls(spec, seed, True) if c.case.name.startswith("random")]
    assert names(5) == names(5)
    assert names(5) != names(6)
    assert derive_seed(1, "a") != derive_seed(1, "b")


def test_plain_arguments_travel_beside_tensors(tmp_path):
    import torch

    from grader.codec import rebuild, write_inputs
    from safetensors.torch import load_file

    inputs = {"q": torch.randn(2, 3).t(), "causal": True, "sm_scale": 0.125, "note": None}
    layout = write_inputs(inputs, tmp_path / "i.safetensors")
    back = rebuild(load_file(str(tmp_path / "i.safetensors")), layout)
    assert list(back) == ["q", "causal", "sm_scale", "note"]
    assert back["q"].equal(inputs["q"]) and back["q"].stride() == (1, 3)
    assert (back["causal"], back["sm_scale"], back["note"]) == (True, 0.125, None)
