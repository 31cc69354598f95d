"""INT8 that misses on a structured sample set keeps the nodes responsible in float (`optimize/int8_fallback.py`).

The model: seven "edge" features (MatMuls whose columns sum to zero, plus a small bias: on a flat
input they read only their bias, as edge filters do on a letterbox-grey frame) and a "brightness"
feature (the sum of the input) are concatenated and read by one head. On the constant input the
brightness is 64 while the edges are about 0.05, so per-tensor INT8 of the head's input (one scale
for the whole tensor, set by its largest value) rounds every edge to 0: the head outputs 0 and the
cosine is 0.0 on the 'constant' set, while the random sets hold (0.9996+). The miss does not depend
on rounding details: a step of 64/255 against values of 0.02-0.08.

Before: the first diverging tensor was excluded, up to 6 times. On the flat input every edge
MatMul "diverges" (its float output is ~1e-8, the rounding of its weights 1e-3), so edge0..edge5
were kept in FP32, the head stayed INT8, and the pass was rolled back (exit 4).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.optimize.quantize import quantize_model
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import Tolerance, check, tolerance_for


def _grey_frame_onnx(probes: int = 7):
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, feats = [], {}, []
    for k in range(probes):
        w = rng.standard_normal((64, 8)) * 0.1
        inits[f"w{k}"] = w - w.mean(axis=0)  # columns summing to 0: a flat input reads 0
        inits[f"b{k}"] = rng.uniform(0.02, 0.08, 8) * rng.choice([-1, 1], 8)
        nodes += [helper.make_node("MatMul", ["x", f"w{k}"], [f"m{k}"], name=f"edge{k}"),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"f{k}"], name=f"edge{k}_bias")]
        feats.append(f"f{k}")
    inits["wb"] = np.ones((64, 1))
    head = rng.standard_normal((8 * probes + 1, 16)) * 0.2
    head[-1] = 0  # the head does not read the brightness; its range still sets the scale of its input
    inits["wh"] = head
    nodes += [helper.make_node("MatMul", ["x", "wb"], ["bright"], name="brightness"),
              helper.make_node("Concat", [*feats, "bright"], ["h"], axis=1, name="features"),
              helper.make_node("MatMul", ["h", "wh"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "grey", [helper.make_tensor_value_info("x", 1, [4, 64])],
                              [helper.make_tensor_value_info("y", 1, [4, 16])],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _with_sets(model):
    """The model as an IR judged on two random sets, all-zeros and a constant input, as the parser draws them."""
    from modelport.ir import IRModel, Reference, Sample, specs_from_onnx

    rng = np.random.default_rng(1)
    runner = OnnxRuntimeRunner(model)
    sets = [Sample(kind, {"x": x}, runner.run({"x": x})) for kind, x in (
        ("random", rng.standard_normal((4, 64)).astype(np.float32)),
        ("random-2", rng.standard_normal((4, 64)).astype(np.float32)),
        ("zeros", np.zeros((4, 64), np.float32)), ("constant", np.ones((4, 64), np.float32)))]
    ref = Reference(sets[0].inputs, sets[0].outputs, "onnxruntime", sets[1:])
    return IRModel(model, specs_from_onnx(model.graph.input), specs_from_onnx(model.graph.output), reference=ref)


@pytest.fixture(scope="module")
def grey_ir():
    return _with_sets(_grey_frame_onnx())


def _cosines(model, ref) -> dict[str, float]:
    parity = check(OnnxRuntimeRunner(model), ref, tolerance_for("int8"), "t")
    return {s["kind"]: s["outputs"][0]["cosine"] for s in parity.samples}


def _ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_int8_missing_on_a_grey_frame_keeps_the_node_that_reads_it_in_float(grey_ir):
    from modelport.optimize import quantize

    at_once = quantize._dynamic(quantize._prepared(grey_ir.model), exclude=[], per_channel=False)
    before = _cosines(at_once, grey_ir.reference)
    assert before["constant"] < 0.1 and min(before["random"], before["random-2"]) > 0.999, before

    out, info = quantize_model(grey_ir)
    assert info.parity_ok and info.excluded == ["head"]
    assert [(k["node"], k["op"]) for k in info.kept_float] == [("head", "MatMul")]
    assert info.kept_float[0]["error"] > 0.9  # nearly all of the error on the grey frame was the head's
    assert info.fallback["missed_on"] == ["constant"] and info.fallback["quantised"] == 9
    assert info.fallback["gave_up"] is None and info.rounds == 1
    # every edge and the brightness stay INT8; the head is a float MatMul reading the float features
    assert _ops(out.model).count("MatMulInteger") == 8
    assert [n.input[0] for n in out.model.graph.node if n.name == "head"] == ["h"]
    after = _cosines(out.model, grey_ir.reference)
    assert min(after.values()) >= 0.98, after
    assert out.provenance["int8"]["kept_float"] == info.kept_float


def test_static_int8_keeps_a_quantised_tensor_with_the_nodes_around_it(grey_ir):
    """QDQ puts one Quantize/Dequantize pair on the head's input for the Concat that writes it and
    the head that reads it: the head alone in float still reads the rounded tensor (no gain), the
    two together hold."""
    rng = np.random.default_rng(5)
    calibration = [{"x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(8)]
    out, info = quantize_model(grey_ir, mode="static", calibration=calibration)
    assert info.parity_ok and info.excluded == ["features", "head"], info.to_dict()
    assert {k["node"]: k.get("with") for k in info.kept_float} == {"features": ["head"], "head": ["features"]}
    assert set(info.fallback["missed_on"]) <= {"zeros", "constant"}
    assert min(_cosines(out.model, out.reference).values()) >= 0.98


def test_a_model_with_more_units_than_the_fanout_is_ranked_in_groups(grey_ir):
    """With 4 entries a ranking, the 10 units are ranked as 4 groups, then the best group's members:
    fewer quantiser runs than units, and the same node found."""
    from modelport.optimize import quantize
    from modelport.optimize.int8_fallback import exclusion_units, hold_parity, quantised_nodes

    base = quantize._prepared(grey_ir.model)

    def quantise(kept):
        return quantize._dynamic(base, exclude=kept, per_channel=False)

    first = quantise([])
    tol = tolerance_for("int8")
    parity = check(OnnxRuntimeRunner(first), grey_ir.reference, tol, "int8")
    units = exclusion_units(base, first, [n for n, _ in quantised_nodes(base, first)])
    assert len(units) == 10  # 9 nodes, and the input x with the 8 nodes that read it
    held = hold_parity(quantise, base, first, parity, grey_ir.reference, tol, "int8", fanout=4)
    assert held.parity.ok and [k["node"] for k in held.kept] == ["head"]
    assert held.trials < len(units), held.trials


def test_a_model_that_holds_at_once_is_the_quantisers_output_with_nothing_excluded(grey_ir):
    """No fallback ran: the artifact is byte for byte what onnxruntime's quantiser writes, dynamic and
    static (the static run also saving its calibration ranges for a fallback changes nothing)."""
    from modelport.ir import Reference
    from modelport.optimize import quantize

    ir = grey_ir.clone(grey_ir.model)
    ir.reference = Reference(grey_ir.reference.inputs, grey_ir.reference.outputs)  # the random set only: INT8 holds
    base = quantize._prepared(ir.model)
    out, info = quantize_model(ir)
    assert info.parity_ok and info.fallback is None and info.kept_float == [] and info.excluded == []
    plain = quantize._dynamic(base, exclude=[], per_channel=False)
    assert out.model.SerializeToString() == plain.SerializeToString()

    rng = np.random.default_rng(5)
    calibration = [{"x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(8)]
    out, info = quantize_model(ir, mode="static", calibration=calibration, check_on_calibration=False)
    assert info.parity_ok and info.fallback is None
    plain = quantize._static(base, calibration, exclude=[], per_channel=False, method="minmax")
    assert out.model.SerializeToString() == plain.SerializeToString()


def test_static_fallback_runs_reuse_the_first_calibration(grey_ir, tmp_path, monkeypatch):
    """The calibration's ranges do not depend on what is kept in float: a run that reads them from the
    first run's cache writes what a run that calibrates again writes, and the whole fallback of the
    static test above calibrates once for its 16 quantiser runs."""
    import importlib
    import inspect

    from modelport.optimize import quantize

    module = importlib.import_module("onnxruntime.quantization.quantize")
    # the pinned onnxruntime's quantize_static takes a calibration cache: the fallback relies on it
    assert "calibration_cache_path" in inspect.signature(module.quantize_static).parameters
    rng = np.random.default_rng(5)
    calibration = [{"x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(8)]
    base = quantize._prepared(grey_ir.model)
    ranges = tmp_path / "ranges.json"
    quantize._static(base, calibration, exclude=[], per_channel=False, method="minmax", ranges=ranges)
    cached = quantize._static(base, calibration, exclude=["head"], per_channel=False, method="minmax", ranges=ranges)
    fresh = quantize._static(base, calibration, exclude=["head"], per_channel=False, method="minmax")
    assert cached.SerializeToString() == fresh.SerializeToString()

    calibrations = []
    create = module.create_calibrator
    monkeypatch.setattr(module, "create_calibrator", lambda *a, **k: calibrations.append(1) or create(*a, **k))
    out, info = quantize_model(grey_ir, mode="static", calibration=calibration)
    assert info.parity_ok and info.fallback["trials"] > 1 and len(calibrations) == 1


def test_the_fallback_quantises_from_the_parked_weights(grey_ir, monkeypatch):
    """A model over PARK_BYTES (lowered here): every quantiser run of the fallback, like the first,
    reads the FP32 weights from the parked file; neither the IR nor the model it is given holds them."""
    from modelport import ir as ir_module
    from modelport.optimize import quantize

    ir = grey_ir.clone(grey_ir.model)
    ir.reference = grey_ir.reference
    monkeypatch.setattr(ir_module, "PARK_BYTES", 1024)
    held = []
    run = quantize._run_quantizer

    def watched(model, *args, **kwargs):
        held.append((sum(len(t.raw_data) for t in model.graph.initializer),
                     sum(len(t.raw_data) for t in ir.model.graph.initializer)))
        return run(model, *args, **kwargs)

    monkeypatch.setattr(quantize, "_run_quantizer", watched)
    out, info = quantize_model(ir)
    assert info.parity_ok and info.excluded == ["head"]
    assert len(held) == 1 + info.fallback["trials"] and all(a < 1024 and b < 1024 for a, b in held), held


def test_the_fallback_aims_at_the_gates_tolerance(grey_ir):
    """The pipeline tells a precision pass what its gate will hold it to: a budget tighter than INT8's
    default keeps more in float (and the gate passes it); an open gate leaves INT8's default."""
    from modelport.optimize.pipeline import run_passes
    from modelport.optimize.quantize import DynamicQuantizationPass

    tight = Tolerance(float("inf"), float("inf"), 0.999, scaled=False)
    out, rows = run_passes(grey_ir, [DynamicQuantizationPass()], tolerance=lambda p: tight)
    row = rows[0].to_dict()
    assert row["status"] == "applied" and len(row["details"]["kept_float"]) > 1
    assert all(o["cosine"] >= 0.999 for s in row["parity"]["samples"] for o in s["outputs"])
    open_gate = Tolerance(float("inf"), float("inf"), -1.0)
    _, rows = run_passes(grey_ir, [DynamicQuantizationPass()], tolerance=lambda p: open_gate)
    assert rows[0].details["kept_fp32"] == ["head"]


