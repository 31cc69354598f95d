import numpy as np
import pytest

from modelport.optimize.precision import convert_fp16, to_fp16
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from tests.optimize.conftest import make_ir


@pytest.fixture(scope="module")
def overflow_ir():
    """x @ W, then * 1e5 (an activation far above 65504), then / 2e5 and tanh.

    Naive FP16 clamps both constants to 65504 (and on a GPU the product overflows): the result
    is tanh(h) instead of tanh(h / 2).
    """
    from onnx import helper

    rng = np.random.default_rng(0)
    return make_ir([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                    helper.make_node("Mul", ["h", "big"], ["hb"], name="scale_up"),
                    helper.make_node("Div", ["hb", "d"], ["q"], name="scale_down"),
                    helper.make_node("Tanh", ["q"], ["y"], name="tanh")],
                   [("x", [2, 16])], [("y", [2, 16])],
                   {"w": rng.standard_normal((16, 16)), "big": np.array(1e5), "d": np.array(2e5)})


def test_plain_fp16_overflows(overflow_ir):
    out, _ = convert_fp16(overflow_ir, auto_block=False)
    y = OnnxRuntimeRunner(out.model).run(overflow_ir.reference.inputs)["y"]
    assert not np.allclose(y, overflow_ir.reference.outputs["y"], atol=1e-2)


def test_overflowing_nodes_kept_in_fp32_and_parity_held(overflow_ir):
    out, info = convert_fp16(overflow_ir)
    assert "scale_up" in info.kept_fp32 and "scale_down" in info.kept_fp32
    assert "mm" not in info.kept_fp32
    assert info.parity_ok
    y = OnnxRuntimeRunner(out.model).run(overflow_ir.reference.inputs)["y"]
    np.testing.assert_allclose(y, overflow_ir.reference.outputs["y"], atol=1e-2)
    assert out.provenance["fp16"]["kept_fp32"] == info.kept_fp32
    assert any(t.data_type == 10 for t in out.model.graph.initializer)  # W really is FP16


def test_to_fp16_helper_and_io_types(overflow_ir):
    kept = to_fp16(overflow_ir)
    assert kept.model.graph.input[0].type.tensor_type.elem_type == 1
    half_io = to_fp16(overflow_ir, keep_io_types=False)
    assert half_io.model.graph.input[0].type.tensor_type.elem_type == 10
    assert half_io.inputs[0].dtype == "float16"
    assert overflow_ir.model.graph.initializer[0].data_type == 1  # input untouched


def test_fp16_on_bert_keeps_parity(bert_ir):
    out, info = convert_fp16(bert_ir)
    assert info.parity_ok
    from modelport.optimize.model_tools import model_size

    assert model_size(out.model) < 0.7 * model_size(bert_ir.model)


def test_fp16_is_judged_and_block_listed_on_every_sample_set():
    """x - 1000.7 holds in FP16 on random inputs (an output of scale 1000) but not at the high end
    of the input's range, where the result is near 0 and the constant's FP16 rounding (1000.5) is
    the whole answer: that sample set fails, the node is localised on it and kept in FP32."""
    from onnx import helper

    from modelport.ir import Sample
    from modelport.validation import check, tolerance_for

    ir = make_ir([helper.make_node("Sub", ["x", "c"], ["y"], name="shift")],
                 [("x", [2, 16])], [("y", [2, 16])], {"c": np.array(1000.7)})
    high = {"x": np.full((2, 16), 1000.0, np.float32)}
    ir.reference.extra = [Sample("high", high, OnnxRuntimeRunner(ir.model).run(high))]
    plain, _ = convert_fp16(ir, auto_block=False)
    first_only = check(OnnxRuntimeRunner(plain.model), type(ir.reference)(ir.reference.inputs, ir.reference.outputs),
                       tolerance_for("fp16"), "fp16")
    assert first_only.ok  # random inputs alone accept it
    assert not check(OnnxRuntimeRunner(plain.model), ir.reference, tolerance_for("fp16"), "fp16").ok
    out, info = convert_fp16(ir)
    assert "shift" in info.kept_fp32 and info.parity_ok
    assert info.diverged and info.diverged[0]["node"] == "shift"
    np.testing.assert_allclose(OnnxRuntimeRunner(out.model).run(high)["y"], -0.7, atol=1e-3)
