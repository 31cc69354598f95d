from __future__ import annotations

import pytest

from modelport.errors import BadInputError
from modelport.parsers import SourceSpec, detect, parse
from modelport.specs import parse_input_spec


def test_parse_records_contract_and_reference(tiny_onnx):
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx))
    assert [(s.name, s.shape, s.layout) for s in ir.inputs] == [("x", ["batch", 8], "NC")]
    assert ir.reference.inputs["x"].shape == (2, 8)
    assert set(ir.reference.outputs) == {"y"}
    assert detect(tiny_onnx) == "onnx"


def test_opset_conversion(tiny_onnx):
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx, opset=18))
    assert ir.provenance["opset"] == 18
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx, opset=15))
    assert ir.provenance["opset"] == 15
    with pytest.raises(BadInputError, match="cannot convert opset 17 to 13"):
        parse(tiny_onnx, SourceSpec(path=tiny_onnx, opset=13))


def test_user_spec_overrides_and_unknown_names(tiny_onnx):
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx, inputs=[parse_input_spec("x:4x8")]))
    assert ir.inputs[0].shape == [4, 8]
    with pytest.raises(BadInputError, match=r"unknown input 'image'.*\['x'\]"):
        parse(tiny_onnx, SourceSpec(path=tiny_onnx, inputs=[parse_input_spec("image:1x8")]))
    with pytest.raises(BadInputError, match="rank"):
        parse(tiny_onnx, SourceSpec(path=tiny_onnx, inputs=[parse_input_spec("x:1x2x8")]))


def test_newer_ir_version_is_lowered_for_onnxruntime(tmp_path):
    """onnx.helper writes the newest IR version, which onnxruntime may not load yet."""
    import onnx
    from onnx import TensorProto, helper

    from modelport.onnx_io import max_onnxruntime_ir_version

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = onnx.IR_VERSION
    p = tmp_path / "new.onnx"
    onnx.save(model, str(p))
    ir = parse(p, SourceSpec(path=p))
    assert ir.model.ir_version == min(onnx.IR_VERSION, max_onnxruntime_ir_version())
    if onnx.IR_VERSION > max_onnxruntime_ir_version():
        assert "lowered" in ir.provenance["ir_version_note"]
