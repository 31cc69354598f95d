"""The v2 REST front end: a plain ASGI app (no framework between the socket and the codec).

Routes (KServe v2 / Triton): `/v2/health/{live,ready}`, `/v2` (server metadata),
`/v2/models/NAME[/versions/V]` (metadata), `.../ready`, `.../infer`, `.../stats`,
`/v2/models/stats` (every model), the repository extension (`POST /v2/repository/index`,
`POST /v2/repository/models/NAME/{load,unload}`) and `/metrics` (Prometheus). Errors are `{"error": reason}` with
the status Triton and KServe use: 400 for a request that does not fit the model, 404 for an
unknown model or route, 413 for a body over `--max-request-bytes` (refused before it is read),
422 for a body that is not a v2 JSON request.
"""

from __future__ import annotations

import logging
import time

import orjson

from modelport.errors import one_line
from modelport.serving.v2.codec import HEADER_LENGTH, RequestError, decode_json, encode_json
from modelport.serving.v2.peers import PEER_HEADER

log = logging.getLogger("modelport.serve")
_JSON = [(b"content-type", b"application/json")]


class _TooLarge(Exception):
    pass


class App:
    """`registry`: what is served (`repository.Repository`, or `repository.Fixed` for one artifact);
    `server`: the `/v2` metadata; `stats`: the shared statistics."""

    def __init__(self, registry, stats, server: dict, max_request_bytes: int):
        self.registry, self.stats, self.server = registry, stats, server
        self.limit = max_request_bytes

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
            if method == "POST" and parts[:2] == ["v2", "repository"]:
                return await self._repository(scope, receive, send, parts[2:])
            if method == "GET":
                if parts == ["v2", "health", "live"]:
                    return await _answer(send, 200, b"")
                if parts == ["v2", "health", "ready"]:
                    return await _answer(send, 200 if self.registry.ready() else 503, b"")
                if parts == ["v2"]:
                    return await _answer(send, 200, orjson.dumps(self.server))
                if parts == ["v2", "models", "stats"]:
                    return await _answer(send, 200, orjson.dumps({"model_stats": [
                        self.stats.model_stats(m.name, m.version) for m in self.registry.loaded()]}))
                if parts == ["metrics"]:
                    return await _answer(send, 200, (self.stats.prometheus() + self.registry.metrics()).encode(),
                                         [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")])
            raise RequestError(404, f"no route {method} {scope['path']}")
        except RequestError as e:
            return await _answer(send, e.status, orjson.dumps({"error": e.reason}))

    async def _repository(self, scope, receive, send, rest: list[str]):
        body = await _body(receive, self.limit)
        if rest == ["index"]:
            try:
                ready = bool(orjson.loads(body).get("ready")) if body.strip() else False
            except (orjson.JSONDecodeError, AttributeError):
                raise RequestError(422, "the index request is not a JSON object") from None
            return await _answer(send, 200, orjson.dumps(self.registry.index(ready)))
        if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
            # another worker's hand-on arrives on this worker's unix socket only (no peer address there)
            peer = scope.get("client") is None and any(k == PEER_HEADER.encode() for k, _ in scope["headers"])
            await (self.registry.load(rest[1], peer=peer) if rest[2] == "load" else self.registry.unload(rest[1], peer=peer))
            return await _answer(send, 200, b"{}")
        raise RequestError(404, f"no repository route {'/'.join(rest)}")

    async def _model(self, scope, receive, send, method: str, name: str, rest: list[str]):
        version = ""
        if rest[:1] == ["versions"]:
            if len(rest) < 2:
                raise RequestError(404, f"no route {method} {scope['path']}")
            version, rest = rest[1], rest[2:]
        if method == "GET" and rest == ["ready"]:
            try:
                self.registry.resolve(name, version)
            except RequestError as e:  # Triton answers 400 for a version that is not ready, an unknown model too
                return await _answer(send, 400, orjson.dumps({"error": e.reason}))
            return await _answer(send, 200, b"")
        model = await self.registry.get(name, version)
        if method == "POST" and rest == ["infer"]:
            return await self._infer(scope, receive, send, model)
        if method == "GET":
            if rest == []:
                return await _answer(send, 200, orjson.dumps(model.metadata()))
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
        model.begin()
        try:
            header = headers.get(HEADER_LENGTH.encode())
            try:
                request = decode_json(body, int(header) if header is not None else None)
            except ValueError:
                raise RequestError(400, f"Inference-Header-Content-Length '{header.decode(errors='replace')}' is not a number") from None
            outputs, params = await model.answer(request.feeds, request.outputs, t0)
            t2 = time.perf_counter_ns()
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
            return await _answer(send, 500, orjson.dumps({"error": one_line(e, typed=True)}))
        finally:
            model.end()
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
