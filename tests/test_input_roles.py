"""An input's role read from the ONNX graph that consumes it (token ids, a mask, a size or index)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from modelport.ir import TensorSpec
from modelport.reference.input_roles import MASK, Role, apply_roles, controls, input_roles


def _model(inputs, nodes, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _positional_decoder():
    """What torch.export gives a GPT-2 called with positional arguments: args_0 (ids) reshaped
    into an embedding Gather, args_1 (the mask) reshaped and cast to bool for a Where."""
    nodes = [
        helper.make_node("Reshape", ["args_0", "shape"], ["view"]),
        helper.make_node("Gather", ["wte", "view"], ["emb"]),
        helper.make_node("Reshape", ["args_1", "shape"], ["view_1"]),
        helper.make_node("Cast", ["view_1"], ["keep"], to=T.BOOL),
        helper.make_node("Where", ["keep", "zero", "ninf"], ["bias"]),
        helper.make_node("Unsqueeze", ["bias", "last"], ["bias3"]),
        helper.make_node("Add", ["emb", "bias3"], ["y"]),
    ]
    inits = [_const("shape", [1, 4], np.int64), _const("wte", np.zeros((100, 8))), _const("zero", 0.0),
             _const("ninf", -1e9), _const("last", [-1], np.int64)]
    return _model([_vi("args_0", T.INT64, [1, 4]), _vi("args_1", T.INT64, [1, 4])], nodes,
                  [_vi("y", T.FLOAT, [1, 4, 8])], inits)


def test_ids_and_mask_of_a_positionally_exported_decoder():
    assert input_roles(_positional_decoder()) == {"args_0": Role("ids", (0, 100)), "args_1": MASK}


def test_an_encoder_mask_turned_into_an_additive_bias_and_a_type_table():
    nodes = [
        helper.make_node("Gather", ["word", "input_ids"], ["w"]),
        helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
        helper.make_node("Unsqueeze", ["attention", "axes"], ["m1"]),
        helper.make_node("Cast", ["m1"], ["mf"], to=T.FLOAT),
        helper.make_node("Sub", ["one", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias"]),
        helper.make_node("Add", ["w", "t"], ["e"]),
        helper.make_node("Add", ["e", "bias"], ["y"]),
    ]
    inits = [_const("word", np.zeros((30, 8))), _const("types", np.zeros((2, 8))), _const("axes", [-1], np.int64),
             _const("one", 1.0), _const("big", -10000.0)]
    model = _model([_vi("input_ids", T.INT64, [1, 4]), _vi("token_type_ids", T.INT64, [1, 4]),
                    _vi("attention", T.INT64, [1, 4])], nodes, [_vi("y", T.FLOAT, [1, 4, 8])], inits)
    assert input_roles(model) == {"input_ids": Role("ids", (0, 30)), "token_type_ids": Role("ids", (0, 2)),
                                  "attention": MASK}


def test_sizes_and_indices_are_controls_and_arithmetic_has_no_role():
    nodes = [
        helper.make_node("Resize", ["image", "", "scales"], ["big"], mode="nearest"),
        helper.make_node("Flatten", ["big"], ["big_flat"]),
        helper.make_node("TopK", ["big_flat", "k"], ["vals", "idx"]),
        helper.make_node("Cast", ["count"], ["countf"], to=T.FLOAT),
        helper.make_node("Add", ["countf", "vals"], ["y"]),
    ]
    model = _model([_vi("image", T.FLOAT, [1, 1, 2, 2]), _vi("scales", T.FLOAT, [4]), _vi("k", T.INT64, [1]),
                    _vi("count", T.INT64, [1])], nodes, [_vi("y", T.FLOAT, [None]), _vi("idx", T.INT64, [None])])
    assert input_roles(model) == {"scales": Role("control"), "k": Role("control")}


def test_roles_give_integer_specs_their_ranges_and_name_what_structured_sets_keep():
    model = _positional_decoder()
    specs = [TensorSpec("args_0", "int64", [1, 4]), TensorSpec("args_1", "int64", [1, 4])]
    roles = apply_roles(specs, model)
    assert [s.value_range for s in specs] == [[0, 100], [1, 2]]
    assert controls(roles, specs) == set()
    # a declared range and a pinned input are left as they are
    specs = [TensorSpec("args_0", "int64", [1, 4], value_range=[0, 7]), TensorSpec("args_1", "int64", [1, 4])]
    apply_roles(specs, model, given={"args_1": np.ones((1, 4), np.int64)})
    assert [s.value_range for s in specs] == [[0, 7], None]
    # a float input with a role keeps its values in the structured sets
    assert controls({"scales": Role("control"), "x": MASK}, [TensorSpec("scales"), TensorSpec("x")]) == {"scales", "x"}


def test_ids_a_padding_mask_is_made_from_take_real_tokens_only():
    """`input_ids != 1` (RoBERTa's padding id, as its position ids are built): the ids are [2, rows),
    not ones; a mask compared with 0 given as a Constant node's value_int is a mask."""
    nodes = [
        helper.make_node("Gather", ["word", "input_ids"], ["w"]),
        helper.make_node("Constant", [], ["pad"], value_int=1),
        helper.make_node("Equal", ["input_ids", "pad"], ["is_pad"]),
        helper.make_node("Not", ["is_pad"], ["real"]),
        helper.make_node("Constant", [], ["zero"], value_int=0),
        helper.make_node("Equal", ["keep", "zero"], ["dropped"]),
        helper.make_node("Where", ["dropped", "ninf", "w"], ["wm"]),
        helper.make_node("Where", ["real", "wm", "ninf"], ["y"]),
    ]
    model = _model([_vi("input_ids", T.INT64, [1, 4]), _vi("keep", T.INT64, [1, 4])], nodes, [_vi("y", T.FLOAT, [1, 4, 8])],
                   [_const("word", np.zeros((50, 8))), _const("ninf", -1e9)])
    roles = input_roles(model)
    assert roles == {"input_ids": Role("ids", (2, 50)), "keep": MASK}
