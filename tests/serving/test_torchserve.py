"""TorchServe: the .mar layout, safe member names, and a real TorchServe serving a real request."""

from __future__ import annotations

import contextlib
import importlib.util
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

from modelport.errors import BadInputError, UnsafeInputError
from modelport.packaging import PackageOptions
from modelport.packaging.bundle import load_artifacts
from modelport.packaging.torchserve import package, safe_arcname, write_mar
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import Tolerance, compare
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
    # reference_varies is a finding of the reference run recorded in the report, not part of the I/O contract
    outputs = [{k: v for k, v in o.items() if k != "reference_varies"} for o in contract["outputs"]]
    assert meta["inputs"] == contract["inputs"] and meta["outputs"] == outputs
    assert meta["inputs"][0]["preprocess"]["mean"] == MEAN
    readme = (out / "README.md").read_text()
    assert "torchserve --start" in readme and "curl" in readme and "/predictions/cnn" in readme
    assert b.details["mar"] == "model-store/cnn.mar"


def properties(path: Path) -> dict[str, str]:
    """A Java .properties file as TorchServe reads it (key=value lines, '#' comments)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))


def test_only_inference_listens_beyond_the_host_and_token_auth_stays_on(bundle):
    from urllib.parse import urlsplit

    out, _ = bundle
    props = properties(out / "config.properties")
    assert urlsplit(props["inference_address"]).port == 8080
    assert urlsplit(props["management_address"]).hostname == "127.0.0.1"
    assert urlsplit(props["metrics_address"]).hostname == "127.0.0.1"
    assert props["disable_token_authorization"] == "false" and props["enable_model_api"] == "false"
    assert int(props["token_expiration_min"]) >= 60 * 24 * 365
    readme = (out / "README.md").read_text()
    assert "--disable-token-auth" not in readme
    assert "key_file.json" in readme and 'localhost:8080/predictions/cnn -H "Authorization: Bearer $KEY"' in readme


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


def _post(url: str, body: dict, timeout: float = 10, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode(errors="replace")}


def _bundle_config(bundle: Path, ports: list[int]) -> str:
    """The bundle's own config.properties, moved to free ports on 127.0.0.1 and otherwise unchanged."""
    lines = []
    for line in (bundle / "config.properties").read_text().splitlines():
        key, sep, value = line.partition("=")
        if key in ("inference_address", "management_address", "metrics_address"):
            port = ports[("inference_address", "management_address", "metrics_address").index(key)]
            value = f"http://127.0.0.1:{port}"
        lines.append(f"{key}={value}" if sep else line)
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _torchserve(bundle: Path, name: str, tmp_path: Path):
    """A real TorchServe on free ports serving `name`.mar with the bundle's config (token auth on).

    Yields the prediction URL, the process, its log and the inference key TorchServe wrote into
    key_file.json in the folder it started from.
    """
    bindir = str(Path(sys.executable).parent)
    if not (Path(bindir) / "torchserve").exists():
        pytest.fail("torchserve is not installed in the test environment (pip install torchserve==0.12.0)")
    if shutil.which("java") is None:
        pytest.fail("TorchServe needs Java 17 on PATH (apt-get install openjdk-17-jre-headless)")
    ports = [_free_port() for _ in range(3)]
    cfg = tmp_path / "config.properties"
    cfg.write_text(_bundle_config(bundle, ports))
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    cmd = [str(Path(bindir) / "torchserve"), "--start", "--foreground", "--ncs",
           "--model-store", str(bundle / "model-store"), "--ts-config", str(cfg), "--models", f"{name}={name}.mar"]
    log_path = tmp_path / "torchserve.out"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        key_file = tmp_path / "key_file.json"
        deadline = time.monotonic() + 60
        while not key_file.is_file() or not key_file.read_text().strip().endswith("}"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"torchserve wrote no key_file.json: {log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        key = json.loads(key_file.read_text())["inference"]["key"]
        yield f"http://127.0.0.1:{ports[0]}/predictions/{name}", proc, log_path, key
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


def _first_reply(url: str, body: dict, proc, log_path: Path, key: str) -> dict:
    """POST until the model is up (60 s at most); the first 200 reply."""
    deadline = time.monotonic() + 60
    status, reply = 0, {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"torchserve exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
        try:
            status, reply = _post(url, body, key=key)
            if status == 200:
                return reply
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"no 200 reply: {status} {reply} {log_path.read_text()[-3000:]}")


def _check_serving(url: str, proc, log_path: Path, reference: Path, key: str) -> None:
    """A preprocessed batch of 2 and a raw-pixel request, both compared with onnxruntime on `reference`.

    Token authorisation is on: the same request without the inference key is refused.
    """
    arts = load_artifacts(reference.parent)
    feeds = arts.sample_inputs(batch=2)
    expected = OnnxRuntimeRunner(reference).run(feeds)
    body = {"inputs": {k: v.tolist() for k, v in feeds.items()}, "preprocessed": True}
    reply = _first_reply(url, body, proc, log_path, key)
    status, refused = _post(url, body)
    assert status in (400, 401, 403) and "Token Authorization failed" in refused["error"], (status, refused)
    got = {k: np.asarray(v, dtype=np.float32) for k, v in reply["outputs"].items()}
    result = compare(expected, got, TOL, hop="torchserve")
    assert result.ok, result.summary()

    # raw pixels: the handler applies the contract's mean/std itself
    raw = np.random.default_rng(3).uniform(0, 1, size=(1, 3, 64, 64)).astype(np.float32)
    pre = (raw - np.asarray(MEAN, np.float32).reshape(1, 3, 1, 1)) / np.asarray(STD, np.float32).reshape(1, 3, 1, 1)
    status, reply = _post(url, {"inputs": {"input": raw.tolist()}}, key=key)
    assert status == 200, reply
    want = OnnxRuntimeRunner(reference).run({"input": pre.astype(np.float32)})
    result = compare(want, {k: np.asarray(v, np.float32) for k, v in reply["outputs"].items()}, TOL, hop="torchserve raw")
    assert result.ok, result.summary()


def test_real_torchserve_serves_the_archive(bundle, cnn_out, tmp_path):
    out, _ = bundle
    with _torchserve(out, "cnn", tmp_path) as (url, proc, log_path, key):
        _check_serving(url, proc, log_path, cnn_out / "model.onnx", key)
        # the Kubernetes probe (reads the key TorchServe wrote, calls /ping with it) passes against this server
        from modelport.packaging.docker import SERVERS

        probe = list(SERVERS["torchserve"].probe_exec)
        probe[-1] = (probe[-1].replace("/home/model-server/key_file.json", str(tmp_path / "key_file.json"))
                     .replace("127.0.0.1:8080", url.split("/")[2]))
        assert subprocess.run([sys.executable, *probe[1:]], capture_output=True, timeout=30).returncode == 0
        wrong = probe[-1].replace("['inference']['key']", "['API']['key']")
        assert subprocess.run([sys.executable, "-c", wrong], capture_output=True, timeout=30).returncode != 0


@pytest.fixture(scope="module")
def torch_bundle(cnn_pt_out, tmp_path_factory):
    out = tmp_path_factory.mktemp("ts_torch") / "bundle"
    out.mkdir()
    b = package(load_artifacts(cnn_pt_out), out, PackageOptions(model_name="cnnpt"))
    return out, b


def test_pytorch_code_archive_layout(torch_bundle, cnn_pt_out):
    out, b = torch_bundle
    assert b.details["runtime"] == "torch"  # the default when the bundle holds the emitted PyTorch code
    with zipfile.ZipFile(out / "model-store" / "cnnpt.mar") as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("MAR-INF/MANIFEST.json"))
        meta = json.loads(z.read("modelport.json"))
        assert z.read("model.py") == (cnn_pt_out / "pytorch" / "model.py").read_bytes()
        reqs = z.read("requirements.txt").decode()
    assert {"model.py", "model.safetensors", "modelport_handler.py", "modelport.json"} <= names
    assert "model.onnx" not in names
    assert manifest["model"]["serializedFile"] == "model.safetensors"
    assert meta["serving"] == {"runtime": "torch", "model_file": "model.safetensors", "code_file": "model.py",
                               "postprocess": "none", "preprocess": True, "precision": "fp32"}
    assert "safetensors==0.7.0" in reqs and "onnxruntime" not in reqs
    assert "emitted PyTorch code" in (out / "README.md").read_text()


