from modelport.optimize import get_pass
from tests.optimize.conftest import assert_same_outputs, make_ir, ops


def test_transpose_pair_and_noop_cast_removed():
    from onnx import helper

    ir = make_ir([helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0]),
                  helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]),
                  helper.make_node("Cast", ["t2"], ["c"], to=1), helper.make_node("Relu", ["c"], ["y"])],
                 [("x", [2, 4])], [("y", [2, 4])])
    result = get_pass("cleanup").apply(ir)
    assert result.modified and ops(result.model) == ["Relu"]
    assert_same_outputs(ir, result.model)


def test_reshape_chain_collapsed():
    import numpy as np
    from onnx import helper

    ir = make_ir([helper.make_node("Reshape", ["x", "s1"], ["r1"]), helper.make_node("Reshape", ["r1", "s2"], ["y"])],
                 [("x", [2, 4])], [("y", [4, 2])], {"s1": np.array([8], np.int64), "s2": np.array([4, 2], np.int64)})
    result = get_pass("cleanup").apply(ir)
    assert result.modified and ops(result.model) == ["Reshape"]
    assert_same_outputs(ir, result.model)
