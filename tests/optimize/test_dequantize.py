"""The `dequantize` pass: integer weights behind DequantizeLinear folded to float initializers
(per tensor, per channel, blocked; int8 and uint8 zero points, none; fp32 and fp16 scales), the
run-time activation quantisation dropped, and the precision passes started from the float graph."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.optimize import get_pass
from modelport.optimize.dequantize import before_float_passes, quantised
from tests.optimize.conftest import ops


def graph_ir(nodes, inits, x_shape, y_shape, *, opset=17, outputs=None, seed=0):
    """An IRModel of one float input x and output y; its references are `outputs(x)` (the float
    computation the quantised graph stands for), else onnxruntime's outputs."""
    from onnx import TensorProto, helper, numpy_helper

    from modelport.ir import IRModel, Reference, specs_from_onnx
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 9 if opset >= 19 else 8
    feeds = {"x": np.random.default_rng(seed).standard_normal(x_shape).astype(np.float32)}
    y = {"y": outputs(feeds["x"])} if outputs else OnnxRuntimeRunner(model).run(feeds)
    return IRModel(model, specs_from_onnx(graph.input), specs_from_onnx(graph.output), reference=Reference(feeds, y))


def quantised_ir(w, scale, zero_point=None, *, axis=None, block_size=None, opset=17):
    """y = x * DequantizeLinear(w, scale, zero_point): the weight's values reach the output one for one,
    so a fold that is off in one element shows there. References: onnxruntime's outputs."""
    from onnx import TensorProto, helper

    inits = {"w": w, "w_scale": scale} | ({} if zero_point is None else {"w_zero_point": zero_point})
    attrs = {k: v for k, v in (("axis", axis), ("block_size", block_size)) if v is not None}
    out_type = helper.np_dtype_to_tensor_dtype(np.asarray(scale).dtype)
    nodes = [helper.make_node("DequantizeLinear", list(inits), ["w_float"], name="dq", **attrs)]
    if out_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["w_float"], ["w_cast"], to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Mul", ["x", nodes[-1].output[0]], ["y"]))
    return graph_ir(nodes, inits, w.shape, w.shape, opset=opset)


def _onnxruntime_outputs(ir):
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    return OnnxRuntimeRunner(ir.model).run(ir.reference.inputs)


rng = np.random.default_rng(1)
W8 = rng.integers(-128, 128, (4, 6), dtype=np.int8)
WU8 = rng.integers(0, 256, (4, 6), dtype=np.uint8)
CASES = {
    "per-tensor int8": dict(w=W8, scale=np.float32(0.02), zero_point=np.int8(3)),
    "per-tensor uint8": dict(w=WU8, scale=np.float32(0.05), zero_point=np.uint8(128)),
    "per-tensor, no zero point": dict(w=W8, scale=np.float32(0.1)),
    "per-tensor, shape [1]": dict(w=W8, scale=np.array([0.03], np.float32), zero_point=np.array([-2], np.int8)),
    "per-channel axis 0 int8": dict(w=W8, scale=np.linspace(0.01, 0.2, 4, dtype=np.float32),
                                    zero_point=np.array([0, 1, -1, 5], np.int8), axis=0),
    "per-channel axis -1 uint8": dict(w=WU8, scale=np.linspace(0.01, 0.06, 6, dtype=np.float32),
                                      zero_point=np.arange(120, 126, dtype=np.uint8), axis=-1),
    "per-channel default axis 1": dict(w=W8, scale=np.linspace(0.5, 1.0, 6, dtype=np.float32)),
    "fp16 scale": dict(w=W8, scale=np.float16(0.01), zero_point=np.int8(0), opset=19),
    "blocked axis 1": dict(w=W8, scale=np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]], np.float32),
                           zero_point=np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.int8), axis=1, block_size=4,
                           opset=21),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_weight_folds_to_the_float_initializer_onnxruntime_computes(case):
    params = CASES[case]
    ir = quantised_ir(**params)
    assert quantised(ir.model)
    result = get_pass("dequantize").apply(ir)
    assert result.modified
    assert result.details == {"initializers": 1, "per_channel": int(np.asarray(params["scale"]).size > 1),
                              "activation_round_trips": 0}
    model = result.model.model
    assert "DequantizeLinear" not in ops(result.model) and not quantised(model)
    (folded,) = [t for t in model.graph.initializer]  # the int8 tensor, its scale and zero point are gone
    assert folded.name == "w_float" and folded.data_type == (10 if case == "fp16 scale" else 1)
    # exactly onnxruntime's DequantizeLinear: every output element is x times one weight
    np.testing.assert_array_equal(_onnxruntime_outputs(result.model)["y"], ir.reference.outputs["y"])
    assert ops(ir)[0] == "DequantizeLinear" and len(ir.model.graph.initializer) >= 2  # the input is not mutated


