"""`modelport serve --workers 2`: two processes on the same REST and gRPC ports, each with its own
runner; answers come from both; one killed is replaced while requests keep succeeding; the
statistics every worker shares count the requests sent to all of them."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.serving.test_serve import Server, _post

pytestmark = pytest.mark.slow
BODY = json.dumps({"inputs": [{"name": "features", "shape": [1, 8], "datatype": "FP32", "data": [0.5] * 8}]}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from modelport.orchestration import ConvertOptions, convert
    from tests.serving.conftest import write_mlp

    root = tmp_path_factory.mktemp("workers")
    convert(write_mlp(root / "src"), root / "mlp", ConvertOptions(targets=["onnx"]))
    s = Server(root / "mlp", "--workers", "2", log=root / "server.log")
    try:
        s.wait_ready(120)
        yield s
    finally:
        s.stop()


def _worker_of_http(port: int) -> str:
    status, text = _post(port, "/v2/models/mlp/infer", BODY)  # a new connection each call
    assert status == 200, text
    return json.loads(text)["parameters"]["worker"]


def _grpc_worker(port: int) -> str:
    import tritonclient.grpc as grpc

    # its own connection (grpc shares one between channels to the same address unless told not to)
    g = grpc.InferenceServerClient(f"127.0.0.1:{port}", channel_args=[("grpc.use_local_subchannel_pool", 1)])
    x = grpc.InferInput("features", [1, 8], "FP32")
    x.set_data_from_numpy(np.full((1, 8), 0.5, np.float32))
    got = g.infer("mlp", [x]).get_response().parameters["worker"].string_param
    g.close()
    return got


def _workers(server) -> set[int]:
    import psutil

    pids = set()
    for c in psutil.Process(server.proc.pid).children():
        try:
            if c.status() != psutil.STATUS_ZOMBIE and "modelport.orchestration.serve_worker" in " ".join(c.cmdline()):
                pids.add(c.pid)
        except psutil.Error:  # gone or a zombie: not a worker that serves
            pass
    return pids


def _until_both(call, pids: set[int], limit_s: float = 60) -> list[str]:
    """Answers of `call` (a new connection each, 8 at a time) until both workers answered: which
    worker accepts a connection is the kernel's choice, so a busy machine may give a run of one."""
    got: list[str] = []
    end = time.monotonic() + limit_s
    with ThreadPoolExecutor(8) as pool:
        while {int(p) for p in got} != pids:
            assert time.monotonic() < end, (set(got), pids)
            got += pool.map(lambda _: call(), range(16))
    return got


def test_answers_come_from_two_worker_processes_over_both_protocols(server):
    pids = _workers(server)
    assert len(pids) == 2 and server.proc.pid not in pids
    assert {int(p) for p in _until_both(lambda: _worker_of_http(server.http), pids)} == pids
    assert {int(p) for p in _until_both(lambda: _grpc_worker(server.grpc), pids)} == pids


def test_the_statistics_count_every_worker_s_requests(server):
    def stats():
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http}/v2/models/mlp/stats", timeout=10) as r:
            return json.loads(r.read())["model_stats"][0]["inference_stats"]["success"]["count"]

    before = stats()
    sent = _until_both(lambda: _worker_of_http(server.http), _workers(server))
    assert stats() == before + len(sent)


def test_a_killed_worker_is_replaced_while_requests_keep_succeeding(server):
    old = _workers(server)
    victim = sorted(old)[0]
    answered, failed = [], []
    stop = time.monotonic() + 60

    def load():
        while time.monotonic() < stop and not (len(_workers(server) - old) == 1 and len(answered) > 200):
            try:
                answered.append(_worker_of_http(server.http))
            except Exception as e:  # a reset, a refused or cut answer: what a killed worker's callers see
                failed.append(f"{type(e).__name__}: {e}")

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(load) for _ in range(4)]
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        for f in futures:
            f.result()
    now = _workers(server)
    assert victim not in now and len(now) == 2, (victim, now)
    # requests in flight on the killed worker at the moment of the kill may fail; none after it
    assert len(failed) <= 4, failed[:5]
    assert len(answered) > 200
    fresh = (now - old).pop()
    deadline = time.monotonic() + 60
    while str(fresh) not in {_worker_of_http(server.http) for _ in range(16)}:
        assert time.monotonic() < deadline, "the replacement worker never answered"
    assert "worker 0" in server.log.read_text() or "worker 1" in server.log.read_text()


def _ready_in_each_worker(server, model: str) -> list[int]:
    """The ready route's status in every worker, asked over each worker's own unix socket (from its
    spec on its command line): which worker a TCP connection reaches is the kernel's choice."""
    import http.client

    import psutil

    statuses = []
    for c in psutil.Process(server.proc.pid).children():
        try:
            cmd = c.cmdline()
        except psutil.Error:
            continue
        if "modelport.orchestration.serve_worker" not in " ".join(cmd):
            continue
        spec = json.loads(cmd[-1])
        path = spec["peers"][spec["index"]]

        class Unix(http.client.HTTPConnection):
            def connect(self, path=path):
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(10)
                self.sock.connect(path)

        conn = Unix("worker")
        conn.request("GET", f"/v2/models/{model}/ready")
        statuses.append(conn.getresponse().status)
        conn.close()
    return statuses


def _answered(call):
    """`call()`, or None while a worker's unix socket refuses (a replacement before it listens)."""
    try:
        return call()
    except OSError:
        return None


def test_a_load_or_unload_taken_by_one_worker_reaches_both(tmp_path):
    """`serve REPO --workers 2 --model-control explicit`: an unload and a load, each taken by whichever
    worker accepts the call, hold in both workers before the call answers; a worker that replaces a
    killed one keeps the unload its predecessor took."""
    from tests.serving.test_serve_repository import _matmul_file

    repo = tmp_path / "repo"
    for name in ("a", "b"):
        _matmul_file(repo / name / "1" / "model.onnx", 4, 3, 0)
    s = Server(repo, "--workers", "2", "--model-control", "explicit", log=tmp_path / "repo-workers.log")
    try:
        s.wait_ready(120)  # one worker answers; the other may still be opening its private socket
        deadline = time.monotonic() + 60
        while (got := _answered(lambda: _ready_in_each_worker(s, "b"))) != [200, 200] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert got == [200, 200]
        status, text = _post(s.http, "/v2/repository/models/b/unload", b"")
        assert status == 200, text
        assert _ready_in_each_worker(s, "b") == [400, 400]  # no worker still serves it
        assert _ready_in_each_worker(s, "a") == [200, 200]
        status, text = _post(s.http, "/v2/repository/models/b/load", b"")
        assert status == 200, text
        assert _ready_in_each_worker(s, "b") == [200, 200]
        status, text = _post(s.http, "/v2/repository/models/b/unload", b"")
        assert status == 200, text
        old = _workers(s)
        os.kill(sorted(old)[0], signal.SIGKILL)
        deadline = time.monotonic() + 90
        while not (len(now := _workers(s)) == 2 and now != old and _answered(lambda: _ready_in_each_worker(s, "a")) == [200, 200]):
            assert time.monotonic() < deadline, "the replacement worker never served"  # it serves once it has followed the other
            time.sleep(0.2)
        assert _ready_in_each_worker(s, "b") == [400, 400]  # it started with b loaded, then took the unload
    finally:
        s.stop()