def test_int8_that_cannot_hold_names_the_nodes_it_tried():
    """A budget no INT8 model meets: the nodes are kept in float one by one, worst first, until the
    last one would be; the run says so and names them. (Before, both MatMuls were excluded in turn
    and parity "held" on a model labelled INT8 with no quantised node left.)"""
    from onnx import helper

    from tests.optimize.conftest import make_ir

    rng = np.random.default_rng(3)
    ir = make_ir([helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"]),
                  helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")],
                 [("x", [4, 64])], [("y", [4, 32])],
                 {"w1": rng.standard_normal((64, 128)) * 0.1, "w2": rng.standard_normal((128, 32)) * 0.1})
    out, info = quantize_model(ir, tol=Tolerance(1e-7, 0.0, 1.0))
    assert not info.parity_ok and len(info.excluded) == 1 and info.excluded[0] in {"fc1", "fc2"}
    last = ({"fc1", "fc2"} - set(info.excluded)).pop()
    gave_up = info.fallback["gave_up"]
    assert f"every quantised node but '{last}' is in float" in gave_up and "nodes tried in float" in gave_up
    assert info.excluded[0] in gave_up


# the CLI: report row, warning, exit codes

def test_optimize_int8_holds_with_the_head_in_float_and_says_so(cli, tmp_path):
    """The input is pixels scaled by 1/255 (`--scale`): the parser's structured sets are then those of
    an image in [0, 1] (a constant 0.5, the ends 0 and 1), and INT8 missed on the flat ones."""
    import onnx

    src = tmp_path / "src" / "grey.onnx"
    src.parent.mkdir()
    onnx.save(_grey_frame_onnx(), str(src))
    out = tmp_path / "out"
    r = cli("optimize", src, "-o", out, "--level", "none", "--precision", "int8", "--scale", str(1 / 255), "--json")
    assert r.exit_code == 0, r
    report = json.loads((out / "report.json").read_text())
    row = next(s for s in report["stages"] if s.get("pass") == "int8-dynamic")
    assert row["status"] == "applied" and row["details"]["kept_fp32"] == ["head"]
    assert row["details"]["kept_float"][0]["node"] == "head" and row["details"]["kept_float"][0]["error"] > 0.9
    assert "constant" in row["details"]["fallback"]["missed_on"]
    assert all(s["ok"] and s["outputs"][0]["cosine"] >= 0.98 for s in row["parity"]["samples"]), row["parity"]["samples"]
    assert report["artifacts"][0]["precision"] == "int8"
    assert _ops(onnx.load(str(out / "model.onnx"))).count("MatMulInteger") == 8
    assert any(line.startswith("warning:") and "'constant'" in line and "head (MatMul" in line
               for line in r.stderr.splitlines()), r.stderr


def test_optimize_int8_that_cannot_hold_exits_4_naming_the_nodes(cli, tmp_path):
    """Even with every quantised node but one in float the budget is missed: exit 4, no output, and
    the message names the nodes kept and the one left."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"], name="act"),
         helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")],
        "mlp", [helper.make_tensor_value_info("x", 1, [4, 64])], [helper.make_tensor_value_info("y", 1, [4, 32])],
        [numpy_helper.from_array((rng.standard_normal((64, 128)) * 0.1).astype(np.float32), "w1"),
         numpy_helper.from_array((rng.standard_normal((128, 32)) * 0.1).astype(np.float32), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = tmp_path / "src" / "mlp.onnx"
    src.parent.mkdir()
    onnx.save(model, str(src))
    r = cli("optimize", src, "-o", tmp_path / "q", "--level", "none", "--precision", "int8",
            "--accuracy-budget", "max_abs<=1e-7")
    assert r.exit_code == 4, r
    message = " ".join(r.stderr.split())
    assert "--precision int8 cannot be delivered" in message and "nodes tried in float" in message
    assert "fc1" in message and "fc2" in message and "would leave no node in INT8" in message
    assert not (tmp_path / "q").exists()
