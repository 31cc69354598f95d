"""modelport's ONNX → TensorFlow lowering (`emitters/onnx_tf.py`): each op against onnxruntime on
the same graph, traced once with its dynamic dims unknown and run at two sizes; and where it
stands in `tf_model.build`: taken when onnx2tf cannot convert a model, named in the report."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelport.errors import UnsupportedError
from modelport.ir import IRModel, specs_from_onnx

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _check(model, sizes, *, ints: dict[str, int] | None = None, atol=1e-5, tfjs: bool = True):
    """The lowering traced once with every named dim unknown, then run at each of `sizes`
    (dim name -> size) against onnxruntime; with `tfjs`, the same function saved, written as a TF.js
    graph model and run in Node.js at each size too."""
    import onnxruntime as ort
    import tensorflow as tf

    from modelport.emitters.onnx_tf import lowered_model

    ir = IRModel(model=model, inputs=specs_from_onnx(model.graph.input), outputs=specs_from_onnx(model.graph.output))
    lowered = lowered_model(tf, ir)
    fn = tf.function(lambda *xs: lowered(list(xs)), input_signature=lowered.inputs, autograph=False).get_concrete_function()
    session = ort.InferenceSession(model.SerializeToString())
    runner = _tfjs_runner(tf, lowered, ir) if tfjs else None
    rng = np.random.default_rng(0)
    for dims in sizes:
        feeds = {}
        for spec in ir.inputs:
            shape = [dims[d] if isinstance(d, str) else d for d in spec.shape]
            high = (ints or {}).get(spec.name)
            feeds[spec.name] = (rng.integers(0, high, shape) if high else rng.standard_normal(shape)).astype(spec.dtype)
        want = session.run(None, feeds)
        got = fn(*[tf.constant(feeds[s.name]) for s in ir.inputs])
        got = [np.asarray(g) for g in (got if isinstance(got, (list, tuple)) else [got])]
        runs = {"tensorflow": got}
        if runner is not None:
            out = runner.run(feeds)
            runs["tfjs"] = [out[o.name] for o in ir.outputs]
        for where, outs in runs.items():
            assert len(outs) == len(want)
            for g, w in zip(outs, want, strict=True):
                assert g.shape == w.shape, (where, dims, g.shape, w.shape)
                np.testing.assert_allclose(g.astype(w.dtype), w, atol=atol, rtol=1e-5, err_msg=f"{where} {dims}")


def _tfjs_runner(tf, lowered, ir):
    """The lowered function as a TF.js graph model (a SavedModel in between), in a runner."""
    import tempfile
    from pathlib import Path

    from modelport.emitters.tfjs_graph import convert_saved_model
    from modelport.runtimes.tfjs import TFJSRunner

    def serve(*xs):
        return {o.name: y for o, y in zip(ir.outputs, lowered(list(xs)), strict=True)}

    module = tf.Module()
    module.lowered = lowered
    fn = tf.function(serve, input_signature=[tf.TensorSpec(s.shape, s.dtype, name=s.name) for s in lowered.inputs],
                     autograph=False)
    work = Path(tempfile.mkdtemp(prefix="onnx-tf-test-"))
    tf.saved_model.save(module, str(work / "saved"), signatures={"serving_default": fn.get_concrete_function()})
    convert_saved_model(tf, work / "saved", work / "tfjs", "fp32")
    return TFJSRunner(work / "tfjs" / "model.json")


def test_reshape_from_the_graphs_own_shape_arithmetic_keeps_both_dims_dynamic():
    """What a PyTorch attention block does: Shape → Gather → Concat into Reshape, a 0 copying a dim,
    -1 inferring one, then a transpose and a matmul of the heads."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
        helper.make_node("Concat", ["b", "n", "heads", "hd"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["h"]),
        helper.make_node("Transpose", ["h"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["h"], ["tt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["t", "tt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "t"], ["ctx"]),
        helper.make_node("Reshape", ["ctx", "back"], ["y"]),
    ]
    model = _model(nodes, [("x", F, ["batch", "seq", 8])], [("y", F, None)],
                   {"i0": np.array([0]), "i1": np.array([1]), "heads": np.array([2]), "hd": np.array([4]),
                    "back": np.array([0, -1, 4])})
    _check(model, [{"batch": 1, "seq": 3}, {"batch": 3, "seq": 7}])


def test_slices_with_int64_extremes_negative_steps_and_run_time_bounds():
    nodes = [
        helper.make_node("Slice", ["x", "st", "en", "ax"], ["a"]),  # [1:] along 1, to the end written as INT64_MAX
        helper.make_node("Slice", ["x", "rs", "re", "ax2", "neg"], ["r"]),  # reversed along 2, INT64 extremes
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Sub", ["n", "one"], ["n1"]),
        helper.make_node("Slice", ["x", "zero", "n1", "one"], ["d"]),  # x[:, :n-1]: an end computed at run time
    ]
    big = np.iinfo(np.int64).max
    model = _model(nodes, [("x", F, ["b", "n", 5])], [("a", F, None), ("r", F, None), ("d", F, None)],
                   {"st": np.array([1]), "en": np.array([big]), "ax": np.array([1]), "rs": np.array([-1]),
                    "re": np.array([-big]), "ax2": np.array([2]), "neg": np.array([-1]), "one": np.array([1]),
                    "zero": np.array([0])})
    _check(model, [{"b": 1, "n": 2}, {"b": 2, "n": 6}])


def test_gather_negative_indices_squeeze_unsqueeze_split_expand_where():
    nodes = [
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),
        helper.make_node("Unsqueeze", ["g", "ax0"], ["u"]),
        helper.make_node("Squeeze", ["u", "ax0"], ["q"]),
        helper.make_node("Split", ["x", "parts"], ["s1", "s2"], axis=2),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Expand", ["row", "shape"], ["e"]),
        helper.make_node("Greater", ["x", "e"], ["m"]),
        helper.make_node("Where", ["m", "x", "e"], ["w"]),
        helper.make_node("Squeeze", ["one"], ["scalar"]),  # no axes: every size-1 dim
        helper.make_node("Mul", ["w", "scalar"], ["w2"]),
    ]
    model = _model(nodes, [("x", F, ["b", "n", 6])], [("q", F, None), ("s1", F, None), ("s2", F, None), ("w2", F, None)],
                   {"idx": np.array([-1, 0]), "ax0": np.array([0]), "parts": np.array([2, 4]),
                    "row": np.linspace(-1, 1, 6, dtype=np.float32), "one": np.ones((1, 1), np.float32) * 3})
    _check(model, [{"b": 1, "n": 2}, {"b": 3, "n": 5}])


