"""An epsilon is not a zero: the optimisation levels keep `x² + 1e-10` before a Log, so digital
silence (all-zeros input) gives the source's finite outputs, not NaN (optimize/exact_rules.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

from modelport.ir import Reference
from modelport.optimize import get_pass
from modelport.optimize.pipeline import OptimizeOptions, optimize_ir
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import check, tolerance_for
from tests.optimize.conftest import make_ir, ops

EPS = 1e-10


@pytest.fixture(scope="module")
def log_power_ir():
    """basic-pitch's NormalizedLog layer as tf2onnx writes it: 10·log10(x² + 1e-10), minus its minimum,
    over its maximum with TF's div_no_nan (Where(max == 0, 0, offset / max)). Random reference inputs."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["power"]), helper.make_node("Add", ["power", "eps"], ["power_eps"]),
             helper.make_node("Log", ["power_eps"], ["ln"]), helper.make_node("Mul", ["ln", "to_db"], ["db"]),
             helper.make_node("ReduceMin", ["db"], ["lo"], axes=[1, 2], keepdims=1),
             helper.make_node("Sub", ["db", "lo"], ["offset"]),
             helper.make_node("ReduceMax", ["offset"], ["hi"], axes=[1, 2], keepdims=1),
             helper.make_node("Div", ["offset", "hi"], ["ratio"]), helper.make_node("Equal", ["hi", "zero"], ["flat"]),
             helper.make_node("Where", ["flat", "zero", "ratio"], ["y"])]
    inits = {"eps": np.float32(EPS), "to_db": np.float32(10 / math.log(10)), "zero": np.float32(0)}
    return make_ir(nodes, [("x", [1, 16, 8])], [("y", [1, 16, 8])], inits)


def on_silence(ir):
    """The IR's reference rerun on an all-zeros input of the same shapes."""
    feeds = {k: np.zeros_like(v) for k, v in ir.reference.inputs.items()}
    return Reference(feeds, OnnxRuntimeRunner(ir.model).run(feeds))


@pytest.mark.parametrize("level", ["basic", "all"])
def test_epsilon_before_a_log_survives_the_level(log_power_ir, level):
    silence = on_silence(log_power_ir)
    assert all(np.isfinite(v).all() for v in silence.outputs.values())
    out, rows, _ = optimize_ir(log_power_ir, OptimizeOptions(level=level))
    assert "Add" in ops(out), rows
    parity = check(OnnxRuntimeRunner(out.model), silence, tolerance_for("fp32"), f"optimize {level} on zeros")
    assert parity.ok, parity.summary()


def test_transformer_and_decoder_fusions_keep_the_epsilon(log_power_ir):
    """Both run onnxscript's own optimizer, whose default rules held the same approximate no-op rules."""
    from modelport.optimize.decoder_fusion import fuse_decoder

    silence = on_silence(log_power_ir)
    fused = get_pass("transformer").apply(log_power_ir).model.model
    decoder, _ = fuse_decoder(log_power_ir.model, group_query_attention=False)
    for model in (fused, decoder):
        assert "Add" in [n.op_type for n in model.graph.node]
        assert check(OnnxRuntimeRunner(model), silence, tolerance_for("fp32"), "zeros").ok


def test_exact_no_ops_still_go_and_near_ones_stay():
    """x+0, 0+x, x-0, x*1, 1*x, x/1 are removed; x*1.000001 and x+1e-9 (within onnxscript's
    tolerances of 1 and 0) are not."""
    chain = [("Add", "x", "zero"), ("Add", "zero", None), ("Sub", None, "zero"), ("Mul", None, "one"),
             ("Mul", "one", None), ("Div", None, "one"), ("Mul", None, "near_one"), ("Add", None, "tiny")]
    nodes, prev = [], "x"
    for i, (op, a, b) in enumerate(chain):
        out = "y" if i == len(chain) - 1 else f"t{i}"
        nodes.append(helper.make_node(op, [a or prev, b or prev], [out]))
        prev = out
    inits = {"zero": np.float32(0), "one": np.float32(1), "near_one": np.float32(1.000001), "tiny": np.float32(1e-9)}
    ir = make_ir(nodes, [("x", [4])], [("y", [4])], inits)
    result = get_pass("cleanup").apply(ir)
    assert ops(result.model) == ["Mul", "Add"]
    kept = {i for n in result.model.model.graph.node for i in n.input}
    assert {"near_one", "tiny"} <= kept


def test_basic_pitch_optimised_stays_finite_on_silence(tmp_path):
    """Spotify's basic-pitch (audio to MIDI; its ONNX from the pip wheel): `--optimize basic` dropped
    the `+ 1e-10` of its log-magnitude and returned NaN for every output value on silence."""
    from modelport.orchestration.options import ConvertOptions
    from modelport.orchestration.source import resolve_source
    from modelport.parsers import parse
    from tests.wheel_models import wheel_model

    src, spec, _ = resolve_source(str(wheel_model("basic_pitch/onnx", tmp_path)), ConvertOptions())
    ir = parse(src, spec)
    out, rows, _ = optimize_ir(ir, OptimizeOptions(level="basic"))
    assert any(r["status"] == "applied" for r in rows), rows
    runner = OnnxRuntimeRunner(out.model)
    silence = on_silence(ir)
    for sample, reference in (("random", ir.reference), ("zeros", silence)):
        got = runner.run(reference.inputs)
        assert all(np.isfinite(v).all() for v in got.values()), sample
        parity = check(runner, reference, tolerance_for("fp32"), sample)
        assert parity.ok, (sample, parity.summary())
