"""`modelport serve --workers N`: N server processes on the same ports, each with its own runner.

The supervisor (the `serve` process) binds the REST socket once and hands it, listening, to every
worker (the kernel gives each new connection to one of them); gRPC binds in each worker with
SO_REUSEPORT (grpc has no way to take a bound socket), after the supervisor has checked that the
port is free. Statistics are one shared array with a row per worker (`stats.py`), so any worker
answers `/stats` and `/metrics` for all of them. A worker that dies is started again under the same
row while the others keep serving; SIGINT or SIGTERM stops them all.

Threads: each worker's runtime gets `--threads` intra-op threads, or the cores this process may use
divided by N (at least 1), so that N workers do not oversubscribe the cores.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from modelport.errors import ModelportError
from modelport.serving.v2.server import ServeOptions, listening_socket, serve_logging
from modelport.serving.v2.stats import Layout

log = logging.getLogger("modelport.serve")
READY_TIMEOUT_S = 300


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_per_worker(threads: int | None, workers: int) -> int | None:
    if threads is not None or workers <= 1:
        return threads
    return max(1, cores() // workers)


def _check_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, port))


class Supervisor:
    """`spec`: what a worker needs to serve: the artifact's path and runtime, the model's name and
    contract, the platform string; or the repository's folder. `entry`: the worker's module
    (`python -m ENTRY SPEC_JSON`, `orchestration/serve_worker.py`)."""

    def __init__(self, spec: dict, options: ServeOptions, threads: int | None, entry: str):
        self.spec, self.options, self.n, self.entry = spec, options, options.workers, entry
        self.threads = threads_per_worker(threads, self.n)
        self.procs: list[subprocess.Popen | None] = [None] * self.n
        self.stopping = False
        self.tmp = Path(tempfile.mkdtemp(prefix="modelport-workers-"))
        self.layout = Layout(path=str(self.tmp / "stats.bin"), workers=self.n)
        self.peers = [str(self.tmp / f"w{i}.sock") for i in range(self.n)]  # each worker's private control socket

    def _spawn(self, index: int, sock: socket.socket) -> tuple[subprocess.Popen, int]:
        read, write = os.pipe()
        spec = {**self.spec, "options": asdict(self.options), "threads": self.threads, "index": index, "http_fd": sock.fileno(),
                "ready_fd": write, "stats": asdict(self.layout), "peers": self.peers}
        proc = subprocess.Popen([sys.executable, "-m", self.entry, json.dumps(spec)],
                                pass_fds=(sock.fileno(), write))
        os.close(write)
        return proc, read

    def run(self, on_ready=None) -> None:
        serve_logging()
        sock = listening_socket(self.options.host, self.options.http_port)
        _check_free(self.options.host, self.options.grpc_port)
        self.layout.create()
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            pipes = []
            for i in range(self.n):
                self.procs[i], fd = self._spawn(i, sock)
                pipes.append(fd)
            for i, fd in enumerate(pipes):
                self._wait_ready(i, fd)
            if on_ready:
                on_ready()
            while not self.stopping:
                time.sleep(0.2)
                for i, p in enumerate(self.procs):
                    if p is not None and p.poll() is not None and not self.stopping:
                        log.warning("serve: worker %d (pid %d) exited with %s; starting another", i, p.pid, p.returncode)
                        self.procs[i], fd = self._spawn(i, sock)
                        os.close(fd)
        finally:
            self._shutdown()
            sock.close()
            for s, h in previous.items():
                signal.signal(s, h)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _wait_ready(self, index: int, fd: int) -> None:
        import select

        end = time.monotonic() + READY_TIMEOUT_S
        try:
            while time.monotonic() < end and not self.stopping:
                if select.select([fd], [], [], 0.2)[0]:
                    if os.read(fd, 16):
                        return
                    break  # closed without a byte: the worker ended
                if self.procs[index].poll() is not None:
                    break
        finally:
            os.close(fd)
        if self.stopping:
            return
        code = self.procs[index].poll()

        raise ModelportError(f"serve: worker {index} did not start (exit {code}); its error is above")

    def _stop(self, *_):
        self.stopping = True

    def _shutdown(self) -> None:
        self.stopping = True
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.terminate()
        end = time.monotonic() + 20
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
