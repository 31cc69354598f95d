"""The in-process onnxruntime runner takes a large ModelProto through a file with external data
(serialised, it would be held once more as bytes and once more by onnxruntime's parse of them) and
runs it exactly as from bytes."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _model():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_large_model_reaches_onnxruntime_through_a_file(monkeypatch):
    from modelport.runtimes import onnxruntime as runner_module
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    x = {"x": np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)}
    from_bytes = OnnxRuntimeRunner(_model())
    assert from_bytes._tmp is None
    monkeypatch.setattr(runner_module, "SESSION_FROM_FILE_BYTES", 1024)  # the 8 KB weight counts as large
    model = _model()
    from_file = OnnxRuntimeRunner(model)
    assert from_file._tmp is not None
    assert np.array_equal(from_file.run(x)["y"], from_bytes.run(x)["y"])
    assert model.graph.initializer[0].raw_data  # the caller's model keeps its weights