def test_normalisations_reductions_and_activations():
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "bias"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("ReduceMean", ["ln", "ax"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["ln", "mean"], ["c"]),
        helper.make_node("Erf", ["c"], ["erf"]),
        helper.make_node("Gelu", ["c"], ["gelu"], approximate="tanh"),
        helper.make_node("Pow", ["c", "two"], ["sq"]),
        helper.make_node("ReduceSum", ["sq"], ["ss"], keepdims=0),
        helper.make_node("ArgMax", ["c"], ["am"], axis=-1, keepdims=1, select_last_index=1),
        helper.make_node("CumSum", ["c", "axis1"], ["cs"], reverse=1),
        helper.make_node("Trilu", ["c"], ["tri"], upper=0),
        helper.make_node("HardSwish", ["c"], ["hs"]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["cl"]),
    ]
    model = _model(nodes, [("x", F, ["b", "n", 6])],
                   [(o, t, None) for o, t in (("erf", F), ("gelu", F), ("ss", F), ("am", I64), ("cs", F), ("tri", F), ("hs", F), ("cl", F))],
                   {"g": np.linspace(0.5, 1.5, 6, dtype=np.float32), "bias": np.full(6, 0.1, np.float32), "ax": np.array([-1]),
                    "two": np.float32(2.0), "axis1": np.array(1), "lo": np.float32(-0.5), "hi": np.float32(0.5)}, opset=20)
    _check(model, [{"b": 1, "n": 6}, {"b": 2, "n": 9}], atol=1e-4)


def test_channels_first_convolutions_and_pools_on_a_dynamic_batch_and_width():
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w", "bw"], ["c"], pads=[1, 1, 1, 1], strides=[1, 2]),
        helper.make_node("Conv", ["c", "dw"], ["d0"], group=4, pads=[1, 1, 1, 1]),  # depthwise
        helper.make_node("Conv", ["d0", "dw"], ["d"], group=4, pads=[1, 1, 1, 1], strides=[2, 1]),  # unequal strides
        helper.make_node("Conv", ["d", "gw"], ["gc"], group=2),  # grouped 1x1
        helper.make_node("MaxPool", ["gc"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["gc"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        helper.make_node("GlobalAveragePool", ["ap"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["y"], axis=1),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["bn"]),
    ]
    model = _model(nodes, [("x", F, ["b", 3, 8, "w"])], [("mp", F, None), ("y", F, None), ("bn", F, None)],
                   {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "bw": rng.standard_normal(4).astype(np.float32),
                    "dw": rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "gw": rng.standard_normal((6, 2, 1, 1)).astype(np.float32),
                    "s": np.full(4, 2.0, np.float32), "bb": np.zeros(4, np.float32), "mu": np.full(4, 0.5, np.float32),
                    "var": np.full(4, 4.0, np.float32)})
    _check(model, [{"b": 1, "w": 8}, {"b": 2, "w": 12}], atol=1e-4)


def test_a_conv1d_and_shapes_built_by_range_and_constant_of_shape():
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]),
        helper.make_node("Shape", ["c"], ["s"]),
        helper.make_node("Gather", ["s", "two"], ["n"], axis=0),
        helper.make_node("Squeeze", ["n"], ["n0"]),
        helper.make_node("Range", ["zero", "n0", "step"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=F),
        helper.make_node("Add", ["c", "posf"], ["y"]),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Add", ["y", "ones"], ["z"]),
        helper.make_node("Einsum", ["z", "z"], ["gram"], equation="bcn,bdn->bcd"),
    ]
    model = _model(nodes, [("x", F, ["b", 2, "n"])], [("z", F, None), ("gram", F, None)],
                   {"w": rng.standard_normal((3, 2, 3)).astype(np.float32), "two": np.array([2]), "zero": np.int64(0),
                    "step": np.int64(1)})
    _check(model, [{"b": 1, "n": 4}, {"b": 2, "n": 9}], atol=1e-4)


