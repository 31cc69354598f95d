import numpy as np

from modelport.optimize import get_pass
from tests.optimize.conftest import assert_same_outputs, make_ir, ops


def test_conv_batchnorm_fused():
    from onnx import helper

    rng = np.random.default_rng(1)
    ir = make_ir([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", ["c", "g", "beta", "m", "v"], ["y"])],
                 [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])],
                 {"w": rng.standard_normal((4, 3, 3, 3)), "b": rng.standard_normal(4), "g": rng.uniform(0.5, 2, 4),
                  "beta": rng.standard_normal(4), "m": rng.standard_normal(4), "v": rng.uniform(0.5, 2, 4)})
    result = get_pass("fuse").apply(ir)
    assert result.modified and ops(result.model) == ["Conv"]
    assert_same_outputs(ir, result.model, atol=1e-4)


def test_matmul_add_to_gemm():
    from onnx import helper

    rng = np.random.default_rng(2)
    ir = make_ir([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])],
                 [("x", [2, 8])], [("y", [2, 4])], {"w": rng.standard_normal((8, 4)), "b": rng.standard_normal(4)})
    result = get_pass("fuse").apply(ir)
    assert result.modified and ops(result.model) == ["Gemm"]
    assert_same_outputs(ir, result.model)
