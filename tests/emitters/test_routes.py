"""Route planning: which routes a target is tried by, per source kind and `--route`, and the
refusals of `--route native` (exit 2 with the reason)."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.emitters import EmitOptions, get_emitter
from modelport.emitters.routes import NATIVE_ROUTES, kind_of, plan
from modelport.emitters.tflite_options import TFLiteOptions
from modelport.errors import BadInputError
from modelport.ir import IRModel, Reference, SourceRef, TensorSpec
from modelport.resolve.specs import SourceSpec


def _ir(kind: str | None, layout: str = "NHWC") -> IRModel:
    x = TensorSpec("image", "float32", ["batch", 8, 8, 3], layout=layout)
    y = TensorSpec("probs", "float32", ["batch", 4], layout="NC")
    ref = Reference({"image": np.zeros((2, 8, 8, 3), np.float32)}, {"probs": np.zeros((2, 4), np.float32)})
    return IRModel(model=None, inputs=[x], outputs=[y], reference=ref,
                   source=SourceRef(kind, "m.keras", SourceSpec()) if kind else None)


def _plan(kind, target, route, **emit):
    return plan(_ir(kind), target, route, EmitOptions(**emit), get_emitter(target))


def test_auto_native_first_for_tensorflow_sources_then_onnx():
    for kind in ("keras", "savedmodel"):
        for target in ("tflite", "savedmodel"):
            p = _plan(kind, target, "auto")
            assert [r.name for r in p.routes] == ["native", "onnx"] and not p.notes


def test_auto_pytorch_tflite_tries_onnx_then_litert():
    p = _plan("pytorch", "tflite", "auto")
    assert [(r.name, r.converter) for r in p.routes] == [("onnx", "onnx2tf"), ("native", "litert-torch")]


def test_onnx_route_is_always_there_and_alone():
    for kind in ("keras", "pytorch", "onnx", "graphdef"):
        assert [r.name for r in _plan(kind, "tflite", "onnx").routes] == ["onnx"]


def test_auto_without_a_native_route_says_so():
    p = _plan("pytorch", "savedmodel", "auto")
    assert [r.name for r in p.routes] == ["onnx"] and p.notes == ["no native route from pytorch to savedmodel"]


def test_native_where_there_is_none_is_exit_2_naming_the_routes():
    with pytest.raises(BadInputError) as e:
        _plan("pytorch", "savedmodel", "native")
    assert e.value.exit_code == 2 and "no native route from a pytorch source to savedmodel" in e.value.message
    assert "keras→savedmodel" in e.value.message and "onnx→tflite" in e.value.message


def test_onnx_side_sources_reach_tflite_by_generated_code_after_onnx2tf():
    """ONNX, GraphDef and Hugging Face sources: onnx2tf first, then the IR's PyTorch code through
    litert-torch; `--route native` takes the second alone. The route needs the IR's graph."""
    for kind in ("onnx", "graphdef", "huggingface"):
        assert NATIVE_ROUTES.load(f"{kind}:tflite").NAME == "PyTorch code + litert-torch"
    ir = _ir("onnx", layout="NC")
    ir.model = _onnx_identity()
    p = plan(ir, "tflite", "auto", EmitOptions(), get_emitter("tflite"))
    assert [(r.name, r.converter) for r in p.routes] == [("onnx", "onnx2tf"), ("native", "PyTorch code + litert-torch")]
    assert [r.name for r in plan(ir, "tflite", "native", EmitOptions(), get_emitter("tflite")).routes] == ["native"]
    p = plan(ir, "tflite", "auto", EmitOptions(precision="int8"), get_emitter("tflite"))
    assert [r.name for r in p.routes] == ["onnx"] and "precision int8" in p.notes[0]


def test_tflite_sources_are_re_emitted_first():
    p = _plan("tflite", "tflite", "auto")
    assert [(r.name, r.converter) for r in p.routes] == [("native", "TFLite re-emission"), ("onnx", "onnx2tf")]
    p = _plan("tflite", "tflite", "auto", precision="int8", calibration="calib.npz")
    assert [r.name for r in p.routes] == ["onnx"] and "--calibration" in p.notes[0]
    with pytest.raises(BadInputError, match="keeps the file's layouts"):
        plan(_ir("tflite"), "tflite", "native", EmitOptions(target=TFLiteOptions(layout="nhwc")), get_emitter("tflite"))