def test_an_op_without_a_tensorflow_form_is_named():
    import tensorflow as tf

    from modelport.emitters.onnx_tf import lowered_model

    model = _model([helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"])],
                   [("boxes", F, [1, 4, 4]), ("scores", F, [1, 1, 4])], [("sel", I64, None)])
    ir = IRModel(model=model, inputs=specs_from_onnx(model.graph.input), outputs=specs_from_onnx(model.graph.output))
    with pytest.raises(UnsupportedError, match="has no TensorFlow form for NonMaxSuppression"):
        lowered_model(tf, ir)


def test_gathers_by_scalar_element_and_tuple_indices():
    """`x[:, 0]` (a 0-d index drops the axis, which TF.js's gather alone does not), GatherElements,
    GatherND with a batch dim (tf.gather_nd's own batch path writes an op TF.js cannot run) and
    without."""
    nodes = [
        helper.make_node("Gather", ["x", "zero"], ["first"], axis=1),
        helper.make_node("ArgMax", ["x"], ["am"], axis=2, keepdims=1),
        helper.make_node("GatherElements", ["x", "am"], ["best"], axis=2),
        helper.make_node("ArgMax", ["x"], ["am2"], axis=2, keepdims=0),
        helper.make_node("Unsqueeze", ["am2", "minus1"], ["tuples"]),
        helper.make_node("GatherND", ["x", "tuples"], ["picked"], batch_dims=2),
        helper.make_node("GatherND", ["x", "pairs"], ["rows"]),
        helper.make_node("TopK", ["x", "k"], ["top", "top_i"], axis=-1),
    ]
    model = _model(nodes, [("x", F, ["b", "n", 5])],
                   [("first", F, None), ("best", F, None), ("picked", F, None), ("rows", F, None), ("top", F, None),
                    ("top_i", I64, None)],
                   {"zero": np.array(0), "minus1": np.array([-1]), "pairs": np.array([[0, 0], [0, -1]]), "k": np.array([2])})
    _check(model, [{"b": 1, "n": 2}, {"b": 3, "n": 4}])


def test_resize_and_a_transposed_convolution_on_dynamic_height_and_width():
    """A segmentation head's upsampling (linear half-pixel by scales, nearest to sizes taken from
    another tensor's shape) and a detector's ConvTranspose with pads, on H and W unknown."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="linear"),
        helper.make_node("Resize", ["x", "", "scales"], ["nn"], mode="nearest", coordinate_transformation_mode="asymmetric",
                         nearest_mode="floor"),
        helper.make_node("Shape", ["up"], ["s"]),
        helper.make_node("Resize", ["x", "", "", "s"], ["to"], mode="nearest"),
        helper.make_node("Resize", ["x", "", "scales"], ["ac"], mode="linear", coordinate_transformation_mode="align_corners"),
        helper.make_node("ConvTranspose", ["x", "w", "b"], ["ct"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
    ]
    model = _model(nodes, [("x", F, [1, 3, "h", "w"])], [(o, F, None) for o in ("up", "nn", "to", "ac", "ct")],
                   {"scales": np.array([1, 1, 2, 2], np.float32), "w": rng.standard_normal((3, 4, 3, 3)).astype(np.float32),
                    "b": rng.standard_normal(4).astype(np.float32)}, opset=18)
    _check(model, [{"h": 4, "w": 6}, {"h": 7, "w": 5}], atol=1e-4)


def test_integer_division_truncates_toward_zero_as_onnxruntime_does():
    """An integer Div (shape arithmetic's, or a model's own on int64) truncates, negative quotients too."""
    nodes = [helper.make_node("Sub", ["x", "five"], ["y"]), helper.make_node("Div", ["y", "three"], ["q"])]
    model = _model(nodes, [("x", TensorProto.INT64, ["n"])], [("q", TensorProto.INT64, None)],
                   {"five": np.array(5, np.int64), "three": np.array(3, np.int64)})
    _check(model, [{"n": 11}], ints={"x": 11}, tfjs=False)
