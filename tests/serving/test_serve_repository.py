"""`modelport serve REPO`: a repository folder in Triton's layout, served live. Triton's clients
over HTTP and gRPC: the repository index, load and unload, versioned readiness; a v1 -> v2 rollout
under concurrency 16 for 30 s with no failed request, every answer naming version 1 or 2 and no caller
going back to 1 after it got 2; a v3 that fails its reference check leaves v2 serving, with the
reason in the index."""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest

from tests.serving.test_serve import Server

pytestmark = pytest.mark.slow


def _mlp(folder, seed: int):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["features", "w"], ["scores"])], "mlp",
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 5])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "mlp.onnx"))
    return folder / "mlp.onnx", rng


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Three convert output folders: v1 and v2 (other weights), and v3, v2 with a reference it does not give."""
    import hashlib
    import json

    from modelport.orchestration import ConvertOptions, convert

    root = tmp_path_factory.mktemp("versions")
    out = {}
    for v, seed in ((1, 1), (2, 2)):
        src, _ = _mlp(root / f"src{v}", seed)
        convert(src, root / f"v{v}", ConvertOptions(targets=["onnx"]))
        out[v] = root / f"v{v}"
    bad = root / "v3"
    shutil.copytree(out[2], bad)
    with np.load(bad / "reference.npz") as z:
        arrays = {k: z[k] + (1.0 if k.startswith("out/") else 0.0) for k in z.files}
    np.savez(bad / "reference.npz", **arrays)
    report = json.loads((bad / "report.json").read_text())
    report["reference"]["sha256"] = hashlib.sha256((bad / "reference.npz").read_bytes()).hexdigest()
    (bad / "report.json").write_text(json.dumps(report))
    out[3] = bad
    return out


@pytest.fixture()
def repo(versions, tmp_path):
    root = tmp_path / "repo"
    (root / "mlp").mkdir(parents=True)
    (root / "mlp" / "config.pbtxt").write_text('name: "mlp"\nversion_policy { latest { num_versions: 1 } }\n')
    shutil.copytree(versions[1], root / "mlp" / "1")
    shutil.copytree(versions[1], root / "other" / "1")
    return root


@pytest.fixture()
def server(repo, tmp_path):
    s = Server(repo, "--model-control", "explicit", log=tmp_path / "server.log")
    try:
        s.wait_ready(120)
        yield s
    finally:
        s.stop()


def _want(folder, x):
    import onnxruntime as ort

    return ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"features": x})[0]


def test_the_repository_api_over_http_and_grpc(server):
    import tritonclient.grpc as grpc
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    h = http.InferenceServerClient(f"127.0.0.1:{server.http}")
    g = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    assert h.get_model_repository_index() == [{"name": "mlp", "version": "1", "state": "READY", "reason": ""},
                                              {"name": "other", "version": "1", "state": "READY", "reason": ""}]
    assert [(m.name, m.version, m.state) for m in g.get_model_repository_index().models] == [("mlp", "1", "READY"), ("other", "1", "READY")]
    assert h.is_model_ready("mlp", "1") and g.is_model_ready("mlp", "1") and not h.is_model_ready("mlp", "2")
    h.unload_model("other")
    assert not h.is_model_ready("other") and not g.is_model_ready("other")
    assert {"name": "other", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in h.get_model_repository_index()
    x = np.ones((1, 8), np.float32)
    i = http.InferInput("features", [1, 8], "FP32")
    i.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException):
        h.infer("other", [i])
    g.load_model("other")
    assert g.is_model_ready("other", "1") and h.infer("other", [i]).get_response()["model_version"] == "1"
    with pytest.raises(InferenceServerException) as e:
        h.load_model("nope")
    assert "no model 'nope'" in e.value.message()


def test_a_rollout_under_load_drops_nothing_and_a_failing_version_never_serves(server, repo, versions):
    import tritonclient.grpc as grpc
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    want = {"1": _want(versions[1], x), "2": _want(versions[2], x)}
    seen: dict[int, list[str]] = {}
    failures: list[str] = []
    stop = threading.Event()

    def caller(k: int):
        if k % 2:
            c = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}", channel_args=[("grpc.use_local_subchannel_pool", 1)])
            i = grpc.InferInput("features", [2, 8], "FP32")
        else:
            c = http.InferenceServerClient(f"127.0.0.1:{server.http}")
            i = http.InferInput("features", [2, 8], "FP32")
        i.set_data_from_numpy(x)
        mine = seen.setdefault(k, [])
        while not stop.is_set():
            try:
                r = c.infer("mlp", [i])
            except Exception as e:
                failures.append(f"{type(e).__name__}: {e}")
                continue
            version = r.get_response().model_version if k % 2 else r.get_response()["model_version"]
            if not np.allclose(r.as_numpy("scores"), want[version], rtol=1e-5, atol=1e-5):
                failures.append(f"version {version} answered another version's outputs")
            mine.append(version)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(16)]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(5)
    shutil.copytree(versions[2], repo / "mlp" / "2")
    http.InferenceServerClient(f"127.0.0.1:{server.http}").load_model("mlp")  # load, check, switch, drain, unload v1
    time.sleep(max(0.0, 15 - (time.monotonic() - start)))
    shutil.copytree(versions[3], repo / "mlp" / "3")
    with pytest.raises(InferenceServerException) as e:
        grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}").load_model("mlp")
    assert "does not give the reference outputs" in e.value.message()
    time.sleep(max(0.0, 30 - (time.monotonic() - start)))  # 30 s of load in all
    stop.set()
    for t in threads:
        t.join()
    assert not failures, failures[:5]
    for k, versions_seen in seen.items():
        assert set(versions_seen) == {"1", "2"}, (k, set(versions_seen))
        first_two = versions_seen.index("2")
        assert set(versions_seen[first_two:]) == {"2"}, k  # once on v2, never back to v1
    index = http.InferenceServerClient(f"127.0.0.1:{server.http}").get_model_repository_index()
    mlp = {m["version"]: m for m in index if m["name"] == "mlp"}
    assert mlp["2"]["state"] == "READY" and "1" not in mlp
    assert mlp["3"]["state"] == "UNAVAILABLE" and "does not give the reference outputs" in mlp["3"]["reason"]
    log = server.log.read_text()
    assert "mlp version 1 unloaded" in log and "mlp version 3 was not loaded" in log


def test_a_parity_rollout_holds_back_a_version_that_answers_differently_and_shadows_one_that_agrees(repo, versions, tmp_path):
    """--rollout parity --shadow 4: v2 (other weights) is held back on the reference sample, with the
    reason in the index and the metrics; v3 (v1 exported again) agrees there, then takes traffic only
    after 4 live requests mirrored to it agree."""
    import urllib.request

    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    s = Server(repo, "--model-control", "explicit", "--rollout", "parity", "--shadow", "4", log=tmp_path / "parity.log")
    try:
        s.wait_ready(120)
        h = http.InferenceServerClient(f"127.0.0.1:{s.http}")
        x = np.ones((1, 8), np.float32)
        i = http.InferInput("features", [1, 8], "FP32")
        i.set_data_from_numpy(x)
        shutil.copytree(versions[2], repo / "mlp" / "2")
        with pytest.raises(InferenceServerException) as e:
            h.load_model("mlp")
        assert "held back: its answers differ from the serving version's on the reference sample" in e.value.message()
        assert h.infer("mlp", [i]).get_response()["model_version"] == "1"
        with urllib.request.urlopen(f"http://127.0.0.1:{s.http}/metrics", timeout=10) as r:
            assert 'modelport_rollout_held_back{model="mlp",version="2",reason="held back' in r.read().decode()
        shutil.copytree(versions[1], repo / "mlp" / "3")
        h.load_model("mlp")  # passes the reference sample; now shadowing
        index = {(m["name"], m["version"]): m for m in h.get_model_repository_index()}
        assert index[("mlp", "3")]["state"] == "LOADING" and "shadowing: 0 of 4" in index[("mlp", "3")]["reason"]
        assert index[("mlp", "2")]["state"] == "UNAVAILABLE" and "held back" in index[("mlp", "2")]["reason"]
        answered = [h.infer("mlp", [i]).get_response()["model_version"] for _ in range(4)]
        assert answered == ["1"] * 4  # the serving version answers while the new one shadows
        deadline = time.monotonic() + 30
        while h.infer("mlp", [i]).get_response()["model_version"] != "3":
            assert time.monotonic() < deadline, h.get_model_repository_index()
            time.sleep(0.05)
        assert "mlp version 3 loaded after 4 mirrored requests" in s.log.read_text()
    finally:
        s.stop()


def _matmul_file(path, rows: int, cols: int, seed: int):
    """NAME/1/model.onnx: one MatMul whose weights take rows x cols floats."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["features", "w"], ["scores"])], "m",
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", rows])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", cols])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