def _onnx_identity():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["image"], ["probs"])], "g",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_native_refusing_the_options_is_exit_2_and_auto_falls_back_with_the_reason():
    with pytest.raises(BadInputError, match="litert-torch cannot convert to tflite: precision fp16"):
        _plan("pytorch", "tflite", "native", precision="fp16")
    p = _plan("pytorch", "tflite", "auto", precision="fp16")
    assert [r.name for r in p.routes] == ["onnx"] and "precision fp16" in p.notes[0]
    with pytest.raises(BadInputError, match="fp32 only"):
        _plan("keras", "savedmodel", "native", precision="int8")
    # TFLiteConverter keeps the source's layouts: nhwc on a channels-first input is refused
    nchw = _ir("savedmodel", layout="NCHW")
    with pytest.raises(BadInputError, match="channels-first"):
        plan(nchw, "tflite", "native", EmitOptions(target=TFLiteOptions(layout="nhwc")), get_emitter("tflite"))
    # the ONNX-consuming targets have the ONNX route only, whatever is asked
    assert [r.name for r in _plan("keras", "onnx", "native").routes] == ["onnx"]


def test_unknown_route_and_registry_keys():
    with pytest.raises(BadInputError, match="unknown route 'fast'"):
        _plan("keras", "tflite", "fast")
    assert set(NATIVE_ROUTES) == {"keras:tflite", "savedmodel:tflite", "keras:savedmodel", "savedmodel:savedmodel",
                                  "pytorch:tflite", "onnx:tflite", "graphdef:tflite", "huggingface:tflite", "tflite:tflite",
                                  "keras:tfjs", "savedmodel:tfjs", "pytorch:executorch", "pytorch:coreml"}
    assert kind_of({"framework": "tensorflow", "format": "graphdef"}) == "graphdef"
    assert kind_of({"framework": "tensorflow", "format": "savedmodel"}) == "savedmodel"
    assert kind_of({"framework": "keras"}) == "keras"


def test_a_run_goes_on_from_the_source_only_where_every_target_is_re_emitted(tmp_path):
    """When tf2onnx's IR of a `.tflite` drifts from the source, the run may still re-emit it: only
    when every target has a route that reads the source alone and takes the options."""
    from modelport.orchestration import ConvertOptions
    from modelport.orchestration.forward import from_source_alone
    from modelport.orchestration.jobs import Context
    from modelport.orchestration.request import decide
    from modelport.validation.report import Report

    def run(**options):
        return Context(decide("zoo:cnn_small", tmp_path / "out", ConvertOptions(**options)), Report("convert"))

    tfl = _ir("tflite")
    assert from_source_alone(tfl, run(targets=["tflite"]))
    assert from_source_alone(tfl, run(targets=["tflite"], precision="fp16"))
    assert not from_source_alone(tfl, run(targets=["tflite"], route="onnx"))
    assert not from_source_alone(tfl, run(targets=["tflite", "onnx"]))
    assert not from_source_alone(tfl, run(targets=["tflite"], precision="int8", calibration="calib.npz"))
    assert not from_source_alone(_ir("onnx"), run(targets=["tflite"]))  # the generated code reads the IR


def test_a_drifted_ir_leaves_only_the_routes_that_read_the_source_and_says_why():
    """jobs.plan_routes is the one planner: under drift (the IR fails parity with the source) the ONNX
    route is dropped before its preflight, with the reason in the plan's notes."""
    from modelport.orchestration.jobs import Job, plan_routes
    from modelport.resolve.precisions import Resolved
    from modelport.validation import Tolerance

    def job():
        return Job("tflite", "", _ir("tflite"), Resolved("tflite", "fp32", False, "emit", "fp32"), EmitOptions(), Tolerance())

    kept = job()
    plan_routes([kept], "auto")
    assert [r.name for r in kept.plan.routes][-1] == "onnx"  # without drift the ONNX route follows the native one
    drifted = job()
    plan_routes([drifted], "auto", drift="the ONNX IR fails parity with the source (min cosine 0.5)")
    assert "onnx" not in [r.name for r in drifted.plan.routes] and drifted.plan.routes
    assert drifted.plan.notes[-1] == "onnx route not taken: the ONNX IR fails parity with the source (min cosine 0.5)"
