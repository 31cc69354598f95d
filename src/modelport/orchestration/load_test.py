"""`bench URL`: load-test a served model over HTTP, at a concurrency and optional request rate.

Two protocols, told apart by the URL's path: KServe v2 / Triton (`.../v2/models/NAME/infer`,
inputs as `{"inputs": [{name, shape, datatype, data}]}`; without `--input` specs the model's
metadata, `GET .../v2/models/NAME`, says what to send) and TorchServe REST (`.../predictions/NAME`,
the `{"inputs": {name: nested list}}` body modelport's handler reads; its inputs come from
`--input` or `--data`). Requests are bounded by a count or a duration, whichever comes first. With
`rate`, request k is not sent before `k / rate` seconds (an open schedule: a slow server makes
latency grow, not the offered load fall). Only loopback URLs are accepted unless `allow_remote`.

A KServe v2 server is spoken to in one of three wire formats (`serving/v2/client.py`): `json`,
`binary` (the HTTP binary-data extension) or `grpc` (ModelInfer with raw contents, at
`grpc_address` or the gRPC port the server's `/v2` metadata names); by default the fastest the
server's metadata says it speaks. Where the server offers the statistics extension, it is read
before and after, and `server` splits the mean latency into the server's time (queue, decoding,
compute, encoding) and the client's and the network's.

Result (`schema: modelport.bench/1`, `target: "http"`): `url`, `protocol`, `settings`
{requests, duration, concurrency, rate, batch}, `requests` (sent), `ok`, `errors`,
`error_kinds` {"HTTP 503": n, "URLError": n, ...}, `first_error`, `latency_ms` (successful
requests) {p50, p90, p99, mean, min, max}, `throughput` (successful requests per second of wall
time), `seconds`, `wire` (json, binary or grpc), `server` (from the statistics extension, or null).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from modelport.errors import BadInputError
from modelport.ir import TensorSpec
from modelport.orchestration.bench import SCHEMA, feeds_for
from modelport.packaging.requests import V2_DATATYPES
from modelport.reference.samples import load_data, parse_values
from modelport.runtimes.timing import stats
from modelport.serving.v2.client import PROTOCOLS

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
DEFAULT_REQUESTS = 100


def is_url(text: str) -> bool:
    return str(text).startswith(("http://", "https://"))


def protocol_of(url: str) -> str:
    path = urllib.parse.urlparse(url).path
    if "/v2/models/" in path:
        return "kserve"
    if "/predictions/" in path:
        return "torchserve"
    raise BadInputError(f"cannot tell the serving protocol of {url}; known: KServe v2 / Triton (/v2/models/NAME/infer), "
                        "TorchServe (/predictions/NAME)")


def check_host(url: str, allow_remote: bool) -> None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise BadInputError(f"not an http(s) URL: {url}")
    if parsed.hostname not in LOOPBACK and not allow_remote:
        raise BadInputError(f"refusing to load-test {parsed.hostname}: only 127.0.0.1/localhost unless --allow-remote")


def _metadata_specs(url: str, headers: dict, timeout: float) -> list[TensorSpec]:
    """The inputs a KServe v2 server states for the model (`GET /v2/models/NAME`); -1 dims symbolic."""
    meta_url = url[: -len("/infer")] if url.rstrip("/").endswith("/infer") else url
    req = urllib.request.Request(meta_url.rstrip("/"), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            meta = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise BadInputError(f"cannot read the model metadata at {meta_url}: {e}", hint="pass the inputs with --input NAME:SHAPE[:DTYPE]") from None

    dtypes = {v: k for k, v in V2_DATATYPES.items()}
    specs = []
    for i in meta.get("inputs") or []:
        shape = [int(d) if int(d) >= 0 else ("batch" if k == 0 else f"{i['name']}_dim{k}") for k, d in enumerate(i.get("shape", []))]
        specs.append(TensorSpec(i["name"], dtypes.get(i.get("datatype", "FP32"), "float32"), shape))
    if not specs:
        raise BadInputError(f"the model metadata at {meta_url} names no inputs", hint="pass --input NAME:SHAPE[:DTYPE]")
    return specs


class _TorchServeSender:
    def __init__(self, url: str, feeds: dict[str, np.ndarray], headers: dict, timeout: float):
        self.url, self.headers, self.timeout = url, {"Content-Type": "application/json", **headers}, timeout
        self.body = json.dumps({"inputs": {k: v.tolist() for k, v in feeds.items()}}).encode()

    def send(self) -> None:
        req = urllib.request.Request(self.url, data=self.body, headers=self.headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            r.read()


def _v2_parts(url: str) -> tuple[str, str]:
    """(scheme://host:port, model name) of a `.../v2/models/NAME[/versions/V]/infer` URL."""
    parsed = urllib.parse.urlparse(url)
    after = parsed.path.split("/v2/models/", 1)[1].split("/")
    return f"{parsed.scheme}://{parsed.netloc}", after[0]


def _wire(url: str, protocol: str, asked: str | None, grpc_address: str | None, headers: dict, timeout: float,
          allow_remote: bool) -> tuple[str, str | None, dict]:
    """(wire format, gRPC address or None, the server's /v2 metadata) for a load test."""
    from modelport.serving.v2 import client

    if protocol != "kserve":
        if asked not in (None, "json") or grpc_address:
            raise BadInputError(f"--protocol {asked or 'grpc'} is for a KServe v2 URL; TorchServe takes JSON")
        return "json", None, {}
    base, _ = _v2_parts(url)
    meta = client.get_json(f"{base}/v2", headers, timeout) or {}
    wire = client.pick({**meta, **({"grpc_port": 1} if grpc_address else {})}, asked)
    if wire != "grpc":
        return wire, None, meta
    address = grpc_address or (f"{urllib.parse.urlparse(url).hostname}:{meta['grpc_port']}" if meta.get("grpc_port") else None)
    if address is None:
        raise BadInputError(f"--protocol grpc: the server at {base} does not name its gRPC port", hint="pass --grpc-address HOST:PORT")
    host = address.rsplit(":", 1)[0].strip("[]")
    if host not in LOOPBACK and not allow_remote:
        raise BadInputError(f"refusing to load-test {host}: only 127.0.0.1/localhost unless --allow-remote")
    return wire, address, meta


def load_test(url: str, *, specs: list[TensorSpec] | None = None, data=None, values: list[str] = (), dims: dict | None = None,
              seed: int = 0, batch: int | None = None, requests: int | None = None, duration: float | None = None,
              concurrency: int = 1, rate: float | None = None, headers: dict[str, str] | None = None,
              allow_remote: bool = False, timeout: float = 30.0, wire: str | None = None, grpc_address: str | None = None) -> dict:

    check_host(url, allow_remote)
    protocol = protocol_of(url)
    if wire is not None and wire not in PROTOCOLS:
        raise BadInputError(f"unknown --protocol '{wire}'; known: {', '.join(PROTOCOLS)}")
    if concurrency < 1 or (rate is not None and rate <= 0) or (requests is not None and requests < 1) \
            or (duration is not None and duration <= 0):
        raise BadInputError("--concurrency, --rate, --requests and --duration must be positive")
    if requests is None and duration is None:
        requests = DEFAULT_REQUESTS
    headers = dict(headers or {})
    wire, address, meta = _wire(url, protocol, wire, grpc_address, headers, timeout, allow_remote)
    given = {**(load_data(data) if data else {}), **parse_values(list(values))}
    if not specs:
        if protocol == "kserve":
            specs = _metadata_specs(url, headers, timeout)
        elif given:
            specs = [TensorSpec(k, str(v.dtype), list(v.shape)) for k, v in given.items()]
        else:
            raise BadInputError("TorchServe does not state its model's inputs", hint="pass --input NAME:SHAPE[:DTYPE] or --data inputs.npz")
    feeds = feeds_for(specs, batch, dims=dims or {}, seed=seed, given=given, path=data or url)
    from modelport.serving.v2 import client

    def sender():
        if protocol != "kserve":
            return _TorchServeSender(url, feeds, headers, timeout)
        if wire == "grpc":
            return client.GrpcSender(address, _v2_parts(url)[1], feeds, timeout)
        return client.HttpSender(url, wire, feeds, headers, timeout)

    with_stats = protocol == "kserve" and "statistics" in (meta.get("extensions") or [])
    stats_at = (lambda: client.read_stats(*_v2_parts(url), headers, timeout)) if with_stats else (lambda: None)
    before = stats_at()

    lock = threading.Lock()
    counter = {"next": 0}
    latencies: list[float] = []
    errors: Counter = Counter()
    first_error: list[str] = []
    start = time.perf_counter()

    def take() -> int | None:
        with lock:
            k = counter["next"]
            if requests is not None and k >= requests:
                return None
            if duration is not None and time.perf_counter() - start >= duration:
                return None
            counter["next"] = k + 1
            return k

    def worker() -> None:
        send = sender()
        while (k := take()) is not None:
            if rate:
                wait = start + k / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            t = time.perf_counter()
            try:
                send.send()
                ok, kind, text = True, None, None
            except urllib.error.HTTPError as e:
                ok, kind, text = False, f"HTTP {e.code}", e.read()[:300].decode(errors="replace")
            except (urllib.error.URLError, OSError) as e:
                ok, kind, text = False, type(getattr(e, "reason", e)).__name__, str(getattr(e, "reason", e))
            except Exception as e:  # grpc.RpcError: its status code and details
                code = getattr(e, "code", None)
                ok, kind = False, f"gRPC {code().name}" if callable(code) else type(e).__name__
                text = e.details() if hasattr(e, "details") else str(e)
            elapsed = time.perf_counter() - t
            with lock:
                if ok:
                    latencies.append(elapsed)
                else:
                    errors[kind] += 1
                    if not first_error:
                        first_error.append(f"{kind}: {text}".strip())
        getattr(send, "close", lambda: None)()

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for f in [pool.submit(worker) for _ in range(concurrency)]:
            f.result()
    wall = time.perf_counter() - start
    timed = stats(latencies)
    server = client.server_split(before, stats_at(), timed["latency_ms"].get("mean") if latencies else None)
    return {
        "schema": SCHEMA, "command": "bench", "target": "http", "status": "ok" if not errors else "errors", "url": url, "protocol": protocol,
        "wire": wire, "grpc_address": address, "server": server,
        "settings": {"requests": requests, "duration": duration, "concurrency": concurrency, "rate": rate, "batch": batch},
        "inputs": {k: list(v.shape) for k, v in feeds.items()},
        "requests": counter["next"], "ok": len(latencies), "errors": sum(errors.values()), "error_kinds": dict(errors),
        "first_error": first_error[0] if first_error else None, "latency_ms": timed["latency_ms"],
        "throughput": round(len(latencies) / wall, 3) if wall > 0 else None, "seconds": round(wall, 3),
    }
