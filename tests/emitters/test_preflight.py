"""Preflight: op coverage, opset and IR version against each target runtime as installed; every
target's preflight runs before anything is emitted and all refusals come in one error."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelport.emitters import EMITTERS, EmitOptions, get_emitter, preflight
from modelport.errors import UnsupportedError
from modelport.ir import IRModel, specs_from_onnx
from tests.conftest import tree
from tests.emitters.models import bitwise_model, det_model, save_onnx


def run(ir: IRModel, target: str):
    """(IR fitted to the target, findings) from the target's emitter module."""
    module = get_emitter(target)
    out = module.parser_check(ir) if target == "tensorrt" else module.check(ir)
    return out[0], out[1]


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
        _, pre = run(ir_of(relu_model(17)), target)
        assert pre.ok and pre.nodes == 1 and pre.runtime_version


def test_unsupported_nodes_collected_per_target():
    _, pre = run(ir_of(bitwise_model()), "tflite")
    assert [u["node"] for u in pre.unsupported] == ["band"]
    _, pre = run(ir_of(det_model()), "tensorrt")
    assert [u["node"] for u in pre.unsupported] == ["det_node"]
    custom = relu_model(17)
    custom.graph.node.append(helper.make_node("Foo", ["y"], ["z"], domain="com.example", name="foo"))
    custom.opset_import.append(helper.make_opsetid("com.example", 1))
    _, pre = run(ir_of(custom), "ort")
    assert pre.unsupported[0]["node"] == "foo" and "no onnxruntime CPU kernel" in pre.unsupported[0]["reason"]
    with pytest.raises(UnsupportedError, match=r"foo \(Foo\)") as e:
        pre.raise_if_unsupported()
    assert e.value.exit_code == 2 and e.value.preflight["unsupported"]


def test_opset_moved_into_the_runtime_range():
    ir, pre = run(ir_of(relu_model(26)), "tensorrt")
    assert pre.ok and pre.opset == 24 and any("26 -> 24" in n for n in pre.notes)
    assert preflight.opset_of(ir.model) == 24
    ir, pre = run(ir_of(relu_model(8, ir_version=4)), "tensorrt")
    assert preflight.opset_of(ir.model) == 9


def test_ir_version_lowered_for_onnxruntime():
    from modelport.onnxfile.ir_version_fit import max_onnxruntime_ir_version

    ir, pre = run(ir_of(relu_model(17, ir_version=max_onnxruntime_ir_version() + 1)), "ort")
    assert ir.model.ir_version == max_onnxruntime_ir_version() and pre.notes


def test_every_emitter_exports_its_preflight():
    ir = ir_of(relu_model(17))
    for target in EMITTERS:
        pre = get_emitter(target).preflight(ir, EmitOptions())
        assert isinstance(pre, preflight.Preflight) and pre.target == target, target
        assert pre.ok is (target != "ort-genai"), target  # ort-genai takes decoder LMs only


def bits_and_det_model():
    """Det (no PyTorch converter, no TensorRT layer) beside BitwiseAnd (no onnx2tf converter):
    onnxruntime runs both, so the source parses and each target refuses for its own op."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Det", ["m"], ["y"], name="det_node"),
         helper.make_node("BitwiseAnd", ["a", "b"], ["c"], name="band")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4]),
         helper.make_tensor_value_info("a", TensorProto.INT32, [4]), helper.make_tensor_value_info("b", TensorProto.INT32, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("c", TensorProto.INT32, [4])],
        initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def test_all_targets_checked_before_emitting_and_refused_in_one_error(cli, tmp_path):
    src = save_onnx(bits_and_det_model(), tmp_path / "src", "mixed.onnx")
    out = tmp_path / "out"
    r = cli("convert", src, "--to", "onnx,tflite,pytorch", "-o", out, "--json", "-q")
    assert r.exit_code == 2, r
    message = r.json()["error"]["message"]
    assert "2 targets cannot represent this model" in message
    assert "--to tflite (onnx2tf): BitwiseAnd x1" in message and "--to pytorch (PyTorch code generator): Det x1" in message
    assert "\n" not in message
    assert not [s["name"] for s in r.json()["stages"] if s["name"].startswith("emit:")]  # nothing was emitted first
    assert not out.exists() and tree(tmp_path) == ["src", "src/mixed.onnx"]
    r = cli("emit", src, "--to", "pytorch,tflite", "-o", out)  # emit: the same check, the same one error
    assert r.exit_code == 2 and "BitwiseAnd x1" in r.stderr and "Det x1" in r.stderr and not out.exists()


def test_one_refusing_target_keeps_its_own_message():
    ir = ir_of(bits_and_det_model())
    with pytest.raises(UnsupportedError, match=r"cannot write PyTorch code: unsupported ops: Det x1") as e:
        preflight.check_targets(ir, ["onnx", "pytorch"], EmitOptions())
    assert e.value.preflight["target"] == "pytorch"
    with pytest.raises(UnsupportedError, match=r"--to tensorrt \(TensorRT ONNX parser\): BitwiseAnd x1, Det x1") as e:
        preflight.check_targets(ir, ["tflite", "tensorrt"], EmitOptions())
    assert [p["target"] for p in e.value.preflight] == ["tflite", "tensorrt"]
