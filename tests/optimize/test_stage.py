"""`convert --precision` with ONNX and non-ONNX targets together: the ONNX artifact really is at
the precision the report says, and TFLite gets the FP32 graph its converter can take."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(3)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (24 + i, 30, 3), dtype=np.uint8)).save(d / f"{i}.png")
    # a calibration set covers black and white frames too: validation judges them (structured samples)
    for name, value in (("black", 0), ("white", 255)):
        Image.fromarray(np.full((28, 30, 3), value, np.uint8)).save(d / f"{name}.png")
    return d


def _ops(path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_int8_onnx_and_tflite_with_an_optimisation_level(cli, images, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", "zoo:cnn_small", "--to", "onnx,tflite", "-o", out, "--optimize", "extended",
            "--precision", "int8", "--calibration", images, "--json")
    assert r.exit_code == 0, r
    rep = json.loads((out / "report.json").read_text())
    assert {a["target"]: a["precision"] for a in rep["artifacts"]} == {"onnx": "int8", "tflite": "int8"}
    # the optimisation stage ran the FP32 passes once, then the INT8 pass for the ONNX target (once; the
    # TFLite converter quantises the FP32 IR itself): a real QDQ model, validated on the calibration images
    assert [s["pass"] for s in rep["stages"] if s.get("pass", "").startswith("int8")] == ["int8-static"]
    assert {"QuantizeLinear", "DequantizeLinear"} <= _ops(out / "model.onnx")
    checks = {s["name"]: s for s in rep["stages"] if s["name"].startswith("validate:")}
    assert {"validate:onnx", "validate:tflite"} <= set(checks)
    assert all(p["ok"] for p in rep["parity"])


def test_auto_with_a_non_onnx_target_is_refused(cli, tmp_path):
    r = cli("convert", "zoo:cnn_small", "--to", "onnx,tflite", "-o", tmp_path / "out", "--optimize", "auto", "--json")
    assert r.exit_code == 2, r
    assert "auto picks an onnxruntime variant" in r.json()["error"]["message"]
    assert not (tmp_path / "out").exists()
