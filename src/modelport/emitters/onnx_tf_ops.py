"""ONNX operators written with TensorFlow ops, one function each (the tensor and shape ops; the
math, normalisation and window ops are in `onnx_tf_math.py`), for modelport's own ONNX →
TensorFlow lowering (`emitters/onnx_tf.py`).

Each function registers in `onnx_tf_common.OPS` with `@OPS.register("Op")` and takes
`(tf, node, ins, at, opset)`: the node, its inputs (a `tf.Tensor`, a numpy array for a constant,
or None for an omitted optional input), its attributes as Python values and the model's opset,
and returns the node's outputs in order. The semantics are ONNX's (opset 13 on; the attribute forms
of older opsets where they differ), not onnx2tf's: tensors keep their ONNX layout (channels-first
convolutions are computed channels-last between two transposes, as TensorFlow's CPU kernels and
TF.js take them, and grappler folds the transposes that meet), and every shape stays as dynamic
as the graph leaves it: shape arithmetic (`Shape`, `Gather`, `Concat` into a `Reshape`) becomes
TensorFlow's shape arithmetic, evaluated at run time.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.onnx_tf_common import (
    ONNX_DTYPES,
    OPS,
    axes_of,
    axis_of,
    dtype_of,
    like,
    rank,
    required_static,
    shape_of,
    static,
)
from modelport.errors import UnsupportedError

INT64_MAX = np.iinfo(np.int64).max

# op type -> the tf.math function it is (Div: `_div`, as ONNX divides integers)
UNARY = {"Neg": "negative", "Abs": "abs", "Sqrt": "sqrt", "Reciprocal": "reciprocal", "Exp": "exp", "Log": "log",
         "Erf": "erf", "Tanh": "tanh", "Sigmoid": "sigmoid", "Sin": "sin", "Cos": "cos", "Floor": "floor", "Ceil": "ceil",
         "Round": "round", "Sign": "sign", "Not": "logical_not", "IsNaN": "is_nan", "IsInf": "is_inf", "Softplus": "softplus"}
BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": None, "Equal": "equal", "Less": "less",
          "LessOrEqual": "less_equal", "Greater": "greater", "GreaterOrEqual": "greater_equal", "And": "logical_and",
          "Or": "logical_or", "Xor": "logical_xor"}
VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add"}


@OPS.register(tuple(UNARY))
def _unary(tf, node, ins, at, opset):
    return [getattr(tf.math, UNARY[node.op_type])(ins[0])]


@OPS.register(tuple(BINARY))
def _binary(tf, node, ins, at, opset):
    a, b = ins[0], ins[1]
    if isinstance(a, np.ndarray) != isinstance(b, np.ndarray):
        a, b = (like(a, b.dtype), b) if isinstance(a, np.ndarray) else (a, like(b, a.dtype))
    name = BINARY[node.op_type]
    return [(getattr(tf.math, name) if name else _div(tf))(a, b)]


def _div(tf):
    def div(a, b):
        t = tf.convert_to_tensor(a)
        return tf.truncatediv(a, b) if t.dtype.is_integer else tf.math.divide(a, b)
    return div


@OPS.register(tuple(VARIADIC))
def _variadic(tf, node, ins, at, opset):
    out = ins[0]
    for x in ins[1:]:
        out = getattr(tf.math, VARIADIC[node.op_type])(out, x)
    return [out]


@OPS.register("Cast")
def _cast(tf, node, ins, at, opset):
    to = tf.as_dtype(ONNX_DTYPES[at["to"]])
    x = ins[0]
    if isinstance(x, np.ndarray):
        return [x.astype(to.as_numpy_dtype)]
    return [x if x.dtype == to else tf.cast(x, to)]


@OPS.register("CastLike")
def _cast_like(tf, node, ins, at, opset):
    to = dtype_of(tf, ins[1])
    return [ins[0].astype(to.as_numpy_dtype) if isinstance(ins[0], np.ndarray) else tf.cast(ins[0], to)]


@OPS.register("Constant")
def _constant(tf, node, ins, at, opset):
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in at:
            v = at[key]
            if key in ("value_float", "value_floats"):
                return [np.asarray(v, np.float32)]
            if key in ("value_int", "value_ints"):
                return [np.asarray(v, np.int64)]
            return [v]
    raise UnsupportedError(f"Constant node '{node.name}': no value attribute the lowering reads")


@OPS.register("Shape")
def _shape(tf, node, ins, at, opset):
    x = ins[0]
    r = rank(node, x)
    start, end = at.get("start", 0), at.get("end", r)
    start, end = (start + r if start < 0 else start), (end + r if end < 0 else end)
    if isinstance(x, np.ndarray):
        return [np.asarray(x.shape[start:end], np.int64)]
    return [tf.shape(x, out_type=tf.int64)[start:end]]


@OPS.register("Size")
def _size(tf, node, ins, at, opset):
    return [tf.size(ins[0], out_type=tf.int64)]


@OPS.register("Reshape")
def _reshape(tf, node, ins, at, opset):
    x, shape = ins
    s = static(tf, shape)
    if s is not None:
        s = s.astype(np.int64)
        if not at.get("allowzero", 0) and (s == 0).any():
            zeros = [i for i in np.flatnonzero(s == 0)]
            if all(isinstance(x, np.ndarray) or x.shape[i] is not None for i in zeros):
                s = s.copy()
                for i in zeros:
                    s[i] = x.shape[i]
            else:
                dyn = shape_of(tf, x)
                parts = [dyn[i:i + 1] if v == 0 else tf.constant([v], tf.int64) for i, v in enumerate(s)]
                return [tf.reshape(x, tf.concat(parts, 0))]
        return [tf.reshape(x, s)]
    if not at.get("allowzero", 0):
        n = tf.shape(shape, out_type=tf.int64)[0]
        r = rank(node, x)
        have = tf.concat([shape_of(tf, x), tf.zeros([tf.maximum(n - r, 0)], tf.int64)], 0)[:n]
        shape = tf.where(tf.equal(shape, 0), have, tf.cast(shape, tf.int64))
    return [tf.reshape(x, shape)]


@OPS.register("Flatten")
def _flatten(tf, node, ins, at, opset):
    x = ins[0]
    r = rank(node, x)
    axis = axis_of(at, r, 1)
    s = shape_of(tf, x)
    first = tf.reduce_prod(s[:axis]) if axis else tf.constant(1, tf.int64)
    return [tf.reshape(x, tf.stack([first, tf.reduce_prod(s[axis:])]))]


@OPS.register("Transpose")
def _transpose(tf, node, ins, at, opset):
    x = ins[0]
    perm = at.get("perm") or list(reversed(range(rank(node, x))))
    return [np.transpose(x, perm) if isinstance(x, np.ndarray) else tf.transpose(x, perm)]


@OPS.register("Squeeze")
def _squeeze(tf, node, ins, at, opset):
    x = ins[0]
    axes = ins[1] if len(ins) > 1 and ins[1] is not None else at.get("axes")
    if axes is None:  # every size-1 dim, which must then be known
        if isinstance(x, np.ndarray):
            return [np.squeeze(x)]
        if any(d is None for d in x.shape):
            raise UnsupportedError(f"Squeeze node '{node.name}' has no axes and its input's shape {x.shape} is not known")
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    else:
        axes = axes_of(required_static(tf, node, axes, "axes"), rank(node, x))
    if isinstance(x, np.ndarray):
        return [np.squeeze(x, tuple(axes))]
    return [drop_axes(tf, x, axes)]


def drop_axes(tf, x, axes):
    """`x` without its size-1 `axes`, by a reshape (to the other sizes where they are known, else to
    the run-time shape without those axes): TFLite's converter refuses some Squeeze ops between
    dynamic dims."""
    if not axes:
        return x
    kept = [d for i, d in enumerate(x.shape) if i not in axes]
    if all(d is not None for d in kept):
        return tf.reshape(x, kept)
    return tf.reshape(x, tf.gather(tf.shape(x, out_type=tf.int64), [i for i in range(len(x.shape)) if i not in axes]))


def _take(tf, x, idx, axis):
    """`tf.gather`, where a 0-d index drops the axis by a reshape: TF.js's GatherV2 keeps it."""
    if getattr(idx, "ndim", None) == 0 or (not isinstance(idx, np.ndarray) and idx.shape.rank == 0):
        return drop_axes(tf, tf.gather(x, tf.reshape(idx, [1]), axis=axis), [axis])
    return tf.gather(x, idx, axis=axis)


