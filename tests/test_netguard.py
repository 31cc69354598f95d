"""The suite's network guard refuses connections and name lookups outside the loopback, in the test
process and in child processes, and records them so a swallowed error still fails the test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.conftest import network_attempts


def _forget(before: int) -> list[str]:
    """The attempts since `before`, removed from the log (this test made them on purpose)."""
    path = os.environ["MODELPORT_TEST_NET_LOG"]
    lines = network_attempts()
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines[:before]))
    return lines[before:]


def test_outside_connections_and_lookups_are_refused_in_process():
    before = len(network_attempts())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("192.0.2.1", 80), timeout=1)
    with pytest.raises(ConnectionRefusedError):
        socket.getaddrinfo("github.com", 443)
    swallowed = socket.socket()
    try:
        swallowed.connect(("198.51.100.7", 443))
    except OSError:
        pass  # a library that hides the error: the log still has it
    finally:
        swallowed.close()
    assert len(_forget(before)) == 3


def test_child_processes_are_guarded_too():
    before = len(network_attempts())
    code = "import urllib.request\ntry:\n    urllib.request.urlopen('https://github.com', timeout=2)\nexcept Exception as e:\n    print(type(e).__name__)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    attempts = _forget(before)
    assert attempts  # github.com, or the proxy a CI machine names


def test_loopback_is_allowed():
    class Hello(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hi")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        import urllib.request

        for host in ("127.0.0.1", "localhost"):
            with urllib.request.urlopen(f"http://{host}:{server.server_port}/", timeout=5) as r:
                assert r.read() == b"hi"
    finally:
        server.shutdown()
