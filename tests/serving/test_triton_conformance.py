"""The same Triton client calls against a real Triton server and against `modelport serve REPO`,
side by side: the repository API (index, load, unload, ready by name and version), inference over
HTTP (JSON and binary) and gRPC, the statistics' fields and counts, and the errors a client sees
for a wrong datatype, a wrong shape and an unknown model. Every outcome must agree, except the differences listed in KEPT.

The real server is the `tritonserver` binary of the nvidia-pytriton 0.7.0 wheel (Triton 2.51,
python backend only; `make setup` installs it into .venv/triton, apart from modelport's own
packages), run on its own, outside pytriton's launcher: its python backend stub links the system's
libpython3.11 and must use that Python's standard library. Both servers serve one model `m`: a
product with the same 4x3 weights, in a python-backend `model.py` there and as ONNX here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.serving.test_serve import Server, _free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TRITON_VENV = ROOT / ".venv" / "triton"
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
W = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
# outcomes that differ on purpose: call -> why modelport answers otherwise
KEPT = {
    "metadata.platform": "Triton names the backend ('python'); modelport the runtime that runs the artifact ('onnxruntime')",
}

CONFIG = """name: "m"
backend: "python"
max_batch_size: 0
input [ { name: "features" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "scores" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
MODEL_PY = """import sys
sys.path.insert(0, {site!r})  # numpy, from the Triton venv (the stub's Python is the system's)
import numpy as np
import triton_python_backend_utils as pb_utils

W = np.load({weights!r})


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "features").as_numpy()
            if x.ndim != 2 or x.shape[1] != 4:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"unexpected shape {{list(x.shape)}}")))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("scores", (x @ W).astype(np.float32))]))
        return out
"""


class Triton:
    """A real tritonserver on 127.0.0.1 serving `repo` in explicit model-control mode."""

    def __init__(self, repo: Path, backends: Path, log: Path):
        home = TRITON_VENV / "lib" / PY / "site-packages" / "pytriton" / "tritonserver"
        self.http, self.grpc, metrics = _free_port(), _free_port(), _free_port()
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["LD_LIBRARY_PATH"] = str(home.parent.parent / "nvidia_pytriton.libs")
        self.proc = subprocess.Popen(
            [str(home / "bin" / "tritonserver"), f"--model-repository={repo}", f"--backend-directory={backends}",
             f"--http-port={self.http}", f"--grpc-port={self.grpc}", f"--metrics-port={metrics}", "--http-address=127.0.0.1",
             "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", "--model-control-mode=explicit", "--load-model=m",
             "--allow-gpu-metrics=false", "--exit-timeout-secs=5"],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 120) -> None:
        Server.wait_ready(self, timeout)

    def stop(self) -> None:
        Server.stop(self)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from tests.serving.test_serve_repository import _matmul_file

    home = TRITON_VENV / "lib" / PY / "site-packages" / "pytriton" / "tritonserver"
    assert (home / "bin" / "tritonserver").is_file(), f"no tritonserver under {TRITON_VENV}: run make setup"
    root = tmp_path_factory.mktemp("conformance")
    backends = root / "backends" / "python"  # the backend beside the stub built for this Python's version
    backends.mkdir(parents=True)
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy(home / "backends" / "python" / f, backends / f)
    shutil.copy(home / "python_backend_stubs" / PY[6:] / "triton_python_backend_stub", backends / "triton_python_backend_stub")
    np.save(root / "w.npy", W)
    (root / "triton" / "m" / "1").mkdir(parents=True)
    (root / "triton" / "m" / "config.pbtxt").write_text(CONFIG)
    (root / "triton" / "m" / "1" / "model.py").write_text(
        MODEL_PY.format(site=str(TRITON_VENV / "lib" / PY / "site-packages"), weights=str(root / "w.npy")))
    _matmul_file(root / "ours" / "m" / "1" / "model.onnx", 4, 3, 1)  # the same seed: the same weights as W
    triton = Triton(root / "triton", root / "backends", root / "triton.log")
    ours = Server(root / "ours", "--model-control", "explicit", log=root / "ours.log")
    try:
        triton.wait_ready()
        ours.wait_ready()
        yield {"triton": triton, "modelport": ours}
    finally:
        triton.stop()
        ours.stop()


def _outcome(call):
    """What a client sees: ('ok', value) or ('error', HTTP or gRPC status)."""
    from tritonclient.utils import InferenceServerException

    try:
        return "ok", call()
    except InferenceServerException as e:
        return "error", str(e.status())


def _calls(server) -> dict:
    """Each call's outcome on `server`, in order (the load and unload change its state)."""
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    h = http.InferenceServerClient(f"127.0.0.1:{server.http}")
    g = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8

    def infer(client, module, data, dtype="FP32", model="m", binary=True):
        i = module.InferInput("features", list(data.shape), dtype)
        i.set_data_from_numpy(data, **({"binary_data": binary} if module is http else {}))
        r = client.infer(model, [i])
        version = r.get_response()["model_version"] if module is http else r.get_response().model_version
        return version, np.round(r.as_numpy("scores"), 5).tolist()

    def index(client, module):
        rows = client.get_model_repository_index()
        rows = rows if module is http else [{"name": m.name, "version": m.version, "state": m.state} for m in rows.models]
        return sorted((r["name"], r.get("version", ""), r.get("state", "")) for r in rows)

    def stats(client, module):
        """The fields of the model's statistics a scaler reads, and its success count so far."""
        if module is http:
            row = client.get_inference_statistics("m")["model_stats"][0]
            return sorted(row["inference_stats"]), row["inference_stats"]["success"]["count"]
        row = client.get_inference_statistics("m").model_stats[0]
        return sorted(f.name for f, _ in row.inference_stats.ListFields()), row.inference_stats.success.count

    out = {}
    for label, client, module in (("http", h, http), ("grpc", g, grpc)):
        out[f"{label}.live"] = _outcome(client.is_server_live)
        out[f"{label}.ready"] = _outcome(client.is_server_ready)
        out[f"{label}.model_ready"] = _outcome(lambda c=client: c.is_model_ready("m"))
        out[f"{label}.model_ready_v1"] = _outcome(lambda c=client: c.is_model_ready("m", "1"))
        out[f"{label}.model_ready_v9"] = _outcome(lambda c=client: c.is_model_ready("m", "9"))
        out[f"{label}.unknown_ready"] = _outcome(lambda c=client: c.is_model_ready("nope"))
        out[f"{label}.index"] = _outcome(lambda c=client, m=module: index(c, m))
        out[f"{label}.infer"] = _outcome(lambda c=client, m=module: infer(c, m, x))
        if module is http:
            out["http.infer_json"] = _outcome(lambda: infer(h, http, x, binary=False))
        out[f"{label}.wrong_datatype"] = _outcome(lambda c=client, m=module: infer(c, m, x.astype(np.int32), "INT32"))
        out[f"{label}.wrong_shape"] = _outcome(lambda c=client, m=module: infer(c, m, np.ones((2, 5), np.float32)))
        out[f"{label}.unknown_model"] = _outcome(lambda c=client, m=module: infer(c, m, x, model="nope"))
        out[f"{label}.stats"] = _outcome(lambda c=client, m=module: stats(c, m))
        meta = client.get_model_metadata("m")
        meta = meta if module is http else {"name": meta.name, "platform": meta.platform,
                                            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs],
                                            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs]}
        out[f"{label}.metadata.io"] = ("ok", [(t["name"], t["datatype"], list(t["shape"])) for t in meta["inputs"] + meta["outputs"]])
        out["metadata.platform"] = ("ok", meta["platform"])
        out[f"{label}.unload"] = _outcome(lambda c=client: c.unload_model("m") or "done")
        deadline = time.monotonic() + 30  # Triton answers an unload before it finishes (UNLOADING); modelport once it has
        while any(state == "UNLOADING" for *_, state in index(client, module)) and time.monotonic() < deadline:
            time.sleep(0.2)
        out[f"{label}.ready_after_unload"] = _outcome(lambda c=client: c.is_model_ready("m"))
        out[f"{label}.index_after_unload"] = _outcome(lambda c=client, m=module: index(c, m))
        out[f"{label}.infer_after_unload"] = _outcome(lambda c=client, m=module: infer(c, m, x))
        out[f"{label}.load"] = _outcome(lambda c=client: c.load_model("m") or "done")
        out[f"{label}.ready_after_load"] = _outcome(lambda c=client: c.is_model_ready("m"))
        out[f"{label}.infer_after_load"] = _outcome(lambda c=client, m=module: infer(c, m, x))
    g.close()
    h.close()
    return out


def test_the_same_client_calls_behave_the_same_as_against_triton(servers):
    triton, ours = _calls(servers["triton"]), _calls(servers["modelport"])
    assert triton["http.infer"][0] == "ok" and triton["http.infer"][1][0] == "1", triton  # the real server answered
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    assert triton["grpc.infer"][1][1] == np.round(x @ W, 5).tolist()
    differ = {k: (triton[k], ours.get(k)) for k in triton if triton[k] != ours.get(k) and k not in KEPT}
    assert not differ, "\n".join(f"{k}: triton {t} / modelport {o}" for k, (t, o) in differ.items())
    assert set(triton) == set(ours)