@OPS.register("Unsqueeze")
def _unsqueeze(tf, node, ins, at, opset):
    x = ins[0]
    axes = ins[1] if len(ins) > 1 else at.get("axes")
    axes = sorted(axes_of(required_static(tf, node, axes, "axes"), rank(node, x) + len(np.ravel(axes))))
    for a in axes:
        x = np.expand_dims(x, a) if isinstance(x, np.ndarray) else tf.expand_dims(x, a)
    return [x]


@OPS.register("Concat")
def _concat(tf, node, ins, at, opset):
    xs = [x for x in ins if x is not None]
    if all(isinstance(x, np.ndarray) for x in xs):
        return [np.concatenate(xs, axis=at["axis"])]
    dt = next(x.dtype for x in xs if not isinstance(x, np.ndarray))
    return [tf.concat([like(x, dt) for x in xs], at["axis"])]


@OPS.register("Split")
def _split(tf, node, ins, at, opset):
    x = ins[0]
    r = rank(node, x)
    axis = axis_of(at, r, 0)
    sizes = ins[1] if len(ins) > 1 and ins[1] is not None else at.get("split")
    n = len(node.output)
    if sizes is not None:
        sizes = [int(v) for v in required_static(tf, node, sizes, "split sizes")]
        return list(tf.split(x, sizes, axis=axis))
    if x.shape[axis] is not None and x.shape[axis] % n:
        step = -(-x.shape[axis] // n)  # opset 18: the last chunk is smaller
        sizes = [step] * (n - 1) + [x.shape[axis] - step * (n - 1)]
        return list(tf.split(x, sizes, axis=axis))
    return list(tf.split(x, n, axis=axis))


@OPS.register("Slice")
def _slice(tf, node, ins, at, opset):
    x = ins[0]
    r = rank(node, x)
    if len(ins) == 1:  # opset < 10: attributes
        starts, ends, axes, steps = at["starts"], at["ends"], at.get("axes"), None
    else:
        starts, ends = ins[1], ins[2]
        axes = ins[3] if len(ins) > 3 else None
        steps = ins[4] if len(ins) > 4 else None
    axes = list(range(len(np.ravel(static(tf, starts)) if static(tf, starts) is not None else r))) if axes is None \
        else axes_of(required_static(tf, node, axes, "axes"), r)
    steps = [1] * len(axes) if steps is None else [int(v) for v in required_static(tf, node, steps, "steps")]
    s_starts, s_ends = static(tf, starts), static(tf, ends)
    begin, end, stride = [0] * r, [0] * r, [1] * r
    begin_mask = end_mask = 0
    for i in range(r):
        if i not in axes:
            begin_mask |= 1 << i
            end_mask |= 1 << i
    dyn_begin, dyn_end = [], []
    for k, a in enumerate(axes):
        stride[a] = steps[k]
        for static_vals, out, dyn, is_end in ((s_starts, begin, dyn_begin, False), (s_ends, end, dyn_end, True)):
            if static_vals is not None:
                v = int(np.ravel(static_vals)[k])
                forward = steps[k] > 0
                # "to the end" / "from the start" written as int64's extremes: the mask says it
                if is_end and (v >= INT64_MAX // 2 if forward else v <= -INT64_MAX // 2):
                    end_mask |= 1 << a
                    v = 0
                elif not is_end and (v <= -INT64_MAX // 2 if forward else v >= INT64_MAX // 2):
                    begin_mask |= 1 << a
                    v = 0
                out[a] = int(np.clip(v, -(2 ** 31), 2 ** 31 - 1))
            else:
                dyn.append((a, k))
    if dyn_begin or dyn_end:
        b = tf.constant(begin, tf.int64)
        e = tf.constant(end, tf.int64)
        idx_b = [[a] for a, _ in dyn_begin]
        idx_e = [[a] for a, _ in dyn_end]
        if dyn_begin:
            b = tf.tensor_scatter_nd_update(b, idx_b, tf.gather(tf.cast(starts, tf.int64), [k for _, k in dyn_begin]))
        if dyn_end:
            e = tf.tensor_scatter_nd_update(e, idx_e, tf.gather(tf.cast(ends, tf.int64), [k for _, k in dyn_end]))
        # an end past the dim is the dim (strided_slice clamps, but not past int32 in TF.js)
        e = tf.clip_by_value(e, -(2 ** 31), 2 ** 31 - 1)
        return [tf.strided_slice(x, b, e, stride, begin_mask=begin_mask, end_mask=end_mask)]
    if isinstance(x, np.ndarray):
        sl = [slice(None)] * r
        for a in range(r):
            if not begin_mask >> a & 1:
                sl[a] = slice(begin[a], None if end_mask >> a & 1 else end[a], stride[a])
        return [x[tuple(sl)]]
    return [tf.strided_slice(x, begin, end, stride, begin_mask=begin_mask, end_mask=end_mask)]


@OPS.register("Gather")
def _gather(tf, node, ins, at, opset):
    x, idx = ins
    r = rank(node, x)
    axis = axis_of(at, r, 0)
    s = static(tf, idx)
    if isinstance(x, np.ndarray) and s is not None:
        return [np.take(x, s, axis=axis)]
    if s is not None:
        if (s < 0).any():
            dim = x.shape[axis]
            if dim is None:
                return [_take(tf, x, tf.where(s < 0, s + tf.shape(x, out_type=tf.int64)[axis], s), axis)]
            s = np.where(s < 0, s + dim, s)
        return [_take(tf, x, s, axis)]
    idx = tf.cast(idx, tf.int64)
    idx = tf.where(idx < 0, idx + shape_of(tf, x)[axis], idx)
    return [_take(tf, x, idx, axis)]


def _axis_index(tf, shape, r: int, axis: int):
    """The index along `axis` of every element of a tensor of `shape` (rank `r`): a range broadcast
    to the shape (TF.js cannot run the int64 `Fill` that `tf.meshgrid` writes)."""
    line = tf.reshape(tf.range(shape[axis], dtype=tf.int64), [-1 if i == axis else 1 for i in range(r)])
    return tf.broadcast_to(line, shape)


@OPS.register("GatherElements")
def _gather_elements(tf, node, ins, at, opset):
    x, idx = ins
    r = rank(node, x)
    axis = axis_of(at, r, 0)
    idx = tf.cast(idx, tf.int64)
    idx = tf.where(idx < 0, idx + shape_of(tf, x)[axis], idx)
    shape = tf.shape(idx, out_type=tf.int64)
    coords = [idx if i == axis else _axis_index(tf, shape, r, i) for i in range(r)]
    return [tf.gather_nd(x, tf.stack(coords, -1))]


@OPS.register("GatherND")
def _gather_nd(tf, node, ins, at, opset):
    x, idx = ins
    idx = tf.cast(idx, tf.int64)
    b = at.get("batch_dims", 0)
    k = idx.shape[-1]
    ri = rank(node, idx)
    if k is None:
        raise UnsupportedError(f"GatherND node '{node.name}': the length of its index tuples is not known")
    xs, ids = shape_of(tf, x), tf.shape(idx, out_type=tf.int64)
    idx = tf.where(idx < 0, idx + xs[b:b + k], idx)  # a negative index counts from the end of its dim
    if not b:
        return [tf.gather_nd(x, idx)]
    # batch dims flattened to one, its index written into each tuple (tf.gather_nd's own batch_dims
    # path builds a meshgrid TF.js cannot run)
    n = tf.reduce_prod(xs[:b], keepdims=True)
    x2 = tf.reshape(x, tf.concat([n, xs[b:]], 0))
    idx2 = tf.reshape(idx, tf.concat([n, ids[b:]], 0))
    lead = _axis_index(tf, tf.concat([tf.shape(idx2, out_type=tf.int64)[:-1], [1]], 0), ri - b + 1, 0)
    y = tf.gather_nd(x2, tf.concat([lead, idx2], -1))
    return [tf.reshape(y, tf.concat([ids[:-1], xs[b + k:]], 0))]


@OPS.register("Expand")
def _expand(tf, node, ins, at, opset):
    x, shape = ins
    shape = tf.cast(shape, tf.int64)
    target = tf.broadcast_dynamic_shape(shape_of(tf, x), shape)
    return [tf.broadcast_to(x, target)]


@OPS.register("Tile")
def _tile(tf, node, ins, at, opset):
    return [tf.tile(ins[0], tf.cast(ins[1], tf.int64))]


@OPS.register("ConstantOfShape")
def _constant_of_shape(tf, node, ins, at, opset):
    value = at.get("value", np.zeros(1, np.float32))
    value = np.ravel(value)[0]
    s = static(tf, ins[0])
    if s is not None:
        return [np.full([int(v) for v in s], value, dtype=np.asarray(value).dtype)]
    return [tf.fill(tf.cast(ins[0], tf.int64), tf.constant(value))]


@OPS.register("Range")
def _range(tf, node, ins, at, opset):
    start, limit, delta = ins
    vals = [static(tf, v) for v in ins]
    if all(v is not None for v in vals):
        return [np.arange(vals[0].item(), vals[1].item(), vals[2].item(), dtype=vals[0].dtype)]
    dt = next(dtype_of(tf, v) for v in ins if not isinstance(v, np.ndarray))
    return [tf.range(*[tf.cast(tf.reshape(v, []), dt) for v in ins])]


@OPS.register("Where")
def _where(tf, node, ins, at, opset):
    c, a, b = ins
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        dt = dtype_of(tf, a if not isinstance(a, np.ndarray) else b)
        a, b = like(a, dt), like(b, dt)
    return [tf.where(c, a, b)]


@OPS.register("Clip")
def _clip(tf, node, ins, at, opset):
    x = ins[0]
    lo = ins[1] if len(ins) > 1 else at.get("min")
    hi = ins[2] if len(ins) > 2 else at.get("max")
    dt = dtype_of(tf, x)
    if lo is not None:
        x = tf.maximum(x, tf.cast(lo, dt))
    if hi is not None:
        x = tf.minimum(x, tf.cast(hi, dt))
    return [x]


REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max", "ReduceMin": "reduce_min",
          "ReduceProd": "reduce_prod"}


@OPS.register(tuple(REDUCE))
def _reduce(tf, node, ins, at, opset):
    x = ins[0]
    axes = ins[1] if len(ins) > 1 and ins[1] is not None else at.get("axes")
    keep = bool(at.get("keepdims", 1))
    if axes is not None:
        axes = axes_of(axes if isinstance(axes, list) else required_static(tf, node, axes, "axes"), rank(node, x))
    if not axes:
        if at.get("noop_with_empty_axes", 0):
            return [x]
        axes = None
    return [getattr(tf.math, REDUCE[node.op_type])(x, axis=axes, keepdims=keep)]


@OPS.register(("ArgMax", "ArgMin"))
def _arg(tf, node, ins, at, opset):
    name = node.op_type.lower()  # argmax, argmin
    x = ins[0]
    r = rank(node, x)
    axis = axis_of(at, r, 0)
    if at.get("select_last_index", 0):
        n = shape_of(tf, x)[axis]
        y = n - 1 - getattr(tf.math, name)(tf.reverse(x, [axis]), axis=axis, output_type=tf.int64)
    else:
        y = getattr(tf.math, name)(x, axis=axis, output_type=tf.int64)
    return [tf.expand_dims(y, axis) if at.get("keepdims", 1) else y]


@OPS.register("OneHot")
def _one_hot(tf, node, ins, at, opset):
    idx, depth, values = ins
    axis = at.get("axis", -1)
    depth = tf.cast(tf.reshape(depth, []), tf.int32)
    idx = tf.cast(idx, tf.int64)
    idx = tf.where(idx < 0, idx + tf.cast(depth, tf.int64), idx)
    return [tf.one_hot(idx, depth, on_value=values[1], off_value=values[0], axis=axis)]


@OPS.register("ScatterND")
def _scatter_nd(tf, node, ins, at, opset):
    if at.get("reduction", "none") != "none":
        raise UnsupportedError(f"ScatterND node '{node.name}': reduction '{at['reduction']}' is not lowered")
    return [tf.tensor_scatter_nd_update(ins[0], tf.cast(ins[1], tf.int64), ins[2])]


@OPS.register("Identity")
def _identity(tf, node, ins, at, opset):
    return [ins[0]]


@OPS.register("Relu")
def _relu(tf, node, ins, at, opset):
    return [tf.nn.relu(ins[0])]


@OPS.register("Dropout")
def _dropout(tf, node, ins, at, opset):
    return [ins[0], tf.ones_like(ins[0], tf.bool)][:len(node.output)]

