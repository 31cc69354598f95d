"""Kubernetes bundle: Dockerfile and manifests, each validated against the Kubernetes schemas."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from modelport.serving import PackageOptions
from modelport.serving.bundle import load_artifacts
from modelport.serving.docker import SERVERS
from modelport.serving.kubernetes import k8s_name, manifests, package

K8S_VERSION = "1.37.0"


def validate(doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("server", ["triton", "torchserve"])
def test_bundle_dockerfile_and_valid_manifests(mlp_out, tmp_path, server):
    b = package(load_artifacts(mlp_out), tmp_path, PackageOptions(server=server, replicas=2, max_replicas=6, cpu="500m"))
    s = SERVERS[server]
    docker = (tmp_path / "Dockerfile").read_text()
    assert f"FROM {s.image_cpu}" in docker and f"COPY {s.bundle_dir}/ {s.mount}/" in docker
    assert (tmp_path / s.bundle_dir).is_dir()
    docs = {p.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "k8s").iterdir()}
    assert set(docs) == {"deployment.yaml", "service.yaml", "hpa.yaml"}
    for doc in docs.values():
        validate(doc)
    pod = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert docs["deployment.yaml"]["spec"]["replicas"] == 2
    assert pod["readinessProbe"]["httpGet"]["path"] == s.readiness.format(name="mlp")
    assert pod["livenessProbe"]["httpGet"]["path"] == s.liveness.format(name="mlp")
    assert pod["resources"]["requests"]["cpu"] == "500m" and "nvidia.com/gpu" not in pod["resources"]["limits"]
    assert docs["hpa.yaml"]["spec"]["maxReplicas"] == 6
    assert docs["hpa.yaml"]["spec"]["scaleTargetRef"]["name"] == docs["deployment.yaml"]["metadata"]["name"]
    assert "kubectl apply -f k8s/" in (tmp_path / "README.md").read_text()
    assert b.details["gpu"] is False


def test_gpu_limit_when_the_artifact_needs_one(mlp_out):
    docs = manifests(PackageOptions(server="tfserving", device="gpu"), "mlp", "mlp-tfserving:1", True)
    pod = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert pod["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["readinessProbe"]["httpGet"]["path"] == "/v1/models/mlp"
    for doc in docs.values():
        validate(doc)


def test_the_schema_check_catches_a_broken_manifest(mlp_out):
    docs = manifests(PackageOptions(), "mlp", "img", False)
    bad = docs["deployment.yaml"]
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad)


def test_k8s_names():
    assert k8s_name("My_Model.v2") == "my-model-v2"
    assert k8s_name("9lives") == "m-9lives"