def test_runtime_choice(cnn_pt_out, cnn_out, tmp_path):
    b = package(load_artifacts(cnn_pt_out), tmp_path / "a", PackageOptions(runtime="onnxruntime"))
    with zipfile.ZipFile(b.files[0]) as z:
        assert "model.onnx" in z.namelist() and "model.py" not in z.namelist()
    with pytest.raises(BadInputError, match="no pytorch artifact"):
        package(load_artifacts(cnn_out), tmp_path / "b", PackageOptions(runtime="torch"))
    with pytest.raises(BadInputError, match="bad --runtime"):
        package(load_artifacts(cnn_out), tmp_path / "c", PackageOptions(runtime="tensorflow"))


def _handle_in_process(mar: Path, folder: Path, feeds: dict) -> dict:
    """The archive's handler as TorchServe calls it, on the extracted archive (no server needed)."""
    from types import SimpleNamespace

    with zipfile.ZipFile(mar) as z:
        z.extractall(folder)
    spec = importlib.util.spec_from_file_location(f"extracted_handler_{folder.name}", folder / "modelport_handler.py")
    handler_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(handler_module)
    handler = handler_module.ModelportHandler()
    context = SimpleNamespace(system_properties={"model_dir": str(folder), "gpu_id": None})
    body = json.dumps({"inputs": {k: v.tolist() for k, v in feeds.items()}, "preprocessed": True}).encode()
    (reply,) = handler.handle([{"body": body}], context)
    return {k: np.asarray(v, np.float32) for k, v in reply["outputs"].items()}


