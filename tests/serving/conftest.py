"""Real artifacts from the earlier stages, converted once per session for every packaging test."""

from __future__ import annotations

from pathlib import Path

import pytest

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


@pytest.fixture(scope="session")
def cnn_out(tmp_path_factory) -> Path:
    """`modelport convert` of the zoo's small CNN (PyTorch .pt2, dynamic batch, NCHW, mean/std) to ONNX."""
    from modelport.orchestration import ConvertOptions, convert
    from modelport.resolve.specs import apply_options, parse_input_spec
    from modelport.zoo_builders import save_source

    root = tmp_path_factory.mktemp("cnn")
    save_source("cnn_small", root / "src")
    specs = apply_options([parse_input_spec("input:batch,3,64,64")], layouts=["NCHW"],
                          means=[",".join(map(str, MEAN))], stds=[",".join(map(str, STD))])
    out = root / "out"
    convert(root / "src" / "model.pt2", out, ConvertOptions(targets=["onnx"], inputs=specs))
    return out


def write_mlp(folder: Path) -> Path:
    """A two-layer ONNX MLP with a dynamic batch: features[batch, 8] -> scores[batch, 5]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "w"], ["h"]), helper.make_node("Relu", ["h"], ["scores"])],
        "mlp", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 5])], initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "mlp.onnx"))
    return folder / "mlp.onnx"


@pytest.fixture(scope="session")
def mlp_out(tmp_path_factory) -> Path:
    """`modelport convert` of a two-layer ONNX MLP with a dynamic batch (source: an .onnx file)."""
    from modelport.orchestration import ConvertOptions, convert

    root = tmp_path_factory.mktemp("mlp")
    convert(write_mlp(root / "src"), root / "out", ConvertOptions(targets=["onnx"]))
    return root / "out"


@pytest.fixture(scope="session")
def mlp_edge_out(tmp_path_factory) -> Path:
    """The MLP converted to TFLite and the ORT format only (no .onnx in the folder)."""
    from modelport.orchestration import ConvertOptions, convert

    root = tmp_path_factory.mktemp("mlp_edge")
    convert(write_mlp(root / "src"), root / "out", ConvertOptions(targets=["tflite", "ort"]))
    return root / "out"


@pytest.fixture(scope="session")
def mlp_plan_out(tmp_path_factory) -> Path:
    """The MLP through `convert --to tensorrt --plan-only`: OUT/tensorrt/ holds the build plan, no engine."""
    from modelport.emitters.tensorrt_options import TensorRTOptions
    from modelport.orchestration import ConvertOptions, convert

    root = tmp_path_factory.mktemp("mlp_plan")
    convert(write_mlp(root / "src"), root / "out", ConvertOptions(targets=["tensorrt"], target_options={"tensorrt": TensorRTOptions(plan_only=True)}))
    return root / "out"


@pytest.fixture(scope="session")
def cnn_pt_out(tmp_path_factory) -> Path:
    """The same CNN converted to ONNX and to PyTorch code (`pytorch/model.py` + `model.safetensors`)."""
    from modelport.orchestration import ConvertOptions, convert
    from modelport.resolve.specs import apply_options, parse_input_spec
    from modelport.zoo_builders import save_source

    root = tmp_path_factory.mktemp("cnn_pt")
    save_source("cnn_small", root / "src")
    specs = apply_options([parse_input_spec("input:batch,3,64,64")], layouts=["NCHW"],
                          means=[",".join(map(str, MEAN))], stds=[",".join(map(str, STD))])
    out = root / "out"
    convert(root / "src" / "model.pt2", out, ConvertOptions(targets=["onnx", "pytorch"], inputs=specs))
    return out
