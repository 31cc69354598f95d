import numpy as np

from modelport.optimize import get_pass
from tests.optimize.conftest import assert_same_outputs, make_ir, ops


def test_fold_evaluates_constant_subgraph_and_keeps_outputs():
    from onnx import helper

    ir = make_ir([helper.make_node("Add", ["c1", "c2"], ["c"]), helper.make_node("Mul", ["c", "c"], ["cc"]),
                  helper.make_node("Mul", ["x", "cc"], ["y"])],
                 [("x", [2, 4])], [("y", [2, 4])], {"c1": np.ones(4), "c2": np.arange(4.0)})
    result = get_pass("fold").apply(ir)
    assert result.modified
    assert ops(result.model) == ["Mul"]
    assert ops(ir) == ["Add", "Mul", "Mul"]  # the input is not mutated
    assert_same_outputs(ir, result.model)


def test_dce_removes_dead_and_identity_nodes():
    from onnx import helper

    ir = make_ir([helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("Relu", ["xi"], ["y"]),
                  helper.make_node("Sigmoid", ["x"], ["dead"])],
                 [("x", [2, 4])], [("y", [2, 4])])
    result = get_pass("dce").apply(ir)
    assert result.modified and ops(result.model) == ["Relu"]
    assert_same_outputs(ir, result.model)


def test_unchanged_when_nothing_to_do():
    from onnx import helper

    ir = make_ir([helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 4])], [("y", [2, 4])])
    assert not get_pass("fold").apply(ir).modified
