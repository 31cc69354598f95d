"""`modelport bench` through the CLI in real processes: artifacts measured interleaved, and a served
model load-tested over HTTP (a KServe v2 server on 127.0.0.1, and the real TorchServe)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tests.serving.conftest import write_mlp

LATENCY = {"p50", "p90", "p99", "mean", "min", "max"}
RESULT = {"artifact", "runtime", "batch", "runs", "latency_ms", "throughput", "speedup", "rss_delta", "serialized"}


@pytest.fixture(scope="module")
def mlp_artifacts(tmp_path_factory):
    """The ONNX MLP converted to onnx, ort, tflite and PyTorch code."""
    from modelport.orchestration import ConvertOptions, convert

    root = tmp_path_factory.mktemp("bench")
    convert(write_mlp(root / "src"), root / "out", ConvertOptions(targets=["onnx", "ort", "tflite", "pytorch"]))
    return root / "out"


def test_bench_two_artifacts_json_has_the_documented_fields(cli_proc, mlp_artifacts):
    r = cli_proc("bench", mlp_artifacts / "model.onnx", mlp_artifacts / "model.tflite", "--batch", "1,4", "--runs", "30",
                 "--warmup", "2", "--json")
    assert r.exit_code == 0, r
    doc = r.json()
    assert doc["schema"] == "modelport.bench/1" and doc["command"] == "bench"
    assert doc["settings"]["runs"] == 30 and doc["settings"]["batches"] == [1, 4]
    assert [(x["runtime"], x["batch"]) for x in doc["results"]] == [("onnxruntime", 1), ("tflite", 1), ("onnxruntime", 4), ("tflite", 4)]
    for x in doc["results"]:
        assert set(x) == RESULT and set(x["latency_ms"]) == LATENCY and x["runs"] == 30
        lat = x["latency_ms"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
        assert x["throughput"] > 0 and x["rss_delta"] is not None
    assert doc["results"][0]["speedup"] == 1.0 and doc["results"][2]["speedup"] == 1.0
    assert doc["peak_rss"] > 0 and doc["tool"]["onnxruntime"] and doc["tool"]["ai-edge-litert"]


def test_bench_table_on_stdout_pipes_and_pytorch_code_needs_trust(cli_proc, mlp_artifacts):
    r = cli_proc("bench", mlp_artifacts / "model.ort", mlp_artifacts / "pytorch", "--runs", "10", "--concurrency", "3", "--trust")
    assert r.exit_code == 0, r
    lines = r.stdout.splitlines()
    assert lines[0].split("\t")[:4] == ["artifact", "runtime", "batch", "p50 ms"]
    assert [line.split("\t")[1] for line in lines[1:]] == ["onnxruntime", "torch_source"]
    refused = cli_proc("bench", mlp_artifacts / "pytorch", "--runs", "3")
    assert refused.exit_code == 3 and "--trust" in refused.stderr


def test_bench_duration_data_and_bad_values(cli_proc, mlp_artifacts, tmp_path):
    data = tmp_path / "x.npz"
    np.savez(data, features=np.ones((3, 8), np.float32))
    r = cli_proc("bench", mlp_artifacts / "model.onnx", "--duration", "0.5", "--data", data, "--batch", "5", "--json")
    assert r.exit_code == 0, r
    row = r.json()["results"][0]
    assert row["batch"] == 5 and row["runs"] > 10
    bad = cli_proc("bench", mlp_artifacts / "model.onnx", "--runtime", "nosuch")
    assert bad.exit_code == 2 and "known: " in bad.stderr and "onnxruntime" in bad.stderr
    assert cli_proc("bench", mlp_artifacts / "report.json").exit_code == 2


class _KServe(BaseHTTPRequestHandler):
    """A KServe v2 server of y = 2x on 127.0.0.1: metadata and infer; every fifth request fails."""

    count = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v2/models/double":
            self._reply(200, {"name": "double", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                              "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]})
        else:
            self._reply(404, {"error": "no such model"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with _KServe.lock:
            _KServe.count += 1
            n = _KServe.count
        if n % 5 == 0:
            self._reply(503, {"error": "busy"})
            return
        (x,) = body["inputs"]
        assert x["name"] == "x" and x["datatype"] == "FP32" and x["shape"][1] == 4
        self._reply(200, {"outputs": [{"name": "y", "datatype": "FP32", "shape": x["shape"], "data": [2 * v for v in x["data"]]}]})


@pytest.fixture
def kserve_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KServe)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _KServe.count = 0
    yield f"http://127.0.0.1:{server.server_address[1]}/v2/models/double/infer"
    server.shutdown()
    server.server_close()


def test_bench_load_tests_a_kserve_v2_server(cli_proc, kserve_url):
    r = cli_proc("bench", kserve_url, "--requests", "40", "--concurrency", "4", "--batch", "3", "--json")
    assert r.exit_code == 0, r
    doc = r.json()
    assert doc["protocol"] == "kserve" and doc["inputs"] == {"x": [3, 4]}
    assert doc["requests"] == 40 and doc["ok"] == 32 and doc["errors"] == 8 and doc["error_kinds"] == {"HTTP 503": 8}
    assert set(doc["latency_ms"]) == LATENCY and doc["throughput"] > 0 and doc["status"] == "errors"
    # an offered rate bounds throughput: 20 requests at 40/s take at least 0.475 s
    r = cli_proc("bench", kserve_url, "--requests", "20", "--rate", "40", "--concurrency", "4", "--json")
    assert r.exit_code == 0 and r.json()["seconds"] >= 0.47, r
    table = cli_proc("bench", kserve_url, "--requests", "5")
    assert table.exit_code == 0 and table.stdout.splitlines()[1].startswith(kserve_url + "\tkserve/json\t5\t")


def test_bench_url_refuses_remote_hosts(cli_proc):
    r = cli_proc("bench", "http://example.com/v2/models/m/infer", "--requests", "1")
    assert r.exit_code == 2 and "--allow-remote" in r.stderr
    r = cli_proc("bench", "http://127.0.0.1:9/other/path")
    assert r.exit_code == 2 and "known: KServe v2" in r.stderr


def test_bench_load_tests_the_real_torchserve(cli_proc, tmp_path):
    """The real TorchServe the serving tests start, serving the MLP; token auth passes through --header."""
    from modelport.orchestration import ConvertOptions, convert
    from modelport.packaging import PackageOptions
    from modelport.packaging.bundle import load_artifacts
    from modelport.packaging.torchserve import package
    from tests.serving.test_torchserve import _first_reply, _torchserve

    out = tmp_path / "out"
    convert(write_mlp(tmp_path / "src"), out, ConvertOptions(targets=["onnx"]))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    package(load_artifacts(out), bundle, PackageOptions(model_name="mlp"))
    with _torchserve(bundle, "mlp", tmp_path) as (url, proc, log_path, key):
        _first_reply(url, {"inputs": {"features": [[0.0] * 8]}}, proc, log_path, key)
        r = cli_proc("bench", url, "--input", "features:batch,8", "--batch", "2", "--requests", "30", "--concurrency", "3",
                     "--duration", "60", "-H", f"Authorization: Bearer {key}", "--json")
        assert r.exit_code == 0, r
        doc = r.json()
        assert doc["protocol"] == "torchserve" and doc["ok"] == 30 and doc["errors"] == 0, doc
        assert doc["latency_ms"]["p50"] > 0 and doc["throughput"] > 0
        refused = cli_proc("bench", url, "--input", "features:batch,8", "--requests", "3", "--json").json()
        assert refused["errors"] == 3 and refused["first_error"].startswith("HTTP 4"), refused
