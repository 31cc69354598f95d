"""KServe InferenceService: fields per server, checked against our schema derived from KServe's CRD."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from modelport.errors import BadInputError
from modelport.packaging import PackageOptions
from modelport.packaging.bundle import load_artifacts
from modelport.packaging.kserve import check, inference_service, package, schema


@pytest.mark.parametrize("server, fmt", [("triton", "triton"), ("torchserve", "pytorch")])
def test_inference_service_is_valid(mlp_out, tmp_path, server, fmt):
    package(load_artifacts(mlp_out), tmp_path, PackageOptions(server=server, storage_uri="s3://bucket/mlp"))
    doc = yaml.safe_load((tmp_path / "inferenceservice.yaml").read_text())
    jsonschema.validate(doc, schema())
    model = doc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == fmt and model["storageUri"] == "s3://bucket/mlp"
    assert "kubectl apply -f inferenceservice.yaml" in (tmp_path / "README.md").read_text()
    if server == "torchserve":
        from tests.serving.test_torchserve import properties

        props = properties(tmp_path / "torchserve" / "config" / "config.properties")
        for key in ("inference_address", "management_address", "metrics_address"):
            assert props[key].startswith("http://127.0.0.1:"), key  # only KServe's wrapper, in the pod, calls TorchServe
        assert props["management_address"] != props["inference_address"] and props["enable_model_api"] == "false"


def test_gpu_and_tfserving_storage_path():
    doc = inference_service(PackageOptions(server="tfserving"), "mlp", True)
    check(doc)
    assert doc["spec"]["predictor"]["model"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert doc["spec"]["predictor"]["model"]["storageUri"].endswith("/mlp/mlp")


def test_schema_rejects_typos():
    doc = inference_service(PackageOptions(), "mlp", False)
    doc["spec"]["predictor"]["model"]["storageURI"] = doc["spec"]["predictor"]["model"].pop("storageUri")
    with pytest.raises(BadInputError, match="storageURI"):
        check(doc)


def test_default_pvc_storage_comes_with_its_claim(mlp_out, tmp_path):
    """pvc://modelport-models/<name> names a claim: pvc.yaml creates it and the README copies the bundle onto it."""
    import kubernetes_validate

    b = package(load_artifacts(mlp_out), tmp_path, PackageOptions(server="triton", namespace="ml"))
    assert b.details["storage_uri"] == "pvc://modelport-models/mlp"
    pvc = yaml.safe_load((tmp_path / "pvc.yaml").read_text())
    kubernetes_validate.validate(pvc, "1.37.0", strict=True)
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["metadata"] == {
        "name": "modelport-models", "labels": {"app.kubernetes.io/part-of": "modelport"}, "namespace": "ml"}
    assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"
    readme = (tmp_path / "README.md").read_text()
    assert "kubectl apply -f pvc.yaml" in readme and "kubectl cp -n ml model_repository/. modelport-copy:/mnt/models/mlp" in readme
    other = tmp_path / "s3"
    package(load_artifacts(mlp_out), other, PackageOptions(server="triton", storage_uri="s3://bucket/mlp"))
    assert not (other / "pvc.yaml").exists()


def test_scaling_per_device():
    cpu = inference_service(PackageOptions(), "mlp", False)["spec"]["predictor"]
    assert (cpu["scaleMetric"], cpu["minReplicas"], cpu["maxReplicas"]) == ("cpu", 1, 4)
    gpu = inference_service(PackageOptions(server="triton", max_batch_size=16), "mlp", True)["spec"]["predictor"]
    assert (gpu["scaleMetric"], gpu["scaleTarget"]) == ("concurrency", 16)
    fixed = inference_service(PackageOptions(replicas=2), "mlp", True)
    check(fixed)
    assert fixed["spec"]["predictor"]["minReplicas"] == fixed["spec"]["predictor"]["maxReplicas"] == 2
    assert "scaleMetric" not in fixed["spec"]["predictor"]


def test_a_pvc_uri_must_name_a_claim(mlp_out, tmp_path):
    with pytest.raises(BadInputError, match="not a PersistentVolumeClaim name"):
        package(load_artifacts(mlp_out), tmp_path, PackageOptions(server="triton", storage_uri="pvc://My_Claim/m"))
