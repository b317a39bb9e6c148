"""grader.worker.memcheck at the edges of a tensor, in this process (no worker): kernels run in
Triton's interpreter with the bounds check installed, reading and writing exactly to the last
element (allowed) and one element further (refused), before the first element, through a
view, and from one argument into another."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton.language as tl
from triton.runtime import interpreter

from grader.worker import memcheck


@pytest.fixture
def checked(monkeypatch):
    """memcheck installed on the interpreter for this test only."""
    for owner, names in ((interpreter.GridExecutor, ("_init_args_hst",)),
                         (interpreter.InterpreterBuilder, ("create_masked_load", "create_masked_store"))):
        for name in names:
            monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    assert memcheck.install()
    yield
    memcheck._RANGES.clear()


def _load_store(x_ptr, out_ptr, start, n_load, n_store, BLOCK: tl.constexpr):
    """Loads x[start + i] for i < n_load, stores out[start + i] for i < n_store."""
    offs = start + tl.arange(0, BLOCK)
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=lanes < n_load, other=0.0)
    tl.store(out_ptr + offs, x, mask=lanes < n_store)


def _two_inputs(x_ptr, y_ptr, out_ptr, n, shift, BLOCK: tl.constexpr):
    """out = x[i + shift]: with shift > 0 the last lanes read past x (and maybe into y)."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs + shift, mask=offs < n)
    y = tl.load(y_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, x + y, mask=offs < n)


load_store = interpreter.InterpretedFunction(_load_store)
two_inputs = interpreter.InterpretedFunction(_two_inputs)


def _violation(run) -> str:
    with pytest.raises(Exception) as info:
        run()
    assert "OutOfBounds" in repr(info.value), repr(info.value)
    return str(info.value)


def test_up_to_the_last_element_is_allowed(checked):
    x, out = torch.arange(10, dtype=torch.float32), torch.zeros(10)
    load_store[(1,)](x, out, 0, 10, 10, BLOCK=16)
    assert torch.equal(out, x) and memcheck._RANGES  # the check was there, and found nothing
    one, out1 = torch.ones(1), torch.zeros(1)  # a single active lane
    load_store[(1,)](one, out1, 0, 1, 1, BLOCK=16)
    assert torch.equal(out1, one)


def test_one_element_past_the_end_is_refused(checked):
    x, out = torch.arange(10, dtype=torch.float32), torch.zeros(10)
    text = _violation(lambda: load_store[(1,)](x, out, 0, 11, 10, BLOCK=16))
    # its mask lets 11 of the 16 lanes through, one past the tensor: a mask's bound, not a missing mask
    message = ("out-of-bounds load in program (0, 0, 0): 1 of 16 lanes fall outside the tensor (the first lies "
               "1 element(s) past the end of x_ptr); the load is masked, and these lanes pass its mask: its addresses "
               "are wrong, not a missing mask: check the strides the pointer is moved by (each tensor's own) and the "
               "mask's bound")
    assert message in text
    assert memcheck.LAST_VIOLATION == {"kind": "load", "program": (0, 0, 0), "where": "1 element(s) past the end of x_ptr",
                                       "message": message}
    text = _violation(lambda: load_store[(1,)](x, out, 0, 10, 11, BLOCK=16))
    assert "out-of-bounds store" in text and "1 element(s) past the end of out_ptr" in text
    assert torch.equal(out, torch.zeros(10))  # refused before the access: nothing was written


def test_the_element_size_counts(checked):
    """Ten float64 elements are 80 bytes: index 9 is inside, and an address 8 bytes past it is not."""
    x, out = torch.arange(10, dtype=torch.float64), torch.zeros(10, dtype=torch.float64)
    load_store[(1,)](x, out, 0, 10, 10, BLOCK=16)
    assert torch.equal(out, x)
    assert "(the first lies 1 element(s) past the end of x_ptr)" in _violation(lambda: load_store[(1,)](x, out, 0, 11, 10, BLOCK=16))
    assert "(the first lies 1 element(s) past the end of x_ptr)" in _violation(lambda: load_store[(1,)](x, out, 2, 9, 8, BLOCK=16))


def test_one_byte_elements_up_to_the_last_are_allowed(checked):
    x, out = torch.arange(10, dtype=torch.int8), torch.zeros(10, dtype=torch.int8)
    load_store[(1,)](x, out, 0, 10, 10, BLOCK=16)
    assert torch.equal(out, x)
    assert "(the first lies 1 element(s) past the end of x_ptr)" in _violation(lambda: load_store[(1,)](x, out, 0, 11, 10, BLOCK=16))


def test_before_the_first_element_is_refused(checked):
    x, out = torch.arange(10, dtype=torch.float32), torch.zeros(12)
    text = _violation(lambda: load_store[(1,)](x, out[2:], -1, 4, 0, BLOCK=4))
    assert "1 of 4 lanes fall outside the tensor (the first lies 1 element(s) before the start of x_ptr)" in text
    text = _violation(lambda: load_store[(1,)](x, out[2:], -3, 4, 0, BLOCK=4))
    assert "3 of 4 lanes fall outside the tensor (the first lies 3 element(s) before the start of x_ptr)" in text


def test_a_view_is_bounded_by_its_storage(checked):
    """Reading outside a view but inside its tensor's memory cannot corrupt anything: allowed
    (the check is for memory safety; the judge sees the values)."""
    base = torch.arange(20, dtype=torch.float32)
    out = torch.zeros(20)
    load_store[(1,)](base[5:10], out[5:10], 0, 15, 0, BLOCK=16)
    assert "past the end of x_ptr" in _violation(lambda: load_store[(1,)](base[5:10], out, 0, 16, 0, BLOCK=16))


def test_a_pointer_may_not_wander_into_another_argument(checked):
    """x and y are two arguments whose memory happens to be adjacent (two numpy slices of one
    buffer, each its own storage): x[8] is y[0]'s address, yet reading it through x is refused."""
    buffer = np.arange(16, dtype=np.float32)
    x, y, out = torch.from_numpy(buffer[:8]), torch.from_numpy(buffer[8:]), torch.zeros(8)
    assert y.data_ptr() == x.data_ptr() + 32 and x.untyped_storage().nbytes() == 32
    two_inputs[(1,)](x, y, out, 8, 0, BLOCK=8)
    assert torch.equal(out, torch.from_numpy(buffer[:8] + buffer[8:]))
    text = _violation(lambda: two_inputs[(1,)](x, y, out, 8, 1, BLOCK=8))
    assert "1 element(s) past the end of x_ptr" in text  # named after x, though the address is y's
    # the same from x's very first byte: lanes x[0] .. x[8], the last one y's first element
    text = _violation(lambda: load_store[(1,)](x, y, 0, 9, 0, BLOCK=16))
    assert "1 of 16 lanes fall outside the tensor (the first lies 1 element(s) past the end of x_ptr)" in text


def test_masked_lanes_are_never_checked(checked):
    x, out = torch.arange(3, dtype=torch.float32), torch.zeros(3)
    load_store[(1,)](x, out, 0, 3, 3, BLOCK=1024)  # 1021 lanes point far past x, all masked
    assert torch.equal(out, x)
