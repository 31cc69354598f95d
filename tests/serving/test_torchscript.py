"""TorchScript model.pt traced from the emitted PyTorch code: parity, other batch sizes, trust, specialisation."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.errors import UnsafeInputError, ValidationError
from modelport.packaging.bundle import load_artifacts
from modelport.packaging.torchscript import TOLERANCE, write_torchscript
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import compare


def test_traced_model_keeps_the_batch_axis_and_matches_onnx(cnn_pt_out, tmp_path):
    import torch

    figures = write_torchscript(load_artifacts(cnn_pt_out), tmp_path / "model.pt", trust=True)
    assert figures["method"] == "trace"
    assert figures["trace_shapes"] == {"input": [2, 3, 64, 64]} and figures["checked_shapes"] == {"input": [3, 3, 64, 64]}
    assert figures["parity"]["ok"] and figures["parity_other_sizes"]["ok"] and figures["parity_onnx"]["ok"]
    # the written file on its own, at a batch size neither check used
    loaded = torch.jit.load(str(tmp_path / "model.pt"))
    x = np.random.default_rng(5).standard_normal((5, 3, 64, 64)).astype(np.float32)
    with torch.no_grad():
        got = loaded(torch.from_numpy(x)).numpy()
    want = OnnxRuntimeRunner(cnn_pt_out / "model.onnx").run({"input": x})
    result = compare(want, {"output": got}, TOLERANCE, hop="model.pt batch 5")
    assert result.ok, result.summary()


def test_tracing_code_needs_trust(cnn_pt_out, tmp_path):
    with pytest.raises(UnsafeInputError, match="imports and runs"):
        write_torchscript(load_artifacts(cnn_pt_out), tmp_path / "model.pt", trust=False)
    assert not (tmp_path / "model.pt").exists()


def test_a_trace_that_freezes_the_batch_is_refused(tmp_path):
    """Code that turns a size into a Python int traces to a constant; script cannot compile it either."""
    import json

    from modelport.ir import TensorSpec
    from modelport.packaging.bundle import Artifacts

    code = tmp_path / "pytorch"
    code.mkdir()
    (code / "model.py").write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(8, 3)\n\n"
        "    def forward(self, x):\n"
        "        n = int(x.shape[0])\n"
        "        return self.fc(x.reshape([*[n], 8]))\n"
    )
    import torch
    from safetensors.torch import save_file

    fc = torch.nn.Linear(8, 3)
    save_file({"fc.weight": fc.weight.detach(), "fc.bias": fc.bias.detach()}, str(code / "model.safetensors"))
    arts = Artifacts(source=tmp_path, inputs=[TensorSpec("x", "float32", ["batch", 4, 2])],
                     outputs=[TensorSpec("y", "float32", ["batch", 3])], name="frozen", files={"pytorch": code})
    with pytest.raises(ValidationError, match="keeps the dynamic dims") as e:
        write_torchscript(arts, tmp_path / "model.pt", trust=True)
    assert "torch.jit.trace" in str(e.value) and not (tmp_path / "model.pt").exists()
    json.dumps(e.value.to_dict())
