from __future__ import annotations

import pytest

from modelport.errors import BadInputError
from modelport.parsers import SourceSpec, detect, parse
from modelport.resolve.specs import parse_input_spec


def test_parse_records_contract_and_reference(tiny_onnx):
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx))
    assert [(s.name, s.shape, s.layout) for s in ir.inputs] == [("x", ["batch", 8], "NC")]
    assert ir.reference.inputs["x"].shape == (2, 8)
    assert set(ir.reference.outputs) == {"y"}
    assert detect(tiny_onnx) == "onnx"


def test_opset_conversion(tiny_onnx):
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx, opset=18))
    assert ir.provenance["opset"] == 18
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx, opset=15))
    assert ir.provenance["opset"] == 15
    with pytest.raises(BadInputError, match="cannot convert opset 17 to 13"):
        parse(tiny_onnx, SourceSpec(path=tiny_onnx, opset=13))


def test_user_spec_overrides_and_unknown_names(tiny_onnx):
    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx, inputs=[parse_input_spec("x:4x8")]))
    assert ir.inputs[0].shape == [4, 8]
    with pytest.raises(BadInputError, match=r"unknown input 'image'.*\['x'\]"):
        parse(tiny_onnx, SourceSpec(path=tiny_onnx, inputs=[parse_input_spec("image:1x8")]))
    with pytest.raises(BadInputError, match="rank"):
        parse(tiny_onnx, SourceSpec(path=tiny_onnx, inputs=[parse_input_spec("x:1x2x8")]))


def test_integer_inputs_take_the_values_their_graph_reads(tmp_path):
    """An encoder whose inputs lost their names: `a` indexes a 2-row type table (random 0..9 failed
    the reference run, exit 2), `b` becomes an additive mask (1 - b) * -10000: ids in [0, 2), ones."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Gather", ["types", "a"], ["t"]), helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT),
             helper.make_node("Sub", ["one", "bf"], ["inv"]), helper.make_node("Mul", ["inv", "big"], ["bias"]),
             helper.make_node("Unsqueeze", ["bias", "last"], ["bias3"]), helper.make_node("Add", ["t", "bias3"], ["y"])]
    inits = [numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "types"),
             numpy_helper.from_array(np.asarray(1.0, np.float32), "one"),
             numpy_helper.from_array(np.asarray(-10000.0, np.float32), "big"),
             numpy_helper.from_array(np.asarray([-1], np.int64), "last")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.INT64, [1, 6]),
                                           helper.make_tensor_value_info("b", TensorProto.INT64, [1, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    ir = parse(tmp_path / "m.onnx", SourceSpec(path=tmp_path / "m.onnx"))
    assert [s.value_range for s in ir.inputs] == [[0, 2], [1, 2]]
    assert ir.reference.inputs["a"].max() <= 1 and (ir.reference.inputs["b"] == 1).all()
    assert ir.reference.guessed == []


def test_newer_ir_version_is_lowered_for_onnxruntime(tmp_path):
    """onnx.helper writes the newest IR version, which onnxruntime may not load yet."""
    import onnx
    from onnx import TensorProto, helper

    from modelport.onnxfile.ir_version_fit import max_onnxruntime_ir_version

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = onnx.IR_VERSION
    p = tmp_path / "new.onnx"
    onnx.save(model, str(p))
    ir = parse(p, SourceSpec(path=p))
    assert ir.model.ir_version == min(onnx.IR_VERSION, max_onnxruntime_ir_version())
    if onnx.IR_VERSION > max_onnxruntime_ir_version():
        assert "lowered" in ir.provenance["ir_version_note"]


def _shaped_model(weight_rows: int = 64):
    """MatMul by a weight, Reshape by a small shape tensor, and an If whose branches read another weight."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((weight_rows, 32)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, 4, 8], np.int64), "shape")
    inner = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "inner")
    branch = helper.make_graph([helper.make_node("MatMul", ["h", "inner"], ["b"])], "branch", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)], [inner])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["y"]),
             helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", weight_rows]),
                                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shapes_are_inferred_without_the_weights_as_with_them():
    """infer_and_check runs onnx's inference and checker on a copy without the large weights: the
    shapes recorded (main graph and subgraphs) are those inference on the whole model gives, the
    weights are untouched, and an invalid model is still refused."""
    import onnx

    from modelport.onnxfile.weightless_copy import weightless
    from modelport.parsers.onnx import infer_and_check

    model = _shaped_model()
    whole = onnx.shape_inference.infer_shapes(_shaped_model(), strict_mode=False, data_prop=True)
    weights = [t.SerializeToString() for t in model.graph.initializer]
    skeleton, size = weightless(model)
    assert size == 64 * 32 * 4 + 2 * 32 * 32 * 4 and all(not t.raw_data for t in skeleton.graph.initializer if t.name != "shape")
    out = infer_and_check(model)
    assert out is model and [t.SerializeToString() for t in model.graph.initializer] == weights
    assert model.graph.value_info == whole.graph.value_info and model.graph.output == whole.graph.output
    assert [str(o.type) for o in model.graph.output] == [str(o.type) for o in whole.graph.output]
    assert model.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 4
    bad = _shaped_model()
    bad.graph.node[0].input[1] = "missing"
    with pytest.raises(BadInputError, match="invalid ONNX model"):
        infer_and_check(bad)


