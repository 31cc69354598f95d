"""KServe InferenceService: fields per server, checked against our schema derived from KServe's CRD."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from modelport.errors import BadInputError
from modelport.serving import PackageOptions
from modelport.serving.bundle import load_artifacts
from modelport.serving.kserve import check, inference_service, package, schema


@pytest.mark.parametrize("server, fmt", [("triton", "triton"), ("torchserve", "pytorch")])
def test_inference_service_is_valid(mlp_out, tmp_path, server, fmt):
    package(load_artifacts(mlp_out), tmp_path, PackageOptions(server=server, storage_uri="s3://bucket/mlp"))
    doc = yaml.safe_load((tmp_path / "inferenceservice.yaml").read_text())
    jsonschema.validate(doc, schema())
    model = doc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == fmt and model["storageUri"] == "s3://bucket/mlp"
    assert "kubectl apply -f inferenceservice.yaml" in (tmp_path / "README.md").read_text()
    if server == "torchserve":
        assert (tmp_path / "torchserve" / "config" / "config.properties").is_file()


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
