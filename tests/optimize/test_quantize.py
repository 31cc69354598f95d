import numpy as np
import pytest

from modelport.optimize.quantize import quantize_dynamic, quantize_model
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import DEFAULT_TOLERANCES, compare
from tests.optimize.conftest import make_ir


@pytest.fixture(scope="module")
def mlp_ir():
    from onnx import helper

    rng = np.random.default_rng(3)
    return make_ir([helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"]),
                    helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")],
                   [("x", [4, 64])], [("y", [4, 32])],
                   {"w1": rng.standard_normal((64, 128)) * 0.1, "w2": rng.standard_normal((128, 32)) * 0.1})


def _ops(model):
    return {n.op_type for n in model.graph.node}


def test_dynamic_quantization_helper(mlp_ir):
    out = quantize_dynamic(mlp_ir)
    assert "MatMulInteger" in _ops(out.model) or "DynamicQuantizeMatMul" in _ops(out.model)
    assert out.provenance["precision"] == "int8"
    outs = OnnxRuntimeRunner(out.model).run(mlp_ir.reference.inputs)
    assert compare(mlp_ir.reference.outputs, outs, DEFAULT_TOLERANCES["int8"], hop="t").ok


def test_static_qdq_from_npz(mlp_ir, tmp_path):
    from modelport.optimize.calibration import load_calibration

    rng = np.random.default_rng(5)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((32, 64)).astype(np.float32))
    samples = load_calibration(tmp_path / "calib.npz", mlp_ir)
    assert len(samples) == 8 and samples[0]["x"].shape == (4, 64)
    out, info = quantize_model(mlp_ir, mode="static", calibration=samples, method="minmax")
    assert "QuantizeLinear" in _ops(out.model) and "DequantizeLinear" in _ops(out.model)
    assert info.parity_ok and info.calibration == {"samples": 8, "method": "minmax"}
    # judged on the first calibration sample (fixed batch of 4) against the FP32 model
    assert info.checked_on == "4 calibration rows against the FP32 model"
    np.testing.assert_array_equal(out.reference.inputs["x"], samples[0]["x"])
    fp32 = OnnxRuntimeRunner(mlp_ir.model).run(samples[0])
    np.testing.assert_allclose(out.reference.outputs[next(iter(fp32))], next(iter(fp32.values())))


def test_static_without_calibration_is_bad_input(mlp_ir):
    from modelport.errors import BadInputError

    with pytest.raises(BadInputError):
        quantize_model(mlp_ir, mode="static")


def test_divergent_node_excluded(mlp_ir):
    """A budget no INT8 model meets: nodes get excluded one by one, named in the info."""
    from modelport.validation import Tolerance

    out, info = quantize_model(mlp_ir, tol=Tolerance(1e-7, 0.0, 1.0), max_rounds=2)
    assert info.diverged and info.excluded
    assert info.excluded[0] in {"fc1", "fc2"}
