"""`modelport serve`: a real server process on 127.0.0.1, spoken to by Triton's own clients
(tritonclient http and grpc, KServe v2): health, metadata, infer, metrics, the access log,
dynamic batching, bad requests answered 4xx while it keeps serving, and a start-up check that
refuses to go ready when the artifact does not give the reference outputs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from modelport.orchestration import ConvertOptions, convert

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 5)).eval()
    out = tmp_path_factory.mktemp("serve") / "cnn"
    convert(model, out, ConvertOptions(targets=["onnx"], inputs=["pixels:batch,3,16,16"], output_names=["logits"]))
    return out


class Server:
    def __init__(self, path: Path, *extra: str, log: Path, env: dict | None = None):
        self.http, self.grpc = _free_port(), _free_port()
        self.log = log
        cmd = [sys.executable, "-m", "modelport", "serve", str(path), "--http-port", str(self.http), "--grpc-port", str(self.grpc), *extra]
        self.proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    def wait_ready(self, timeout: float = 60) -> None:
        import tritonclient.http as http

        client = http.InferenceServerClient(f"127.0.0.1:{self.http}")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if client.is_server_ready():
                    return
            except Exception:
                pass
            time.sleep(0.25)
        raise AssertionError("the server was not ready in time: " + self.log.read_text()[-3000:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    s = Server(folder, "--max-batch-size", "8", "--max-queue-delay-ms", "5", "--max-request-bytes", "200000", "--access-log",
               log=tmp_path_factory.mktemp("serve_log") / "server.log")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def _reference(folder: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"pixels": x})[0]


def _post(port: int, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_triton_clients_get_metadata_and_answers_over_http_and_grpc(server, folder):
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    x = np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32)
    want = _reference(folder, x)
    client = http.InferenceServerClient(f"127.0.0.1:{server.http}")
    meta = client.get_model_metadata("cnn")
    assert meta["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 5]}]
    for binary in (True, False):
        i = http.InferInput("pixels", list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=binary)
        got = client.infer("cnn", [i], headers=None if binary else {"Content-Type": "application/json"}).as_numpy("logits")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    g = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    assert g.is_server_ready() and g.is_model_ready("cnn")
    gi = grpc.InferInput("pixels", list(x.shape), "FP32")
    gi.set_data_from_numpy(x)
    np.testing.assert_allclose(g.infer("cnn", [gi]).as_numpy("logits"), want, rtol=1e-5, atol=1e-5)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'nv_inference_request_success{model="cnn",version="1"}' in metrics
    assert 'modelport_inference_request_duration_seconds_bucket{model="cnn",version="1",le="+Inf"}' in metrics
    assert '"POST /v2/models/cnn/infer HTTP/1.1" 200' in server.log.read_text()  # the access log
    assert "answers checked against the reference sample" in server.log.read_text()


def test_it_listens_on_loopback_only(server):
    import psutil

    addresses = {c.laddr.ip for c in psutil.Process(server.proc.pid).net_connections(kind="inet") if c.status == "LISTEN"}
    assert addresses and addresses <= {"127.0.0.1", "::ffff:127.0.0.1"}, addresses


def test_concurrent_callers_each_get_their_rows_with_dynamic_batching(server, folder):
    import tritonclient.http as http

    xs = [np.random.default_rng(n).standard_normal((1 + n % 3, 3, 16, 16)).astype(np.float32) for n in range(24)]

    def call(x):
        client = http.InferenceServerClient(f"127.0.0.1:{server.http}")
        i = http.InferInput("pixels", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        return client.infer("cnn", [i]).as_numpy("logits")

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(call, xs))
    for x, y in zip(xs, got, strict=True):
        np.testing.assert_allclose(y, _reference(folder, x), rtol=1e-5, atol=1e-5)


def test_bad_requests_are_4xx_with_the_reason_and_it_keeps_serving(server):
    ok = json.dumps({"inputs": [{"name": "pixels", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": [0.5] * 768}]}).encode()
    cases = [
        (b"{not json", 422, "JSON decode error"),
        (b'{"outputs": []}', 422, "it needs an 'inputs' list"),
        (json.dumps({"inputs": [{"name": "pixels", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": [0.5] * 700}]}).encode(),
         400, "700 values for shape [1, 3, 16, 16]"),
        (json.dumps({"inputs": [{"name": "pixels", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": ["a"] * 768}]}).encode(),
         400, "its data is not FP32"),
        (json.dumps({"inputs": [{"name": "pixels", "shape": [1, 3, 16, 16], "datatype": "INT64", "data": [1] * 768}]}).encode(),
         400, "input 'pixels' is INT64; the model takes FP32"),
        (json.dumps({"inputs": [{"name": "pixels", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.5] * 192}]}).encode(),
         400, "input 'pixels' has the shape [1, 3, 8, 8]; the model takes [-1, 3, 16, 16]"),
        (json.dumps({"inputs": [{"name": "image", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": [0.5] * 768}]}).encode(),
         400, "the model takes ['pixels']"),
        (b"0" * 300_000, 413, "over the server's limit of 200000 bytes"),
    ]
    for body, code, reason in cases:
        status, text = _post(server.http, "/v2/models/cnn/infer", body)
        assert status == code and reason in text, (status, text)
    status, text = _post(server.http, "/v2/models/nope/infer", ok)
    assert status == 404, (status, text)
    status, text = _post(server.http, "/v2/models/cnn/infer", ok)
    assert status == 200 and json.loads(text)["outputs"][0]["shape"] == [1, 5]


def test_a_wrong_reference_answer_refuses_to_start(folder, tmp_path):
    """The artifact is checked against the reference sample before ready: outputs that differ are
    exit 4 naming the output; a reference.npz changed after the run is exit 2."""
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    with np.load(bad / "reference.npz") as z:
        arrays = {k: z[k] + (1.0 if k.startswith("out/") else 0.0) for k in z.files}
    np.savez(bad / "reference.npz", **arrays)
    s = Server(bad, log=tmp_path / "changed.log")
    assert s.proc.wait(120) == 2
    assert "does not match the sha256 its report.json records" in s.log.read_text()
    import hashlib

    report = json.loads((bad / "report.json").read_text())
    report["reference"]["sha256"] = hashlib.sha256((bad / "reference.npz").read_bytes()).hexdigest()
    (bad / "report.json").write_text(json.dumps(report))
    s = Server(bad, log=tmp_path / "wrong.log")
    assert s.proc.wait(120) == 4
    text = s.log.read_text()
    assert "does not give the reference outputs, so the server does not start" in text and "logits" in text


def test_bench_load_tests_the_served_model(server, cli):
    """`modelport bench URL` against `serve`: the model's metadata says what to send; every request answered."""
    r = cli("bench", f"http://127.0.0.1:{server.http}/v2/models/cnn/infer", "--requests", "30", "--concurrency", "4", "--json")
    assert r.exit_code == 0, r
    doc = r.json()
    assert doc["protocol"] == "kserve" and doc["ok"] == 30 and doc["errors"] == 0 and doc["latency_ms"]["p50"] > 0


def test_without_the_serve_extra_it_is_exit_5_naming_the_install(folder, cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # an import of it fails, as where it is not installed
    r = cli("serve", folder, "--http-port", str(_free_port()), "--grpc-port", str(_free_port()))
    assert r.exit_code == 5, r
    assert "modelport[serve]" in r.stderr


def test_a_report_naming_a_path_outside_the_folder_is_refused(folder, tmp_path, cli_proc):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    report = json.loads((bad / "report.json").read_text())
    report["artifacts"][0]["path"] = "../cnn/model.onnx"
    (bad / "report.json").write_text(json.dumps(report))
    r = cli_proc("serve", bad, "--http-port", str(_free_port()), "--grpc-port", str(_free_port()))
    assert r.exit_code == 3 and "outside the folder" in r.stderr, r


def test_an_unreadable_report_is_exit_2_naming_it(folder, tmp_path, cli_proc):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / "report.json").write_text("{not json")
    r = cli_proc("serve", bad, "--http-port", str(_free_port()), "--grpc-port", str(_free_port()))
    assert r.exit_code == 2 and "report.json cannot be read" in r.stderr, r
