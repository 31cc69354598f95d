"""Translations of the Caffe layers with weights or windows (Convolution, Deconvolution, Pooling,
InnerProduct, Scale, BatchNorm), and the table of every translated layer type."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from modelport.parsers.caffe_graph import Graph, Layer
from modelport.parsers.caffe_ops import OPS
from modelport.parsers.caffe_ssd import SSD


def _hw(p, field: str, *, default: int, layer: Layer) -> tuple[int, int]:
    """A 2-D kernel size, stride or pad from Caffe's `<field>` (one value, or one per axis where
    the field is repeated) or its `<x>_h` and `<x>_w` pair (`kernel_size` pairs with `kernel_h`)."""
    stem = field.split("_")[0]
    h, w = f"{stem}_h", f"{stem}_w"
    if p.HasField(h) or p.HasField(w):
        if not (p.HasField(h) and p.HasField(w)):
            raise layer.error(f"{h} and {w} go together, one of them is missing")
        return int(getattr(p, h)), int(getattr(p, w))
    if p.DESCRIPTOR.fields_by_name[field].label == p.DESCRIPTOR.fields_by_name[field].LABEL_REPEATED:
        values = [int(v) for v in getattr(p, field)]
        if len(values) > 2:
            raise layer.error(f"{len(values)} values of {field}; a 2-D layer takes 1 or 2")
        return (values[0], values[-1]) if values else (default, default)
    return (int(getattr(p, field)),) * 2 if p.HasField(field) else (default, default)


def _conv(g: Graph, L: Layer, *, transpose: bool = False) -> list[str]:
    p = L.proto.convolution_param
    x, s = L.inputs[0], L.shapes[0]
    if len(s) != 4 or p.axis != 1:
        raise L.error(f"only 2-D convolutions on NCHW inputs are translated, the input is {s}")
    kh, kw = _hw(p, "kernel_size", default=0, layer=L)
    if not kh or not kw:
        raise L.error("no kernel size")
    sh, sw = _hw(p, "stride", default=1, layer=L)
    ph, pw = _hw(p, "pad", default=0, layer=L)
    dil = list(p.dilation) or [1]
    dh, dw = int(dil[0]), int(dil[-1])
    group, n_out = int(p.group), int(p.num_output)
    cin = s[1]
    if not isinstance(cin, int) or not group or cin % group or n_out % group:
        raise L.error(f"group {group} does not divide the {cin} input and {n_out} output channels")
    kernel = [cin, n_out // group, kh, kw] if transpose else [n_out, cin // group, kh, kw]
    needed = [("weights", kernel)] + ([("bias", [n_out])] if p.bias_term else [])
    blobs = L.blobs(*needed)
    inputs = [x, g.const(L.name, "weights", blobs[0])] + ([g.const(L.name, "bias", blobs[1])] if p.bias_term else [])
    h, w = s[2], s[3]
    if transpose:
        shape = [s[0], n_out, *(None if not isinstance(d, int) else st * (d - 1) + di * (k - 1) + 1 - 2 * pd
                                for d, st, di, k, pd in ((h, sh, dh, kh, ph), (w, sw, dw, kw, pw)))]
    else:
        shape = [s[0], n_out, *(None if not isinstance(d, int) else (d + 2 * pd - (di * (k - 1) + 1)) // st + 1
                                for d, st, di, k, pd in ((h, sh, dh, kh, ph), (w, sw, dw, kw, pw)))]
    if any(isinstance(d, int) and d <= 0 for d in shape):
        raise L.error(f"the output would be {shape} for the input {s}")
    return [g.node("ConvTranspose" if transpose else "Conv", inputs, shape, L.name, kernel_shape=[kh, kw],
                   strides=[sh, sw], pads=[ph, pw, ph, pw], dilations=[dh, dw], group=group)]


def caffe_pool_size(size: int, kernel: int, stride: int, pad: int, *, ceil: bool, padded: bool) -> int:
    """Caffe's (and OpenCV's) pooled size: ceil (the default) or floor rounding, and with padding
    the last window must start inside the image or its top/left padding."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if padded and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pool(g: Graph, L: Layer) -> list[str]:
    p = L.proto.pooling_param
    x, s = L.inputs[0], L.shapes[0]
    if len(s) != 4:
        raise L.error(f"pooling takes a 4-D NCHW input, the input is {s}")
    if p.pool not in (0, 1):
        raise L.error("STOCHASTIC pooling has no translation")
    op = "Max" if p.pool == 0 else "Average"
    if p.global_pooling:
        return [g.node(f"Global{op}Pool", [x], [s[0], s[1], 1, 1], L.name)]
    h, w = L.static(s[2:], "pooling")
    kh, kw = _hw(p, "kernel_size", default=0, layer=L)
    if not kh or not kw:
        raise L.error("no kernel size")
    sh, sw = _hw(p, "stride", default=1, layer=L)
    ph, pw = _hw(p, "pad", default=0, layer=L)
    padded = bool(ph or pw)
    oh = caffe_pool_size(h, kh, sh, ph, ceil=p.ceil_mode, padded=padded)
    ow = caffe_pool_size(w, kw, sw, pw, ceil=p.ceil_mode, padded=padded)
    if oh <= 0 or ow <= 0:
        raise L.error(f"the kernel {kh}x{kw} does not fit the input {s}")
    # the end padding that makes a floor-rounded pooling give Caffe's size (never negative: a floor
    # pooling leaves the rows it does not reach unused)
    eh = max((oh - 1) * sh + kh - h - ph, 0)
    ew = max((ow - 1) * sw + kw - w - pw, 0)
    shape = [s[0], s[1], oh, ow]
    if op == "Max":  # a max window clipped to the image is what padding with -inf gives
        return [g.node("MaxPool", [x], shape, L.name, kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, eh, ew])]
    # Caffe divides each window's sum by its area inside the padded image [-pad, size + pad), the
    # zeros of the padding counted and the part beyond it not: a sum pooling over the zero-padded
    # input, divided by that area, a constant per output position
    area = np.empty((oh, ow), np.float32)
    for i in range(oh):
        rows = min(i * sh - ph + kh, h + ph) - (i * sh - ph)
        for j in range(ow):
            area[i, j] = rows * (min(j * sw - pw + kw, w + pw) - (j * sw - pw))
    if ph or pw or eh or ew:
        pads = g.const(L.name, "pads", np.array([0, 0, ph, pw, 0, 0, eh, ew], np.int64))
        x = g.node("Pad", [x, pads], [s[0], s[1], h + ph + eh, w + pw + ew], L.name, mode="constant")
    mean = g.node("AveragePool", [x], shape, L.name, kernel_shape=[kh, kw], strides=[sh, sw])
    if np.all(area == kh * kw):
        return [mean]
    return [g.node("Mul", [mean, g.const(L.name, "area", (kh * kw / area).astype(np.float32))], shape, L.name)]


