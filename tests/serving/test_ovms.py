"""OpenVINO serving: the OVMS repository (config.json checked against the schema written from the
OVMS docs), Triton's `openvino` backend (config.pbtxt through Triton's own schema), and the
Kubernetes / KServe / Docker bundles around the OVMS image."""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest
import yaml

from modelport.errors import BadInputError
from modelport.packaging import PackageOptions
from modelport.packaging.bundle import load_artifacts
from modelport.packaging.docker import SERVERS
from modelport.packaging.ovms import check, package, schema
from modelport.runtimes.openvino import supports
from tests.serving.conftest import write_mlp


@pytest.fixture(scope="module")
def ov_out(tmp_path_factory):
    """The MLP converted to ONNX and OpenVINO IR, at fp32 and (where the CPU has it) bf16."""
    from modelport.orchestration import ConvertOptions, convert

    root = tmp_path_factory.mktemp("ov")
    src = write_mlp(root / "src")
    convert(src, root / "fp32", ConvertOptions(targets=["onnx", "openvino"]))
    if supports("bf16"):
        convert(src, root / "bf16", ConvertOptions(targets=["openvino"], precision="bf16"))
    return root


def test_ovms_repository_layout_and_config(ov_out, tmp_path):
    b = package(load_artifacts(ov_out / "fp32"), tmp_path, PackageOptions(model_name="mlp"))
    assert sorted(p.name for p in (tmp_path / "mlp" / "1").iterdir()) == ["model.bin", "model.xml"]
    doc = json.loads((tmp_path / "config.json").read_text())
    jsonschema.validate(doc, schema())
    (entry,) = doc["model_config_list"]
    config = entry["config"]
    assert config["name"] == "mlp" and config["base_path"] == "mlp" and config["target_device"] == "CPU"
    assert config["plugin_config"]["INFERENCE_PRECISION_HINT"] == "f32"  # fp32 means fp32, also in the server
    assert b.details["format"] == "openvino-ir" and b.details["versions"] == [1]
    request = json.loads((tmp_path / "mlp.request.json").read_text())
    assert request["inputs"][0]["name"] == "features" and request["inputs"][0]["shape"] == [1, 8]
    assert "--config_path=/models/config.json" in (tmp_path / "README.md").read_text()


@pytest.mark.skipif(not supports("bf16"), reason="needs a CPU with BF16 (this project's CPU has AVX512-BF16)")
def test_a_bf16_artifact_is_served_at_bf16(ov_out, tmp_path):
    package(load_artifacts(ov_out / "bf16"), tmp_path / "ovms", PackageOptions(model_name="mlp"))
    doc = json.loads((tmp_path / "ovms" / "config.json").read_text())
    assert doc["model_config_list"][0]["config"]["plugin_config"]["INFERENCE_PRECISION_HINT"] == "bf16"
    from modelport.packaging.triton import package as triton_package
    from modelport.packaging.triton import parse_config

    triton_package(load_artifacts(ov_out / "bf16"), tmp_path / "triton", PackageOptions(model_name="mlp"))
    config = parse_config((tmp_path / "triton" / "mlp" / "config.pbtxt").read_text())
    assert config.backend == "openvino" and config.parameters["HINT_BF16"].string_value == "YES"


def test_versions_are_added_and_other_models_kept(ov_out, tmp_path):
    package(load_artifacts(ov_out / "fp32"), tmp_path, PackageOptions(model_name="mlp"))
    config = tmp_path / "config.json"
    doc = json.loads(config.read_text())
    doc["model_config_list"].insert(0, {"config": {"name": "other", "base_path": "other"}})
    config.write_text(json.dumps(doc))
    b = package(load_artifacts(ov_out / "fp32"), tmp_path, PackageOptions(model_name="mlp"))
    assert b.details["versions"] == [1, 2] and (tmp_path / "mlp" / "2" / "model.xml").is_file()
    names = [m["config"]["name"] for m in json.loads(config.read_text())["model_config_list"]]
    assert names == ["other", "mlp"]
    with pytest.raises(BadInputError, match="version 2 of 'mlp' already exists"):
        package(load_artifacts(ov_out / "fp32"), tmp_path, PackageOptions(model_name="mlp", version=2))


