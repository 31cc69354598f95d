"""Every runner states its input specs; for the artifacts modelport writes they are the contract's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from modelport.emitters import EmitOptions
from modelport.ir import IRModel, TensorSpec, specs_from_onnx
from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes import get_runner
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner, open_onnx_file
from modelport.runtimes.tflite import open_untrusted


def same_as_contract(specs: list[TensorSpec], contract: list[dict]) -> None:
    """Names, order and dtypes equal; fixed dims equal, and a dynamic dim symbolic on both sides."""
    assert [s.name for s in specs] == [c["name"] for c in contract]
    for s, c in zip(specs, contract, strict=True):
        assert s.dtype == c["dtype"] and len(s.shape) == len(c["shape"]), (s, c)
        for got, want in zip(s.shape, c["shape"], strict=True):
            assert got == want if isinstance(want, int) else isinstance(got, str), (s, c)


def test_onnx_ort_and_tflite_artifacts(tiny_onnx, tmp_path):
    out = tmp_path / "out"
    report = convert(tiny_onnx, out, ConvertOptions(targets=["onnx", "ort", "tflite"]))
    contract = report["contract"]["inputs"]
    onnx_specs = OnnxRuntimeRunner(out / "model.onnx").input_specs()
    assert [s.to_dict() for s in onnx_specs] == contract  # the file keeps the whole contract
    same_as_contract(open_onnx_file(out / "model.onnx").input_specs(), contract)
    same_as_contract(OnnxRuntimeRunner(out / "model.ort").input_specs(), contract)
    same_as_contract(get_runner("tflite", out / "model.tflite", signature="serving_default").input_specs(), contract)
    same_as_contract(open_untrusted(out / "model.tflite").input_specs(), contract)  # read in a child process


def test_pytorch_code_artifact(tiny_onnx, tmp_path):
    from modelport.emitters.pytorch_code import emit

    model = onnx.load(str(tiny_onnx))
    ir = IRModel(model, specs_from_onnx(model.graph.input), specs_from_onnx(model.graph.output))
    artifact = emit(ir, tmp_path / "out", EmitOptions())
    runner = get_runner(artifact.runner, artifact.path, **artifact.runner_options)
    same_as_contract(runner.input_specs(), [s.to_dict() for s in ir.inputs])


def test_torch_runner_reads_an_exported_graph():
    import torch

    module = torch.export.export(torch.nn.Linear(4, 2), (torch.zeros(3, 4),),
                                 dynamic_shapes=({0: torch.export.Dim("batch")},)).module()
    specs = get_runner("torch", module, input_names=["x"]).input_specs()
    assert [(s.name, s.dtype, s.shape) for s in specs] == [("x", "float32", ["x_dim0", 4])]
    given = [TensorSpec("x", "float32", ["batch", 4])]
    assert get_runner("torch", torch.nn.Linear(4, 2), input_names=["x"], inputs=given).input_specs() == given


@pytest.mark.tf
def test_savedmodel_artifact(tmp_path):
    from modelport.packaging import PackageOptions
    from modelport.packaging.bundle import load_artifacts
    from modelport.packaging.tfserving import package
    from tests.serving.conftest import write_mlp

    out = tmp_path / "out"
    report = convert(write_mlp(tmp_path / "src"), out, ConvertOptions(targets=["onnx"]))
    package(load_artifacts(out), tmp_path / "tfs", PackageOptions(model_name="mlp"))
    runner = get_runner("savedmodel", tmp_path / "tfs" / "mlp" / "1")
    same_as_contract(runner.input_specs(), report["contract"]["inputs"])
    x = np.ones((2, 8), np.float32)
    assert list(runner.run({"features": x})) == ["scores"]
