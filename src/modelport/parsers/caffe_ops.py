"""Translations of the Caffe layers that combine, reshape or map their inputs: Eltwise, Concat,
Flatten, Reshape, Permute, Crop, Slice, Split and the activations (ReLU, PReLU, Softmax, Dropout,
LRN, Power, ELU and the plain unary ones)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from modelport.parsers.caffe_graph import Graph, Layer


def _eltwise(g: Graph, L: Layer) -> list[str]:
    p = L.proto.eltwise_param
    s = L.shapes[0]
    coeff = list(p.coeff)
    if coeff and len(coeff) != len(L.inputs):
        raise L.error(f"{len(coeff)} coefficients for {len(L.inputs)} bottoms")
    if len(L.inputs) < 2:
        raise L.error("Eltwise takes two or more bottoms")
    if p.operation == 1:  # SUM
        terms = [x if not coeff or c == 1 else g.node("Mul", [x, g.const(L.name, f"coeff{i}", np.array(c, np.float32))],
                                                      s, L.name)
                 for i, (x, c) in enumerate(zip(L.inputs, coeff or [1.0] * len(L.inputs), strict=True))]
        return [g.node("Sum", terms, s, L.name)]
    if coeff:
        raise L.error("coefficients are for the SUM operation only")
    if p.operation == 2:  # MAX
        return [g.node("Max", list(L.inputs), s, L.name)]
    out = L.inputs[0]  # PROD
    for x in L.inputs[1:]:
        out = g.node("Mul", [out, x], s, L.name)
    return [out]


def _concat(g: Graph, L: Layer) -> list[str]:
    p = L.proto.concat_param
    axis = L.axis(p.axis if p.HasField("axis") or not p.HasField("concat_dim") else p.concat_dim)
    g.across_batch(axis)
    s = list(L.shapes[0])
    sizes = [shape[axis] for shape in L.shapes]
    s[axis] = sum(sizes) if all(isinstance(d, int) for d in sizes) else None
    return [g.node("Concat", list(L.inputs), s, L.name, axis=axis)]


def _flatten(g: Graph, L: Layer) -> list[str]:
    p = L.proto.flatten_param
    s = L.shapes[0]
    a, e = L.axis(p.axis), L.axis(p.end_axis)
    g.across_batch(a)
    merged = math.prod(L.static(s[a:e + 1], "Flatten"))
    shape = [*s[:a], merged, *s[e + 1:]]
    target = [0] * a + [-1] + L.static(s[e + 1:], "Flatten")
    return [g.node("Reshape", [L.inputs[0], g.const(L.name, "shape", np.array(target, np.int64))], shape, L.name)]


def _reshape(g: Graph, L: Layer) -> list[str]:
    p = L.proto.reshape_param
    s = L.shapes[0]
    rank = len(s)
    axis = p.axis if p.axis >= 0 else rank + p.axis + 1
    if not 0 <= axis <= rank:
        raise L.error(f"axis {p.axis} is out of range for the input {s}")
    end = rank if p.num_axes < 0 else axis + p.num_axes
    if end > rank:
        raise L.error(f"axis {p.axis} and num_axes {p.num_axes} reach past the input {s}")
    dims = [int(d) for d in p.shape.dim]
    if sum(d == -1 for d in dims) > 1:
        raise L.error("more than one -1 in the shape")
    if axis == 0 and (not dims or dims[0] != 0) and end > 0:
        g.across_batch(0)
    middle = [s[axis + i] if d == 0 else d for i, d in enumerate(dims)]
    if -1 in middle:  # the dims a 0 copies cancel out (a dynamic batch among them)
        copied = {axis + i for i, d in enumerate(dims) if d == 0}
        total = math.prod(L.static([s[i] for i in range(axis, end) if i not in copied], "Reshape with -1"))
        rest = math.prod([d for d in dims if d not in (0, -1)]
                         + L.static([s[i] for i in copied if not axis <= i < end], "Reshape with -1"))
        if not rest or total % rest:
            raise L.error(f"the shape {dims} does not divide the input {s}")
        middle[middle.index(-1)] = total // rest
    shape = [*s[:axis], *middle, *s[end:]]
    target = [0] * axis + [0 if d == 0 else d for d in dims] + L.static(s[end:], "Reshape")
    if any(isinstance(d, str) for d in s[axis:end]) and -1 not in dims and 0 not in dims:
        raise L.error(f"the shape {dims} fixes a dynamic dim of the input {s}")
    if isinstance(s[0], str) and axis == 0 and dims and dims[0] == 0:
        target[0] = 0
    return [g.node("Reshape", [L.inputs[0], g.const(L.name, "shape", np.array(target, np.int64))], shape, L.name)]


def _permute(g: Graph, L: Layer) -> list[str]:
    s = L.shapes[0]
    order = [int(o) for o in L.proto.permute_param.order]
    if len(set(order)) != len(order) or any(o >= len(s) for o in order):
        raise L.error(f"the order {order} is not a permutation of the input's {len(s)} axes")
    order += [a for a in range(len(s)) if a not in order]
    if order[0] != 0:
        g.across_batch(0)
    return [g.node("Transpose", [L.inputs[0]], [s[o] for o in order], L.name, perm=order)]


def _crop(g: Graph, L: Layer) -> list[str]:
    p = L.proto.crop_param
    if len(L.inputs) != 2:
        raise L.error("Crop takes two bottoms: the blob and the reference")
    s, ref = L.shapes
    axis = L.axis(p.axis)
    g.across_batch(axis)
    axes = list(range(axis, len(s)))
    offsets = list(p.offset)
    if len(offsets) == 1:
        offsets = offsets * len(axes)
    elif not offsets:
        offsets = [0] * len(axes)
    elif len(offsets) != len(axes):
        raise L.error(f"{len(offsets)} offsets for the {len(axes)} cropped axes")
    size = L.static(ref[axis:], "Crop's reference")
    have = L.static(s[axis:], "Crop")
    if any(o + n > h for o, n, h in zip(offsets, size, have, strict=True)):
        raise L.error(f"the crop {size} at {offsets} does not fit the input {s}")
    consts = [g.const(L.name, what, np.array(v, np.int64))
              for what, v in (("starts", offsets), ("ends", [o + n for o, n in zip(offsets, size, strict=True)]),
                              ("axes", axes))]
    return [g.node("Slice", [L.inputs[0], *consts], [*s[:axis], *size], L.name)]


def _slice(g: Graph, L: Layer) -> list[str]:
    p = L.proto.slice_param
    s = L.shapes[0]
    axis = L.axis(p.axis if p.HasField("axis") or not p.HasField("slice_dim") else p.slice_dim)
    g.across_batch(axis)
    (size,) = L.static([s[axis]], "Slice")
    tops = len(L.proto.top)
    points = [int(v) for v in p.slice_point]
    if points:
        if len(points) != tops - 1:
            raise L.error(f"{len(points)} slice points for {tops} tops")
        bounds = [0, *points, size]
    else:
        if size % tops:
            raise L.error(f"{size} does not split into {tops} equal parts")
        bounds = [size // tops * i for i in range(tops + 1)]
    parts = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    if any(n <= 0 for n in parts):
        raise L.error(f"the slice points {points} do not split {size}")
    from onnx import helper

    outs = [g.fresh(f"{L.name}/Split") for _ in parts]
    g.nodes.append(helper.make_node("Split", [L.inputs[0], g.const(L.name, "split", np.array(parts, np.int64))], outs,
                                    name=g.fresh(f"{L.name}#Split"), axis=axis))
    for out, n in zip(outs, parts, strict=True):
        g.shapes[out] = [*s[:axis], n, *s[axis + 1:]]
    return outs


def _unary(op: str, **attrs) -> Callable:
    def convert(g: Graph, L: Layer) -> list[str]:
        return [g.node(op, [L.inputs[0]], L.shapes[0], L.name, **attrs)]
    return convert


def _relu(g: Graph, L: Layer) -> list[str]:
    slope = L.proto.relu_param.negative_slope
    if slope:
        return [g.node("LeakyRelu", [L.inputs[0]], L.shapes[0], L.name, alpha=float(slope))]
    return [g.node("Relu", [L.inputs[0]], L.shapes[0], L.name)]


def _prelu(g: Graph, L: Layer) -> list[str]:
    s = L.shapes[0]
    shared = L.proto.prelu_param.channel_shared
    if len(s) < 2:
        raise L.error(f"PReLU takes an input with a channel axis, the input is {s}")
    c = 1 if shared else L.static([s[1]], "PReLU")[0]
    (slope,) = L.blobs(("slope", [c]))
    slope = slope.reshape([1, c] + [1] * (len(s) - 2))
    return [g.node("PRelu", [L.inputs[0], g.const(L.name, "slope", slope)], s, L.name)]


def _softmax(g: Graph, L: Layer) -> list[str]:
    axis = L.axis(L.proto.softmax_param.axis)
    g.across_batch(axis)
    return [g.node("Softmax", [L.inputs[0]], L.shapes[0], L.name, axis=axis)]


def _dropout(g: Graph, L: Layer) -> list[str]:
    p = L.proto.dropout_param
    if p.scale_train:  # inference passes the input through
        return [g.node("Identity", [L.inputs[0]], L.shapes[0], L.name)]
    keep = g.const(L.name, "keep", np.array(1.0 - p.dropout_ratio, np.float32))
    return [g.node("Mul", [L.inputs[0], keep], L.shapes[0], L.name)]


def _lrn(g: Graph, L: Layer) -> list[str]:
    """x / (k + alpha/n * sum of x^2 over a window of n channels)^beta, the window sum a 1x1
    convolution with a band of ones (plain ops every target has; ONNX's LRN is the same formula)."""
    p = L.proto.lrn_param
    if p.norm_region != 0:
        raise L.error("WITHIN_CHANNEL normalisation has no translation (ACROSS_CHANNELS has)")
    x, s = L.inputs[0], L.shapes[0]
    if len(s) != 4:
        raise L.error(f"LRN takes a 4-D NCHW input, the input is {s}")
    (c,) = L.static([s[1]], "LRN")
    n = int(p.local_size)
    before = (n - 1) // 2
    band = np.zeros((c, c, 1, 1), np.float32)
    for i in range(c):
        band[i, max(i - before, 0):min(i - before + n, c), 0, 0] = 1.0
    square = g.node("Mul", [x, x], s, L.name)
    total = g.node("Conv", [square, g.const(L.name, "window", band)], s, L.name, kernel_shape=[1, 1])
    scaled = g.node("Mul", [total, g.const(L.name, "alpha", np.array(p.alpha / n, np.float32))], s, L.name)
    base = g.node("Add", [scaled, g.const(L.name, "k", np.array(p.k, np.float32))], s, L.name)
    denom = g.node("Pow", [base, g.const(L.name, "beta", np.array(p.beta, np.float32))], s, L.name)
    return [g.node("Div", [x, denom], s, L.name)]


def _power(g: Graph, L: Layer) -> list[str]:
    p = L.proto.power_param
    x, s = L.inputs[0], L.shapes[0]
    if p.scale != 1:
        x = g.node("Mul", [x, g.const(L.name, "scale", np.array(p.scale, np.float32))], s, L.name)
    if p.shift != 0:
        x = g.node("Add", [x, g.const(L.name, "shift", np.array(p.shift, np.float32))], s, L.name)
    if p.power != 1:
        x = g.node("Pow", [x, g.const(L.name, "power", np.array(p.power, np.float32))], s, L.name)
    return [x if x != L.inputs[0] else g.node("Identity", [x], s, L.name)]


def _elu(g: Graph, L: Layer) -> list[str]:
    return [g.node("Elu", [L.inputs[0]], L.shapes[0], L.name, alpha=float(L.proto.elu_param.alpha))]


def _split(g: Graph, L: Layer) -> list[str]:
    return [g.node("Identity", [L.inputs[0]], L.shapes[0], L.name) for _ in L.proto.top]


# the translations of this module by layer type (caffe_layers.CONVERTERS holds them all)
OPS: dict[str, Callable] = {
    "ReLU": _relu, "PReLU": _prelu, "ELU": _elu,
    "Sigmoid": _unary("Sigmoid"), "TanH": _unary("Tanh"), "AbsVal": _unary("Abs"), "BNLL": _unary("Softplus"),
    "Softmax": _softmax, "Eltwise": _eltwise, "Concat": _concat, "Flatten": _flatten, "Reshape": _reshape,
    "Dropout": _dropout, "LRN": _lrn, "Permute": _permute, "Power": _power, "Crop": _crop, "Slice": _slice,
    "Split": _split,
}