CHECK = """
import sys
from modelport.run.memory import own_peak
from modelport.parsers.onnx import infer_and_check
from tests.parsers.test_onnx import _shaped_model
small, big = _shaped_model(64), _shaped_model(int(sys.argv[1]))
infer_and_check(small)
before = own_peak()
infer_and_check(big)
print(own_peak() - before)
"""


def test_checking_a_large_model_does_not_copy_its_weights(tmp_path):
    """A model of 256 MB of weights checked in a child: the high-water mark grows by a small part of
    it (serialising it for onnx's inference and checker held it three times over)."""
    from tests.alone import run_alone

    rows = 2_000_000  # 2e6 x 32 float32: 256 MB
    grown = int(run_alone(CHECK, str(rows)).split()[-1])
    assert grown < 0.5 * rows * 32 * 4, grown


def _misdeclared(path, *, x: list, new_shape: list, declared: list):
    """y = Reshape(x * 0.5, new_shape), its output declared as `declared` whatever the Reshape gives."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array(new_shape, np.int64), "shape")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, declared)], [shape, half])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(exist_ok=True)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("target", ["onnx", "tflite"])
def test_declared_output_shape_that_onnxruntime_contradicts_gives_way_to_the_produced_one(cli, tmp_path, target):
    """The file declares y [1, 4]; onnxruntime, running it, returns [2, 1, 4]. The contract took the
    declaration, so a target that holds its artifact to the contract failed (tflite: exit 4, "the
    tflite artifact's output 'y' has the shape [2, 1, 4]; the contract's is [1, 4]"). The contract
    now follows the runtime, the IR declares that shape, and a warning names the declaration."""
    import onnx

    path = _misdeclared(tmp_path / "src" / "m.onnx", x=[8, 1], new_shape=[2, 1, 4], declared=[1, 4])
    out = tmp_path / "out"
    r = cli("convert", path, "--to", target, "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    report = r.json()
    (y,) = report["contract"]["outputs"]
    assert y["name"] == "y" and y["shape"] == [2, 1, 4]
    assert any("output 'y': the model declares the shape [1, 4], its runtime produces [2, 1, 4]" in w for w in report["warnings"])
    assert all(p["ok"] for p in report["parity"])
    if target == "onnx":
        dims = onnx.load(str(out / "model.onnx")).graph.output[0].type.tensor_type.shape.dim
        assert [d.dim_value for d in dims] == [2, 1, 4]


@pytest.mark.parametrize("x, new_shape, declared, expected", [
    (["n", 8], [0, 8], ["n", 3], ["n", 8]),  # the fixed dim that differs is replaced, the symbolic one kept
    (["n", 8], [0, 8], [5, 8], ["n", 8]),  # a fixed dim where the graph's is dynamic: symbolic again
    (["n", 8], [0, 2, 4], ["n", 8], ["n", 2, 4]),  # another rank: the graph's own dims, n still symbolic
    (["n", 8], [0, 8], ["n", 8], ["n", 8]),  # agreeing: nothing changes, n is not fixed at its sample size
])
def test_only_a_contradicted_output_shape_is_replaced(tmp_path, x, new_shape, declared, expected):
    path = _misdeclared(tmp_path / "m.onnx", x=x, new_shape=new_shape, declared=declared)
    ir = parse(path, SourceSpec(path=path))
    assert ir.outputs[0].shape == expected
    dims = ir.model.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == expected
    notes = [w for w in ir.provenance.get("warnings") or [] if "declares" in w]
    assert bool(notes) == (declared != expected)
    if notes:
        assert f"declares the shape {declared}" in notes[0] and f"the contract takes {expected}" in notes[0]
