"""The v2 request path's parts, in-process: the codec (JSON, binary extension, BYTES), the shared
statistics (summed over worker rows, Prometheus text), and dynamic batching returning each caller
its own rows under concurrent load."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import orjson
import pytest

from modelport.ir import TensorSpec
from modelport.serving.v2.codec import RequestError, decode_json, encode_json
from modelport.serving.v2.model import local_model
from modelport.serving.v2.stats import Layout, Stats


def _binary_request(arrays: dict[str, np.ndarray], datatype: dict[str, str]) -> tuple[bytes, int]:
    head = orjson.dumps({"inputs": [{"name": k, "shape": list(v.shape), "datatype": datatype[k],
                                     "parameters": {"binary_data_size": v.nbytes}} for k, v in arrays.items()]})
    return head + b"".join(v.tobytes() for v in arrays.values()), len(head)


def test_json_and_binary_requests_decode_to_the_same_arrays():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    as_json = orjson.dumps({"id": "a", "inputs": [
        {"name": "x", "shape": [2, 3, 4], "datatype": "FP32", "data": x.ravel().tolist()},
        {"name": "ids", "shape": [2, 3], "datatype": "INT64", "data": ids.tolist()}]})  # nested data is row-major too
    got = decode_json(as_json)
    body, length = _binary_request({"x": x, "ids": ids}, {"x": "FP32", "ids": "INT64"})
    raw = decode_json(body, length)
    for d in (got, raw):
        assert np.array_equal(d.feeds["x"], x) and d.feeds["x"].dtype == np.float32
        assert np.array_equal(d.feeds["ids"], ids) and d.feeds["ids"].dtype == np.int64
    assert got.id == "a"
    assert not raw.feeds["x"].flags.owndata  # a view on the body, not a copy


@pytest.mark.parametrize("body,length,status,reason", [
    (b"[1, 2", None, 422, "JSON decode error"),
    (b'{"inputs": 3}', None, 422, "needs an 'inputs' list"),
    (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP99", "data": [1, 2]}]}', None, 400, "unknown datatype 'FP99'"),
    (b'{"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}', None, 400, "non-negative integers"),
    (b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}', None, 400, "2 values for shape [3]"),
    (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "INT32", "data": ["a", "b"]}]}', None, 400, "its data is not INT32"),
    (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32"}]}', None, 400, "has no data"),
    (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}', None, 400,
     "Inference-Header-Content-Length header is missing"),
    (b'{"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}', bytes(8), 400,
     "beyond the body"),
    (b'{"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}', bytes(8), 400,
     "8 bytes of data for shape [4] of FP32 (16 expected)"),
])
def test_bad_requests_are_refused_with_status_and_reason(body, length, status, reason):
    if isinstance(length, bytes):  # a JSON header, then this binary tail
        body, length = body + length, len(body)
    with pytest.raises(RequestError) as e:
        decode_json(body, length)
    assert e.value.status == status and reason in e.value.reason, (e.value.status, e.value.reason)


def test_responses_in_json_and_binary_and_bytes_tensors():
    y = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    words = np.array([b"ab", b"", "\u00e9".encode()], dtype=object)
    body, length = encode_json("m", "1", "r", [("y", "FP32", y), ("w", "BYTES", words)], set(), {"worker": "7"})
    assert length is None
    doc = json.loads(body)
    assert doc["model_version"] == "1" and doc["id"] == "r" and doc["parameters"] == {"worker": "7"}
    assert np.array_equal(np.asarray(doc["outputs"][0]["data"], np.float32).reshape(2, 3), y)
    assert doc["outputs"][1]["data"] == ["ab", "", "\u00e9"]
    body, length = encode_json("m", "1", "", [("y", "FP32", y), ("w", "BYTES", words)], {"y", "w"})
    head = json.loads(body[:length])
    size = head["outputs"][0]["parameters"]["binary_data_size"]
    assert np.array_equal(np.frombuffer(body[length:length + size], np.float32).reshape(2, 3), y)
    tail = body[length + size:]
    assert tail == b"".join(len(w).to_bytes(4, "little") + w for w in words)  # BYTES: length-prefixed
    bytes_request = (orjson.dumps({"inputs": [{"name": "w", "shape": [3], "datatype": "BYTES",
                                               "parameters": {"binary_data_size": len(tail)}}]}))
    got = decode_json(bytes_request + tail, len(bytes_request)).feeds["w"]
    assert list(got) == list(words)


def test_statistics_sum_every_worker_row_and_write_prometheus(tmp_path):
    layout = Layout(path=str(tmp_path / "stats.bin"), workers=2, slots=4)
    layout.create()
    a, b = Stats(layout, 0), Stats(layout, 1)
    for s, n in ((a, 3), (b, 2)):
        slot = s.slot("m", "1")
        for _ in range(n):
            s.phase(slot, "compute_input", 1_000)
            s.phase(slot, "queue", 2_000)
            s.phase(slot, "compute_infer", 300_000)
            s.execution(slot, 4)
            s.request(slot, True, 400_000)
        s.request(slot, False, 50)
    stats = Stats(layout, 0).model_stats("m", "1")  # a fresh reader: the shared file
    assert stats["inference_stats"]["success"] == {"count": 5, "ns": 2_000_000}
    assert stats["inference_stats"]["fail"] == {"count": 2, "ns": 100}
    assert stats["inference_count"] == 20 and stats["execution_count"] == 5
    text = a.prometheus()
    assert 'nv_inference_request_success{model="m",version="1"} 5' in text
    assert 'nv_inference_compute_infer_duration_us{model="m",version="1"} 1500' in text
    assert 'modelport_inference_compute_infer_duration_seconds_bucket{model="m",version="1",le="0.25"} 0' not in text
    assert 'modelport_inference_request_duration_seconds_bucket{model="m",version="1",le="0.00025"} 0' in text
    assert 'modelport_inference_request_duration_seconds_bucket{model="m",version="1",le="0.0005"} 5' in text
    assert 'modelport_inference_request_duration_seconds_count{model="m",version="1"} 5' in text


class _Doubler:
    def __init__(self):
        self.calls = []

    def run(self, feeds):
        self.calls.append(feeds["x"].shape[0])
        return {"y": feeds["x"] * 2, "n": np.full((feeds["x"].shape[0], 1), feeds["x"].shape[0], np.int64)}


def test_batching_returns_each_caller_its_own_rows_under_concurrent_load():
    runner = _Doubler()
    stats = Stats()
    model = local_model("m", runner, [TensorSpec("x", "float32", ["b", 3])],
                        [TensorSpec("y", "float32", ["b", 3]), TensorSpec("n", "int64", ["b", 1])], stats, platform="test",
                        max_batch_size=8, max_queue_delay_ms=20)

    async def main():
        xs = [np.full((1 + i % 3, 3), i, np.float32) for i in range(40)]
        return xs, await asyncio.gather(*[model.infer({"x": x}, 0) for x in xs])

    xs, answers = asyncio.run(main())
    for x, (outputs, _) in zip(xs, answers, strict=True):
        y = dict((name, a) for name, _, a in outputs)["y"]
        assert np.array_equal(y, x * 2)
    assert max(runner.calls) > 3 and sum(runner.calls) == sum(x.shape[0] for x in xs)  # rows were run together
    s = stats.model_stats("m", "1")
    assert s["execution_count"] == len(runner.calls) < 40 and s["inference_count"] == sum(runner.calls)
