from __future__ import annotations

import numpy as np

from modelport.ir import IRModel, Preprocess, TensorSpec, guess_layout
from modelport.parsers import SourceSpec, parse


def test_save_load_round_trip(tiny_onnx, tmp_path):
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx))
    ir.inputs[0].preprocess = Preprocess(mean=[0.5], std=[2.0])
    ir.save(tmp_path / "ir")
    again = IRModel.load(tmp_path / "ir")
    assert again.contract() == ir.contract()
    assert again.provenance["framework"] == "onnx"
    np.testing.assert_array_equal(again.reference.outputs["y"], ir.reference.outputs["y"])
    assert again.model.SerializeToString() == ir.model.SerializeToString()


def test_clone_is_independent(tiny_onnx):
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx))
    c = ir.clone()
    c.model.graph.node.pop()
    c.inputs[0].layout = "NTC"
    assert len(ir.model.graph.node) == 3 and ir.inputs[0].layout == "NC"


def test_spec_helpers():
    s = TensorSpec("x", shape=["batch", 3, "h", 8])
    assert s.dynamic_dims == {0: "batch", 2: "h"}
    assert s.concrete_shape({"h": 5}) == (2, 3, 5, 8)
    assert TensorSpec.from_dict(s.to_dict()) == s
    assert guess_layout([1, 3, 224, 224]) == "NCHW" and guess_layout([1, 224, 224, 3]) == "NHWC"
    assert guess_layout([1, 3, 3, 3]) is None


def test_contract_read_back_from_an_onnx_file(tiny_onnx):
    """One reader for the parser, the packager, `validate` and `inspect`: the graph's I/O plus what a
    modelport-written file stores beside it; a stored entry without a name is passed over."""
    import onnx

    from modelport.ir import contract_from_onnx
    from modelport.onnxfile.contract_stamp import CONTRACT_KEY, stamped_contract

    model = onnx.load(str(tiny_onnx))
    inputs, outputs, dims = contract_from_onnx(model)
    assert [s.name for s in inputs] == ["x"] and inputs[0].layout is None and dims == {}
    ir = IRModel(model, [TensorSpec("x", "float32", ["batch", 8], layout="NC", value_range=[0, 4])], outputs,
                 sample_dims={"batch": 3})
    with stamped_contract(ir) as stamped:
        inputs, _, dims = contract_from_onnx(stamped)
    assert (inputs[0].layout, inputs[0].value_range, dims) == ("NC", [0, 4], {"batch": 3})
    entry = model.metadata_props.add()
    entry.key, entry.value = CONTRACT_KEY, '{"inputs": [{"dtype": "float32"}], "outputs": []}'
    assert contract_from_onnx(model)[0][0].name == "x"


def test_negative_and_anonymous_onnx_dims_are_dynamic(tmp_path):
    """Paddle exports (e.g. an OCR classifier) write a batch of -1 and "?" for H and W: each is a
    dynamic dim of its own, so the sample inputs are sized and H need not equal W."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    x.type.tensor_type.shape.dim[0].dim_value = -1
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3, "?", "?"])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "paddle_like.onnx"
    onnx.save(model, path)
    ir = parse(path, SourceSpec(path=path))
    assert ir.inputs[0].shape == ["x_dim0", 3, "x_dim2", "x_dim3"]
    assert ir.reference.inputs["x"].shape[0] > 0


PARK = """
import sys
import numpy as np, onnx
from onnx import helper, numpy_helper
from modelport.ir import IRModel, TensorSpec
from modelport.run.memory import give_back, tree_rss
w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((300 << 18,), dtype=np.float32).reshape(-1, 1024), "w")
x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1024])
y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 300 << 8])
model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "wt"], ["y"]),
                                             helper.make_node("Transpose", ["w"], ["wt"])], "g", [x], [y], [w]))
del w
before = model.SerializeToString()
ir = IRModel(model=model, inputs=[TensorSpec("x", "float32", [1, 1024])], outputs=[TensorSpec("y", "float32", [1, 300 << 8])])
del model
give_back()
held = tree_rss()
with ir.weights_parked():
    parked = tree_rss()
    assert ir.model.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
assert ir.model.SerializeToString() == before
print(held - parked)
"""


def test_weights_parked_leave_memory_while_the_block_runs_and_come_back_the_same():
    """A 300 MB model: while parked, the process holds its graph only (the bytes it freed are given
    back to the system); afterwards the model is the same message, byte for byte."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PARK], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) > 250 << 20


def test_small_models_are_not_parked(tiny_onnx):
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx))
    model = ir.model
    with ir.weights_parked():
        assert ir.model is model
    assert ir.model is model
