"""The registry both ONNX-op translators use (`emitters/op_registry.py`): entries over opset ranges,
lookup by the model's opset, an op outside every range named with its opset, duplicates refused;
and the two instances, the PyTorch code generator's converters and the TensorFlow lowering's ops."""

from __future__ import annotations

import re

import pytest

from modelport.emitters.op_registry import OpNotFound, OpRegistry


def _registry() -> OpRegistry:
    reg = OpRegistry("translator")

    @reg.register("Clip", until=10)
    def clip_attributes(*args):
        return "attributes"

    @reg.register("Clip", since=11)
    def clip_inputs(*args):
        return "inputs"

    @reg.register(("Relu", "Tanh"))
    def unary(*args):
        return "unary"

    @reg.register("TopK", since=10, until=12)
    def topk(*args):
        return "topk"

    @reg.register("Attention", domain="com.microsoft")
    def attention(*args):
        return "attention"

    return reg


def _another(*args):
    return "another"


def test_register_returns_the_function_and_lookup_picks_the_range_holding_the_opset():
    reg = _registry()
    assert reg.lookup("Clip", 1).fn() == "attributes"
    assert reg.lookup("Clip", 10).fn() == "attributes"  # until is inclusive
    assert reg.lookup("Clip", 11).fn() == "inputs"
    assert reg.lookup("Clip", 23).fn() == "inputs"  # until=None: every later opset
    assert reg.lookup("TopK", 10).fn() == reg.lookup("TopK", 12).fn() == "topk"
    assert reg.register("Foo")(_another) is _another
    entry = reg.lookup("Clip", 11)
    assert (entry.op_type, entry.since, entry.until, entry.domain) == ("Clip", 11, None, "")
    assert entry.origin == "test_op_registry"  # the registering module, named in a duplicate's error


def test_a_tuple_registers_one_function_for_each_op():
    reg = _registry()
    assert reg.lookup("Relu", 13).fn is reg.lookup("Tanh", 13).fn
    assert sorted(reg.ops()) == ["Attention", "Clip", "Relu", "Tanh", "TopK"]
    assert [(e.since, e.until) for e in reg.ops()["Clip"]] == [(1, 10), (11, None)]


def test_domains_are_kept_apart_and_ai_onnx_is_the_default_domain():
    reg = _registry()
    assert reg.lookup("Attention", 1, "com.microsoft").fn() == "attention"
    assert reg.find("Attention", 1) is None
    assert reg.lookup("Clip", 13, "ai.onnx").fn() == "inputs"


@pytest.mark.parametrize(("op", "opset", "domain", "message"), [
    ("TopK", 9, "", "no translator for ai.onnx::TopK at opset 9"),  # before its range
    ("TopK", 13, "", "no translator for ai.onnx::TopK at opset 13"),  # after it
    ("Det", 17, "", "no translator for ai.onnx::Det at opset 17"),  # never registered
    ("Attention", 1, "custom", "no translator for custom::Attention at opset 1"),
])
def test_an_op_outside_every_range_is_named_with_its_opset(op, opset, domain, message):
    reg = _registry()
    assert reg.find(op, opset, domain) is None
    with pytest.raises(OpNotFound) as err:
        reg.lookup(op, opset, domain)
    assert isinstance(err.value, KeyError)
    assert str(err.value) == message


@pytest.mark.parametrize(("since", "until", "other"), [(5, None, "1-10"), (1, 1, "1-10"), (10, 11, "1-10"), (30, 40, "11+")])
def test_a_duplicate_over_an_overlapping_range_is_refused(since, until, other):
    reg = _registry()
    with pytest.raises(ValueError, match=rf"duplicate translator for ai.onnx::Clip opsets {since}\S* \(test_op_registry\) "
                                         rf"overlaps {re.escape(other)} \(test_op_registry\)"):
        reg.register("Clip", since=since, until=until)(_another)
    assert len(reg.ops()["Clip"]) == 2  # nothing was added


def test_a_tuple_with_one_duplicate_is_refused_and_a_disjoint_range_is_not():
    reg = _registry()
    with pytest.raises(ValueError, match="duplicate translator for ai.onnx::Tanh"):
        reg.register(("Sigmoid", "Tanh"))(print)
    reg.register("TopK", since=13)(print)  # after 10-12: no overlap
    reg.register("Relu", domain="custom")(print)  # another domain: no overlap
    assert reg.lookup("TopK", 13).fn is print
    with pytest.raises(ValueError, match="empty opset range 5-4"):
        reg.register("Foo", since=5, until=4)(print)


def test_each_translator_has_its_own_instance():
    from modelport.emitters.onnx_tf import ops
    from modelport.emitters.pytorch_code.registry import default_table

    torch_table, tf_table = default_table(), ops()
    assert isinstance(torch_table, OpRegistry) and isinstance(tf_table, OpRegistry) and torch_table is not tf_table
    assert (torch_table.kind, tf_table.kind) == ("converter", "TensorFlow form")
    assert torch_table.lookup("Clip", 10).fn is not torch_table.lookup("Clip", 11).fn
    assert tf_table.lookup("Softmax", 11).fn is tf_table.lookup("Softmax", 13).fn  # the opset reaches the function
    with pytest.raises(KeyError, match="no TensorFlow form for ai.onnx::NonMaxSuppression at opset 13"):
        tf_table.lookup("NonMaxSuppression", 13)
