"""TorchServe: the .mar layout, safe member names, and a real TorchServe serving a real request."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest

from modelport.convert.parity import Tolerance, compare
from modelport.errors import UnsafeInputError
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.serving import PackageOptions
from modelport.serving.bundle import load_artifacts
from modelport.serving.torchserve import package, safe_arcname, write_mar
from tests.serving.conftest import MEAN, STD

TOL = Tolerance(1e-4, 1e-3, 0.9999)


@pytest.fixture(scope="module")
def bundle(cnn_out, tmp_path_factory):
    out = tmp_path_factory.mktemp("ts") / "bundle"
    out.mkdir()
    b = package(load_artifacts(cnn_out), out, PackageOptions(model_name="cnn"))
    return out, b


def test_mar_is_what_the_archiver_writes(bundle, cnn_out):
    out, b = bundle
    mar = out / "model-store" / "cnn.mar"
    with zipfile.ZipFile(mar) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("MAR-INF/MANIFEST.json"))
        meta = json.loads(z.read("modelport.json"))
    assert {"MAR-INF/MANIFEST.json", "model.onnx", "modelport_handler.py", "modelport.json", "requirements.txt"} <= names
    assert all(not n.startswith("/") and ".." not in n.split("/") for n in names)
    assert manifest["runtime"] == "python" and manifest["archiverVersion"] == "0.12.0"
    assert manifest["model"] == {"modelName": "cnn", "serializedFile": "model.onnx", "handler": "modelport_handler.py",
                                 "modelVersion": "1", "requirementsFile": "requirements.txt"}
    # the handler's contract is the converter's contract, not a re-derived copy
    contract = json.loads((cnn_out / "report.json").read_text())["contract"]
    assert meta["inputs"] == contract["inputs"] and meta["outputs"] == contract["outputs"]
    assert meta["inputs"][0]["preprocess"]["mean"] == MEAN
    readme = (out / "README.md").read_text()
    assert "torchserve --start" in readme and "curl" in readme and "/predictions/cnn" in readme
    assert b.details["mar"] == "model-store/cnn.mar"


@pytest.mark.parametrize("name", ["../evil.py", "/etc/passwd", "a/../../b", "a\\..\\b", ""])
def test_unsafe_member_names_refused(tmp_path, name):
    with pytest.raises(UnsafeInputError):
        safe_arcname(name)
    with pytest.raises(UnsafeInputError):
        write_mar(tmp_path / "x.mar", {"MAR-INF/MANIFEST.json": b"{}", name: b"x"})
    assert not (tmp_path / "x.mar").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 10) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode(errors="replace")}


@pytest.mark.skipif(shutil.which("java") is None, reason="TorchServe needs Java")
def test_real_torchserve_serves_the_archive(bundle, cnn_out, tmp_path):
    out, _ = bundle
    bindir = str(Path(sys.executable).parent)
    if not (Path(bindir) / "torchserve").exists():
        pytest.fail("torchserve is not installed in the test environment (pip install torchserve==0.12.0)")
    ports = [_free_port() for _ in range(3)]
    cfg = tmp_path / "config.properties"
    cfg.write_text("\n".join([
        f"inference_address=http://127.0.0.1:{ports[0]}", f"management_address=http://127.0.0.1:{ports[1]}",
        f"metrics_address=http://127.0.0.1:{ports[2]}", "disable_token_authorization=true",
        "install_py_dep_per_model=false", "default_workers_per_model=1", "",
    ]))
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    cmd = [str(Path(bindir) / "torchserve"), "--start", "--foreground", "--ncs", "--disable-token-auth",
           "--model-store", str(out / "model-store"), "--ts-config", str(cfg), "--models", "cnn=cnn.mar"]
    log = open(tmp_path / "torchserve.out", "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        arts = load_artifacts(cnn_out)
        feeds = arts.sample_inputs(batch=2)
        expected = OnnxRuntimeRunner(cnn_out / "model.onnx").run(feeds)
        url = f"http://127.0.0.1:{ports[0]}/predictions/cnn"
        body = {"inputs": {k: v.tolist() for k, v in feeds.items()}, "preprocessed": True}
        deadline = time.monotonic() + 60
        status, reply = 0, {}
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"torchserve exited with {proc.returncode}: {(tmp_path / 'torchserve.out').read_text()[-3000:]}")
            try:
                status, reply = _post(url, body)
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        assert status == 200, (status, reply, (tmp_path / "torchserve.out").read_text()[-3000:])
        got = {k: np.asarray(v, dtype=np.float32) for k, v in reply["outputs"].items()}
        result = compare(expected, got, TOL, hop="torchserve")
        assert result.ok, result.summary()

        # raw pixels: the handler applies the contract's mean/std itself
        raw = np.random.default_rng(3).uniform(0, 1, size=(1, 3, 64, 64)).astype(np.float32)
        pre = (raw - np.asarray(MEAN, np.float32).reshape(1, 3, 1, 1)) / np.asarray(STD, np.float32).reshape(1, 3, 1, 1)
        status, reply = _post(url, {"inputs": {"input": raw.tolist()}})
        assert status == 200, reply
        want = OnnxRuntimeRunner(cnn_out / "model.onnx").run({"input": pre.astype(np.float32)})
        result = compare(want, {k: np.asarray(v, np.float32) for k, v in reply["outputs"].items()}, TOL, hop="torchserve raw")
        assert result.ok, result.summary()
    finally:
        subprocess.run([str(Path(bindir) / "torchserve"), "--stop", "--foreground"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=30)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def test_handler_postprocessing_modes():
    from modelport.serving.torchserve_handler import ModelportHandler

    h = ModelportHandler()
    v = np.array([[1.0, 3.0, 2.0]], np.float32)
    h.meta = {"serving": {"postprocess": "topk=2"}}
    assert h.postprocess({"y": v}) == {"outputs": {"y": {"indices": [[1, 2]], "values": [[3.0, 2.0]]}}}
    h.meta = {"serving": {"postprocess": "softmax"}}
    probs = np.asarray(h.postprocess({"y": v})["outputs"]["y"])
    assert probs.shape == (1, 3) and abs(probs.sum() - 1) < 1e-6 and probs.argmax() == 1


def test_bgr_models_get_channels_reversed():
    from modelport.serving.torchserve_handler import ModelportHandler

    spec = {"name": "x", "dtype": "float32", "layout": "NHWC", "preprocess": {"channel_order": "BGR", "scale": 0.5}}
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    out = ModelportHandler().preprocess_one(spec, x)
    np.testing.assert_array_equal(out, x[..., ::-1] * 0.5)