class _Peak:
    """The largest RSS of a process, sampled every 5 ms on a thread."""

    def __init__(self, pid: int):
        import psutil

        self.proc, self.peak, self.stop = psutil.Process(pid), 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def _infer(port: int, name: str, rows: int) -> str:
    import tritonclient.http as http

    i = http.InferInput("features", [1, rows], "FP32")
    i.set_data_from_numpy(np.ones((1, rows), np.float32))
    return http.InferenceServerClient(f"127.0.0.1:{port}").infer(name, [i]).get_response()["model_version"]


def test_ten_models_under_a_bound_that_fits_three(tmp_path):
    """--max-memory: models load on their first request and the least recently used is unloaded
    to fit; every request is answered, evictions are counted, and the RSS never passes the bound."""
    import urllib.request

    import psutil

    rows, cols = 2000, 3000  # 24 MB of weights each
    repo = tmp_path / "repo"
    for k in range(10):
        _matmul_file(repo / f"m{k}" / "1" / "model.onnx", rows, cols, k)
    probe = Server(repo, "--max-memory", "1T", log=tmp_path / "probe.log")
    try:
        probe.wait_ready(120)
        _infer(probe.http, "m0", rows)
        one = psutil.Process(probe.proc.pid).memory_info().rss
        _infer(probe.http, "m1", rows)
        per = psutil.Process(probe.proc.pid).memory_info().rss - one
    finally:
        probe.stop()
    allowance = 4.0 * (repo / "m0" / "1" / "model.onnx").stat().st_size  # repository.LOAD_FACTOR x the file
    bound = int(one + 1.5 * per + allowance)  # room for a third model's allowance, not for a fourth's
    s = Server(repo, "--max-memory", str(bound), log=tmp_path / "bounded.log")
    try:
        s.wait_ready(120)
        peak = _Peak(s.proc.pid)
        answered = [_infer(s.http, f"m{k % 10}", rows) for k in range(30)]
        answered += [_infer(s.http, f"m{k}", rows) for k in (0, 1, 2, 0, 1, 2)]  # three fit: no eviction among them
        highest = peak.done()
        with urllib.request.urlopen(f"http://127.0.0.1:{s.http}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        s.stop()
    assert answered == ["1"] * 36
    evictions = sum(int(line.split()[-1]) for line in metrics.splitlines() if line.startswith("modelport_model_evictions_total{"))
    loads = sum(int(line.split()[-1]) for line in metrics.splitlines() if line.startswith("modelport_model_loads_total{"))
    # ten models cycled through room for about three (what fits is measured, not counted): most requests load, most loads evict
    assert loads >= 30 and evictions >= 20 and loads - evictions <= 5, (loads, evictions)
    assert highest <= bound, (highest, bound, one, per)
    assert "unloaded to make room" in s.log.read_text()


def test_a_hundred_load_and_unload_cycles_keep_the_memory_flat(tmp_path):
    import psutil
    import tritonclient.http as http

    repo = tmp_path / "repo"
    _matmul_file(repo / "m" / "1" / "model.onnx", 1000, 1500, 0)
    s = Server(repo, "--model-control", "explicit", log=tmp_path / "cycles.log")
    try:
        s.wait_ready(120)
        h = http.InferenceServerClient(f"127.0.0.1:{s.http}")
        proc = psutil.Process(s.proc.pid)

        def cycles(n: int) -> None:
            for _ in range(n):
                h.unload_model("m")
                h.load_model("m")
                assert _infer(s.http, "m", 1000) == "1"

        cycles(10)  # the allocator's pools reach their working size
        warm = proc.memory_info().rss
        cycles(100)
        grown = proc.memory_info().rss / warm - 1
    finally:
        s.stop()
    assert grown < 0.05, f"RSS grew {grown:.1%} over 100 load/unload cycles"
