"""The runner for generated PyTorch source: imports model.py from its folder in isolation and runs it."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest

from modelport.emitters import EmitOptions
from modelport.emitters.pytorch_code import emit
from modelport.errors import BadInputError
from modelport.ir import IRModel, specs_from_onnx
from modelport.runtimes import get_runner
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner


def _emit(path, out):
    model = onnx.load(str(path))
    ir = IRModel(model, specs_from_onnx(model.graph.input), specs_from_onnx(model.graph.output))
    return emit(ir, out, EmitOptions())


def test_runs_generated_code_like_onnxruntime(tiny_onnx, tmp_path):
    artifact = _emit(tiny_onnx, tmp_path / "a")
    assert artifact.runner == "torch_source"
    runner = get_runner(artifact.runner, artifact.path, **artifact.runner_options)
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    got = runner.run({"x": x})
    want = OnnxRuntimeRunner(tiny_onnx).run({"x": x})
    np.testing.assert_allclose(got["y"], want["y"], atol=1e-5)


def test_two_generated_models_do_not_shadow_each_other(tiny_onnx, tmp_path):
    a = _emit(tiny_onnx, tmp_path / "a")
    model = onnx.load(str(tiny_onnx))
    for t in model.graph.initializer:
        t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t) * 2, t.name))
    other = tmp_path / "src2" / "tiny2.onnx"
    other.parent.mkdir()
    onnx.save(model, str(other))
    b = _emit(other, tmp_path / "b")
    x = np.ones((2, 8), np.float32)
    ya = get_runner("torch_source", a.path, **a.runner_options).run({"x": x})["y"]
    yb = get_runner("torch_source", b.path, **b.runner_options).run({"x": x})["y"]
    assert not np.allclose(ya, yb)
    assert not any(name.startswith("modelport_generated_") for name in sys.modules)


def test_missing_files_are_bad_input(tiny_onnx, tmp_path):
    with pytest.raises(BadInputError, match="no generated model.py"):
        get_runner("torch_source", tmp_path, input_names=["x"])
    artifact = _emit(tiny_onnx, tmp_path / "a")
    (artifact.path / "model.safetensors").unlink()
    with pytest.raises(BadInputError, match="model.safetensors is missing"):
        get_runner("torch_source", artifact.path, input_names=["x"])


def test_missing_feed_is_bad_input(tiny_onnx, tmp_path):
    artifact = _emit(tiny_onnx, tmp_path / "a")
    runner = get_runner("torch_source", artifact.path, **artifact.runner_options)
    with pytest.raises(BadInputError, match="missing inputs"):
        runner.run({})
