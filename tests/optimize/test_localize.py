import numpy as np
from onnx import helper, numpy_helper

from modelport.optimize.localize import first_divergence, magnitudes
from tests.optimize.conftest import make_ir


def test_first_divergent_node_named_in_small_batches():
    ir = make_ir([helper.make_node("Relu", ["x"], ["a"], name="n0"), helper.make_node("Sigmoid", ["a"], ["b"], name="n1"),
                  helper.make_node("Mul", ["b", "k"], ["c"], name="n2"), helper.make_node("Tanh", ["c"], ["y"], name="n3")],
                 [("x", [2, 4])], [("y", [2, 4])], {"k": np.full(4, 2.0)})
    cand = type(ir.model)()
    cand.CopyFrom(ir.model)
    cand.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full(4, 2.5, np.float32), "k"))
    div = first_divergence(ir.model, cand, ir.reference.inputs, batch=1)
    assert div.node == "n2" and div.tensor == "c" and div.checked == 3
    assert first_divergence(ir.model, ir.model, ir.reference.inputs) is None


def test_magnitudes():
    ir = make_ir([helper.make_node("Mul", ["x", "k"], ["y"], name="m")], [("x", [2, 4])], [("y", [2, 4])], {"k": np.full(4, 1e6)})
    assert magnitudes(ir.model, ir.reference.inputs)["y"] > 1e5
