"""Kubernetes bundle: Dockerfile and manifests, each validated against the Kubernetes schemas."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from modelport.errors import BadInputError
from modelport.packaging import PackageOptions
from modelport.packaging.bundle import load_artifacts
from modelport.packaging.docker import SERVERS
from modelport.packaging.kubernetes import k8s_name, manifests, package

K8S_VERSION = "1.37.0"


def validate(doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("server", ["triton", "torchserve"])
def test_bundle_dockerfile_and_valid_manifests(mlp_out, tmp_path, server):
    b = package(load_artifacts(mlp_out), tmp_path, PackageOptions(server=server, max_replicas=6, cpu="500m"))
    s = SERVERS[server]
    docker = (tmp_path / "Dockerfile").read_text()
    assert f"FROM {s.image_cpu}" in docker and f"COPY {s.bundle_dir}/ {s.mount}/" in docker
    assert (tmp_path / s.bundle_dir).is_dir()
    docs = {p.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "k8s").iterdir()}
    assert set(docs) == {"deployment.yaml", "service.yaml", "hpa.yaml"}
    for doc in docs.values():
        validate(doc)
    pod = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert "replicas" not in docs["deployment.yaml"]["spec"]  # the HPA owns the scale
    for probe, path in ((pod["readinessProbe"], s.readiness), (pod["livenessProbe"], s.liveness)):
        if s.probe_exec:  # the health endpoint needs a key: the probe runs in the container and sends it
            assert probe["exec"]["command"] == list(s.probe_exec) and path.format(name="mlp") in s.probe_exec[-1]
        else:
            assert probe["httpGet"]["path"] == path.format(name="mlp")
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


def test_gpu_deployments_get_no_cpu_autoscaler(mlp_out, tmp_path):
    """CPU utilisation says nothing about a GPU server: no CPU HPA, a fixed scale, and the README says how to scale it."""
    b = package(load_artifacts(mlp_out), tmp_path, PackageOptions(server="triton", device="gpu", replicas=3))
    docs = {p.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "k8s").iterdir()}
    assert set(docs) == {"deployment.yaml", "service.yaml"} and b.details["manifests"] == ["k8s/deployment.yaml", "k8s/service.yaml"]
    assert docs["deployment.yaml"]["spec"]["replicas"] == 3
    for doc in docs.values():
        validate(doc)
    readme = (tmp_path / "README.md").read_text()
    assert "not scaled on CPU" in readme and "DCGM" in readme
    with pytest.raises(BadInputError, match="GPU deployment is not autoscaled on CPU"):
        manifests(PackageOptions(server="triton", device="gpu", max_replicas=4), "mlp", "img", True)


def test_fixed_replicas_mean_no_autoscaler(mlp_out, tmp_path):
    package(load_artifacts(mlp_out), tmp_path, PackageOptions(server="triton", replicas=2))
    docs = {p.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "k8s").iterdir()}
    assert set(docs) == {"deployment.yaml", "service.yaml"} and docs["deployment.yaml"]["spec"]["replicas"] == 2
    with pytest.raises(BadInputError, match="pick one"):
        PackageOptions(replicas=2, max_replicas=6)


@pytest.mark.parametrize("flag, value", [("--cpu", "lots"), ("--memory", "2GB"), ("--cpu", "0"), ("--cpu", "-1"),
                                         ("--memory", "500m"), ("--memory", "2 Gi"), ("--cpu", "1.2.3"), ("--memory", "")])
def test_bad_quantities_exit_2_naming_the_flag(cli, mlp_out, tmp_path, flag, value):
    r = cli("package", mlp_out, "--for", "k8s", flag, value, "-o", tmp_path / "b")
    assert r.exit_code == 2, r
    assert f"bad {flag} '{value}'" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text, value", [("500m", "0.5"), ("2", "2"), ("1.5", "1.5"), (".5", "0.5"), ("4Gi", str(4 << 30)),
                                         ("512Mi", str(512 << 20)), ("1e3", "1E+3"), ("2k", "2E+3"), ("1.", "1")])
def test_quantity_grammar(text, value):
    from decimal import Decimal

    from modelport.packaging.quantities import check_quantity, parse_quantity

    assert parse_quantity(text) == Decimal(value)
    assert check_quantity(text, "--cpu") == text


def test_the_schema_check_catches_a_broken_manifest(mlp_out):
    docs = manifests(PackageOptions(), "mlp", "img", False)
    bad = docs["deployment.yaml"]
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad)


def test_k8s_names():
    assert k8s_name("My_Model.v2") == "my-model-v2"
    assert k8s_name("9lives") == "m-9lives"


def test_torchserve_container_exposes_the_inference_port_only(mlp_out, tmp_path):
    """No --disable-token-auth, EXPOSE and the Service carry 8080 only, probes send the inference key."""
    import json

    package(load_artifacts(mlp_out), tmp_path, PackageOptions(server="torchserve"))
    docker = (tmp_path / "Dockerfile").read_text().splitlines()
    entry = json.loads(next(line for line in docker if line.startswith("ENTRYPOINT"))[len("ENTRYPOINT"):])
    assert "--disable-token-auth" not in entry and entry[0] == "torchserve"
    assert [line for line in docker if line.startswith("EXPOSE")] == ["EXPOSE 8080"]
    assert "WORKDIR /home/model-server" in docker
    docs = {p.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "k8s").iterdir()}
    for doc in docs.values():
        validate(doc)
    assert [p["port"] for p in docs["service.yaml"]["spec"]["ports"]] == [8080]
    # each pod makes its own keys: one replica, no autoscaler, unless a range is asked for
    assert "hpa.yaml" not in docs and docs["deployment.yaml"]["spec"]["replicas"] == 1
    pod = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert [p["containerPort"] for p in pod["ports"]] == [8080]
    for probe in (pod["readinessProbe"], pod["livenessProbe"]):
        command = probe["exec"]["command"]
        assert "/home/model-server/key_file.json" in command[-1] and "Bearer" in command[-1] and "/ping" in command[-1]
    from tests.serving.test_torchserve import properties

    props = properties(tmp_path / "torchserve" / "config.properties")
    assert props["management_address"].startswith("http://127.0.0.1:") and props["disable_token_authorization"] == "false"
    assert "key_file.json" in (tmp_path / "README.md").read_text()


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_an_autoscaler_on_the_server_s_queue(mlp_out, tmp_path, device):
    """--scale-on pending-requests: an autoscaling/v2 HPA on Triton's nv_inference_pending_request_count
    per pod (a GPU deployment too: a queue says when a GPU is saturated), the pods annotated for
    Prometheus to scrape the metrics port, and the prometheus-adapter rule that serves the metric;
    every manifest valid against the Kubernetes schemas."""
    b = package(load_artifacts(mlp_out), tmp_path, PackageOptions(server="triton", device=device, scale_on="pending-requests",
                                                                  target_pending=6, max_replicas=8))
    docs = {p.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "k8s").iterdir()}
    assert set(docs) == {"deployment.yaml", "service.yaml", "hpa.yaml", "prometheus-adapter-rules.yaml"}
    for doc in docs.values():
        validate(doc)
    (metric,) = docs["hpa.yaml"]["spec"]["metrics"]
    assert metric == {"type": "Pods", "pods": {"metric": {"name": "nv_inference_pending_request_count"},
                                               "target": {"type": "AverageValue", "averageValue": "6"}}}
    assert docs["hpa.yaml"]["spec"]["maxReplicas"] == 8 and "replicas" not in docs["deployment.yaml"]["spec"]
    annotations = docs["deployment.yaml"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(SERVERS["triton"].ports["metrics"])
    rule = yaml.safe_load(docs["prometheus-adapter-rules.yaml"]["data"]["config.yaml"])["rules"][0]
    assert rule["name"]["as"] == "nv_inference_pending_request_count" and "pod" in rule["resources"]["overrides"]
    assert "nv_inference_pending_request_count" in (tmp_path / "README.md").read_text()
    assert b.details["gpu"] is (device == "gpu")


def test_scaling_on_the_queue_needs_a_server_that_exports_it():
    with pytest.raises(BadInputError, match="the torchserve server exports no pending-requests metric"):
        manifests(PackageOptions(server="torchserve", scale_on="pending-requests"), "mlp", "img", False)
    with pytest.raises(BadInputError, match="unknown --scale-on metric 'memory'; known: cpu, pending-requests"):
        PackageOptions(scale_on="memory")
