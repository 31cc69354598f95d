"""The OpenVINO normalisation fallback (`emitters/norm_fallback.py`): an IR whose LayerNorm misses
the reference on a constant frame in the CPU plugin is converted again from the ONNX IR with
shifted normalisation (each norm fed x - x₀), and that IR gives torch's answer on digital silence.

Measured here (LayerNorm(192) → Linear, gains 4 to 8, on float32(20·log10(eps)) = -138.4738):
OpenVINO's CPU plugin at f32 (the LayerNorm fused into its MVN kernel) missed by 5.7e-2; shifted,
the MVN kernel is still used (the shift comes before it) and sees exact zeros: 5e-6. The IR cannot
pin the precision a plain `compile_model` runs at (bf16 on a CPU with BF16, a separate warning),
so the IR is judged as a plain compile runs it where that is f32, else at the f32 it records."""

from __future__ import annotations

import json

import numpy as np

from modelport.reference.sample_sets import DB_FLOOR
from tests.emitters.models import layer_norm_encoder, save_pt2

WIDTH = 192
SHAPE = (1, 16, WIDTH)


def _compiled(xml):
    """The IR compiled as `compile_model(xml, "CPU")` does, where that runs f32; else with the f32 hint
    the IR records (a plain compile on a CPU without BF16)."""
    import openvino

    from modelport.runtimes.openvino import core

    compiled = core().compile_model(str(xml), "CPU")
    if compiled.get_property("INFERENCE_PRECISION_HINT") != openvino.Type.f32:
        compiled = core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled


def test_a_layer_norm_that_misses_on_silence_is_delivered_shifted(cli, tmp_path):
    import torch

    model = layer_norm_encoder(WIDTH)
    out = tmp_path / "out"
    r = cli("convert", save_pt2(model, tmp_path / "encoder.pt2", SHAPE), "--to", "openvino", "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    art = report["artifacts"][0]
    fallback = art["kernel_fallback"]
    assert fallback["rewrite"] == "shifted normalisation" and fallback["repaired"] is True
    assert "floor-db" in fallback["missed_on"] and fallback["shifted"] == ["LayerNormalization node_layer_norm"]
    assert any("openvino" in w and "shifted normalisation" in w for w in report["warnings"])
    hop = next(p for p in report["parity"] if "openvino" in p["hop"])
    assert hop["ok"] and "floor-db" in [s["kind"] for s in hop["samples"]]
    compiled = _compiled(out / "model.xml")
    for x in (np.full(SHAPE, DB_FLOOR, np.float32), np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)):
        want = model(torch.from_numpy(x)).detach().numpy()
        got = compiled(x)[0]
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max())), np.abs(got - want).max()
