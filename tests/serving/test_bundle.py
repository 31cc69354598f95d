"""Loading what packaging reads: convert output folders, bare .onnx files, and bad inputs."""

from __future__ import annotations

import json
import shutil

import pytest

from modelport.errors import BadInputError, UnsafeInputError
from modelport.packaging.bundle import load_artifacts, safe_name


def test_out_dir_contract_and_artifacts(cnn_out):
    arts = load_artifacts(cnn_out)
    assert arts.files["onnx"] == cnn_out / "model.onnx"
    assert arts.inputs[0].layout == "NCHW" and arts.inputs[0].preprocess.std == [0.229, 0.224, 0.225]
    assert arts.batch_axis() == "batch"
    assert arts.sample_inputs(batch=3)["input"].shape == (3, 3, 64, 64)


def test_bare_onnx_written_by_modelport_keeps_its_contract(cnn_out):
    arts = load_artifacts(cnn_out / "model.onnx")
    assert arts.inputs[0].preprocess.mean == [0.485, 0.456, 0.406] and arts.inputs[0].shape[0] == "batch"


def test_bare_onnx_from_elsewhere_uses_the_graph(tiny_onnx):
    arts = load_artifacts(tiny_onnx)
    assert [(s.name, s.shape) for s in arts.inputs] == [("x", ["batch", 8])] and arts.name == "tiny"


def test_report_paths_outside_the_folder_refused(mlp_out, tmp_path):
    bad = tmp_path / "out"
    shutil.copytree(mlp_out, bad)
    report = json.loads((bad / "report.json").read_text())
    report["artifacts"][0]["path"] = "../../etc/passwd"
    (bad / "report.json").write_text(json.dumps(report))
    with pytest.raises(UnsafeInputError):
        load_artifacts(bad)


@pytest.mark.parametrize("content, name", [(b"not json", "report.json"), (b'{"status": "failed"}', "report.json")])
def test_bad_out_dirs(tmp_path, content, name):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(BadInputError):
        load_artifacts(tmp_path)


def test_bare_file_without_contract(tmp_path):
    (tmp_path / "model.plan").write_bytes(b"\x00" * 16)
    with pytest.raises(BadInputError, match="no I/O contract"):
        load_artifacts(tmp_path / "model.plan")


def test_safe_name():
    assert safe_name("resnet-18.v1") == "resnet-18_v1" and safe_name("3d") == "m_3d"
