"""An artifact served on the Open Inference Protocol (KServe v2) over HTTP and gRPC, in one process.

Built on KServe's Python ModelServer (FastAPI/uvicorn for REST, grpc.aio for gRPC): health and
readiness (`/v2/health/ready`), model metadata, infer, Prometheus metrics (`/metrics`) and an
access log come from it. What is ours: `V2Model`, a `kserve.Model` whose predict runs the
artifact's own runner (onnxruntime, OpenVINO, LiteRT, ExecuTorch, ...: `modelport.runtimes`) after
checking each input's name, dtype and shape against the contract (a 400 naming the input
otherwise); `Batcher`, dynamic batching where the contract's batch dim is dynamic (requests queue
for at most `max_queue_delay_ms`, up to `max_batch_size` rows run as one call, each caller gets its
rows); and the binding: KServe 0.21 listens on every interface with no option to change it, so the
REST server's uvicorn config and the gRPC server's address are set to `host` (127.0.0.1 unless
told otherwise) before it starts. A body over `max_request_bytes` is refused before it is read
(413 over HTTP, RESOURCE_EXHAUSTED over gRPC).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import numpy as np

from modelport.ir import TensorSpec
from modelport.serving.requests import V2_DATATYPES

log = logging.getLogger("modelport.serve")
NUMPY_OF = {v: k for k, v in V2_DATATYPES.items() if k != "string"}
REPLICA = "__replica__"  # a replica's answer names itself under this key (`ray_serve.py`)


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    max_request_bytes: int = 64 << 20
    max_batch_size: int = 0  # 0: no dynamic batching
    max_queue_delay_ms: float = 2.0


KSERVE_INSTALL = 'pip install "modelport[serve]", then pip install --no-deps kserve==0.21.0 (make setup does both)'


def require_kserve():
    """KServe's ModelServer, or exit 5 naming how to install it (it is installed without its
    dependencies: it declares psutil<6 and pandas<3, which would downgrade both under the rest)."""
    from modelport.deps import require
    from modelport.errors import MissingDependencyError

    try:
        return require("kserve", purpose="modelport serve")
    except MissingDependencyError as e:
        raise MissingDependencyError(e.reason, hint=KSERVE_INSTALL) from None


def shape_of(spec: TensorSpec) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in spec.shape]


def check_inputs(feeds: dict[str, np.ndarray], inputs: list[TensorSpec]) -> str | None:
    """Why `feeds` cannot run (a name, dtype or shape the contract does not take), or None."""
    names = [s.name for s in inputs]
    if sorted(feeds) != sorted(names):
        return f"inputs {sorted(feeds)} given; the model takes {names}"
    for s in inputs:
        a = feeds[s.name]
        if a.dtype != np.dtype(s.dtype):
            return f"input '{s.name}' is {V2_DATATYPES.get(a.dtype.name, a.dtype.name)}; the model takes {V2_DATATYPES.get(s.dtype, s.dtype)}"
        want = shape_of(s)
        if a.ndim != len(want) or any(w not in (-1, n) for w, n in zip(want, a.shape, strict=True)):
            return f"input '{s.name}' has the shape {list(a.shape)}; the model takes {want} (-1: any size)"
    return None


class Batcher:
    """Requests queued for at most `delay` seconds and run together, up to `limit` rows along axis 0;
    `infer(feeds)` is the coroutine that runs one call (`local_infer`, or a Ray Serve replica's)."""

    def __init__(self, infer, limit: int, delay: float):
        self.infer, self.limit, self.delay = infer, limit, delay
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None

    async def submit(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.worker = asyncio.get_running_loop().create_task(self._loop())
        done = asyncio.get_running_loop().create_future()
        await self.queue.put((feeds, done))
        return await done

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self.queue.get()
            group, rows = [first], _rows(first[0])
            deadline = loop.time() + self.delay
            while rows < self.limit:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), left)
                except TimeoutError:
                    break
                if not _same_shapes(first[0], item[0]):
                    await self._run([item])  # another size: its own call
                    continue
                group.append(item)
                rows += _rows(item[0])
            await self._run(group)

    async def _run(self, group: list) -> None:
        feeds = {k: np.concatenate([g[0][k] for g in group]) for k in group[0][0]} if len(group) > 1 else group[0][0]
        try:
            out = await self.infer(feeds)
        except Exception as e:  # every caller of the group gets the error
            for _, done in group:
                if not done.done():
                    done.set_exception(e)
            return
        replica = {REPLICA: out.pop(REPLICA)} if REPLICA in out else {}
        start = 0
        for item, done in group:
            n = _rows(item)
            if not done.done():
                done.set_result({**({k: v[start:start + n] for k, v in out.items()} if len(group) > 1 else out), **replica})
            start += n


