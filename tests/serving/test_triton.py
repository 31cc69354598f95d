"""Triton model repository: layout, config round trip through Triton's schema, batching, versions."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from modelport.errors import BadInputError
from modelport.packaging import PackageOptions
from modelport.packaging.bundle import load_artifacts
from modelport.packaging.triton import build_config, config_text, package, parse_config


def test_repository_layout_and_config_from_the_contract(cnn_out, tmp_path):
    b = package(load_artifacts(cnn_out), tmp_path, PackageOptions(model_name="cnn", preferred_batch_sizes=[2, 8], queue_delay_us=500))
    assert (tmp_path / "cnn" / "1" / "model.onnx").is_file()
    config = parse_config((tmp_path / "cnn" / "config.pbtxt").read_text())
    assert config.name == "cnn" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 8  # dim 0 is the symbolic 'batch' on every input and output
    (inp,), (out,) = config.input, config.output
    assert (inp.name, pb.DataType.Name(inp.data_type), list(inp.dims)) == ("input", "TYPE_FP32", [3, 64, 64])
    assert pb.ModelInput.Format.Name(inp.format) == "FORMAT_NCHW"
    assert (out.name, list(out.dims)) == ("output", [10])
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
    assert b.details["versions"] == [1]
    readme = (tmp_path / "README.md").read_text()
    assert "tritonserver --model-repository" in readme and "/v2/models/cnn/infer" in readme
    assert (tmp_path / "cnn.request.json").is_file()


def test_config_round_trips_through_tritons_schema(mlp_out):
    opts = PackageOptions(device="gpu", instances=2, trt_acceleration=True, max_batch_size=16)
    config = build_config(load_artifacts(mlp_out), opts, "onnx", "mlp")
    text = config_text(config)
    again = parse_config(text)
    assert again == config
    assert again.instance_group[0].count == 2 and again.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
    acc = again.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert acc.name == "tensorrt" and acc.parameters["precision_mode"] == "FP16"
    with pytest.raises(BadInputError):
        parse_config(text + "\nnot_a_triton_field: 1\n")


def test_no_batch_axis_means_full_dims(mlp_out):
    config = build_config(load_artifacts(mlp_out), PackageOptions(max_batch_size=0), "onnx", "mlp")
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [-1, 8]
    assert not config.HasField("dynamic_batching")


@pytest.mark.parametrize("kw, text", [
    ({"trt_acceleration": True}, "--trt-accel"),  # CPU
    ({"preferred_batch_sizes": [32]}, "outside"),
    ({"backend": "nope"}, "unknown Triton backend"),
])
def test_bad_options(mlp_out, kw, text):
    with pytest.raises(BadInputError, match=text):
        opts = PackageOptions(**kw)
        build_config(load_artifacts(mlp_out), opts, opts.backend or "onnx", "mlp")


def test_tensorrt_backend_needs_the_plan(mlp_out, tmp_path):
    with pytest.raises(BadInputError, match="no tensorrt artifact"):
        package(load_artifacts(mlp_out), tmp_path, PackageOptions(backend="tensorrt"))


def test_adding_a_version_keeps_the_old_ones(mlp_out, tmp_path):
    arts = load_artifacts(mlp_out)
    package(arts, tmp_path, PackageOptions())
    b = package(arts, tmp_path, PackageOptions(add_version=True))
    assert b.details["versions"] == [1, 2]
    assert (tmp_path / "mlp" / "1" / "model.onnx").is_file() and (tmp_path / "mlp" / "2" / "model.onnx").is_file()
    with pytest.raises(BadInputError, match="already exists"):
        package(arts, tmp_path, PackageOptions(version=2))


def test_torchscript_repository_from_the_pytorch_code(cnn_pt_out, tmp_path):
    import json

    import numpy as np
    import torch

    from modelport.packaging.torchscript import TOLERANCE
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
    from modelport.validation import compare

    b = package(load_artifacts(cnn_pt_out), tmp_path, PackageOptions(model_name="cnn", backend="pytorch", trust=True))
    model_pt = tmp_path / "cnn" / "1" / "model.pt"
    assert model_pt.is_file() and not (tmp_path / "cnn" / "1" / "model.onnx").exists()
    text = (tmp_path / "cnn" / "config.pbtxt").read_text()
    config = parse_config(text)
    assert config == build_config(load_artifacts(cnn_pt_out), PackageOptions(), "torchscript", "cnn")
    assert (config.platform, config.default_model_filename, config.max_batch_size) == ("pytorch_libtorch", "model.pt", 8)
    (inp,), (out,) = config.input, config.output
    assert (inp.name, list(inp.dims), pb.ModelInput.Format.Name(inp.format)) == ("INPUT__0", [3, 64, 64], "FORMAT_NCHW")
    assert (out.name, pb.DataType.Name(out.data_type), list(out.dims)) == ("OUTPUT__0", "TYPE_FP32", [10])
    assert b.details["platform"] == "pytorch_libtorch" and b.details["torchscript"]["parity_onnx"]["ok"]
    request = json.loads((tmp_path / "cnn.request.json").read_text())
    assert [i["name"] for i in request["inputs"]] == ["INPUT__0"]
    assert "`INPUT__0` is `input`" in (tmp_path / "README.md").read_text()
    # what Triton's libtorch backend would load, run at a batch inside max_batch_size
    x = np.random.default_rng(9).standard_normal((4, 3, 64, 64)).astype(np.float32)
    with torch.no_grad():
        got = torch.jit.load(str(model_pt))(torch.from_numpy(x)).numpy()
    result = compare(OnnxRuntimeRunner(cnn_pt_out / "model.onnx").run({"input": x}), {"output": got}, TOLERANCE, hop="model.pt")
    assert result.ok, result.summary()


def test_torchscript_without_trust_is_refused(cnn_pt_out, tmp_path):
    from modelport.errors import UnsafeInputError

    with pytest.raises(UnsafeInputError):
        package(load_artifacts(cnn_pt_out), tmp_path, PackageOptions(backend="torchscript"))
    assert not list((tmp_path).rglob("model.pt"))


def test_tensorrt_plan_only_gives_config_and_build_folder(mlp_plan_out, tmp_path):
    import json

    arts = load_artifacts(mlp_plan_out)
    b = package(arts, tmp_path, PackageOptions(model_name="mlp"))  # the plan is the only artifact: tensorrt_plan
    config = parse_config((tmp_path / "mlp" / "config.pbtxt").read_text())
    assert (config.platform, config.default_model_filename, config.max_batch_size) == ("tensorrt_plan", "model.plan", 8)
    assert [(i.name, list(i.dims)) for i in config.input] == [("features", [8])]
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
    version = tmp_path / "mlp" / "1"
    build = version / "build"
    assert {p.name for p in build.iterdir()} >= {"model.onnx", "plan.json", "trtexec.sh", "build_engine.py"}
    assert not (version / "model.plan").exists()
    # the build scripts write the engine exactly where Triton looks for it
    plan = json.loads((build / "plan.json").read_text())
    assert (build / plan["engine"]).resolve() == (version / "model.plan").resolve()
    assert "--saveEngine=../model.plan" in (build / "trtexec.sh").read_text()
    assert b.details["engine"].startswith("not built") and "trtexec.sh" in (tmp_path / "README.md").read_text()
    # Triton may batch up to max_batch_size: the engine's profile must reach it
    with pytest.raises(BadInputError, match="exceeds the TensorRT profile's max batch 8"):
        package(arts, tmp_path / "big", PackageOptions(max_batch_size=16))


def test_tensorrt_plan_only_refused_in_a_container(mlp_plan_out, tmp_path):
    from modelport.packaging import kubernetes
    with pytest.raises(BadInputError, match="engine is not built"):
        kubernetes.package(load_artifacts(mlp_plan_out), tmp_path, PackageOptions(server="triton"))


def test_tflite_and_ort_are_refused_naming_what_triton_takes(mlp_edge_out, tmp_path):
    with pytest.raises(BadInputError, match=r"Triton cannot serve .*ORT-format.*TFLite.*Triton takes ONNX") as e:
        package(load_artifacts(mlp_edge_out), tmp_path, PackageOptions())
    assert e.value.exit_code == 2 and "--to onnx" in (e.value.hint or "")
