"""One server process: the REST app on uvicorn and the gRPC servicer on grpc.aio, on one event loop
(uvloop where installed), until SIGINT or SIGTERM.

The REST socket is either bound here (`host`:`http_port`, one process) or handed over already
listening (`http_fd`: the supervisor's, shared by its workers, `workers.py`); gRPC binds with
SO_REUSEPORT so that workers share its port. `access_log` writes one uvicorn line per REST request.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

from modelport.serving.v2.grpc import Servicer
from modelport.serving.v2.grpc import server as grpc_server
from modelport.serving.v2.http import App

log = logging.getLogger("modelport.serve")
EXTENSIONS = ["model_repository", "statistics", "binary_tensor_data", "metrics"]


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    max_request_bytes: int = 64 << 20
    max_batch_size: int = 0  # 0: no dynamic batching
    max_queue_delay_ms: float = 2.0
    workers: int = 1
    access_log: bool = False


def metadata() -> dict:
    from modelport.version import __version__

    return {"name": "modelport", "version": __version__, "extensions": EXTENSIONS}


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket (IPv6 when `host` is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def _serve(models: dict, stats, options: ServeOptions, http_sock: socket.socket, on_serving=None) -> None:
    import uvicorn

    info = {**metadata(), "grpc_port": options.grpc_port}  # where `bench URL` finds the gRPC front end
    app = App(models, stats, info, options.max_request_bytes)
    config = uvicorn.Config(app, lifespan="off", http="httptools" if _has("httptools") else "auto", loop="none",
                            access_log=options.access_log, log_level="info", timeout_keep_alive=30)
    http = uvicorn.Server(config)
    rpc = grpc_server(Servicer(models, stats, info), options.host, options.grpc_port, options.max_request_bytes)
    await rpc.start()
    if on_serving:
        asyncio.get_running_loop().call_soon(on_serving)
    try:
        await http.serve(sockets=[http_sock])
    finally:
        await rpc.stop(grace=2)
        for m in models.values():
            if m.close:
                m.close()


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def serve_logging() -> None:
    """The server's own lines (a worker replaced, which replica answered) on stderr, beside uvicorn's."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def run(models: dict, stats, options: ServeOptions, http_sock: socket.socket | None = None, on_serving=None) -> None:
    """Serve `models` ({name: ServedModel}) until interrupted."""
    serve_logging()
    sock = http_sock or listening_socket(options.host, options.http_port)
    main = _serve(models, stats, options, sock, on_serving)
    if _has("uvloop"):
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)
