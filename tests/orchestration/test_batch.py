"""The batch's pieces without a CLI: manifest resolution, keys, and a Ray worker's output returned to the driver."""

from __future__ import annotations

import json
import shutil

import pytest

from modelport.errors import BadInputError
from modelport.orchestration.batch import job_key, load_manifest, tool_versions
from modelport.orchestration.batch_job import parse_size
from modelport.orchestration.batch_ray import _remote_job, _unpack


def test_manifest_entries_become_convert_arguments(tmp_path):
    (tmp_path / "m.yaml").write_text(
        "defaults: {to: [onnx, ort], timeout: 60, tolerances: {atol: 1e-4}}\n"
        "models:\n"
        "  - sub/model.onnx\n"
        "  - {source: zoo:cnn_small, name: cnn, input: ['input:batch,3,64,64'], value: ['sr=16000'], data: d.npz,\n"
        "     tolerances: {outputs: {probs: {atol: 0.1}}}, package: [triton], args: ['--opset', '17'], memory: 2GiB}\n")
    plain, cnn = load_manifest(tmp_path / "m.yaml")
    assert plain.name == "model" and plain.source == str(tmp_path / "sub" / "model.onnx") and plain.timeout == 60
    assert plain.argv == ["--to", "onnx,ort", "--atol", "1e-4"]
    assert cnn.argv == ["--to", "onnx,ort", "--input", "input:batch,3,64,64", "--value", "sr=16000", "--data", str(tmp_path / "d.npz"),
                        "--package", "triton", "--atol", "probs=0.1", "--opset", "17"]
    assert cnn.memory == 2 * 2**30 and cnn.inputs == [str(tmp_path / "d.npz")]


def test_sizes_and_keys(tmp_path):
    assert parse_size("512MiB", "m") == 512 * 2**20 and parse_size("2G", "m") == 2 * 10**9 and parse_size(1000, "m") == 1000
    with pytest.raises(BadInputError, match="bad m '8 parsecs'"):
        parse_size("8 parsecs", "m")
    (tmp_path / "a.onnx").write_bytes(b"one")
    (tmp_path / "m.yaml").write_text("models: [a.onnx]\n")
    job, = load_manifest(tmp_path / "m.yaml")
    v = tool_versions()
    key = job_key(job, v)
    assert key == job_key(job, v) and key != job_key(job, {**v, "onnx": "0.0"})
    (tmp_path / "a.onnx").write_bytes(b"two")
    assert job_key(job, v) != key


def test_a_worker_without_the_shared_folder_returns_the_model_folder(tiny_onnx, tmp_path):
    shutil.copy(tiny_onnx, tmp_path / "m.onnx")
    (tmp_path / "m.yaml").write_text("models: [m.onnx]\n")
    job, = load_manifest(tmp_path / "m.yaml")
    driver_out = tmp_path / "out"
    (driver_out / ".batch").mkdir(parents=True)
    entry = _remote_job(job, str(tmp_path / "not-shared"), False, ".batch/token")  # the worker cannot see the driver's folder
    assert entry["status"] == "ok" and isinstance(entry["_archive"], bytes)
    assert not (tmp_path / "not-shared").exists()
    entry = _unpack(entry, driver_out)
    assert entry["returned"] is True and "_archive" not in entry
    assert json.loads((driver_out / "m" / "report.json").read_text())["status"] == "ok"
    assert (driver_out / "m" / "model.onnx").is_file() and (driver_out / ".batch" / "m.log").is_file()
