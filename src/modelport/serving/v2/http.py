"""The v2 REST front end: a plain ASGI app (no framework between the socket and the codec).

Routes (KServe v2 / Triton): `/v2/health/{live,ready}`, `/v2` (server metadata),
`/v2/models/NAME[/versions/V]` (metadata), `.../ready`, `.../infer`, `.../stats`,
`/v2/models/stats` (every model), and `/metrics` (Prometheus). Errors are `{"error": reason}` with
the status Triton and KServe use: 400 for a request that does not fit the model, 404 for an
unknown model or route, 413 for a body over `--max-request-bytes` (refused before it is read),
422 for a body that is not a v2 JSON request.
"""

from __future__ import annotations

import logging
import time

import orjson

from modelport.serving.v2.codec import HEADER_LENGTH, RequestError, decode_json, encode_json
from modelport.serving.v2.model import check_inputs

log = logging.getLogger("modelport.serve")
_JSON = [(b"content-type", b"application/json")]


class _TooLarge(Exception):
    pass


class App:
    """`models`: {name: ServedModel} (a live dict: the server may change it); `server`: the
    `/v2` metadata; `stats`: the shared statistics."""

    def __init__(self, models: dict, stats, server: dict, max_request_bytes: int, ready=lambda: True):
        self.models, self.stats, self.server = models, stats, server
        self.limit, self.ready = max_request_bytes, ready

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                while True:
                    message = await receive()
                    kind = message["type"].rsplit(".", 1)[-1]
                    await send({"type": f"lifespan.{kind}.complete"})
                    if kind == "shutdown":
                        return
            return
        parts = scope["path"].strip("/").split("/")
        method = scope["method"]
        try:
            if parts[:2] == ["v2", "models"] and len(parts) >= 3 and parts[2] != "stats":
                return await self._model(scope, receive, send, method, parts[2], parts[3:])
            if method == "GET":
                if parts == ["v2", "health", "live"]:
                    return await _answer(send, 200, b"")
                if parts == ["v2", "health", "ready"]:
                    return await _answer(send, 200 if self.ready() else 503, b"")
                if parts == ["v2"]:
                    return await _answer(send, 200, orjson.dumps(self.server))
                if parts == ["v2", "models", "stats"]:
                    return await _answer(send, 200, orjson.dumps({"model_stats": [
                        self.stats.model_stats(m.name, m.version) for m in self.models.values()]}))
                if parts == ["metrics"]:
                    return await _answer(send, 200, self.stats.prometheus().encode(),
                                         [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")])
            raise RequestError(404, f"no route {method} {scope['path']}")
        except RequestError as e:
            return await _answer(send, e.status, orjson.dumps({"error": e.reason}))

    async def _model(self, scope, receive, send, method: str, name: str, rest: list[str]):
        model = self.models.get(name)
        if model is None:
            raise RequestError(404, f"model '{name}' is not served here; it serves {sorted(self.models)}")
        if rest[:1] == ["versions"]:
            if len(rest) < 2 or rest[1] != model.version:
                raise RequestError(404, f"model '{name}' has no version '{rest[1] if len(rest) > 1 else ''}'; it serves {model.version}")
            rest = rest[2:]
        if method == "POST" and rest == ["infer"]:
            return await self._infer(scope, receive, send, model)
        if method == "GET":
            if rest == []:
                return await _answer(send, 200, orjson.dumps(model.metadata()))
            if rest == ["ready"]:
                return await _answer(send, 200, b"")
            if rest == ["stats"]:
                return await _answer(send, 200, orjson.dumps({"model_stats": [self.stats.model_stats(model.name, model.version)]}))
        raise RequestError(404, f"no route {method} {scope['path']}")

    async def _infer(self, scope, receive, send, model):
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(send)
        try:
            body = await _body(receive, self.limit)
        except _TooLarge:
            return await self._refuse(send)
        t0 = time.perf_counter_ns()
        stats, slot = model.stats, model.slot
        stats.pending(slot, 1)
        try:
            header = headers.get(HEADER_LENGTH.encode())
            try:
                request = decode_json(body, int(header) if header is not None else None)
            except ValueError:
                raise RequestError(400, f"Inference-Header-Content-Length '{header.decode(errors='replace')}' is not a number") from None
            reason = check_inputs(request.feeds, model.inputs)
            if reason:
                raise RequestError(400, reason)
            if request.outputs is not None:
                unknown = [o for o in request.outputs if o not in model.datatypes]
                if unknown:
                    raise RequestError(400, f"output {unknown[0]!r} is not one of the model's {model.output_names}")
            t1 = time.perf_counter_ns()
            stats.phase(slot, "compute_input", t1 - t0)
            outputs, params = await model.infer(request.feeds, t1)
            t2 = time.perf_counter_ns()
            if request.outputs is not None:
                outputs = [o for o in outputs if o[0] in request.outputs]
            binary = {o[0] for o in outputs} if request.binary_all else request.binary
            payload, head = encode_json(model.name, model.version, request.id, outputs, binary, params)
            t3 = time.perf_counter_ns()
            stats.phase(slot, "compute_output", t3 - t2)
            stats.request(slot, True, t3 - t0)
        except RequestError as e:
            stats.request(slot, False, time.perf_counter_ns() - t0)
            return await _answer(send, e.status, orjson.dumps({"error": e.reason}))
        except Exception as e:  # the runtime failed: 500 with its reason, and the server keeps serving
            stats.request(slot, False, time.perf_counter_ns() - t0)
            log.error("infer on '%s' failed: %s", model.name, e)
            return await _answer(send, 500, orjson.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}))
        finally:
            stats.pending(slot, -1)
        if head is None:
            return await _answer(send, 200, payload)
        return await _answer(send, 200, payload, [(b"content-type", b"application/octet-stream"),
                                                  (HEADER_LENGTH.encode(), str(head).encode())])

    async def _refuse(self, send):
        return await _answer(send, 413, orjson.dumps(
            {"error": f"the request body is over the server's limit of {self.limit} bytes (--max-request-bytes)"}))


async def _body(receive, limit: int) -> bytes:
    chunks, seen = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        if chunk:
            seen += len(chunk)
            if seen > limit:
                raise _TooLarge()
            chunks.append(chunk)
        if not message.get("more_body"):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _answer(send, status: int, body: bytes, headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*(headers or _JSON), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
