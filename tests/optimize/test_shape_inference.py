from modelport.optimize import get_pass
from tests.optimize.conftest import make_ir


def test_value_info_added_and_outputs_unchanged():
    from onnx import helper

    ir = make_ir([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])],
                 [("x", [2, 4])], [("y", [2, 4])])
    assert not ir.model.graph.value_info
    result = get_pass("shape").apply(ir)
    assert result.modified
    names = {v.name for v in result.model.model.graph.value_info}
    assert "r" in names
    assert not ir.model.graph.value_info
