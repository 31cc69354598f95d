"""The CPU-kernel forms: residual Sum (no SkipLayerNormalization at onnxruntime load) and BiasGelu
split back into Add + Gelu; both keep the outputs. The BERT end-to-end checks are in
test_transformer_fusion.py."""

from __future__ import annotations

from collections import Counter

import numpy as np
from onnx import helper

from modelport.optimize.model_tools import from_onnx_ir, to_onnx_ir, with_model
from tests.optimize.conftest import assert_same_outputs, make_ir

D = 64


def ort_loaded_ops(model) -> Counter:
    """Op types of the graph onnxruntime actually runs after its own session optimisation."""
    import tempfile
    from pathlib import Path

    import onnx
    import onnxruntime as ort

    from modelport.onnxfile.ir_version_fit import fit_ir_version

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    fit_ir_version(copy)
    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(Path(d) / "opt.onnx")
        ort.InferenceSession(copy.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return Counter(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)


def _residual_block():
    """x -> MatMul -> (+ x) -> LayerNormalization, the residual a (post-LN) encoder layer ends with."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
    ]
    inits = {"w": rng.standard_normal((D, D)) * 0.1, "g": rng.standard_normal(D), "b": rng.standard_normal(D)}
    return make_ir(nodes, [("x", [1, 16, D])], [("y", None)], inits.items())


def _apply(ir, fn):
    model = to_onnx_ir(ir.model)
    count = fn(model)
    return with_model(ir, from_onnx_ir(model)), count


def test_residual_sum_stops_onnxruntime_fusing_skip_layer_norm():
    from modelport.optimize.cpu_kernels import residual_add_to_sum

    ir = _residual_block()
    assert ort_loaded_ops(ir.model)["SkipLayerNormalization"] == 1  # what onnxruntime does by itself
    out, count = _apply(ir, residual_add_to_sum)
    assert count == 1
    assert [n.op_type for n in out.model.graph.node] == ["MatMul", "Sum", "LayerNormalization"]
    loaded = ort_loaded_ops(out.model)
    assert loaded["SkipLayerNormalization"] == 0 and loaded["LayerNormalization"] == 1
    assert_same_outputs(ir, out, atol=1e-5)  # the reference ran SkipLayerNormalization: rounding differs


def test_bias_gelu_split_keeps_consumers_and_graph_outputs():
    from modelport.optimize.cpu_kernels import split_bias_gelu

    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("BiasGelu", ["h", "bias"], ["g"], domain="com.microsoft"),
        helper.make_node("Neg", ["g"], ["n"]),
    ]
    ir = make_ir(nodes, [("x", [2, 8, D])], [("g", None), ("n", None)],
                 {"w": rng.standard_normal((D, 4 * D)) * 0.1, "bias": rng.standard_normal(4 * D)}.items())
    ir.model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    out, count = _apply(ir, split_bias_gelu)
    assert count == 1
    graph = out.model.graph
    assert [(n.domain, n.op_type) for n in graph.node] == [
        ("", "MatMul"), ("", "Add"), ("com.microsoft", "Gelu"), ("", "Neg")]
    assert [o.name for o in graph.output] == ["g", "n"]
    assert_same_outputs(ir, out, atol=1e-6)
