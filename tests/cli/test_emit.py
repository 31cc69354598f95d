"""`modelport emit` and the deployment options of `convert`: exit codes, outputs, stdout discipline."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import tree
from tests.emitters.models import det_model, save_onnx


def test_emit_tflite_and_ort(cli, tiny_onnx, tmp_path):
    out = tmp_path / "out"
    r = cli("emit", tiny_onnx, "--to", "tflite,ort", "-o", out, "--json", "-q")
    assert r.exit_code == 0, r
    report = r.json()  # stdout holds only the report: onnx2tf's output was kept off it
    assert report["command"] == "emit" and [a["target"] for a in report["artifacts"]] == ["tflite", "ort"]
    assert all(p["ok"] for p in report["parity"])
    assert {"model.tflite", "model.ort", "report.json"} <= set(tree(out))


def test_emit_tensorrt_plan_only_and_exit_5(cli, tiny_onnx, tmp_path):
    out = tmp_path / "plan"
    r = cli("emit", tiny_onnx, "--to", "tensorrt", "--plan-only", "-o", out, "--trt-shapes", "x:1x8:4x8:16x8", "-q")
    assert r.exit_code == 0, r
    plan = json.loads((out / "tensorrt/plan.json").read_text())
    assert plan["profiles"][0] == {"name": "x", "min": [1, 8], "opt": [4, 8], "max": [16, 8], "source": "user"}
    assert "--minShapes=x:1x8" in (out / "tensorrt/trtexec.sh").read_text()
    out2 = tmp_path / "nogpu"
    r = cli("emit", tiny_onnx, "--to", "tensorrt", "-o", out2)
    assert r.exit_code == 5 and "modelport[tensorrt]" in r.stderr and "--plan-only" in r.stderr
    assert not out2.exists()


def test_wrong_profile_name_is_refused(cli, tiny_onnx, tmp_path):
    r = cli("emit", tiny_onnx, "--to", "tensorrt", "--plan-only", "-o", tmp_path / "o", "--trt-shapes", "input:1x8:4x8:16x8")
    assert r.exit_code == 2 and "its inputs are ['x']" in r.stderr and not (tmp_path / "o").exists()


def test_unsupported_op_exit_2_naming_the_node(cli, tmp_path):
    src = save_onnx(det_model(), tmp_path / "src", "det.onnx")
    r = cli("convert", src, "--to", "tensorrt", "--plan-only", "-o", tmp_path / "o")
    assert r.exit_code == 2 and "det_node (Det)" in r.stderr and not (tmp_path / "o").exists()


def test_convert_tflite_layout_option(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "--to", "tflite", "--tflite-layout", "nchw", "-o", tmp_path / "o")
    assert r.exit_code == 2 and "known: source, nhwc" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None,
                    reason="with TensorRT present the bytes below are not a valid engine; covered on GPU machines")
def test_inspect_plan_without_tensorrt(cli, tiny_onnx, tmp_path):
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"\x01" * 128)
    r = cli("inspect", plan, "--json")
    assert r.exit_code == 0 and r.json()["format"] == "tensorrt-engine" and "tensorrt" in r.json()["note"]


def test_emit_with_a_pinned_control_input(cli, tmp_path):
    from tests.test_samples import _control_input_model

    model = _control_input_model(tmp_path / "vad.onnx")
    r = cli("emit", model, "--to", "ort", "-o", tmp_path / "bad")
    assert r.exit_code == 2 and "['sr']" in r.stderr and "--value NAME=V" in r.stderr, r
    r = cli("emit", model, "--to", "ort", "--value", "sr=16000", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0 and r.json()["contract"]["given_inputs"] == ["sr"], r
