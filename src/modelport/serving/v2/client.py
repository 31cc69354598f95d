"""The client side of the v2 protocol, for `bench URL`: one request, prepared once, sent in the
wire format asked for, and the server's statistics read around a load test.

- `json`: the request as v2 JSON (`data` row-major).
- `binary`: the HTTP binary-data extension: a JSON header, `Inference-Header-Content-Length`, then
  each tensor's raw bytes; outputs asked back as binary.
- `grpc`: `inference.GRPCInferenceService/ModelInfer` with `raw_input_contents`, on its own channel.

`pick(metadata, asked)`: the protocol to use: the one asked for, else the fastest the server's
`/v2` metadata says it speaks (gRPC where it names its gRPC port, then binary where it lists the
`binary_tensor_data` extension, else JSON).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np

from modelport.errors import BadInputError
from modelport.packaging.requests import v2_datatype

PROTOCOLS = ("json", "binary", "grpc")


def pick(metadata: dict, asked: str | None) -> str:
    if asked:
        if asked not in PROTOCOLS:
            raise BadInputError(f"unknown --protocol '{asked}'; known: {', '.join(PROTOCOLS)}")
        return asked
    if metadata.get("grpc_port"):
        return "grpc"
    if "binary_tensor_data" in (metadata.get("extensions") or []):
        return "binary"
    return "json"


def json_body(feeds: dict[str, np.ndarray]) -> bytes:
    return json.dumps({"inputs": [{"name": k, "shape": list(v.shape), "datatype": v2_datatype(str(v.dtype)),
                                   "data": v.ravel().tolist()} for k, v in feeds.items()]}).encode()


def binary_body(feeds: dict[str, np.ndarray]) -> tuple[bytes, int]:
    arrays = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
    head = json.dumps({"inputs": [{"name": k, "shape": list(v.shape), "datatype": v2_datatype(str(v.dtype)),
                                   "parameters": {"binary_data_size": v.nbytes}} for k, v in arrays.items()],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(v.tobytes() for v in arrays.values()), len(head)


class HttpSender:
    """POSTs one prepared body; `send()` returns None or raises (urllib's errors)."""

    def __init__(self, url: str, protocol: str, feeds: dict[str, np.ndarray], headers: dict, timeout: float):
        self.url, self.timeout = url, timeout
        if protocol == "binary":
            self.body, length = binary_body(feeds)
            self.headers = {**headers, "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(length)}
        else:
            self.body, self.headers = json_body(feeds), {"Content-Type": "application/json", **headers}

    def send(self) -> None:
        req = urllib.request.Request(self.url, data=self.body, headers=self.headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            r.read()


class GrpcSender:
    """ModelInfer on its own channel (not shared with other senders: each its own connection)."""

    def __init__(self, address: str, model: str, feeds: dict[str, np.ndarray], timeout: float):
        import grpc
        from tritonclient.grpc import service_pb2 as pb
        from tritonclient.grpc import service_pb2_grpc as pb_grpc

        self.channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1),
                                                               ("grpc.max_receive_message_length", -1)])
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        arrays = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
        self.request = pb.ModelInferRequest(
            model_name=model,
            inputs=[pb.ModelInferRequest.InferInputTensor(name=k, datatype=v2_datatype(str(v.dtype)), shape=v.shape)
                    for k, v in arrays.items()],
            raw_input_contents=[v.tobytes() for v in arrays.values()])
        self.timeout = timeout

    def send(self) -> None:
        self.stub.ModelInfer(self.request, timeout=self.timeout)

    def close(self) -> None:
        self.channel.close()


def get_json(url: str, headers: dict, timeout: float) -> dict | None:
    """A GET answered with a JSON object, or None (not offered, not reachable)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            doc = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def read_stats(base: str, model: str, headers: dict, timeout: float) -> dict | None:
    """The model's `inference_stats` ({phase: (count, ns)}) from the statistics extension, or None."""
    doc = get_json(f"{base}/v2/models/{model}/stats", headers, timeout)
    try:
        s = doc["model_stats"][0]["inference_stats"]
        return {k: (int(v.get("count", 0)), int(v.get("ns", 0))) for k, v in s.items()}
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def server_split(before: dict | None, after: dict | None, mean_ms: float | None) -> dict | None:
    """What the server's statistics say about the requests between `before` and `after`: their
    count, and the mean time (ms) in the server, in its queue, decoding, computing and encoding;
    with the client's mean latency, the rest is the client and the network."""
    if not before or not after:
        return None
    n = after["success"][0] - before["success"][0]
    if n <= 0:
        return {"requests": n, "failures": after["fail"][0] - before["fail"][0]}

    def mean(phase: str) -> float:
        return round((after[phase][1] - before[phase][1]) / n / 1e6, 4)

    split = {"requests": n, "failures": after["fail"][0] - before["fail"][0], "server_ms": mean("success"),
             "queue_ms": mean("queue"), "compute_input_ms": mean("compute_input"), "compute_infer_ms": mean("compute_infer"),
             "compute_output_ms": mean("compute_output")}
    split["outside_compute_ms"] = round(split["server_ms"] - split["compute_infer_ms"], 4)
    if mean_ms is not None:
        split["client_and_network_ms"] = round(mean_ms - split["server_ms"], 4)
    return split