def _rows(feeds: dict[str, np.ndarray]) -> int:
    return int(next(iter(feeds.values())).shape[0])


def _same_shapes(a: dict, b: dict) -> bool:
    return all(a[k].shape[1:] == b[k].shape[1:] and a[k].dtype == b[k].dtype for k in a)


def local_infer(runner):
    """The coroutine running `runner` (the artifact's) off the event loop."""

    async def infer(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return await asyncio.get_running_loop().run_in_executor(None, runner.run, feeds)

    return infer


def make_model(name: str, infer, inputs: list[TensorSpec], outputs: list[TensorSpec], batching: Batcher | None):
    """The `kserve.Model` of one artifact (kserve imported here: its import takes about a second).
    `infer(feeds)`: the coroutine answering one call (`local_infer`, or `ray_serve.replica_infer`);
    an output named REPLICA in its answer (which replica ran it) goes into the response's parameters."""
    kserve = require_kserve()
    from kserve import InferOutput, InferRequest, InferResponse
    from kserve.errors import InvalidInput

    class V2Model(kserve.Model):
        def load(self) -> bool:
            self.ready = True
            return True

        def get_input_types(self):
            return [{"name": s.name, "datatype": V2_DATATYPES[s.dtype], "shape": shape_of(s)} for s in inputs]

        def get_output_types(self):
            return [{"name": s.name, "datatype": V2_DATATYPES[s.dtype], "shape": shape_of(s)} for s in outputs]

        async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
            try:
                feeds = {i.name: i.as_numpy() for i in payload.inputs}
            except Exception as e:
                raise InvalidInput(f"the request's data does not fit its shape or datatype: {e}") from None
            reason = check_inputs(feeds, inputs)
            if reason:
                raise InvalidInput(reason)
            got = await (batching.submit(feeds) if batching is not None else infer(feeds))
            replica = got.pop(REPLICA, None) if isinstance(got, dict) else None
            binary = payload.use_binary_outputs  # gRPC: raw contents, what Triton's client reads
            out = []
            for s in outputs:
                a = np.ascontiguousarray(np.asarray(got[s.name]).astype(s.dtype, copy=False))
                o = InferOutput(name=s.name, shape=list(a.shape), datatype=V2_DATATYPES[s.dtype])
                o.set_data_from_numpy(a, binary_data=binary)
                out.append(o)
            if replica is not None:  # beside KServe's access log
                logging.getLogger("kserve.modelport").info("infer answered by replica %s", replica)
            return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=out,
                                 use_binary_outputs=binary, requested_outputs=payload.request_outputs,
                                 parameters={"replica": str(replica)} if replica is not None else None)

    model = V2Model(name)
    model.load()
    return model


def bind(host: str, max_request_bytes: int) -> None:
    """KServe's REST and gRPC servers on `host` only, bodies over `max_request_bytes` refused."""
    import types

    import grpc
    import kserve.model_server as model_server
    import kserve.protocol.grpc.server as grpc_server
    import kserve.protocol.rest.server as rest_server

    class RESTServer(rest_server.RESTServer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.config.host = host

        def _add_middlewares(self, app):
            super()._add_middlewares(app)
            app.add_middleware(_BodyCap, limit=max_request_bytes)

    model_server.RESTServer = RESTServer

    def server(*a, **kw):
        options = [*(kw.pop("options", None) or []), ("grpc.max_receive_message_length", max_request_bytes)]
        srv = grpc.aio.server(*a, options=options, **kw)
        add = srv.add_insecure_port
        srv.add_insecure_port = lambda address: add(f"{host}:{address.rsplit(':', 1)[1]}")
        return srv

    grpc_server.aio = types.SimpleNamespace(server=server)


class _BodyCap:
    """ASGI middleware: a request whose body is over `limit` bytes gets 413 before it is read."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _refuse(send, self.limit)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge()
            return message

        try:
            return await self.app(scope, counted, send)
        except _TooLarge:
            return await _refuse(send, self.limit)


class _TooLarge(Exception):
    pass


async def _refuse(send, limit: int) -> None:
    import json

    body = json.dumps({"error": f"the request body is over the server's limit of {limit} bytes (--max-request-bytes)"}).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json"),
                                                                          (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def start(model, options: ServeOptions) -> None:
    """Serve `model` until interrupted (SIGINT/SIGTERM stop it)."""
    import kserve

    bind(options.host, options.max_request_bytes)
    kserve.ModelServer(http_port=options.http_port, grpc_port=options.grpc_port, workers=1,
                       enable_docs_url=False).start([model])