def _inner_product(g: Graph, L: Layer) -> list[str]:
    p = L.proto.inner_product_param
    x, s = L.inputs[0], L.shapes[0]
    axis = L.axis(p.axis)
    g.across_batch(axis)
    k = math.prod(L.static(s[axis:], "InnerProduct"))
    n = int(p.num_output)
    needed = [("weights", [k, n] if p.transpose else [n, k])] + ([("bias", [n])] if p.bias_term else [])
    blobs = L.blobs(*needed)
    weights = blobs[0] if p.transpose else blobs[0].T
    shape = [*s[:axis], n]
    if axis == 1:
        flat = x if len(s) == 2 else g.node("Flatten", [x], [s[0], k], L.name, axis=1)
        inputs = [flat, g.const(L.name, "weights", np.ascontiguousarray(weights))]
        inputs += [g.const(L.name, "bias", blobs[1])] if p.bias_term else []
        return [g.node("Gemm", inputs, shape, L.name)]
    flat = g.node("Reshape", [x, g.const(L.name, "shape", np.array([0] * axis + [k], np.int64))], [*s[:axis], k], L.name)
    y = g.node("MatMul", [flat, g.const(L.name, "weights", np.ascontiguousarray(weights))], shape, L.name)
    if p.bias_term:
        y = g.node("Add", [y, g.const(L.name, "bias", blobs[1])], shape, L.name)
    return [y]


