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


def groupnorm_model():
    """Two inputs, two outputs, a float64 input: Conv → GroupNormalization → Relu gives `features`,
    their spatial mean times `gain` (CastLike to float) gives `score`. onnxruntime runs it; onnx2tf
    has no converter for GroupNormalization or CastLike, modelport's PyTorch code has both."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, (4,)).astype(np.float32), "scale"),
            numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "bias"),
            numpy_helper.from_array(np.array([2, 3], np.int64), "axes")]
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GroupNormalization", ["c", "scale", "bias"], ["g"], num_groups=2, epsilon=1e-5),
             helper.make_node("Relu", ["g"], ["features"]),
             helper.make_node("ReduceMean", ["features", "axes"], ["pooled"], keepdims=0),
             helper.make_node("CastLike", ["gain", "pooled"], ["gainf"]),
             helper.make_node("Mul", ["pooled", "gainf"], ["score"])]
    graph = helper.make_graph(nodes, "groupnorm", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 8, 8]),
                                                   helper.make_tensor_value_info("gain", TensorProto.DOUBLE, ["batch", 1])],
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4, 8, 8]),
                               helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 4])], initializer=init)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def layer_norm_encoder(width: int = 384):
    """LayerNorm(width) over the input's last axis, then Linear(width, 64): a frame normaliser at the
    front of an encoder, as audio models fed log-mel or dB frames have. Its gains are 4 to 8 and its
    biases small, so a kernel that loses a constant frame's mean by one ulp (5e-3 of normalised
    output at -138.47) shows on every output, far outside the fp32 tolerance."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, 64)).eval()
    with torch.no_grad():
        model[0].weight.uniform_(4.0, 8.0)
        model[0].bias.normal_(0.0, 0.1)
    return model


def save_pt2(model, path: Path, shape: tuple[int, ...]) -> Path:
    """`model` exported by torch.export on a random input of `shape`, saved as a .pt2 program."""
    import torch

    torch.export.save(torch.export.export(model, (torch.randn(*shape),)), path)
    return path
