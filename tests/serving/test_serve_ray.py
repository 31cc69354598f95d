"""`modelport serve --replicas 2`: the artifact in two Ray Serve replicas on a local Ray cluster
behind one KServe v2 front end. Requests spread over both (each answer names its replica, and the
log says which answered); a replica killed under load is replaced by Ray Serve's controller, and
every request either gets its answer or an error the client retries, none hangs. A repository on
the replicas: each version checked by the front end, answered by the replicas, a promote followed."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.cli.test_batch import ray_cluster  # noqa: F401  (a Ray head on 127.0.0.1, outside the network guard)
from tests.serving.test_serve import Server, _reference, folder  # noqa: F401  (the module's convert folder)

pytestmark = pytest.mark.slow


def _call(port: int, x: np.ndarray):
    import tritonclient.http as http

    client = http.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
    i = http.InferInput("pixels", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    result = client.infer("cnn", [i])
    return result.as_numpy("logits"), result.get_response()["parameters"]["replica"]


def test_two_replicas_share_the_load_and_a_killed_one_is_replaced(folder, ray_cluster, tmp_path):  # noqa: F811
    """On an existing cluster (`--address`; Ray's own head processes look up cloud metadata hosts
    when they start, so the cluster runs outside the suite's network guard and the server joins it)."""
    address, env = ray_cluster
    server = Server(folder, "--replicas", "2", "--address", address, log=tmp_path / "server.log", env=env)
    try:
        server.wait_ready(timeout=180)
        x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
        want = _reference(folder, x)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: _call(server.http, x), range(40)))
        for got, _ in answers:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        first = {replica for _, replica in answers}
        assert len(first) == 2, first  # both replicas answered
        log = server.log.read_text()
        assert all(f"infer answered by replica {r}" in log for r in first)

        victim = int(sorted(first)[0])
        outcomes: list[str] = []

        def load(n: int) -> None:
            try:
                outcomes.append(_call(server.http, x)[1])
            except Exception as e:  # told to retry: an error answer, never a hang (network_timeout bounds it)
                outcomes.append(f"error: {type(e).__name__}")

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(load, n) for n in range(20)]
            time.sleep(0.5)
            os.kill(victim, signal.SIGKILL)
            futures += [pool.submit(load, n) for n in range(40)]
            for f in futures:
                f.result(timeout=120)
        errors = [o for o in outcomes if o.startswith("error")]
        assert len(outcomes) == 60 and len(errors) <= 4, outcomes  # at most the calls in flight on the killed replica

        deadline, seen = time.monotonic() + 120, set()
        while time.monotonic() < deadline:  # Ray Serve's controller starts a replacement
            seen |= {_call(server.http, x)[1] for _ in range(8)}
            if len(seen - first) >= 1 and len(seen - {str(victim)}) >= 2:
                break
            time.sleep(1)
        assert str(victim) not in seen - first and len(seen - {str(victim)}) >= 2, (first, seen)
    finally:
        server.stop()


def test_a_repository_on_two_replicas_answers_every_model_and_follows_a_promote(cli, ray_cluster, tmp_path):  # noqa: F811
    import onnxruntime as ort
    import tritonclient.http as http

    from tests.serving.test_serve_repository import _matmul_file

    for v in (1, 2):
        _matmul_file(tmp_path / f"m{v}" / "model.onnx", 4, 3, v)
    _matmul_file(tmp_path / "n1" / "model.onnx", 4, 5, 7)
    repo = tmp_path / "repo"
    for name, src in (("m", "m1"), ("m", "m2"), ("n", "n1")):
        assert cli("repo", "add", repo, name, tmp_path / src).exit_code == 0
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)

    def want(src: str) -> np.ndarray:
        return ort.InferenceSession(str(tmp_path / src / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"features": x})[0]

    def ask(name: str):
        client = http.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=60)
        i = http.InferInput("features", [2, 4], "FP32")
        i.set_data_from_numpy(x)
        r = client.infer(name, [i])
        return r.as_numpy("scores"), r.get_response()["model_version"], r.get_response()["parameters"]["replica"]

    address, env = ray_cluster
    server = Server(repo, "--replicas", "2", "--address", address, "--model-control", "poll", "--poll-seconds", "0.5",
                    log=tmp_path / "repo-ray.log", env=env)
    try:
        server.wait_ready(timeout=180)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda k: ask("mn"[k % 2]), range(40)))
        for k, (got, version, _) in enumerate(answers):
            np.testing.assert_allclose(got, want("m1" if k % 2 == 0 else "n1"), rtol=1e-5, atol=1e-5)
            assert version == "1"
        assert len({replica for *_, replica in answers}) == 2, answers  # both replicas answered
        assert cli("repo", "promote", repo, "m", "2").exit_code == 0
        deadline = time.monotonic() + 60
        while ask("m")[1] != "2":
            assert time.monotonic() < deadline, server.log.read_text()[-2000:]
            time.sleep(0.2)
        np.testing.assert_allclose(ask("m")[0], want("m2"), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ask("n")[0], want("n1"), rtol=1e-5, atol=1e-5)
    finally:
        server.stop()
