"""TensorRT target on CPU: the parser check node by node, the build plan, exit 5 without a GPU.

Building and running an engine needs `tensorrt` and a CUDA GPU; that one test is skipped here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from modelport.emitters import trt_plan, trt_support
from modelport.emitters.tensorrt_options import TensorRTOptions
from modelport.errors import BadInputError, MissingDependencyError, UnsupportedError
from modelport.orchestration import ConvertOptions, convert
from tests.conftest import check_options_class, tree
from tests.emitters.models import det_model, save_onnx


@pytest.fixture(scope="module")
def cnn_ir():
    from modelport.parsers import SourceSpec, parse
    from modelport.resolve.specs import parse_input_spec
    from modelport.zoo_builders.pytorch import cnn_small

    return parse(cnn_small(), SourceSpec(inputs=[parse_input_spec("x:batch,3,32,32")]))


def test_real_cnn_passes_the_parser_check(cnn_ir):
    check = trt_support.check_model(cnn_ir.model)
    assert check.ok, check.to_dict(all_nodes=False)
    assert len(check.nodes) == len(cnn_ir.model.graph.node)
    assert {n.op for n in check.nodes} >= {"Conv", "Relu", "Add"}


def test_unsupported_and_restricted_nodes_are_named():
    from onnx import TensorProto, helper

    check = trt_support.check_model(det_model())
    bad = {n.node: n for n in check.unsupported}
    assert list(bad) == ["det_node"] and "Det" in bad["det_node"].reason
    # restrictions decidable from the graph: 1-D pooling, TopK sorted=0, a custom-domain op
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2], name="pool1d"),
             helper.make_node("TopK", ["p", "k"], ["v", "i"], sorted=0, name="topk"),
             helper.make_node("Foo", ["v"], ["y"], domain="com.example", name="custom")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[helper.make_tensor("k", TensorProto.INT64, [1], [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    reasons = {n.node: n.reason for n in trt_support.check_model(m).unsupported}
    assert set(reasons) == {"pool1d", "topk", "custom"}
    assert "2D or 3D" in reasons["pool1d"] and "sorted=0" in reasons["topk"] and "plugin" in reasons["custom"]


def test_int64_weights_and_double_are_warnings():
    from onnx import TensorProto, helper

    big = helper.make_tensor("big", TensorProto.INT64, [1], [2**40])
    g = helper.make_graph([helper.make_node("Add", ["x", "big"], ["y"], name="add64"),
                           helper.make_node("Cast", ["d"], ["e"], to=1, name="cast_d")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.INT64, [1]),
                           helper.make_tensor_value_info("d", TensorProto.DOUBLE, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, [1]),
                           helper.make_tensor_value_info("e", TensorProto.FLOAT, [1])], initializer=[big])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    check = trt_support.check_model(m)
    warns = {n.node: n.reason for n in check.warnings}
    assert check.ok and "beyond INT32" in warns["add64"] and "DOUBLE" in warns["cast_d"]


def test_profiles_derived_from_the_contract(cnn_ir):
    plan = trt_plan.make_plan(cnn_ir, "fp32")
    p = plan.profiles[0]
    batch = cnn_ir.reference.inputs["x"].shape[0]
    assert (p.name, p.source) == ("x", "derived")
    assert p.min == [1, 3, 32, 32] and p.opt == [batch, 3, 32, 32] and p.max == [max(4 * batch, 8), 3, 32, 32]


def test_a_declared_range_is_the_profile(cnn_ir):
    """--dim batch=2..16: the optimisation profile spans the declared bounds, optimised at the sample."""
    from dataclasses import replace

    from modelport.dims import parse_dims

    ir = replace(cnn_ir, dim_bounds=parse_dims(["batch=2..16"]))
    p = trt_plan.make_plan(ir, "fp32").profiles[0]
    batch = cnn_ir.reference.inputs["x"].shape[0]
    assert (p.source, p.min, p.opt, p.max) == ("declared", [2, 3, 32, 32], [batch, 3, 32, 32], [16, 3, 32, 32])


def test_profile_names_are_checked_against_real_inputs(cnn_ir):
    with pytest.raises(BadInputError, match=r"\['input'\] are not inputs of the model; its inputs are \['x'\]"):
        trt_plan.make_plan(cnn_ir, "fp32", shapes=["input:1x3x32x32:4x3x32x32:8x3x32x32"])
    with pytest.raises(BadInputError, match="axis 1 is fixed at 3"):
        trt_plan.make_plan(cnn_ir, "fp32", shapes=["x:1x4x32x32:4x4x32x32:8x4x32x32"])
    with pytest.raises(BadInputError, match="min <= opt <= max"):
        trt_plan.parse_shapes_option(["x:8x3x32x32:4x3x32x32:8x3x32x32"])
    user = trt_plan.make_plan(cnn_ir, "fp32", shapes=["x:1x3x32x32:16x3x32x32:64x3x32x32"]).profiles[0]
    assert (user.opt, user.max, user.source) == ([16, 3, 32, 32], [64, 3, 32, 32], "user")


def test_trtexec_command_matches_the_tensorrt_version(cnn_ir):
    plan = trt_plan.make_plan(cnn_ir, "fp16", shapes=["x:1x3x32x32:8x3x32x32:32x3x32x32"], workspace_mib=2048)
    v10, v11 = trt_plan.trtexec_command(plan, 10), trt_plan.trtexec_command(plan, 11)
    assert "--onnx=model.onnx" in v10 and "--fp16" in v10
    assert "--onnx=model_fp16.onnx" in v11 and "--fp16" not in v11 and "--best" not in v11
    for cmd in (v10, v11):
        assert "--minShapes=x:1x3x32x32" in cmd and "--optShapes=x:8x3x32x32" in cmd and "--maxShapes=x:32x3x32x32" in cmd
        assert "--memPoolSize=workspace:2048M" in cmd and "--timingCacheFile=timing.cache" in cmd
    from modelport.resolve.precisions import resolve

    with pytest.raises(BadInputError, match="the tensorrt target takes --precision fp32, fp16, best, not int8") as e:
        resolve(["tensorrt"], "int8")  # refused before any work, with the reason from its descriptor
    assert "Q/DQ" in e.value.hint


def test_plan_only_writes_the_build_plan(cnn_ir, tmp_path):
    from modelport.zoo_builders.pytorch import cnn_small

    out = tmp_path / "out"
    report = convert(cnn_small(), out, ConvertOptions(targets=["tensorrt"], inputs=["x:batch,3,32,32"], precision="fp16",
                                                      target_options={"tensorrt": TensorRTOptions(plan_only=True, workspace=1024)}))
    assert report["status"] == "ok"
    names = set(tree(out))
    assert {"tensorrt/plan.json", "tensorrt/trtexec.sh", "tensorrt/build_engine.py", "tensorrt/compat.json",
            "tensorrt/model.onnx", "tensorrt/model_fp16.onnx", "report.json"} <= names
    assert "model.plan" not in names
    art = report["artifacts"][0]
    assert art["plan_only"] and art["check"]["ok"] and art["check"]["unsupported"] == 0
    assert not any("tensorrt" in p["hop"] for p in report["parity"])  # nothing ran it
    plan = json.loads((out / "tensorrt/plan.json").read_text())
    assert plan["workspace_mib"] == 1024 and plan["profiles"][0]["name"] == "x"
    compat = json.loads((out / "tensorrt/compat.json").read_text())
    assert len(compat["nodes"]) == compat["unsupported"] + sum(1 for n in compat["nodes"] if n["status"] != "unsupported")
    # the FP16 ONNX the strongly typed TensorRT 11 build uses runs, with FP32 I/O
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    x = cnn_ir.reference.inputs["x"]
    got = OnnxRuntimeRunner(str(out / "tensorrt/model_fp16.onnx")).run({"x": x})
    np.testing.assert_allclose(got["output"], cnn_ir.reference.outputs["output"], atol=2e-2)
    # the build script runs standalone and says what it needs
    p = subprocess.run([sys.executable, str(out / "tensorrt/build_engine.py")], capture_output=True, text=True)
    if p.returncode != 0:
        assert p.returncode == 5 and "tensorrt is not installed" in p.stderr


@pytest.mark.skipif(__import__("importlib").util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_without_tensorrt_exit_5_and_no_output(tmp_path, tiny_onnx):
    out = tmp_path / "out"
    with pytest.raises(MissingDependencyError) as e:
        convert(tiny_onnx, out, ConvertOptions(targets=["tensorrt"]))
    assert e.value.exit_code == 5
    assert "modelport[tensorrt]" in e.value.message and "--plan-only" in e.value.message
    assert "3/3 nodes supported" in e.value.message
    assert not out.exists() and tree(tmp_path) == ["src", "src/tiny.onnx"]
    from modelport.runtimes import get_runner

    with pytest.raises(MissingDependencyError, match="modelport\\[tensorrt\\]"):
        get_runner("tensorrt", tmp_path / "x.plan")


def test_unsupported_op_fails_before_writing(tmp_path):
    src = save_onnx(det_model(), tmp_path / "src", "det.onnx")
    out = tmp_path / "out"
    with pytest.raises(UnsupportedError) as e:
        convert(src, out, ConvertOptions(targets=["tensorrt"], target_options={"tensorrt": TensorRTOptions(plan_only=True)}))
    assert e.value.exit_code == 2 and "det_node (Det)" in e.value.message
    assert not out.exists()


@pytest.mark.skipif(__import__("importlib").util.find_spec("tensorrt") is None, reason="needs tensorrt and a CUDA GPU")
def test_engine_build_and_parity_on_gpu(tmp_path):  # pragma: no cover - GPU machines only
    from modelport.zoo_builders.pytorch import cnn_small

    out = tmp_path / "out"
    report = convert(cnn_small(), out, ConvertOptions(targets=["tensorrt"], inputs=["x:batch,3,32,32"]))
    assert (out / "model.plan").exists() and report["parity"][-1]["ok"]
    meta = json.loads((out / "tensorrt/engine.json").read_text())
    assert meta["tensorrt"] and meta["compute_capability"]


def test_options_are_checked_once_here():
    check_options_class(TensorRTOptions, [({"workspace": 0}, "--workspace must be a positive number of MiB"),
                                          ({"shapes": ["x:1x3"]}, "expected NAME:MIN:OPT:MAX"),
                                          ({"shapes": "x:8x3:4x3:8x3"}, "every dim needs min <= opt <= max")],
                        given={"shapes": "x:1x3:2x3:4x3"}, normalised={"shapes": ("x:1x3:2x3:4x3",)})
