"""Route planning: which routes a target is tried by, per source kind and `--route`, and the
refusals of `--route native` (exit 2 with the reason)."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.emitters import EmitOptions, get_emitter
from modelport.emitters.routes import NATIVE_ROUTES, kind_of, plan
from modelport.emitters.tflite import TFLiteOptions
from modelport.errors import BadInputError
from modelport.ir import IRModel, Reference, SourceRef, TensorSpec
from modelport.specs import SourceSpec


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
    p = _plan("graphdef", "tflite", "auto")
    assert [r.name for r in p.routes] == ["onnx"] and p.notes == ["no native route from graphdef to tflite"]


def test_native_where_there_is_none_is_exit_2_naming_the_routes():
    with pytest.raises(BadInputError) as e:
        _plan("onnx", "tflite", "native")
    assert e.value.exit_code == 2 and "no native route from a onnx source to tflite" in e.value.message
    assert "keras→tflite" in e.value.message and "pytorch→tflite" in e.value.message


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
                                  "pytorch:tflite"}
    assert kind_of({"framework": "tensorflow", "format": "graphdef"}) == "graphdef"
    assert kind_of({"framework": "tensorflow", "format": "savedmodel"}) == "savedmodel"
    assert kind_of({"framework": "keras"}) == "keras"
