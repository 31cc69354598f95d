from unittest import mock

import numpy as np

from modelport.optimize import get_pass
from tests.optimize.conftest import assert_same_outputs, make_ir, ops


def _shape_graph():
    from onnx import helper

    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape: static shapes make it constant.
    return make_ir([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
                    helper.make_node("Unsqueeze", ["b", "ax"], ["bu"]), helper.make_node("Concat", ["bu", "m1"], ["shp"], axis=0),
                    helper.make_node("Reshape", ["x", "shp"], ["y"])],
                   [("x", [2, 3, 4])], [("y", [2, 12])],
                   {"i0": np.array(0, np.int64), "ax": np.array([0], np.int64), "m1": np.array([-1], np.int64)})


def test_onnxsim_folds_shape_computation():
    ir = _shape_graph()
    result = get_pass("simplify").apply(ir)
    assert result.modified and ops(result.model) == ["Reshape"]
    assert_same_outputs(ir, result.model)


def test_skipped_over_protobuf_limit():
    ir = _shape_graph()
    with mock.patch("onnx.checker.MAXIMUM_PROTOBUF", 64):
        result = get_pass("simplify").apply(ir)
    assert not result.modified and "protobuf limit" in result.details["skipped"]


def test_skipped_from_max_bytes_of_weights(monkeypatch):
    """onnxsim holds a model several times over: from simplify.MAX_BYTES of tensors it is passed over, saying why."""
    from modelport.optimize import simplify

    ir = _shape_graph()
    monkeypatch.setattr(simplify, "MAX_BYTES", 16)
    result = get_pass("simplify").apply(ir)
    assert not result.modified and "onnxsim holds a model several times over" in result.details["skipped"]
    monkeypatch.setattr(simplify, "MAX_BYTES", 1 << 20)
    assert get_pass("simplify").apply(ir).modified
