import numpy as np
from onnx import helper, numpy_helper

from modelport.validation.localize import first_divergence, magnitudes
from tests.optimize.conftest import make_ir


def test_first_divergent_node_named_in_small_batches():
    ir = make_ir([helper.make_node("Relu", ["x"], ["a"], name="n0"), helper.make_node("Sigmoid", ["a"], ["b"], name="n1"),
                  helper.make_node("Mul", ["b", "k"], ["c"], name="n2"), helper.make_node("Tanh", ["c"], ["y"], name="n3")],
                 [("x", [2, 4])], [("y", [2, 4])], {"k": np.full(4, 2.0)})
    cand = type(ir.model)()
    cand.CopyFrom(ir.model)
    cand.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full(4, 2.5, np.float32), "k"))
    div = first_divergence(ir.model, cand, ir.reference.inputs, batch=1)
    assert div.node == "n2" and div.tensor == "c" and div.checked == 3
    assert first_divergence(ir.model, ir.model, ir.reference.inputs) is None


def test_magnitudes():
    ir = make_ir([helper.make_node("Mul", ["x", "k"], ["y"], name="m")], [("x", [2, 4])], [("y", [2, 4])], {"k": np.full(4, 1e6)})
    assert magnitudes(ir.model, ir.reference.inputs)["y"] > 1e5


def test_plan_batches_packs_in_order_under_the_budget():
    from modelport.runtimes.onnxruntime import plan_batches

    assert plan_batches([100, 100, 300, 50, 50], 200) == [[0, 1], [2], [3, 4]]  # 300 > budget: alone
    assert plan_batches([100, 100, 100], 300) == [[0, 1, 2]]  # exactly at the budget fits
    assert plan_batches([100, 100, 100], 299) == [[0, 1], [2]]
    assert plan_batches([1] * 5, None, batch=2) == [[0, 1], [2, 3], [4]]
    assert plan_batches([10, 10, 10, 10], 1000, batch=3) == [[0, 1, 2], [3]]  # the count cap still applies
    assert plan_batches([500, 1, 1], 0) == [[0], [1], [2]]  # at least one tensor per batch
    assert plan_batches([], 100) == []


def _wide_model():
    """x [64, 64] (16 KiB) -> a 16 KiB, b/y 64 KiB (Concat x4), f 16 KiB, c data-dependent (Compress)."""
    return make_ir([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                    helper.make_node("Concat", ["a", "a", "a", "a"], ["b"], axis=0, name="concat"),
                    helper.make_node("Sigmoid", ["b"], ["y"], name="sigmoid"),
                    helper.make_node("Reshape", ["x", "shp"], ["f"], name="flat"),
                    helper.make_node("Greater", ["f", "zero"], ["m"], name="gt"),
                    helper.make_node("Compress", ["f", "m"], ["c"], name="compress")],
                   [("x", [64, 64])], [("y", [256, 64]), ("c", ["k"])],
                   {"shp": np.array([-1], np.int64), "zero": np.zeros((), np.float32)})


def test_tensor_sizes_from_shape_inference_with_feed_shapes():
    from modelport.runtimes.onnxruntime import tensor_sizes

    ir = _wide_model()
    sizes = tensor_sizes(ir.model, ir.reference.inputs, ["a", "b", "y", "f", "c"])
    # c's length depends on the data: counted at the largest known size
    assert sizes == {"a": 16384, "b": 65536, "y": 65536, "f": 16384, "c": 65536}


def test_symbolic_input_dims_take_the_feed_shape():
    import onnx

    from modelport.runtimes.onnxruntime import tensor_sizes

    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Concat", ["a", "a"], ["y"], axis=1)], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "m"])]),
        opset_imports=[helper.make_opsetid("", 17)])
    sizes = tensor_sizes(m, {"x": np.zeros((8, 100), np.float32)}, ["a", "y"])
    assert sizes == {"a": 3200, "y": 6400}


def test_run_tensors_sessions_hold_only_what_fits_the_budget():
    from modelport.runtimes.onnxruntime import run_tensors

    ir = _wide_model()
    names = ["a", "b", "y", "f", "c"]
    got = list(run_tensors(ir.model, ir.reference.inputs, names, max_bytes=100_000))
    assert [list(d) for d in got] == [["a", "b"], ["y", "f"], ["c"]]  # 80 KiB, 80 KiB, 64 KiB (estimated)
    assert all(sum(v.nbytes for v in d.values()) <= 100_000 for d in got)
    tiny = list(run_tensors(ir.model, ir.reference.inputs, names, max_bytes=1))
    assert [list(d) for d in tiny] == [[n] for n in names]
    assert [list(d) for d in run_tensors(ir.model, ir.reference.inputs, names)] == [names]  # default: one session
    np.testing.assert_array_equal(got[1]["y"], ir.reference.outputs["y"])


def test_first_divergence_with_a_tiny_budget_finds_the_node():
    from modelport.validation.localize import first_divergence, magnitudes

    ir = _wide_model()
    cand = type(ir.model)()
    cand.CopyFrom(ir.model)
    next(n for n in cand.graph.node if n.name == "sigmoid").op_type = "Tanh"
    for budget in (1, 2 * 16384 + 2 * 65536, None):
        div = first_divergence(ir.model, cand, ir.reference.inputs, max_bytes=budget, batch=None)
        assert (div.node, div.tensor, div.checked) == ("sigmoid", "y", 3)
    assert first_divergence(ir.model, ir.model, ir.reference.inputs, max_bytes=1) is None
    mags = magnitudes(ir.model, ir.reference.inputs, max_bytes=1)
    assert set(mags) == {"a", "b", "y", "f", "c"}
    assert mags["y"] == float(np.abs(ir.reference.outputs["y"]).max())


def test_sizes_without_copying_big_weights():
    """Big initializers are declared as inputs for inference, so the weights never enter it."""
    from modelport.runtimes.onnxruntime import _skeleton, tensor_sizes

    ir = make_ir([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"])],
                 [("x", [3, 256])], [("y", [3, 512])], {"w": np.ones((256, 512))})  # 512 KiB of weights
    skeleton = _skeleton(ir.model, ir.reference.inputs)
    assert skeleton.ByteSize() < 4096 and [t.name for t in skeleton.graph.initializer] == []
    assert tensor_sizes(ir.model, ir.reference.inputs, ["h", "y"]) == {"h": 3 * 512 * 4, "y": 3 * 512 * 4}