def _channel_shape(values: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A parameter over axes axis.. of the input, shaped to broadcast against it (trailing 1s)."""
    return values.reshape(list(values.shape) + [1] * (rank - axis - values.ndim))


def _covered(L: Layer, axis: int, num_axes: int) -> list[int]:
    s = L.shapes[0]
    end = len(s) if num_axes < 0 else axis + num_axes
    if end > len(s):
        raise L.error(f"axis {axis} and num_axes {num_axes} reach past the input {s}")
    return L.static(s[axis:end], "the parameter's shape")


def _scale(g: Graph, L: Layer) -> list[str]:
    p = L.proto.scale_param
    x, s = L.inputs[0], L.shapes[0]
    axis = L.axis(p.axis)
    if len(L.inputs) > 1 or p.num_axes != 0:
        g.across_batch(axis)
    if len(L.inputs) > 1:  # the scale is the second bottom, over the axes its shape covers
        other = L.shapes[1]
        target = [*L.static(other, "a second bottom"), *[1] * (len(s) - axis - len(other))]
        y = g.node("Reshape", [L.inputs[1], g.const(L.name, "shape", np.array(target, np.int64))], target, L.name)
        out = g.node("Mul", [x, y], s, L.name)
        if p.bias_term:
            (bias,) = L.blobs(("bias", _covered(L, axis, len(other))))
            out = g.node("Add", [out, g.const(L.name, "bias", _channel_shape(bias, axis, len(s)))], s, L.name)
        return [out]
    dims = _covered(L, axis, p.num_axes)
    needed = [("scale", dims)] + ([("bias", dims)] if p.bias_term else [])
    blobs = L.blobs(*needed)
    out = g.node("Mul", [x, g.const(L.name, "scale", _channel_shape(blobs[0], axis, len(s)))], s, L.name)
    if p.bias_term:
        out = g.node("Add", [out, g.const(L.name, "bias", _channel_shape(blobs[1], axis, len(s)))], s, L.name)
    return [out]


def _batch_norm(g: Graph, L: Layer) -> list[str]:
    p = L.proto.batch_norm_param
    x, s = L.inputs[0], L.shapes[0]
    if len(s) < 2 or not isinstance(s[1], int):
        raise L.error(f"the input {s} has no channel axis of a fixed size")
    c = s[1]
    needed = [("mean", [c]), ("variance", [c]), ("scale factor", [1])]
    if p.scale_bias:
        needed += [("scale", [c]), ("bias", [c])]
    blobs = L.blobs(*needed)
    if p.HasField("use_global_stats") and not p.use_global_stats:
        return [_batch_statistics(g, L, blobs)]
    factor = float(blobs[2][0])
    factor = 0.0 if factor == 0 else 1.0 / factor
    gamma = blobs[3] if p.scale_bias else np.ones(c, np.float32)
    beta = blobs[4] if p.scale_bias else np.zeros(c, np.float32)
    inputs = [x] + [g.const(L.name, what, np.asarray(v, np.float32))
                    for what, v in (("gamma", gamma), ("beta", beta), ("mean", blobs[0] * factor),
                                    ("variance", blobs[1] * factor))]
    return [g.node("BatchNormalization", inputs, s, L.name, epsilon=float(p.eps))]


def _batch_statistics(g: Graph, L: Layer, blobs: list[np.ndarray]) -> str:
    """`use_global_stats: false`: the input normalised with its own mean and variance per channel
    over the batch and the spatial axes, as Caffe does (the batch keeps its declared size; OpenCV
    runs this at batch 1 only)."""
    p = L.proto.batch_norm_param
    x, s = L.inputs[0], L.shapes[0]
    g.across_batch(0)
    axes = [0, *range(2, len(s))]
    mean = g.node("ReduceMean", [x], [1, s[1], *[1] * (len(s) - 2)], L.name, axes=axes, keepdims=1)
    centred = g.node("Sub", [x, mean], s, L.name)
    # E[x^2] - E[x]^2, as Caffe and OpenCV compute the variance (their rounding on inputs far from zero)
    square = g.node("ReduceMean", [g.node("Mul", [x, x], s, L.name)], g.shapes[mean], L.name, axes=axes, keepdims=1)
    var = g.node("Sub", [square, g.node("Mul", [mean, mean], g.shapes[mean], L.name)], g.shapes[mean], L.name)
    std = g.node("Sqrt", [g.node("Add", [var, g.const(L.name, "eps", np.array(p.eps, np.float32))], g.shapes[mean], L.name)],
                 g.shapes[mean], L.name)
    out = g.node("Div", [centred, std], s, L.name)
    if p.scale_bias:
        shape = [1, s[1], *[1] * (len(s) - 2)]
        out = g.node("Mul", [out, g.const(L.name, "gamma", blobs[3].reshape(shape))], s, L.name)
        out = g.node("Add", [out, g.const(L.name, "beta", blobs[4].reshape(shape))], s, L.name)
    return out


# every translated layer type -> its translation (those of caffe_ops.py and caffe_ssd.py included)
CONVERTERS: dict[str, Callable] = {
    "Convolution": _conv, "ConvolutionDepthwise": _conv,
    "Deconvolution": lambda g, L: _conv(g, L, transpose=True),
    "Pooling": _pool, "InnerProduct": _inner_product, "BatchNorm": _batch_norm, "Scale": _scale,
    **OPS, **SSD,
}
# the number of bottoms each translated type takes (None: one or more)
BOTTOMS = {"Eltwise": None, "Concat": None, "Crop": 2, "Scale": (1, 2), "PriorBox": 2}
