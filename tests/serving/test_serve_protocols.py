"""`modelport serve` over every protocol a client uses: JSON, the HTTP binary-data extension and
gRPC raw contents give identical answers; the statistics extension (HTTP and gRPC) and the
Prometheus page count exactly the requests sent; versioned routes answer for the served version;
bad gRPC requests are INVALID_ARGUMENT / NOT_FOUND with the reason. A real server on 127.0.0.1,
spoken to by Triton's own clients."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from tests.serving.test_serve import Server, _post

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch

    from modelport.orchestration import ConvertOptions, convert

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 6)).eval()
    out = tmp_path_factory.mktemp("protocols") / "net"
    convert(model, out, ConvertOptions(targets=["onnx"], inputs=["pixels:batch,3,8,8"], output_names=["scores"]))
    return out


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    s = Server(folder, log=tmp_path_factory.mktemp("protocols_log") / "server.log")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def _stats_http(port: int, path: str = "/v2/models/net/stats") -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())["model_stats"][0]


def test_json_binary_and_grpc_give_identical_answers_and_the_stats_count_each(server):
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    before = _stats_http(server.http)
    h = http.InferenceServerClient(f"127.0.0.1:{server.http}")
    g = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    answers = []
    for _ in range(3):
        i = http.InferInput("pixels", list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=False)
        answers.append(h.infer("net", [i], outputs=[http.InferRequestedOutput("scores", binary_data=False)]).as_numpy("scores"))
        i = http.InferInput("pixels", list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        answers.append(h.infer("net", [i]).as_numpy("scores"))
        gi = grpc.InferInput("pixels", list(x.shape), "FP32")
        gi.set_data_from_numpy(x)
        result = g.infer("net", [gi], model_version="1")
        assert result.get_response().model_version == "1"
        answers.append(result.as_numpy("scores"))
    for a in answers[1:]:
        assert a.dtype == np.float32 and a.shape == (2, 6)
        assert np.array_equal(a, answers[0])  # bit for bit: JSON floats round-trip float32 exactly
    after = _stats_http(server.http)
    sent = 9
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == sent
    assert after["inference_count"] - before["inference_count"] == 2 * sent  # rows
    assert after["execution_count"] - before["execution_count"] == sent
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert after["inference_stats"][phase]["count"] - before["inference_stats"][phase]["count"] == sent, phase
        assert after["inference_stats"][phase]["ns"] > before["inference_stats"][phase]["ns"], phase
    over = after["inference_stats"]["success"]["ns"] - after["inference_stats"]["compute_infer"]["ns"]
    assert over > 0  # the time outside the runtime, as `bench/serve_bench.py` reports it
    rpc = g.get_inference_statistics("net", as_json=True)["model_stats"][0]
    assert int(rpc["inference_stats"]["success"]["count"]) == after["inference_stats"]["success"]["count"]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    line = next(ln for ln in metrics.splitlines() if ln.startswith('nv_inference_request_success{model="net",version="1"}'))
    assert int(line.split()[-1]) == after["inference_stats"]["success"]["count"]
    count = next(ln for ln in metrics.splitlines()
                 if ln.startswith('modelport_inference_request_duration_seconds_count{model="net",version="1"}'))
    assert int(count.split()[-1]) == after["inference_stats"]["success"]["count"]


def test_failures_are_counted_and_versioned_routes_answer_for_the_served_version(server):
    before = _stats_http(server.http)["inference_stats"]["fail"]["count"]
    bad = json.dumps({"inputs": [{"name": "pixels", "shape": [1, 3, 4, 4], "datatype": "FP32", "data": [0.0] * 48}]}).encode()
    assert _post(server.http, "/v2/models/net/infer", bad)[0] == 400
    assert _stats_http(server.http)["inference_stats"]["fail"]["count"] == before + 1
    ok = json.dumps({"inputs": [{"name": "pixels", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.25] * 192}], "id": "r7"}).encode()
    status, text = _post(server.http, "/v2/models/net/versions/1/infer", ok)
    doc = json.loads(text)
    assert status == 200 and doc["model_version"] == "1" and doc["id"] == "r7" and doc["outputs"][0]["shape"] == [1, 6]
    status, text = _post(server.http, "/v2/models/net/versions/2/infer", ok)
    assert status == 404 and "has no version '2'" in text
    assert _stats_http(server.http, "/v2/models/net/versions/1/stats")["name"] == "net"
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http}/v2", timeout=10) as r:
        meta = json.loads(r.read())
    assert meta["name"] == "modelport" and {"statistics", "binary_tensor_data"} <= set(meta["extensions"])


def test_grpc_bad_requests_name_the_reason(server):
    import tritonclient.grpc as grpc
    from tritonclient.utils import InferenceServerException

    g = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    cases = [
        ("net", np.zeros((1, 3, 8, 8), np.int64), "INT64", "StatusCode.INVALID_ARGUMENT", "input 'pixels' is INT64; the model takes FP32"),
        ("net", np.zeros((1, 3, 4, 4), np.float32), "FP32", "StatusCode.INVALID_ARGUMENT", "has the shape [1, 3, 4, 4]"),
        ("nope", np.zeros((1, 3, 8, 8), np.float32), "FP32", "StatusCode.NOT_FOUND", "model 'nope' is not served here"),
    ]
    for name, x, datatype, status, reason in cases:
        gi = grpc.InferInput("pixels", list(x.shape), datatype)
        gi.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as e:
            g.infer(name, [gi])
        assert e.value.status() == status and reason in e.value.message(), (e.value.status(), e.value.message())
    assert not g.is_model_ready("net", "2") and g.is_model_ready("net", "1")
    gi = grpc.InferInput("pixels", [1, 3, 8, 8], "FP32")
    gi.set_data_from_numpy(np.ones((1, 3, 8, 8), np.float32))
    assert g.infer("net", [gi]).as_numpy("scores").shape == (1, 6)  # still serving


@pytest.mark.parametrize("protocol", ["json", "binary", "grpc", None])
def test_bench_in_each_protocol_counts_what_the_server_counts(server, cli, protocol):
    """`bench URL --protocol P` against the server: every request answered, as many as the server's
    statistics count, and the mean latency split into the server's part and the rest. Without
    --protocol: gRPC, the port the server's metadata names."""
    before = _stats_http(server.http)["inference_stats"]["success"]["count"]
    r = cli("bench", f"http://127.0.0.1:{server.http}/v2/models/net/infer", "--requests", "24", "--concurrency", "3",
            *(["--protocol", protocol] if protocol else []), "--json")
    assert r.exit_code == 0, r
    doc = r.json()
    assert doc["wire"] == (protocol or "grpc") and doc["ok"] == 24 and doc["errors"] == 0
    assert _stats_http(server.http)["inference_stats"]["success"]["count"] - before == 24
    split = doc["server"]
    assert split["requests"] == 24 and split["failures"] == 0
    assert 0 < split["compute_infer_ms"] < split["server_ms"] < doc["latency_ms"]["mean"]
    assert split["client_and_network_ms"] > 0


def test_bench_refuses_an_unknown_protocol_before_sending(server, cli):
    before = _stats_http(server.http)["inference_stats"]
    r = cli("bench", f"http://127.0.0.1:{server.http}/v2/models/net/infer", "--protocol", "carrier-pigeon")
    assert r.exit_code == 2 and "unknown --protocol 'carrier-pigeon'; known: json, binary, grpc" in r.stderr
    assert _stats_http(server.http)["inference_stats"] == before
