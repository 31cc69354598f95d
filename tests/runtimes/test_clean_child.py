"""Artifacts are validated as their users load them: in a fresh child process that imports only
the artifact's runtime, with that runtime's defaults."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from modelport.errors import ModelportError
from modelport.runtimes import runner_class
from modelport.runtimes.isolated import FRAMEWORKS, IsolatedRunner, blocked_for


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A two-input, two-output model converted to every CPU target that runs here."""
    import torch

    from modelport.orchestration import ConvertOptions, convert

    class TwoByTwo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, a, b):
            h = torch.tanh(self.fc(a) + b)
            return h, torch.log(a * a + 1e-6) - h

    out = tmp_path_factory.mktemp("clean") / "out"
    report = convert(TwoByTwo().eval(), out, ConvertOptions(
        targets=["onnx", "ort", "pytorch", "openvino", "tflite"], inputs=["a:batch,8", "b:batch,8"]))
    return out, report


@pytest.mark.parametrize("target", ["onnx", "ort", "pytorch", "openvino", "tflite"])
def test_every_artifact_is_validated_in_a_child_with_its_runtime_alone(converted, target):
    _, report = converted
    entry = next(a for a in report["artifacts"] if a["target"] == target)
    runner = {"onnx": "onnxruntime", "ort": "onnxruntime", "pytorch": "torch_source"}.get(target, target)
    used = entry["validated_with"]
    assert used["process"] == "child"
    assert used["frameworks"] and set(used["frameworks"]) <= set(runner_class(runner).frameworks()), used
    hop = next(h for h in report["parity"] if h["hop"].startswith(f"pytorch→{target} "))
    assert hop["ok"] and {"random", "zeros", "constant"} <= {s["kind"] for s in hop["samples"]}


def test_an_artifact_that_needs_another_framework_fails_validation(converted, tmp_path):
    """Generated code that reaches for onnxruntime runs where modelport is installed, not where
    only torch is: the clean child says so."""
    out, _ = converted
    folder = tmp_path / "pytorch"
    shutil.copytree(out / "pytorch", folder)
    code = folder / "model.py"
    code.write_text(code.read_text().replace("\nimport torch\n", "\nimport onnxruntime  # noqa\nimport torch\n", 1))
    options = {"input_names": ["a", "b"], "inputs": [{"name": n, "dtype": "float32", "shape": ["batch", 8]} for n in "ab"]}
    feeds = {n: np.ones((2, 8), np.float32) for n in "ab"}
    assert IsolatedRunner("torch_source", folder, **options).run(feeds)  # another child that does not block
    with pytest.raises(ModelportError) as e:
        IsolatedRunner("torch_source", folder, clean=True, **options).run(feeds)
    assert "onnxruntime" in e.value.reason and "only that runtime is installed" in e.value.reason


def test_runs_several_sets_in_one_child(converted):
    out, _ = converted
    runner = IsolatedRunner("onnxruntime", out / "model.onnx", clean=True)
    sets = [{n: np.full((1, 8), v, np.float32) for n in "ab"} for v in (0.0, 1.0, 2.0)]
    outs = runner.run_many(sets)
    assert len(outs) == 3 and runner.modules == ["onnxruntime"]
    assert not np.array_equal(next(iter(outs[0].values())), next(iter(outs[2].values())))


def test_blocked_frameworks_and_environment():
    from modelport.deps import runtime_defaults_env

    assert "tf_keras" in blocked_for("savedmodel") and "tensorflow" not in blocked_for("savedmodel")
    assert set(blocked_for("onnxruntime")) == set(FRAMEWORKS) - {"onnxruntime", "onnx"}
    env = runtime_defaults_env({"TF_ENABLE_ONEDNN_OPTS": "0", "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert env == {"TF_CPP_MIN_LOG_LEVEL": "3"}  # TensorFlow's own kernels and Keras, as its users have them
