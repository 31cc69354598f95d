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
from modelport.version import __version__

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
    model_control: str = "none"  # a repository folder: none, poll or explicit (`repository.py`)
    poll_seconds: float = 5.0
    rollout: str = "direct"  # a repository's new version: direct, or parity (gated on the serving version's answers)
    shadow: int = 0  # parity: live requests mirrored to the new version before it switches in
    max_memory: int | None = None  # a repository: the process tree's RSS bound; models load on first use, LRU unloaded


def metadata() -> dict:

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


async def _serve(registry, stats, options: ServeOptions, http_sock: socket.socket, extra_sockets: list, on_serving=None) -> None:
    import uvicorn

    info = {**metadata(), "grpc_port": options.grpc_port}  # where `bench URL` finds the gRPC front end
    app = App(registry, stats, info, options.max_request_bytes)
    config = uvicorn.Config(app, lifespan="off", http="httptools" if _has("httptools") else "auto", loop="none",
                            access_log=options.access_log, log_level="info", timeout_keep_alive=30)
    http = uvicorn.Server(config)
    rpc = grpc_server(Servicer(registry, stats, info), options.host, options.grpc_port, options.max_request_bytes)
    await rpc.start()
    poller = None
    try:
        await registry.start()  # a repository loads its models (the front ends answer, not ready, meanwhile)
        if getattr(registry, "control", "none") == "poll":
            poller = asyncio.get_running_loop().create_task(registry.poll())
        if on_serving:
            asyncio.get_running_loop().call_soon(on_serving)
        await http.serve(sockets=[http_sock, *extra_sockets])
    finally:
        if poller is not None:
            poller.cancel()
        await rpc.stop(grace=2)
        for m in registry.loaded():
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


def run(registry, stats, options: ServeOptions, http_sock: socket.socket | None = None, extra_sockets: list | None = None,
        on_serving=None) -> None:
    """Serve `registry` (`repository.Repository`, or `repository.Fixed` for one artifact) until
    interrupted; `extra_sockets`: more listening sockets for the REST app (a worker's unix socket)."""
    serve_logging()
    sock = http_sock or listening_socket(options.host, options.http_port)
    main = _serve(registry, stats, options, sock, list(extra_sockets or []), on_serving)
    if _has("uvloop"):
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)
