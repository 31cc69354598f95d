"""User input specs against the model's own: a wrong dim or dtype is exit 2 naming it, in one line."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.errors import BadInputError
from modelport.ir import TensorSpec
from modelport.parsers.contract import merge_specs


@pytest.fixture
def fixed_onnx(tmp_path):
    """y = relu(x @ w) with x fixed at [1, 8]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "fixed.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("spec,words", [
    ("x:2,8", "input 'x' dim 0 is fixed at 1 in the model [1, 8], the spec gives 2"),
    ("x:batch,8", "input 'x' dim 0 is fixed at 1 in the model [1, 8], the spec gives 'batch' (a dynamic dim)"),
    ("x:1,eight", "input 'x' dim 1 is fixed at 8"),
    ("x:1,7", "input 'x' dim 1 is fixed at 8"),
    ("x:1,8:int64", "input 'x' is float32 in the model, the spec gives int64"),
    ("x:1,8:float99", "unknown dtype 'float99'"),
    ("x:1,8,1", "has rank 2"),
])
def test_bad_input_spec_on_an_onnx_model_is_exit_2_naming_the_dim(cli, fixed_onnx, tmp_path, spec, words):
    r = cli("convert", fixed_onnx, "--input", spec, "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert not (tmp_path / "out").exists()


def test_tiny_model_dynamic_dims_still_take_sizes(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "--input", "x:3,8", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    assert r.json()["contract"]["inputs"][0]["shape"] == [3, 8]


def test_merge_specs_fixed_only_binds_graph_dims():
    graph = [TensorSpec(name="x", shape=["batch", 8], dtype="float32")]
    assert merge_specs(graph, [TensorSpec(name="x", shape=[4, 8])], fixed=True)[0].shape == [4, 8]
    # a source whose specs are only defaults (PyTorch, zoo) keeps accepting new sizes
    graph = [TensorSpec(name="x", shape=[1, 8], dtype="float32")]
    assert merge_specs(graph, [TensorSpec(name="x", shape=[1, 16])])[0].shape == [1, 16]
    with pytest.raises(BadInputError, match="dim 1 is fixed at 8"):
        merge_specs([TensorSpec(name="x", shape=[1, 8])], [TensorSpec(name="x", shape=[1, 16])], fixed=True)


def test_a_scalar_spec_on_an_input_with_dims_is_exit_2():
    from modelport.resolve.specs import parse_input_spec

    with pytest.raises(BadInputError, match=r"input 'x' has rank 2 \['batch', 8\], the spec gives a scalar"):
        merge_specs([TensorSpec("x", shape=["batch", 8])], [parse_input_spec("x:scalar")])
    (sr,) = merge_specs([TensorSpec("sr", dtype="int64", shape=[])], [parse_input_spec("sr:scalar:int64")])
    assert (sr.shape, sr.dtype) == ([], "int64")


def test_produced_shapes_replace_only_contradicted_dims():
    """`follow_produced`: a size that differs between sample sets becomes a symbolic dim, a declared
    symbolic dim stays, and an output without a declared shape is left alone."""
    from modelport.parsers.contract import follow_produced

    outs = [TensorSpec("boxes", shape=["n", 4]), TensorSpec("scores", shape=[1, "n"]), TensorSpec("free", shape=[])]
    produced = [{"boxes": np.zeros((3, 4)), "scores": np.zeros((2, 3, 7)), "free": np.zeros((2, 2))},
                {"boxes": np.zeros((5, 4)), "scores": np.zeros((2, 5, 7)), "free": np.zeros((2, 2))}]
    notes = follow_produced(outs, produced, declared={"boxes", "scores"})
    assert [o.shape for o in outs] == [["n", 4], [2, "scores_dim1", 7], []]
    (note,) = notes
    assert "output 'scores': the model declares the shape [1, 'n'], its runtime produces [2, 3, 7] or [2, 5, 7]" in note
