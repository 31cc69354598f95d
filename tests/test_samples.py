"""Sample inputs and the check that a reference depends on its input."""

from __future__ import annotations

import numpy as np

from modelport.ir import TensorSpec
from modelport.samples import make_inputs, output_varies, reference_varies

SPECS = [TensorSpec("x", "float32", ["batch", 4]), TensorSpec("ids", "int64", ["batch", 3], value_range=[0, 50])]


def test_second_set_differs_and_the_first_is_unchanged():
    first = make_inputs(SPECS, {"batch": 2}, seed=3)
    again = make_inputs(SPECS, {"batch": 2}, seed=3, variant=0)
    second = make_inputs(SPECS, {"batch": 2}, seed=3, variant=1)
    for k in first:
        assert np.array_equal(first[k], again[k])
        assert not np.array_equal(first[k], second[k])
    # the reference set is what it was before the second set existed
    rng = np.random.default_rng([3, __import__("zlib").crc32(b"x")])
    assert np.array_equal(first["x"], rng.standard_normal((2, 4)).astype(np.float32))


def test_output_varies_rules():
    a = np.arange(4, dtype=np.float32)
    assert output_varies(a, a + 1) is True
    assert output_varies(a, a.copy()) is False
    assert output_varies(np.full(3, np.nan, np.float32), np.full(3, 1.0, np.float32)) is False  # all NaN
    assert output_varies(np.array([np.inf, -np.inf]), np.array([1.0, 2.0])) is False
    assert output_varies(np.array([1, 2]), np.array([1, 2])) is None  # an argmax that agrees proves nothing either way
    assert output_varies(np.array([1, 2]), np.array([2, 2])) is True
    assert output_varies(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)) is True


def test_reference_varies_runs_the_second_set():
    feeds = make_inputs(SPECS, {"batch": 2}, seed=0)

    def run(f):
        return {"y": f["x"] * 2, "c": np.ones(3, np.float32)}

    assert reference_varies(run, SPECS, run(feeds), {"batch": 2}, seed=0) == {"y": True, "c": False}

    def broken(f):
        raise RuntimeError("data-dependent failure")

    assert reference_varies(broken, SPECS, run(feeds), {"batch": 2}, seed=0) == {"y": None, "c": None}
