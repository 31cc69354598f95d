"""`package --for ray-serve`: a Serve config whose application is KServe's v2 REST endpoints on Ray
Serve's proxy with the artifact in Replica deployments, a KubeRay RayService with the same config,
and a Dockerfile; run by Ray's own `serve run` on a local Ray cluster and answered over HTTP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.cli.test_batch import ray_cluster  # noqa: F401  (a Ray head on 127.0.0.1, outside the network guard)


@pytest.fixture(scope="module")
def bundle(mlp_out, tmp_path_factory) -> Path:
    from modelport.orchestration.package import package
    from modelport.packaging import PackageOptions
    out = tmp_path_factory.mktemp("rayserve") / "bundle"
    package(mlp_out, out, ["ray-serve"], PackageOptions(replicas=2))
    return out


def test_the_bundle_holds_the_config_the_service_and_the_model(bundle, mlp_out):
    assert {"model/model.onnx", "serve_config.yaml", "rayservice.yaml", "Dockerfile", "README.md"} <= {
        str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()}
    assert (bundle / "model" / "model.onnx").read_bytes() == (mlp_out / "model.onnx").read_bytes()
    config = yaml.safe_load((bundle / "serve_config.yaml").read_text())
    assert config["http_options"]["host"] == "127.0.0.1"
    (app,) = config["applications"]
    assert app["import_path"] == "modelport.serving.ray_app:build"
    assert app["args"]["model"] == "model/model.onnx" and app["args"]["runtime"] == "onnxruntime"
    assert {d["name"]: d for d in app["deployments"]}["Replica"]["num_replicas"] == 2
    contract = json.loads((mlp_out / "report.json").read_text())["contract"]
    for kind in ("inputs", "outputs"):  # the contract's names, dtypes and shapes
        assert [(s["name"], s["dtype"], s["shape"]) for s in app["args"]["contract"][kind]] == [
            (s["name"], s["dtype"], s["shape"]) for s in contract[kind]]
    service = yaml.safe_load((bundle / "rayservice.yaml").read_text())
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    served = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert served["applications"][0]["args"]["model"] == f"/models/{app['name']}/model.onnx"
    assert f"COPY model/ /models/{app['name']}/" in (bundle / "Dockerfile").read_text()


def test_autoscaling_bounds_go_into_the_config(mlp_out, tmp_path):
    from modelport.orchestration.package import package
    from modelport.packaging import PackageOptions
    package(mlp_out, tmp_path / "b", ["ray-serve"], PackageOptions(min_replicas=1, max_replicas=3))
    (app,) = yaml.safe_load((tmp_path / "b" / "serve_config.yaml").read_text())["applications"]
    replica = {d["name"]: d for d in app["deployments"]}["Replica"]
    assert replica["autoscaling_config"]["min_replicas"] == 1 and replica["autoscaling_config"]["max_replicas"] == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_run_answers_v2_requests(bundle, mlp_out, ray_cluster, tmp_path):  # noqa: F811
    """Ray's `serve run serve_config.yaml --working-dir .` from the bundle, on an existing cluster."""
    import onnxruntime as ort

    address, env = ray_cluster
    config = yaml.safe_load((bundle / "serve_config.yaml").read_text())
    port = _free_port()
    config["http_options"]["port"] = port  # a free port instead of 8000 on a shared machine
    (bundle / "serve_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    name = config["applications"][0]["name"]
    serve = str(Path(sys.executable).with_name("serve"))
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([serve, "run", "serve_config.yaml", "--working-dir", ".", "--address", address], cwd=bundle,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, **env})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{base}/v2/models/{name}/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        spec = json.loads(urllib.request.urlopen(f"{base}/v2/models/{name}", timeout=10).read())["inputs"][0]
        x = np.random.default_rng(0).standard_normal([3 if d == -1 else d for d in spec["shape"]]).astype(np.float32)
        body = json.dumps({"inputs": [{"name": spec["name"], "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.ravel().tolist()}]}).encode()
        request = urllib.request.Request(f"{base}/v2/models/{name}/infer", data=body, headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(request, timeout=30).read())["outputs"][0]
        want = ort.InferenceSession(str(mlp_out / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {spec["name"]: x})[0]
        np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(out["shape"]), want, rtol=1e-5, atol=1e-5)
        bad = json.dumps({"inputs": [{"name": spec["name"], "shape": [1, 2], "datatype": "FP32", "data": [0.0, 0.0]}]}).encode()
        try:
            urllib.request.urlopen(urllib.request.Request(f"{base}/v2/models/{name}/infer", data=bad,
                                                          headers={"Content-Type": "application/json"}), timeout=30)
            raise AssertionError("a wrong shape was answered")
        except urllib.error.HTTPError as e:
            assert e.code == 400 and "has the shape [1, 2]" in e.read().decode()
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
