"""A dynamic-range quantised TFLite source on every route: its IR holds the int8 weights behind
DequantizeLinear, which the ONNX artifact keeps at fp32; the targets that take float weights
(PyTorch code, ExecuTorch, Core ML) and the FP16 and INT8 passes get them dequantised (the
`dequantize` pass, one report row). Before it, `--to pytorch|executorch|coreml` was exit 2 (no
converter for DequantizeLinear), `--precision fp16` exit 4 (a DequantizeLinear with an fp16 scale)
and `--precision int8` exit 4 (onnxruntime's quantiser expected the weight to be an initializer)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.tflite_models import write_dynamic_range_cnn_tflite

FOLDED = {"initializers": 2, "per_channel": 2, "activation_round_trips": 1}  # Conv2D and Dense kernels; the Dense's input


@pytest.fixture(scope="module")
def quantised_tflite(tmp_path_factory):
    return write_dynamic_range_cnn_tflite(tmp_path_factory.mktemp("dr") / "model.tflite")


def _convert(cli, source, out, *args) -> dict:
    r = cli("convert", source, *args, "-o", out, "--json")
    assert r.exit_code == 0, r
    return r.json()


def _rows(report: dict) -> dict:
    return {s["pass"]: s for s in report["stages"] if s["name"].startswith("optimize:")}


def _int8_weights(path) -> int:
    """The int8 initializers a DequantizeLinear widens (a kernel, not its zero point) in an ONNX file."""
    model = onnx.load(str(path))
    int8 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) > 1}
    return sum(n.op_type == "DequantizeLinear" and n.input[0] in int8 for n in model.graph.node)


def test_float_weight_targets_beside_an_onnx_artifact_that_keeps_int8(cli, quantised_tflite, tmp_path):
    """One run to every target that takes float weights and to ONNX: the first three are emitted from the
    dequantised IR and validated (Core ML by its contract off macOS), the ONNX model keeps the int8 weights."""
    from safetensors.numpy import load_file

    out = tmp_path / "out"
    report = _convert(cli, quantised_tflite, out, "--to", "onnx,pytorch,executorch,coreml")
    assert report["source"]["source_precision"] == "int8-dynamic-range"
    (row,) = _rows(report).values()
    assert row["pass"] == "dequantize" and row["status"] == "applied" and row["details"] == FOLDED
    arts = {a["target"]: a for a in report["artifacts"]}
    assert sorted(arts) == ["coreml", "executorch", "onnx", "pytorch"]
    ended = {p["hop"]: p["ok"] for p in report["parity"] if p["hop"].endswith("(end to end)")}
    assert ended == {f"tflite→{t} (end to end)": True for t in ("onnx", "pytorch", "executorch")}
    assert arts["coreml"]["validated"] is False and "macOS" in arts["coreml"]["not_validated"]
    assert arts["coreml"]["contract_check"]["inputs"] == "names, dtypes and ranks as the contract's"
    assert arts["coreml"]["route"] == "onnx" and (out / "model.mlpackage").is_dir()
    # the ONNX artifact at fp32 is the quantised IR: its two kernels stay int8
    assert _int8_weights(out / "model.onnx") == 2
    weights = load_file(str(out / "pytorch" / "model.safetensors"))
    assert weights and all(np.issubdtype(w.dtype, np.floating) for w in weights.values())


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_onnx_precision_starts_from_the_float_graph(cli, quantised_tflite, tmp_path, precision):
    out = tmp_path / "out"
    report = _convert(cli, quantised_tflite, out, "--to", "onnx", "--precision", precision)
    rows = _rows(report)
    assert list(rows) == ["dequantize", "fp16" if precision == "fp16" else "int8-dynamic"]
    assert rows["dequantize"]["details"] == FOLDED and all(r["status"] == "applied" for r in rows.values())
    (art,) = report["artifacts"]
    assert art["precision"] == precision and "precision_fallback" not in art
    assert all(p["ok"] for p in report["parity"]) and any(p["hop"] == "tflite→onnx (end to end)" for p in report["parity"])
    ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    assert "DynamicQuantizeLinear" in ops if precision == "int8" else not ops & {"DequantizeLinear", "DynamicQuantizeLinear"}