def test_activation_round_trip_dropped_and_weights_folded():
    """tf2onnx's hybrid fully connected layer: x → DynamicQuantizeLinear → DequantizeLinear → MatMul with an
    int8 weight behind DequantizeLinear; the float graph is one MatMul on a float weight."""
    from onnx import helper

    w = np.random.default_rng(2).integers(-127, 128, (8, 3), dtype=np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    ir = graph_ir(nodes, {"w": w, "s": np.full(3, 0.02, np.float32), "z": np.zeros(3, np.int8)}, (2, 8), (2, 3))
    result = get_pass("dequantize").apply(ir)
    assert result.details == {"initializers": 1, "per_channel": 1, "activation_round_trips": 1}
    assert ops(result.model) == ["MatMul"]
    float_y = ir.reference.inputs["x"] @ (w.astype(np.float32) * np.float32(0.02))
    np.testing.assert_allclose(_onnxruntime_outputs(result.model)["y"], float_y, rtol=1e-5, atol=1e-6)
    # what differs from the quantised graph is x's run-time rounding to uint8 (its step about 0.02 here)
    quantised_y = ir.reference.outputs["y"]
    assert 0 < np.abs(float_y - quantised_y).max() < 0.2
    assert np.dot(float_y.ravel(), quantised_y.ravel()) / np.linalg.norm(float_y) / np.linalg.norm(quantised_y) > 0.999


def test_left_as_it_is_what_is_no_weight():
    """A DequantizeLinear of a graph input (an activation) or one whose output is a graph output stays."""
    from onnx import TensorProto, helper, numpy_helper

    from modelport.ir import IRModel, specs_from_onnx

    nodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("q", TensorProto.INT8, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(np.float32(0.5), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ir = IRModel(model, specs_from_onnx(graph.input), specs_from_onnx(graph.output))
    assert not quantised(model) and not get_pass("dequantize").apply(ir).modified
    w = numpy_helper.from_array(np.arange(4, dtype=np.int8), "w")
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["w", "s"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [w, numpy_helper.from_array(np.float32(0.5), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = get_pass("dequantize").apply(IRModel(model, [], specs_from_onnx(graph.output)))
    assert not result.modified and result.details["initializers"] == 0


def test_inserted_before_the_first_pass_that_takes_float_weights():
    ir = quantised_ir(w=W8, scale=np.float32(0.02))
    passes = [get_pass("dce"), get_pass("fp16"), get_pass("int8-dynamic")]
    assert [p.name for p in before_float_passes(passes, ir.model)] == ["dce", "dequantize", "fp16", "int8-dynamic"]
    assert before_float_passes(passes[:1], ir.model) == passes[:1]  # no pass that needs it
    plain = quantised_ir(w=W8, scale=np.float32(0.02))
    plain.model.graph.node[0].input[0] = "x"  # no initializer behind it: nothing quantised to fold
    assert before_float_passes(passes, plain.model) == passes


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_precision_passes_start_from_the_float_graph(precision):
    """FP16 wrote the weight's DequantizeLinear an fp16 scale (a model onnxruntime refuses), INT8 expected
    the MatMul's weight to be an initializer: both were rolled back and the precision not delivered."""
    from onnx import helper

    from modelport.optimize.pipeline import OptimizeOptions, optimize_ir

    r = np.random.default_rng(4)
    w, s = r.integers(-127, 128, (64, 32), dtype=np.int8), r.uniform(0.005, 0.01, 32).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wd"], axis=1), helper.make_node("MatMul", ["x", "wd"], ["y"])]
    # references: the float computation (onnxruntime runs DequantizeLinear → MatMul as MatMulNBits, int8 activations)
    ir = graph_ir(nodes, {"w": w, "s": s, "z": np.zeros(32, np.int8)}, (4, 64), (4, 32),
                  outputs=lambda x: x @ (w.astype(np.float32) * s))
    out, rows, _ = optimize_ir(ir, OptimizeOptions(level="none", precision=precision))
    assert [(row["pass"], row["status"]) for row in rows] == [("dequantize", "applied"), (rows[1]["pass"], "applied")]
    assert rows[0]["details"] == {"initializers": 1, "per_channel": 1, "activation_round_trips": 0}
    assert out.provenance["precision"] == precision
    inits = {t.name: t.data_type for t in out.model.graph.initializer}
    assert "w" not in inits and "s" not in inits  # the int8 weight and its scale are gone
    if precision == "fp16":
        assert inits["wd"] == 10 and "DequantizeLinear" not in ops(out)
    else:
        assert "MatMulInteger" in ops(out)
