"""The test suite's network guard: no connection and no name lookup outside the loopback.

Installed in the test process by `tests/conftest.py` and, through this folder on PYTHONPATH, in
every child process the tests start (the CLI in a subprocess, isolated loaders, servers). A
refused attempt raises ConnectionRefusedError where it happens and is appended to the file named
by MODELPORT_TEST_NET_LOG, so a test fails even when a library swallows the error.
"""

import os
import socket

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", ""}


def _is_loopback(host) -> bool:
    if host is None:
        return True
    host = host.decode() if isinstance(host, bytes) else str(host)
    host = host.strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    if host.startswith("127.") or host in ("::1", "0:0:0:0:0:0:0:1", "0.0.0.0", "::"):
        return True
    return host.startswith("::ffff:127.")


def _refuse(what: str, host) -> None:
    message = f"network access outside 127.0.0.1 refused in tests: {what} {host!r}"
    log = os.environ.get("MODELPORT_TEST_NET_LOG")
    if log:
        try:
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {message}\n")
        except OSError:
            pass
    raise ConnectionRefusedError(message)


def install() -> None:
    if getattr(socket, "_modelport_guard", False):
        return
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def host_of(address):
        return address[0] if isinstance(address, tuple) and address else None

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(host_of(address)):
            _refuse("connect to", host_of(address))
        return real_connect(self, address)

    def connect_ex(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(host_of(address)):
            _refuse("connect to", host_of(address))
        return real_connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if not _is_loopback(host):
            _refuse("name lookup of", host)
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.getaddrinfo = getaddrinfo
    socket._modelport_guard = True


if os.environ.get("MODELPORT_TEST_NET_LOG"):
    install()