def test_torch_handler_runs_the_archive_in_process(torch_bundle, cnn_pt_out, tmp_path):
    out, _ = torch_bundle
    feeds = load_artifacts(cnn_pt_out).sample_inputs(batch=3)
    got = _handle_in_process(out / "model-store" / "cnnpt.mar", tmp_path, feeds)
    result = compare(OnnxRuntimeRunner(cnn_pt_out / "model.onnx").run(feeds), got, TOL, hop="handler")
    assert result.ok, result.summary()


def test_ort_format_model_is_served_by_the_onnxruntime_handler(mlp_edge_out, tmp_path):
    """A folder with model.ort (and model.tflite) but no .onnx: the .mar carries model.ort."""
    b = package(load_artifacts(mlp_edge_out), tmp_path / "bundle", PackageOptions(model_name="mlp"))
    assert b.details["runtime"] == "onnxruntime"
    mar = tmp_path / "bundle" / "model-store" / "mlp.mar"
    with zipfile.ZipFile(mar) as z:
        assert "model.ort" in z.namelist() and "model.tflite" not in z.namelist()
        assert json.loads(z.read("MAR-INF/MANIFEST.json"))["model"]["serializedFile"] == "model.ort"
    feeds = load_artifacts(mlp_edge_out).sample_inputs(batch=2)
    got = _handle_in_process(mar, tmp_path / "x", feeds)
    want = OnnxRuntimeRunner(mlp_edge_out.parent / "src" / "mlp.onnx").run(feeds)
    result = compare(want, got, TOL, hop="ort handler")
    assert result.ok, result.summary()


