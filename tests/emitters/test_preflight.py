"""Preflight: op coverage, opset and IR version against each target runtime as installed."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from modelport.emitters import preflight
from modelport.errors import UnsupportedError
from modelport.ir import IRModel, specs_from_onnx
from tests.emitters.models import bitwise_model, det_model


def ir_of(model) -> IRModel:
    return IRModel(model=model, inputs=specs_from_onnx(model.graph.input), outputs=specs_from_onnx(model.graph.output))


def relu_model(opset: int, ir_version: int = 8):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m


def test_every_target_accepts_a_plain_model():
    for target in ("tflite", "tensorrt", "ort"):
        _, pre = preflight.run(ir_of(relu_model(17)), target)
        assert pre.ok and pre.nodes == 1 and pre.runtime_version


def test_unsupported_nodes_collected_per_target():
    _, pre = preflight.run(ir_of(bitwise_model()), "tflite")
    assert [u["node"] for u in pre.unsupported] == ["band"]
    _, pre = preflight.run(ir_of(det_model()), "tensorrt")
    assert [u["node"] for u in pre.unsupported] == ["det_node"]
    custom = relu_model(17)
    custom.graph.node.append(helper.make_node("Foo", ["y"], ["z"], domain="com.example", name="foo"))
    custom.opset_import.append(helper.make_opsetid("com.example", 1))
    _, pre = preflight.run(ir_of(custom), "ort")
    assert pre.unsupported[0]["node"] == "foo" and "no onnxruntime CPU kernel" in pre.unsupported[0]["reason"]
    with pytest.raises(UnsupportedError, match=r"foo \(Foo\)") as e:
        pre.raise_if_unsupported()
    assert e.value.exit_code == 2 and e.value.preflight["unsupported"]


def test_opset_moved_into_the_runtime_range():
    ir, pre = preflight.run(ir_of(relu_model(26)), "tensorrt")
    assert pre.ok and pre.opset == 24 and any("26 -> 24" in n for n in pre.notes)
    assert preflight.opset_of(ir.model) == 24
    ir, pre = preflight.run(ir_of(relu_model(8, ir_version=4)), "tensorrt")
    assert preflight.opset_of(ir.model) == 9


def test_ir_version_lowered_for_onnxruntime():
    from modelport.onnx_io import max_onnxruntime_ir_version

    ir, pre = preflight.run(ir_of(relu_model(17, ir_version=max_onnxruntime_ir_version() + 1)), "ort")
    assert ir.model.ir_version == max_onnxruntime_ir_version() and pre.notes
