"""Small real models the emitter tests share, built in the test process."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def save_onnx(model, folder: Path, name: str) -> Path:
    import onnx

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save(model, str(path))
    return path


def det_model():
    """MatMul then Det: onnxruntime runs it, TensorRT's ONNX parser has no Det."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Det", ["m"], ["y"], name="det_node")],
        "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])], initializer=[w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def bitwise_model():
    """BitwiseAnd on int32: onnxruntime runs it, onnx2tf (TFLite) has no converter for it."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("BitwiseAnd", ["a", "b"], ["c"], name="band")], "bits",
        [helper.make_tensor_value_info("a", TensorProto.INT32, [4]), helper.make_tensor_value_info("b", TensorProto.INT32, [4])],
        [helper.make_tensor_value_info("c", TensorProto.INT32, [4])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m
