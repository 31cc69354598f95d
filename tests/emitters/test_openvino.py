"""The OpenVINO target: PyTorch, Keras and ONNX sources to OpenVINO IR (fp32, fp16 weights, bf16
inference, INT8 through NNCF), each validated in OpenVINO's CPU runtime at a pinned precision;
preflight, inspect, validate and --localize on `.xml` files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.errors import MissingDependencyError
from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.openvino import OpenVINORunner, require_precision, supports
from tests.emitters.models import det_model, save_onnx

BF16 = pytest.mark.skipif(not supports("bf16"), reason="needs a CPU with BF16 (this project's CPU has AVX512-BF16)")


@pytest.fixture(scope="module")
def cnn():
    from modelport.zoo_builders.pytorch import cnn_small

    return cnn_small()


def small_onnx(folder):
    """Conv -> Relu -> global pool -> Gemm, with a dynamic batch: a small real ONNX model."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "cw"),
             numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32) * 0.3, "fw")]
    nodes = [helper.make_node("Conv", ["image", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="pool"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fw"], ["logits"], name="fc")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5])], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return save_onnx(m, folder, "small.onnx")


def _hop(report):
    return next(p for p in report["parity"] if p["hop"].endswith("openvino (end to end)"))


def _random_max_abs(report) -> float:
    """The hop's max abs error on the first (random) sample set: f32 against bf16 shows there; the
    large-constant sets scale every error with outputs ~100 times larger."""
    return _hop(report)["samples"][0]["outputs"][0]["max_abs"]


@pytest.mark.parametrize("precision,weights,atol", [("fp32", "'float32'", 1e-4), ("fp16", "'float16'", 2e-2), ("int8", "int8", 0.25)])
def test_pytorch_cnn_to_openvino_ir(cnn, tmp_path, precision, weights, atol):
    import torch

    out = tmp_path / "out"
    report = convert(cnn, out, ConvertOptions(targets=["openvino"], inputs=["x:batch,3,32,32"], precision=precision))
    (art,) = report["artifacts"]
    assert art["files"] == ["model.xml", "model.bin"] and art["precision"] == precision and art["runtime"] == "openvino"
    assert art["inference_precision"] == ("fp16" if precision == "fp16" and supports("fp16") else "fp32")
    assert _hop(report)["ok"]
    runner = OpenVINORunner(out / "model.xml")  # as a user reads it: the precision it was validated at comes from the IR
    assert runner.inference_precision == "f32" or precision == "fp16"
    (spec,) = runner.input_specs()
    assert (spec.name, spec.dtype, spec.shape) == ("x", "float32", ["batch", 3, 32, 32])  # the contract, dynamic batch named
    assert [s.name for s in runner.output_specs()] == [o["name"] for o in report["contract"]["outputs"]]
    stored = {str(op.get_element_type()) for op in runner.model.get_ordered_ops() if op.get_type_name() == "Constant"}
    assert any(weights in t for t in stored), stored  # INT8 weights are stored asymmetric, as u8
    x = np.random.default_rng(7).standard_normal((3, 3, 32, 32)).astype(np.float32)  # another batch size than the samples
    with torch.no_grad():
        want = cnn(torch.from_numpy(x)).numpy()
    got = next(iter(runner.run({"x": x}).values()))
    np.testing.assert_allclose(got, want, atol=atol * max(1.0, float(np.abs(want).max())), rtol=0)


def test_keras_model_to_openvino_ir(tmp_path):
    import keras

    inp = keras.Input((12, 12, 3), name="image")
    y = keras.layers.Conv2D(6, 3, activation="relu")(inp)
    y = keras.layers.GlobalAveragePooling2D()(y)
    y = keras.layers.Dense(4, name="logits")(y)
    model = keras.Model(inp, y)
    src = tmp_path / "src" / "m.keras"
    src.parent.mkdir()
    model.save(src)
    report = convert(src, tmp_path / "out", ConvertOptions(targets=["openvino"]))
    assert report["source"]["framework"] == "keras" and _hop(report)["ok"]
    runner = OpenVINORunner(tmp_path / "out" / "model.xml")
    assert [s.name for s in runner.input_specs()] == ["image"] and runner.input_specs()[0].shape[1:] == [12, 12, 3]
    x = np.random.default_rng(5).standard_normal((2, 12, 12, 3)).astype(np.float32)
    got = runner.run({"image": x})
    np.testing.assert_allclose(next(iter(got.values())), model.predict(x, verbose=0), atol=1e-4, rtol=1e-3)


def test_onnx_to_openvino_fp32_is_pinned_to_f32(cli, tmp_path):
    src = small_onnx(tmp_path / "src")
    r = cli("emit", src, "--to", "openvino", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["artifacts"][0]["inference_precision"] == "fp32"
    assert _random_max_abs(report) < 1e-5  # f32, not the CPU's default bf16
    r = cli("validate", src, tmp_path / "out" / "model.xml", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["b"]["io"].startswith("OpenVINO CPU, inference precision f32")


@BF16
def test_bf16_is_a_first_class_precision_on_this_cpu(cli, tmp_path):
    src = small_onnx(tmp_path / "src")
    r = cli("convert", src, "--to", "openvino", "--precision", "bf16", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    (art,) = report["artifacts"]
    assert art["precision"] == "bf16" and art["inference_precision"] == "bf16" and art["weights"] == "fp32"
    hop = _hop(report)
    assert hop["ok"] and hop["tolerance"]["atol"] == 2e-2 and 0 < hop["outputs"][0]["max_abs"]  # bf16 really ran
    runner = OpenVINORunner(tmp_path / "out" / "model.xml")
    assert runner.inference_precision == "bf16"
    # fp32 tolerances catch the bf16 rounding; no single tensor is off by more than the localiser's 5%
    r = cli("validate", src, tmp_path / "out" / "model.xml", "--localize", "--json")
    assert r.exit_code == 4
    assert json.loads(r.stdout)["localize"]["note"].startswith("none of the 5 intermediate tensors")


def test_localize_names_the_first_diverging_node_between_onnx_and_an_ir(cli, tmp_path):
    """An IR converted from a model whose Conv weights differ: the divergence starts at the Conv."""
    import onnx
    from onnx import numpy_helper

    src = small_onnx(tmp_path / "src")
    other = onnx.load(str(src))
    w = other.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * -1.0, w.name))
    changed = save_onnx(other, tmp_path / "changed", "changed.onnx")
    assert cli("emit", changed, "--to", "openvino", "-o", tmp_path / "ir").exit_code == 0
    r = cli("validate", src, tmp_path / "ir" / "model.xml", "--localize", "--json")
    assert r.exit_code == 4
    where = json.loads(r.stdout)["localize"]
    assert (where["node"], where["op_type"], where["tensor"]) == ("conv", "Conv", "c") and where["checked"] == 1


def test_a_cpu_without_bf16_refuses_it_with_exit_5():
    caps = ["WINOGRAD", "FP32", "INT8", "BIN", "EXPORT_IMPORT"]  # an AVX2 CPU's OPTIMIZATION_CAPABILITIES
    with pytest.raises(MissingDependencyError, match="cannot run bf16 natively") as e:
        require_precision("bf16", caps)
    assert e.value.exit_code == 5 and "AVX512-BF16 or AMX" in e.value.hint
    require_precision("bf16", ["BF16", "FP32"])
    require_precision("fp32", caps)


def test_int8_static_with_calibration_and_accuracy_control(cli, tmp_path):
    src = small_onnx(tmp_path / "src")
    rng = np.random.default_rng(11)
    calib = tmp_path / "calib.npz"
    np.savez(calib, image=rng.uniform(0, 1, (16, 3, 16, 16)).astype(np.float32))
    r = cli("convert", src, "--to", "openvino", "--precision", "int8", "--calibration", calib, "-o", tmp_path / "a", "--json")
    assert r.exit_code == 0, r.stderr
    art = json.loads(r.stdout)["artifacts"][0]
    assert art["int8_mode"] == "static" and art["quantizer"].endswith(" quantize") and art["calibration_samples"] == 16
    r = cli("convert", src, "--to", "openvino", "--precision", "int8", "--calibration", calib, "--accuracy-budget", "cosine>=0.99",
            "-o", tmp_path / "b", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["artifacts"][0]["quantizer"].endswith("quantize_with_accuracy_control")
    assert report["artifacts"][0]["max_drop"] == pytest.approx(0.01) and _hop(report)["ok"]
    ops = {op.get_type_name() for op in OpenVINORunner(tmp_path / "b" / "model.xml").model.get_ordered_ops()}
    assert "FakeQuantize" in ops


def test_preflight_names_every_op_openvino_cannot_convert(cli, tmp_path):
    src = save_onnx(det_model(), tmp_path / "src", "det.onnx")
    r = cli("emit", src, "--to", "openvino", "-o", tmp_path / "out")
    assert r.exit_code == 2
    assert "det_node (Det): no OpenVINO conversion for ai.onnx::Det" in r.stderr
    assert not (tmp_path / "out").exists()


def test_inspect_reads_an_ir(cli, tmp_path):
    src = small_onnx(tmp_path / "src")
    assert cli("emit", src, "--to", "openvino", "--precision", "fp16", "-o", tmp_path / "out").exit_code == 0
    r = cli("inspect", tmp_path / "out" / "model.xml", "--json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["format"] == "openvino-ir" and info["inputs"][0]["name"] == "image" and info["inputs"][0]["shape"][0] == "batch"
    assert info["ops"]["Convolution"] == 1 and "<Type: 'float16'>" in info["weights"]
    assert info["size"] == sum((tmp_path / "out" / f).stat().st_size for f in ("model.xml", "model.bin"))


# A user's load of an IR, in a fresh process that imports OpenVINO alone: no configuration at all.
PLAIN_LOAD = """
import json, sys
sys.modules.setdefault("openvino_telemetry", None)
import numpy as np
import openvino as ov

xml, feeds, out = sys.argv[1:4]
core = ov.Core()
model = core.read_model(xml)
compiled = core.compile_model(xml, "CPU")
result = compiled(dict(np.load(feeds)))
np.savez(out + ".npz", **{p.get_any_name(): result[p] for p in compiled.outputs})
option = ["runtime_options", "INFERENCE_PRECISION_HINT"]
json.dump({"precision": str(compiled.get_property("INFERENCE_PRECISION_HINT")),
           "runtime_option": str(model.get_rt_info(option).astype(str)) if model.has_rt_info(option) else None}, open(out, "w"))
"""
OV_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _plain_load(xml, feeds: dict, work):
    import subprocess
    import sys

    np.savez(work / "feeds.npz", **feeds)
    p = subprocess.run([sys.executable, "-c", PLAIN_LOAD, str(xml), str(work / "feeds.npz"), str(work / "plain.json")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    seen = json.loads((work / "plain.json").read_text())
    seen["precision"] = next(v for k, v in OV_NAMES.items() if k in seen["precision"])
    with np.load(work / "plain.json.npz") as z:
        return seen, dict(z)


def test_an_fp32_ir_loaded_as_users_load_it_runs_at_the_precision_its_report_gives(tmp_path):
    """`ov.Core().compile_model(xml, "CPU")` with no configuration, in a fresh process: the IR records
    f32 in OpenVINO's runtime_options, the report's `plain_compile` names the precision that load
    runs at on this CPU, and at f32 its outputs hold the fp32 rule against the source. OpenVINO 2026.4
    does not apply the recorded hint, so on a CPU with BF16 that load runs bf16: the report then
    carries its figures and a warning naming INFERENCE_PRECISION_HINT=f32."""
    import onnxruntime as ort

    from modelport.validation import compare_arrays, tolerance_for

    src = small_onnx(tmp_path / "src")
    report = convert(src, tmp_path / "out", ConvertOptions(targets=["openvino"]))
    (art,) = report["artifacts"]
    feeds = {"image": np.random.default_rng(21).standard_normal((2, 3, 16, 16)).astype(np.float32)}
    seen, got = _plain_load(tmp_path / "out" / "model.xml", feeds, tmp_path)
    assert seen["runtime_option"] == "f32"
    assert art["precision"] == art["inference_precision"] == "fp32"
    assert art["plain_compile"]["inference_precision"] == seen["precision"]
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    if seen["precision"] == "fp32":
        assert "outputs" not in art["plain_compile"]  # the plain load is the validated one
        assert compare_arrays("logits", want, got["logits"], tolerance_for("fp32")).ok
        assert not any("plain compile_model" in w for w in report["warnings"])
    else:
        assert len(art["plain_compile"]["outputs"]) == 1
        assert any("INFERENCE_PRECISION_HINT=f32" in w for w in report["warnings"])


@pytest.fixture
def plugin_default_dynamic():
    """This process's OpenVINO Core with a CPU default that is not f32 ("dynamic": each op at its own
    precision), as a CPU with BF16 has bf16: a plain compile then differs from the validated one."""
    from modelport.runtimes.openvino import core

    before = core().get_property("CPU", "INFERENCE_PRECISION_HINT")
    core().set_property("CPU", {"INFERENCE_PRECISION_HINT": "dynamic"})
    try:
        yield
    finally:
        core().set_property("CPU", {"INFERENCE_PRECISION_HINT": before})


def test_the_report_and_row_carry_the_precision_a_plain_load_runs_at_when_it_differs(tmp_path, plugin_default_dynamic,
                                                                                      monkeypatch):
    import importlib

    from rich.console import Console

    from modelport.cli.render import artifacts_table
    from modelport.runtimes import get_runner

    # the plugin default set above lives in this process: validate here rather than in a clean child
    artifact_validation = importlib.import_module("modelport.validation.artifact")
    monkeypatch.setattr(artifact_validation, "artifact_runner",
                        lambda artifact, **o: get_runner(artifact.runner, artifact.path, **{**artifact.runner_options, **o}))
    src = small_onnx(tmp_path / "src")
    report = convert(src, tmp_path / "out", ConvertOptions(targets=["openvino"]))
    (art,) = report["artifacts"]
    assert art["inference_precision"] == "fp32" and _random_max_abs(report) < 1e-5  # validated pinned at f32
    plain = art["plain_compile"]
    assert plain["inference_precision"] == "dynamic"  # read back from the plain compile's properties
    scale = _hop(report)["outputs"][0]["tolerance"]["scale"]  # of the worst set's outputs, as the plain load's figure
    assert plain["ok"] and [o["name"] for o in plain["outputs"]] == ["logits"] and plain["outputs"][0]["max_abs"] < 1e-4 * scale
    (warning,) = [w for w in report["warnings"] if "plain compile_model" in w]
    assert "validated at fp32" in warning and "runs it at dynamic" in warning and "INFERENCE_PRECISION_HINT=f32" in warning
    import jsonschema

    from modelport.validation.report import SCHEMA_FILE

    jsonschema.validate(report, json.loads(SCHEMA_FILE.read_text()))
    console = Console(width=240, record=True)
    console.print(artifacts_table(report))
    assert "fp32 (runs fp32; dynamic by default)" in console.export_text()
    runner = OpenVINORunner(tmp_path / "out" / "model.xml")
    assert runner.describe() == {"inference_precision": "fp32", "asked": "fp32", "plain_compile": "dynamic",
                                 "plain_options": {"precision": "default"}}
    assert runner.io_note().endswith("a plain compile_model runs it at dynamic on this CPU")


def test_strict_fails_an_ir_whose_plain_load_is_outside_the_tolerance(tmp_path, monkeypatch):
    """A CPU whose OpenVINO default is bf16 runs the fp32 IR there, which the IR cannot prevent:
    --strict makes a plain load outside the tolerance exit 4 with no output (a warning without it)."""
    import importlib

    from modelport.errors import ValidationError

    artifact_validation = importlib.import_module("modelport.validation.artifact")

    def bf16_by_default(artifact, runner, reference, judging):
        return {"inference_precision": "fp32",
                "plain_compile": {"inference_precision": "bf16", "ok": False,
                                  "outputs": [{"name": "logits", "max_abs": 0.2, "cosine": 0.99, "ok": False}]}}

    monkeypatch.setattr(artifact_validation, "_plain_load", bf16_by_default)
    src = small_onnx(tmp_path / "src")
    with pytest.raises(ValidationError, match="runs it at bf16.*--strict"):
        convert(src, tmp_path / "strict", ConvertOptions(targets=["openvino"], strict=True))
    assert not (tmp_path / "strict").exists()
    report = convert(src, tmp_path / "out", ConvertOptions(targets=["openvino"]))
    assert any("outside the fp32 tolerance" in w for w in report["warnings"])