def test_tflite_only_is_refused(mlp_edge_out, tmp_path):
    import shutil as sh

    folder = tmp_path / "tfl"
    sh.copytree(mlp_edge_out, folder)
    (folder / "model.ort").unlink()
    report = json.loads((folder / "report.json").read_text())
    report["artifacts"] = [a for a in report["artifacts"] if a["target"] == "tflite"]
    (folder / "report.json").write_text(json.dumps(report))
    with pytest.raises(BadInputError, match=r"TorchServe cannot serve .*TFLite.*TorchServe takes ONNX"):
        package(load_artifacts(folder), tmp_path / "b", PackageOptions())


def test_real_torchserve_serves_the_pytorch_code(torch_bundle, cnn_pt_out, tmp_path):
    out, _ = torch_bundle
    with _torchserve(out, "cnnpt", tmp_path) as (url, proc, log_path, key):
        _check_serving(url, proc, log_path, cnn_pt_out / "model.onnx", key)


def test_handler_postprocessing_modes():
    from modelport.packaging.torchserve_handler import ModelportHandler

    h = ModelportHandler()
    v = np.array([[1.0, 3.0, 2.0]], np.float32)
    h.meta = {"serving": {"postprocess": "topk=2"}}
    assert h.postprocess({"y": v}) == {"outputs": {"y": {"indices": [[1, 2]], "values": [[3.0, 2.0]]}}}
    h.meta = {"serving": {"postprocess": "softmax"}}
    probs = np.asarray(h.postprocess({"y": v})["outputs"]["y"])
    assert probs.shape == (1, 3) and abs(probs.sum() - 1) < 1e-6 and probs.argmax() == 1


def test_bgr_models_get_channels_reversed():
    from modelport.packaging.torchserve_handler import ModelportHandler

    spec = {"name": "x", "dtype": "float32", "layout": "NHWC", "preprocess": {"channel_order": "BGR", "scale": 0.5}}
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    out = ModelportHandler().preprocess_one(spec, x)
    np.testing.assert_array_equal(out, x[..., ::-1] * 0.5)


def _pinned(text: str) -> dict[str, str]:
    """requirements.txt -> {distribution: version}; every requirement line must be an exact `==` pin."""
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version and not any(c in version for c in "<>=!~,; *"), f"not an exact pin: {line!r}"
            out[name] = version
    return out


@pytest.mark.parametrize("fixture, runtime, device", [("cnn_out", "onnxruntime", "cpu"), ("cnn_out", "onnxruntime", "gpu"),
                                                      ("cnn_pt_out", "torch", "cpu"), ("cnn_pt_out", "torch", "gpu")])
def test_requirements_are_the_pins_for_the_image_python(request, tmp_path, fixture, runtime, device):
    """The bundle pins what installs on the image's Python 3.9 (the table), never this machine's versions."""
    from modelport.packaging.torchserve_pins import HANDLER_PINS

    package(load_artifacts(request.getfixturevalue(fixture)), tmp_path, PackageOptions(runtime=runtime, device=device))
    with zipfile.ZipFile(next((tmp_path / "model-store").glob("*.mar"))) as z:
        inside = z.read("requirements.txt").decode()
    outside = (tmp_path / "requirements.txt").read_text()
    assert inside == outside
    assert _pinned(outside) == HANDLER_PINS[(runtime, device)]
    assert "Python 3.9" in outside


def test_models_the_image_onnxruntime_cannot_load_are_refused(tmp_path):
    """onnxruntime 1.19 (the image's) loads IR <= 10 and opset <= 21: a newer model fails at packaging, not in the server."""
    import onnx

    from tests.serving.conftest import write_mlp

    path = write_mlp(tmp_path / "src")
    model = onnx.load(str(path))
    model.opset_import[0].version = 22
    onnx.save(model, str(path))
    with pytest.raises(BadInputError, match=r"onnxruntime 1\.19\.2 loads ONNX IR <= 10 and opset <= 21; this model has IR 8, opset 22"):
        package(load_artifacts(path), tmp_path / "b", PackageOptions())
