"""ORT-format target: model.ort written by onnxruntime, validated in onnxruntime, fp32/fp16/int8."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from modelport.convert import ConvertOptions, convert


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_onnx_to_ort(tiny_onnx, tmp_path, precision):
    out = tmp_path / "out"
    report = convert(tiny_onnx, out, ConvertOptions(targets=["ort"], precision=precision))
    hop = report["parity"][-1]
    assert "ort" in hop["hop"] and hop["ok"]
    art = report["artifacts"][0]
    assert art["path"] == "model.ort" and art["precision"] == precision
    assert (out / "model.ort").read_bytes()[4:8] == b"ORTM"  # the ORT flatbuffer identifier
    assert "ai.onnx;" in (out / "required_operators.config").read_text()
    sess = ort.InferenceSession(str(out / "model.ort"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)
    ref = ort.InferenceSession(str(tiny_onnx), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, atol={"fp32": 1e-5, "fp16": 1e-2, "int8": 0.2}[precision])


def test_pytorch_cnn_to_ort(tmp_path):
    from modelport.zoo_builders.pytorch import cnn_small

    report = convert(cnn_small(), tmp_path / "out", ConvertOptions(targets=["ort", "onnx"], inputs=["x:batch,3,32,32"]))
    assert [a["target"] for a in report["artifacts"]] == ["ort", "onnx"]
    assert all(p["ok"] for p in report["parity"])
