from __future__ import annotations

import numpy as np
import pytest

from modelport.convert.parity import Tolerance, compare, compare_arrays
from modelport.errors import ValidationError

TOL = Tolerance(1e-4, 1e-3, 0.999)


def test_identical_passes():
    a = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    r = compare_arrays("y", a, a.copy(), TOL)
    assert r.ok and r.max_abs == 0 and r.cosine == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_inf_always_fail(bad):
    a = np.ones(4, np.float32)
    b = a.copy()
    b[2] = bad
    r = compare_arrays("y", a, b, Tolerance(1e9, 1e9, -1))
    assert not r.ok and (r.nan or r.inf)


def test_atol_rtol_and_cosine_breaches():
    a = np.ones(100, np.float32)
    assert not compare_arrays("y", a, a + 1e-2, TOL).ok
    assert compare_arrays("y", a, a + 1e-2, Tolerance(2e-2, 0, 0.99)).ok
    assert not compare_arrays("y", a, -a, Tolerance(10, 10, 0.999)).ok  # cosine -1


def test_shape_mismatch_and_raise():
    res = compare({"y": np.ones((2, 3))}, {"y": np.ones((3, 3))}, TOL, hop="a→b")
    assert not res.ok
    with pytest.raises(ValidationError, match="a→b"):
        res.raise_if_failed()
    d = res.to_dict()
    assert d["ok"] is False and d["outputs"][0]["max_abs"] is None  # inf is written as null


def test_positional_match_when_names_differ():
    res = compare({"logits": np.ones(3)}, {"output_0": np.ones(3)}, TOL, hop="h")
    assert res.ok and res.outputs[0].name == "logits"
