"""The math, normalisation and window ops of modelport's ONNX → TensorFlow lowering
(`emitters/onnx_tf.py`): matrix products, softmax, normalisations, activations, padding, top-k and
the channels-first convolutions and pools, each computed channels-last between two transposes (as
TensorFlow's CPU kernels and TF.js take them; grappler folds the transposes that meet). The
tensor and shape ops are in `onnx_tf_ops.py`; the registry every op function registers in
(`OPS`) and the conventions it follows, in `onnx_tf_common.py`.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.onnx_tf_common import OPS, axes_of, axis_of, dtype_of, rank, required_static, shape_of, static
from modelport.emitters.onnx_tf_ops import drop_axes
from modelport.errors import UnsupportedError


@OPS.register(("Softmax", "LogSoftmax"))
def _softmax(tf, node, ins, at, opset):
    fn = tf.nn.log_softmax if node.op_type == "LogSoftmax" else tf.nn.softmax
    x = ins[0]
    r = rank(node, x)
    axis = axis_of(at, r, -1)
    if opset < 13:  # the input flattened to 2-D at axis
        s = tf.shape(x)
        flat = tf.reshape(x, tf.stack([tf.reduce_prod(s[:axis]), tf.reduce_prod(s[axis:])]))
        return [tf.reshape(fn(flat, axis=-1), s)]
    return [fn(x, axis=axis)]


@OPS.register("MatMul")
def _matmul(tf, node, ins, at, opset):
    a, b = ins
    ra, rb = rank(node, a), rank(node, b)
    if ra == 1:
        return [tf.squeeze(tf.matmul(tf.expand_dims(a, 0), b), -2)]
    if rb == 1:
        return [tf.squeeze(tf.matmul(a, tf.expand_dims(b, -1)), -1)]
    return [tf.matmul(a, b)]


@OPS.register("Gemm")
def _gemm(tf, node, ins, at, opset):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    y = tf.matmul(a, b, transpose_a=bool(at.get("transA", 0)), transpose_b=bool(at.get("transB", 0)))
    alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return [y]


@OPS.register("Einsum")
def _einsum(tf, node, ins, at, opset):
    return [tf.einsum(at["equation"].replace(" ", ""), *ins)]


@OPS.register("LayerNormalization")
def _layer_norm(tf, node, ins, at, opset):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    r = rank(node, x)
    axis = axis_of(at, r, -1)
    axes = list(range(axis, r))
    mean, var = tf.nn.moments(x, axes, keepdims=True)
    inv = tf.math.rsqrt(var + at.get("epsilon", 1e-5))
    y = (x - mean) * inv * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inv][:len(node.output)]


@OPS.register("BatchNormalization")
def _batch_norm(tf, node, ins, at, opset):
    x, scale, bias, mean, var = ins[:5]
    r = rank(node, x)
    shape = [1, -1] + [1] * (r - 2)
    eps = at.get("epsilon", 1e-5)
    k = np.reshape(scale / np.sqrt(var + eps), shape) if isinstance(var, np.ndarray) and isinstance(scale, np.ndarray) \
        else tf.reshape(scale * tf.math.rsqrt(var + eps), shape)
    return [(x - tf.reshape(mean, shape)) * k + tf.reshape(bias, shape)]


@OPS.register("InstanceNormalization")
def _instance_norm(tf, node, ins, at, opset):
    x, scale, bias = ins
    r = rank(node, x)
    mean, var = tf.nn.moments(x, list(range(2, r)), keepdims=True)
    shape = [1, -1] + [1] * (r - 2)
    return [(x - mean) * tf.math.rsqrt(var + at.get("epsilon", 1e-5)) * tf.reshape(scale, shape) + tf.reshape(bias, shape)]


@OPS.register("Gelu")
def _gelu(tf, node, ins, at, opset):
    return [tf.nn.gelu(ins[0], approximate=at.get("approximate", "none") == "tanh")]


@OPS.register("LeakyRelu")
def _leaky(tf, node, ins, at, opset):
    return [tf.nn.leaky_relu(ins[0], alpha=at.get("alpha", 0.01))]


@OPS.register("Elu")
def _elu(tf, node, ins, at, opset):
    x, alpha = ins[0], at.get("alpha", 1.0)
    return [tf.nn.elu(x) if alpha == 1.0 else tf.where(x > 0, x, alpha * (tf.exp(x) - 1))]


@OPS.register("HardSigmoid")
def _hard_sigmoid(tf, node, ins, at, opset):
    return [tf.clip_by_value(ins[0] * at.get("alpha", 0.2) + at.get("beta", 0.5), 0.0, 1.0)]


@OPS.register("HardSwish")
def _hard_swish(tf, node, ins, at, opset):
    x = ins[0]
    return [x * tf.clip_by_value(x / 6.0 + 0.5, 0.0, 1.0)]


@OPS.register("PRelu")
def _prelu(tf, node, ins, at, opset):
    x, slope = ins
    return [tf.where(x >= 0, x, x * slope)]


@OPS.register("Pow")
def _pow(tf, node, ins, at, opset):
    x, p = ins
    sp = static(tf, p)
    if sp is not None and sp.size == 1 and float(sp) == 2.0:
        return [tf.square(x)]
    if sp is not None and sp.size == 1 and float(sp) == 0.5:
        return [tf.sqrt(x)]
    return [tf.pow(x, tf.cast(p, dtype_of(tf, x)))]


@OPS.register("Mod")
def _mod(tf, node, ins, at, opset):
    a, b = ins
    return [tf.math.truncatemod(a, b) if at.get("fmod", 0) else tf.math.floormod(a, b)]


@OPS.register("Trilu")
def _trilu(tf, node, ins, at, opset):
    x = ins[0]
    k = int(required_static(tf, node, ins[1], "k")) if len(ins) > 1 and ins[1] is not None else 0
    n, m = shape_of(tf, x)[-2], shape_of(tf, x)[-1]
    rows = tf.range(n, dtype=tf.int64)[:, None]
    cols = tf.range(m, dtype=tf.int64)[None, :]
    keep = cols - rows >= k if at.get("upper", 1) else cols - rows <= k
    return [tf.where(keep, x, tf.zeros_like(x))]


@OPS.register("CumSum")
def _cumsum(tf, node, ins, at, opset):
    axis = int(np.ravel(required_static(tf, node, ins[1], "axis"))[0])
    return [tf.math.cumsum(ins[0], axis=axis, exclusive=bool(at.get("exclusive", 0)), reverse=bool(at.get("reverse", 0)))]


@OPS.register("Pad")
def _pad(tf, node, ins, at, opset):
    x = ins[0]
    r = rank(node, x)
    pads = ins[1] if len(ins) > 1 else at["pads"]
    pads = [int(v) for v in required_static(tf, node, pads, "pads")]
    value = ins[2] if len(ins) > 2 and ins[2] is not None else at.get("value", 0.0)
    axes = axes_of(required_static(tf, node, ins[3], "axes"), r) if len(ins) > 3 and ins[3] is not None else list(range(r))
    k = len(axes)
    paddings = [[0, 0] for _ in range(r)]
    for i, a in enumerate(axes):
        paddings[a] = [pads[i], pads[i + k]]
    mode = at.get("mode", "constant")
    if mode == "constant":
        return [tf.pad(x, paddings, constant_values=tf.cast(tf.reshape(value, []), dtype_of(tf, x)))]
    if mode == "reflect":
        return [tf.pad(x, paddings, mode="REFLECT")]
    raise UnsupportedError(f"Pad node '{node.name}': mode '{mode}' is not lowered")


@OPS.register("TopK")
def _topk(tf, node, ins, at, opset):
    x, k = ins
    r = rank(node, x)
    axis = axis_of(at, r, -1)
    if not at.get("largest", 1):
        raise UnsupportedError(f"TopK node '{node.name}': smallest-k is not lowered")
    perm = list(range(r))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    xt = tf.transpose(x, perm) if axis != r - 1 else x
    v, i = tf.math.top_k(xt, k=tf.cast(tf.reshape(k, []), tf.int32))
    if axis != r - 1:
        v, i = tf.transpose(v, perm), tf.transpose(i, perm)
    return [v, tf.cast(i, tf.int64)]


# --- channels-first windows: computed channels-last between two transposes --------------------

def _pads(at, spatial: int, kernel) -> list[list[int]] | str:
    """ONNX padding as TensorFlow takes it: explicit [before, after] per spatial dim, or SAME / VALID."""
    auto = at.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if auto == "SAME_LOWER" and any(k > 1 for k in kernel):
            raise UnsupportedError("auto_pad SAME_LOWER is not lowered")
        return "SAME"
    if auto == "VALID":
        return "VALID"
    p = at.get("pads", [0] * (2 * spatial))
    return [[p[i], p[i + spatial]] for i in range(spatial)]


def _to_last(tf, x, r):
    return tf.transpose(x, [0, *range(2, r), 1])


def _to_first(tf, y, r):
    return tf.transpose(y, [0, r - 1, *range(1, r - 1)])


@OPS.register("Conv")
def _conv(tf, node, ins, at, opset):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    r = rank(node, x)
    spatial = r - 2
    if spatial not in (1, 2):
        raise UnsupportedError(f"Conv node '{node.name}': {spatial}-D convolutions are not lowered")
    if any(d is None for d in w.shape):
        raise UnsupportedError(f"Conv node '{node.name}': its weight's shape is not known")
    at = dict(at)
    if spatial == 1:  # as 2-D, height 1
        x = tf.expand_dims(x, 2)
        w = tf.expand_dims(w, 2)
        at.update(strides=[1, *at.get("strides", [1])], dilations=[1, *at.get("dilations", [1])])
        if "pads" in at:
            at["pads"] = [0, at["pads"][0], 0, at["pads"][1]]
    m, per_group, kh, kw = (int(d) for d in w.shape)
    strides = [1, *at.get("strides", [1, 1]), 1]
    dilations = at.get("dilations", [1, 1])
    pads = _pads(at, 2, [kh, kw])
    xl = _to_last(tf, x, 4)
    if isinstance(pads, list):
        if any(v for p in pads for v in p):
            xl = tf.pad(xl, [[0, 0], *pads, [0, 0]])
        pads = "VALID"
    group = at.get("group", 1)
    cin = per_group * group

    def hwio(k):  # ONNX [M, C/g, kh, kw] -> TensorFlow [kh, kw, C/g, M]
        return tf.transpose(k, (2, 3, 1, 0))

    if group == 1:
        y = tf.nn.conv2d(xl, hwio(w), strides=strides, padding=pads, dilations=dilations)
    elif group == cin and per_group == 1:  # depthwise: [C * k, 1, kh, kw] -> [kh, kw, C, k]
        k = tf.transpose(tf.reshape(w, [cin, m // cin, kh, kw]), (2, 3, 0, 1))
        if strides[1] != strides[2] and pads == "VALID":
            # TensorFlow's depthwise kernel takes equal strides only: stride 1, then every s-th row and column
            y = tf.nn.depthwise_conv2d(xl, k, strides=[1, 1, 1, 1], padding=pads, dilations=dilations)
            y = y[:, ::strides[1], ::strides[2], :]
        else:
            y = tf.nn.depthwise_conv2d(xl, k, strides=strides, padding=pads, dilations=dilations)
    else:
        y = tf.concat([tf.nn.conv2d(xg, hwio(wg), strides=strides, padding=pads, dilations=dilations)
                       for xg, wg in zip(tf.split(xl, group, axis=-1), tf.split(w, group, axis=0), strict=True)], -1)
    if b is not None:
        y = tf.nn.bias_add(y, b)
    y = _to_first(tf, y, 4)
    return [drop_axes(tf, y, [2]) if spatial == 1 else y]


@OPS.register(("MaxPool", "AveragePool"))
def _pool(tf, node, ins, at, opset):
    kind = "max" if node.op_type == "MaxPool" else "avg"
    x = ins[0]
    r = rank(node, x)
    if r != 4:
        raise UnsupportedError(f"{node.op_type} node '{node.name}': only 2-D pooling is lowered")
    kernel = at["kernel_shape"]
    strides = at.get("strides", [1, 1])
    if at.get("ceil_mode", 0) or any(d != 1 for d in at.get("dilations", [1, 1])):
        raise UnsupportedError(f"{node.op_type} node '{node.name}': ceil_mode and dilations are not lowered")
    pads = _pads(at, 2, kernel)
    xl = _to_last(tf, x, 4)
    if isinstance(pads, list):
        if any(v for p in pads for v in p):
            if kind == "max":
                xl = tf.pad(xl, [[0, 0], *pads, [0, 0]], constant_values=-np.inf)
            elif at.get("count_include_pad", 0):
                xl = tf.pad(xl, [[0, 0], *pads, [0, 0]])
            else:
                raise UnsupportedError(f"AveragePool node '{node.name}': padding that is not counted is not lowered")
        pads = "VALID"
    fn = tf.nn.max_pool2d if kind == "max" else tf.nn.avg_pool2d
    return [_to_first(tf, fn(xl, kernel, [1, *strides, 1], pads), 4)]


@OPS.register(("GlobalAveragePool", "GlobalMaxPool"))
def _global_pool(tf, node, ins, at, opset):
    x = ins[0]
    axes = list(range(2, rank(node, x)))
    return [(tf.reduce_max if node.op_type == "GlobalMaxPool" else tf.reduce_mean)(x, axis=axes, keepdims=True)]


@OPS.register("ConvTranspose")
def _conv_transpose(tf, node, ins, at, opset):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    if rank(node, x) != 4 or at.get("group", 1) != 1 or any(d != 1 for d in at.get("dilations", [1, 1])):
        raise UnsupportedError(f"ConvTranspose node '{node.name}': only 2-D, ungrouped, undilated ones are lowered")
    if at.get("auto_pad", "NOTSET") != "NOTSET" or "output_shape" in at:
        raise UnsupportedError(f"ConvTranspose node '{node.name}': auto_pad and output_shape are not lowered")
    cin, cout, kh, kw = (int(d) for d in w.shape)
    sh, sw = at.get("strides", [1, 1])
    t, left, bottom, right = at.get("pads", [0, 0, 0, 0])
    oh, ow = at.get("output_padding", [0, 0])
    xl = _to_last(tf, x, 4)
    s = tf.shape(xl)
    # VALID: (in - 1) * stride + kernel (+ output_padding at the end), then the pads cut off
    full = tf.stack([s[0], (s[1] - 1) * sh + kh + oh, (s[2] - 1) * sw + kw + ow, cout])
    y = tf.nn.conv2d_transpose(xl, tf.transpose(w, (2, 3, 1, 0)), full, strides=[1, sh, sw, 1], padding="VALID")
    y = y[:, t:tf.shape(y)[1] - bottom, left:tf.shape(y)[2] - right, :]
    if b is not None:
        y = tf.nn.bias_add(y, b)
    return [_to_first(tf, y, 4)]


# ONNX Resize (mode, coordinate transformation, nearest rounding) -> TensorFlow's kernel and its
# (align_corners, half_pixel_centers); the pairs whose sample positions are the same
_RESIZE = {
    ("linear", "half_pixel", None): ("bilinear", False, True),
    ("linear", "pytorch_half_pixel", None): ("bilinear", False, True),
    ("linear", "align_corners", None): ("bilinear", True, False),
    ("linear", "asymmetric", None): ("bilinear", False, False),
    ("nearest", "asymmetric", "floor"): ("nearest", False, False),
    ("nearest", "half_pixel", "round_prefer_ceil"): ("nearest", False, True),
    ("nearest", "pytorch_half_pixel", "round_prefer_ceil"): ("nearest", False, True),
    # round_prefer_floor differs from TensorFlow's rounding only on ties, which upsampling never meets
    ("nearest", "half_pixel", "round_prefer_floor"): ("nearest", False, True),
    ("nearest", "pytorch_half_pixel", "round_prefer_floor"): ("nearest", False, True),
    ("nearest", "align_corners", "round_prefer_ceil"): ("nearest", True, False),
}


@OPS.register("Resize")
def _resize(tf, node, ins, at, opset):
    x = ins[0]
    if rank(node, x) != 4:
        raise UnsupportedError(f"Resize node '{node.name}': only 4-D (N, C, H, W) inputs are lowered")
    scales = ins[1] if len(ins) == 2 else ins[2] if len(ins) > 2 else None  # opset 10: (X, scales)
    sizes = ins[3] if len(ins) > 3 else None
    mode = at.get("mode", "nearest")
    coords = at.get("coordinate_transformation_mode", "half_pixel" if opset >= 11 else "asymmetric")
    rounding = at.get("nearest_mode", "round_prefer_floor") if mode == "nearest" else None
    kind = _RESIZE.get((mode, coords, rounding))
    if kind is None or at.get("antialias", 0) or at.get("axes") is not None:
        raise UnsupportedError(f"Resize node '{node.name}': mode '{mode}' with '{coords}'"
                               + (f" and '{rounding}'" if rounding else "") + " is not lowered")
    s = static(tf, scales)  # an empty scales input stands for "sizes given"
    if s is not None and s.size and (s[0] != 1 or s[1] != 1):
        raise UnsupportedError(f"Resize node '{node.name}': only the last two axes may be resized")
    if sizes is not None:
        hw = tf.cast(tf.reshape(sizes, [-1])[2:4], tf.int32)
    elif s is not None and s.size:
        hw = tf.cast(tf.floor(tf.cast(tf.shape(x)[2:4], tf.float32) * s[2:4].astype(np.float32)), tf.int32)
    else:
        raise UnsupportedError(f"Resize node '{node.name}': neither scales nor sizes are known")
    method, align, half = kind
    xl = _to_last(tf, x, 4)
    if method == "bilinear":
        y = tf.raw_ops.ResizeBilinear(images=xl, size=hw, align_corners=align, half_pixel_centers=half)
        y = tf.cast(y, xl.dtype)
    else:
        y = tf.raw_ops.ResizeNearestNeighbor(images=xl, size=hw, align_corners=align, half_pixel_centers=half)
    return [_to_first(tf, y, 4)]