def test_the_schema_rejects_what_ovms_would():
    good = {"model_config_list": [{"config": {"name": "m", "base_path": "m", "model_version_policy": {"all": {}}}}]}
    check(good)
    for bad, where in (({"model_config_list": [{"config": {"name": "m"}}]}, "model_config_list/0/config"),
                       ({"model_config_list": [{"config": {"name": "m", "base_path": "m", "base_pth": "x"}}]},
                        "model_config_list/0/config"),
                       ({"model_config_list": [{"config": {"name": "m", "base_path": "m",
                                                           "model_version_policy": {"latest": {"num_versions": 0}}}}]},
                        "model_config_list/0/config/model_version_policy")):
        with pytest.raises(BadInputError, match=f"OVMS config.json invalid at {where}:"):
            check(bad)


def test_an_onnx_only_folder_is_served_as_onnx(mlp_out, tmp_path):
    b = package(load_artifacts(mlp_out), tmp_path, PackageOptions(model_name="mlp"))
    assert (tmp_path / "mlp" / "1" / "model.onnx").is_file() and b.details["format"] == "onnx"


def test_triton_openvino_backend_config_through_tritons_schema(ov_out, tmp_path):
    from tritonclient.grpc import model_config_pb2 as pb

    from modelport.packaging.triton import package as triton_package
    from modelport.packaging.triton import parse_config

    b = triton_package(load_artifacts(ov_out / "fp32"), tmp_path, PackageOptions(model_name="mlp", backend="openvino"))
    assert sorted(p.name for p in (tmp_path / "mlp" / "1").iterdir()) == ["model.bin", "model.xml"]
    config = parse_config((tmp_path / "mlp" / "config.pbtxt").read_text())
    assert config.backend == "openvino" and not config.platform and config.default_model_filename == "model.xml"
    assert config.max_batch_size == 8 and list(config.input[0].dims) == [8] and pb.DataType.Name(config.input[0].data_type) == "TYPE_FP32"
    assert "HINT_BF16" not in config.parameters and config.parameters["PERFORMANCE_HINT"].string_value == "LATENCY"
    assert b.details["platform"] == "openvino"
    assert "cannot pin f32" in (tmp_path / "README.md").read_text()


def test_k8s_kserve_and_docker_around_ovms(ov_out, tmp_path):
    from modelport.packaging.kserve import package as kserve_package
    from modelport.packaging.kserve import schema as kserve_schema
    from modelport.packaging.kubernetes import package as k8s_package

    s = SERVERS["ovms"]
    k8s_package(load_artifacts(ov_out / "fp32"), tmp_path / "k8s", PackageOptions(server="ovms", model_name="mlp"))
    docker = (tmp_path / "k8s" / "Dockerfile").read_text()
    assert f"FROM {s.image_cpu}" in docker and "COPY ovms/ /models/" in docker and '"--config_path=/models/config.json"' in docker
    assert (tmp_path / "k8s" / "ovms" / "mlp" / "1" / "model.xml").is_file()
    docs = {p.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "k8s" / "k8s").iterdir()}
    for doc in docs.values():
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    pod = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert pod["readinessProbe"]["httpGet"]["path"] == "/v2/models/mlp/ready"
    assert {p["containerPort"] for p in pod["ports"]} == {8000, 9000}

    kserve_package(load_artifacts(ov_out / "fp32"), tmp_path / "ks", PackageOptions(server="ovms", model_name="mlp",
                                                                                    storage_uri="s3://bucket/models"))
    doc = yaml.safe_load((tmp_path / "ks" / "inferenceservice.yaml").read_text())
    jsonschema.validate(doc, kserve_schema())
    model = doc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "openvino_ir" and model["runtime"] == "kserve-ovms"
    assert model["storageUri"] == "s3://bucket/models/mlp" and model["protocolVersion"] == "v2"


def test_package_cli_for_ovms(cli, ov_out, tmp_path):
    r = cli("package", ov_out / "fp32", "--for", "ovms", "-o", tmp_path / "b", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["bundles"][0]["system"] == "ovms"
