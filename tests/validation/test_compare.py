from __future__ import annotations

import numpy as np
import pytest

from modelport.errors import ValidationError
from modelport.validation import Tolerance, compare, compare_arrays

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


def test_name_mismatch_fails_naming_both_sides():
    res = compare({"logits": np.ones(3)}, {"output_0": np.ones(3)}, TOL, hop="h")
    assert not res.ok
    assert "'logits'" in res.outputs[0].reason and "'output_0'" in res.outputs[0].reason


def test_positional_match_only_when_asked():
    res = compare({"logits": np.ones(3)}, {"output_0": np.ones(3)}, TOL, hop="h", by_position=True)
    assert res.ok and res.outputs[0].name == "logits"


def test_same_size_other_shape_fails_naming_both_shapes():
    ref = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = compare_arrays("y", ref, ref.reshape(3, 2), TOL)
    assert not r.ok and not r.shape_ok
    assert "[3, 2]" in r.reason and "[2, 3]" in r.reason


def test_large_magnitude_output_judged_at_its_scale():
    # logits in the thousands: float reordering moves near-zero elements by ~1e-3 (far above atol 1e-4)
    rng = np.random.default_rng(0)
    ref = (rng.standard_normal((4, 1000)) * 2000).astype(np.float32)
    ref[0, 0] = 0.01
    act = ref + (rng.standard_normal(ref.shape) * 3e-4 * 2000 * 1e-3).astype(np.float32)
    act[0, 0] = ref[0, 0] + 2e-3
    r = compare_arrays("logits", ref, act, TOL)
    assert r.ok, r.reason
    assert r.max_abs > 1e-3 and r.tolerance["scale"] == pytest.approx(float(np.abs(ref).max()))
    assert r.tolerance["atol_effective"] == pytest.approx(1e-4 * r.tolerance["scale"])
    # a genuinely wrong element at that scale still fails
    bad = act.copy()
    bad[1, 5] += 50.0
    r = compare_arrays("logits", ref, bad, TOL)
    assert not r.ok and "1 elements outside" in r.reason
    # an absolute budget is not scaled
    assert not compare_arrays("logits", ref, act, Tolerance(1e-4, 0.0, 0.0, scaled=False)).ok


def test_small_outputs_keep_the_plain_rule():
    a = np.full(10, 0.01, np.float32)
    r = compare_arrays("p", a, a + 2e-4, TOL)
    assert not r.ok and r.tolerance["scale"] == 1.0


def test_per_output_tolerance_applies_to_that_output_only():
    ref = {"probs": np.full(8, 0.5), "logits": np.full(8, 0.5)}
    act = {"probs": ref["probs"] + 0.05, "logits": ref["logits"] + 0.05}
    tol = Tolerance(1e-4, 1e-3, 0.999, overrides={"probs": {"atol": 0.1}})
    res = compare(ref, act, tol, hop="h")
    by = {o.name: o for o in res.outputs}
    assert by["probs"].ok and by["probs"].tolerance["atol"] == 0.1
    assert not by["logits"].ok and by["logits"].tolerance["atol"] == 1e-4
    assert res.to_dict()["tolerance"]["outputs"] == {"probs": {"atol": 0.1}}


def test_parse_tolerance_flags():
    from modelport.errors import BadInputError
    from modelport.validation import parse_tolerance_flags

    d, o = parse_tolerance_flags(atol=["1e-3", "probs=0.1,logits=0.5"], rtol=["probs=0"], min_cosine=[])
    assert d == {"atol": 1e-3} and o == {"probs": {"atol": 0.1, "rtol": 0.0}, "logits": {"atol": 0.5}}
    for bad in (["x"], ["probs=abc"], ["=0.1"], ["-1"]):
        with pytest.raises(BadInputError):
            parse_tolerance_flags(atol=bad)


def test_identical_outputs_have_cosine_exactly_one():
    """min_cosine=1 is a valid demand of a bit-exact candidate: rounding in the dot product must not fail it."""
    x = np.random.default_rng(8).random(7)  # dot(x, x) / |x|^2 rounds to 0.9999999999999999 here
    r = compare({"y": x}, {"y": x.copy()}, Tolerance(0.0, 0.0, 1.0), hop="t")
    assert r.ok and r.outputs[0].cosine == 1.0
