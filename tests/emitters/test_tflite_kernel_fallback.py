"""The TFLite normalisation fallback (`emitters/norm_fallback.py`): a `.tflite` whose LayerNorm
misses the reference on a constant frame is converted again with shifted normalisation (each norm
fed x - x₀), and that file, loaded plainly (LiteRT's default interpreter, XNNPACK delegate and
all), gives torch's answer on digital silence.

Measured here (LayerNorm(192) → Linear, gains 4 to 8, on float32(20·log10(eps)) = -138.4738):
onnx2tf's file (MEAN, SQUARED_DIFFERENCE, MEAN: two passes already) missed by 0.90, litert-torch's
by 0.09, with XNNPACK and with the builtin kernels alike: MEAN of the constant frame is one ulp
off, and the normalisation multiplies that ulp by 1/sqrt(eps). Shifted, both hold to 1e-5."""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.reference.sample_sets import DB_FLOOR
from modelport.runtimes.tflite import load_interpreter
from tests.emitters.models import layer_norm_encoder, save_pt2

WIDTH = 192
SHAPE = (1, 16, WIDTH)


def _plain_load(path, x: np.ndarray) -> np.ndarray:
    """The file as a user runs it: the default interpreter (XNNPACK delegate), its signature."""
    runner = load_interpreter(path).get_signature_runner("serving_default")
    return runner(input=x)["output"]


@pytest.mark.parametrize("route,converter", [("onnx", "onnx2tf"), ("native", "litert-torch")])
def test_a_layer_norm_that_misses_on_silence_is_delivered_shifted(cli, tmp_path, route, converter):
    import torch

    model = layer_norm_encoder(WIDTH)
    out = tmp_path / "out"
    r = cli("convert", save_pt2(model, tmp_path / "encoder.pt2", SHAPE), "--to", "tflite", "--route", route,
            "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    art = report["artifacts"][0]
    assert converter in art["converter"]
    fallback = art["kernel_fallback"]
    assert fallback["rewrite"] == "shifted normalisation" and fallback["repaired"] is True
    assert "floor-db" in fallback["missed_on"] and fallback["shifted"]
    assert any("tflite" in w and "shifted normalisation" in w and "floor-db" in w for w in report["warnings"])
    hop = next(p for p in report["parity"] if "tflite" in p["hop"])
    assert hop["ok"] and "floor-db" in [s["kind"] for s in hop["samples"]]
    for x in (np.full(SHAPE, DB_FLOOR, np.float32), np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)):
        want = model(torch.from_numpy(x)).detach().numpy()
        got = _plain_load(out / "model.tflite", x)
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max())), np.abs(got - want).max()


def test_a_layer_norm_that_holds_is_delivered_as_converted(cli, tmp_path):
    """Linear → LayerNorm → Linear: the Linear makes a constant frame uneven before the norm, so
    LiteRT's kernels hold on every set; the file is the one onnx2tf wrote, with no fallback entry."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, 64)).eval()
    r = cli("convert", save_pt2(model, tmp_path / "encoder.pt2", SHAPE), "--to", "tflite", "--route", "onnx",
            "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert "kernel_fallback" not in report["artifacts"][0]
    assert not any("shifted normalisation" in w for w in report["warnings"])
