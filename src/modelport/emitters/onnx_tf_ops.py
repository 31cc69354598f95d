"""ONNX operators written with TensorFlow ops, one function each (`OPS`), for modelport's own ONNX →
TensorFlow lowering (`emitters/onnx_tf.py`).

Each function takes `(tf, node, ins, at)`: the node, its inputs (a `tf.Tensor`, a numpy array
for a constant, or None for an omitted optional input) and its attributes as Python values, and
returns the node's outputs in order. The semantics are ONNX's (opset 13 on; the attribute forms
of older opsets where they differ), not onnx2tf's: tensors keep their ONNX layout (channels-first
convolutions are computed channels-last between two transposes, as TensorFlow's CPU kernels and
TF.js take them, and grappler folds the transposes that meet), and every shape stays as dynamic
as the graph leaves it: shape arithmetic (`Shape`, `Gather`, `Concat` into a `Reshape`) becomes
TensorFlow's shape arithmetic, evaluated at run time.
"""

from __future__ import annotations

import numpy as np

from modelport.errors import UnsupportedError

# ONNX TensorProto element types -> numpy dtype names
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}
INT64_MAX = np.iinfo(np.int64).max


def static(tf, x):
    """The value of `x` as a numpy array when it is known before run time, else None."""
    if x is None or isinstance(x, np.ndarray):
        return x
    if isinstance(x, (int, float, list, tuple)):
        return np.asarray(x)
    v = tf.get_static_value(x)
    return None if v is None else np.asarray(v)


def required_static(tf, node, x, what: str) -> np.ndarray:
    v = static(tf, x)
    if v is None:
        raise UnsupportedError(f"{node.op_type} node '{node.name}': its {what} is computed at run time; "
                               f"the lowering needs it as a constant")
    return v


def rank(node, x) -> int:
    r = x.ndim if isinstance(x, np.ndarray) else x.shape.rank
    if r is None:
        raise UnsupportedError(f"{node.op_type} node '{node.name}': the rank of its input is unknown")
    return r


def dtype_of(tf, x):
    return tf.as_dtype(x.dtype)


def shape_of(tf, x, out=None):
    out = out or tf.int64
    return tf.constant(np.asarray(x.shape, dtype=out.as_numpy_dtype)) if isinstance(x, np.ndarray) else tf.shape(x, out_type=out)


def _axes(at_or_input, r: int) -> list[int]:
    return [int(a) + r if int(a) < 0 else int(a) for a in np.ravel(at_or_input)]


def _unary(name):
    def op(tf, node, ins, at):
        return [getattr(tf.math, name)(ins[0])]
    return op


def _binary(fn):
    def op(tf, node, ins, at):
        a, b = ins[0], ins[1]
        if isinstance(a, np.ndarray) and not isinstance(b, np.ndarray):
            a = a.astype(b.dtype.as_numpy_dtype) if a.dtype != b.dtype.as_numpy_dtype else a
        if isinstance(b, np.ndarray) and not isinstance(a, np.ndarray):
            b = b.astype(a.dtype.as_numpy_dtype) if b.dtype != a.dtype.as_numpy_dtype else b
        return [fn(tf)(a, b)]
    return op


def _div(tf):
    def div(a, b):
        t = tf.convert_to_tensor(a)
        return tf.math.truncatediv(a, b) if t.dtype.is_integer else tf.math.divide(a, b)
    return div


def _variadic(name):
    def op(tf, node, ins, at):
        out = ins[0]
        for x in ins[1:]:
            out = getattr(tf.math, name)(out, x)
        return [out]
    return op


def _cast(tf, node, ins, at):
    to = tf.as_dtype(ONNX_DTYPES[at["to"]])
    x = ins[0]
    if isinstance(x, np.ndarray):
        return [x.astype(to.as_numpy_dtype)]
    return [x if x.dtype == to else tf.cast(x, to)]


def _cast_like(tf, node, ins, at):
    to = dtype_of(tf, ins[1])
    return [ins[0].astype(to.as_numpy_dtype) if isinstance(ins[0], np.ndarray) else tf.cast(ins[0], to)]


def _constant(tf, node, ins, at):
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in at:
            v = at[key]
            if key == "value_float" or key == "value_floats":
                return [np.asarray(v, np.float32)]
            if key in ("value_int", "value_ints"):
                return [np.asarray(v, np.int64)]
            return [v]
    raise UnsupportedError(f"Constant node '{node.name}': no value attribute the lowering reads")


def _shape(tf, node, ins, at):
    x = ins[0]
    r = rank(node, x)
    start, end = at.get("start", 0), at.get("end", r)
    start, end = (start + r if start < 0 else start), (end + r if end < 0 else end)
    if isinstance(x, np.ndarray):
        return [np.asarray(x.shape[start:end], np.int64)]
    return [tf.shape(x, out_type=tf.int64)[start:end]]


def _size(tf, node, ins, at):
    return [tf.size(ins[0], out_type=tf.int64)]


def _reshape(tf, node, ins, at):
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


def _flatten(tf, node, ins, at):
    x = ins[0]
    r = rank(node, x)
    axis = at.get("axis", 1)
    axis = axis + r if axis < 0 else axis
    s = shape_of(tf, x)
    first = tf.reduce_prod(s[:axis]) if axis else tf.constant(1, tf.int64)
    return [tf.reshape(x, tf.stack([first, tf.reduce_prod(s[axis:])]))]


def _transpose(tf, node, ins, at):
    x = ins[0]
    perm = at.get("perm") or list(reversed(range(rank(node, x))))
    return [np.transpose(x, perm) if isinstance(x, np.ndarray) else tf.transpose(x, perm)]


def _squeeze(tf, node, ins, at):
    x = ins[0]
    axes = ins[1] if len(ins) > 1 and ins[1] is not None else at.get("axes")
    if axes is None:  # every size-1 dim, which must then be known
        if isinstance(x, np.ndarray):
            return [np.squeeze(x)]
        if any(d is None for d in x.shape):
            raise UnsupportedError(f"Squeeze node '{node.name}' has no axes and its input's shape {x.shape} is not known")
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    else:
        axes = _axes(required_static(tf, node, axes, "axes"), rank(node, x))
    if isinstance(x, np.ndarray):
        return [np.squeeze(x, tuple(axes))]
    return [_drop_axes(tf, x, axes)]


def _drop_axes(tf, x, axes):
    """`x` without its size-1 `axes`: a reshape when the other sizes are known, else index 0 taken
    along each (TFLite's converter refuses some Squeeze ops between dynamic dims)."""
    if not axes:
        return x
    kept = [d for i, d in enumerate(x.shape) if i not in axes]
    if all(d is not None for d in kept):
        return tf.reshape(x, kept)
    return tf.reshape(x, tf.gather(tf.shape(x, out_type=tf.int64), [i for i in range(len(x.shape)) if i not in axes]))


def _take(tf, x, idx, axis):
    """`tf.gather`, where a 0-d index drops the axis by a reshape: TF.js's GatherV2 keeps it."""
    if getattr(idx, "ndim", None) == 0 or (not isinstance(idx, np.ndarray) and idx.shape.rank == 0):
        return _drop_axes(tf, tf.gather(x, tf.reshape(idx, [1]), axis=axis), [axis])
    return tf.gather(x, idx, axis=axis)


def _unsqueeze(tf, node, ins, at):
    x = ins[0]
    axes = ins[1] if len(ins) > 1 else at.get("axes")
    axes = sorted(_axes(required_static(tf, node, axes, "axes"), rank(node, x) + len(np.ravel(axes))))
    for a in axes:
        x = np.expand_dims(x, a) if isinstance(x, np.ndarray) else tf.expand_dims(x, a)
    return [x]


def _concat(tf, node, ins, at):
    xs = [x for x in ins if x is not None]
    if all(isinstance(x, np.ndarray) for x in xs):
        return [np.concatenate(xs, axis=at["axis"])]
    dt = next(x.dtype for x in xs if not isinstance(x, np.ndarray))
    xs = [x.astype(dt.as_numpy_dtype) if isinstance(x, np.ndarray) else x for x in xs]
    return [tf.concat(xs, at["axis"])]


def _split(tf, node, ins, at):
    x = ins[0]
    r = rank(node, x)
    axis = at.get("axis", 0)
    axis = axis + r if axis < 0 else axis
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


def _slice(tf, node, ins, at):
    x = ins[0]
    r = rank(node, x)
    if len(ins) == 1:  # opset < 10: attributes
        starts, ends, axes, steps = at["starts"], at["ends"], at.get("axes"), None
    else:
        starts, ends = ins[1], ins[2]
        axes = ins[3] if len(ins) > 3 else None
        steps = ins[4] if len(ins) > 4 else None
    axes = list(range(len(np.ravel(static(tf, starts)) if static(tf, starts) is not None else r))) if axes is None \
        else _axes(required_static(tf, node, axes, "axes"), r)
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
    end = [int(np.clip(v, -(2 ** 31), 2 ** 31 - 1)) for v in end]
    return [tf.strided_slice(x, begin, end, stride, begin_mask=begin_mask, end_mask=end_mask)]


def _gather(tf, node, ins, at):
    x, idx = ins
    r = rank(node, x)
    axis = at.get("axis", 0)
    axis = axis + r if axis < 0 else axis
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


def _gather_elements(tf, node, ins, at):
    x, idx = ins
    r = rank(node, x)
    axis = at.get("axis", 0)
    axis = axis + r if axis < 0 else axis
    idx = tf.cast(idx, tf.int64)
    idx = tf.where(idx < 0, idx + shape_of(tf, x)[axis], idx)
    shape = tf.shape(idx, out_type=tf.int64)
    coords = [idx if i == axis else _axis_index(tf, shape, r, i) for i in range(r)]
    return [tf.gather_nd(x, tf.stack(coords, -1))]


def _gather_nd(tf, node, ins, at):
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


def _expand(tf, node, ins, at):
    x, shape = ins
    shape = tf.cast(shape, tf.int64)
    target = tf.broadcast_dynamic_shape(shape_of(tf, x), shape)
    return [tf.broadcast_to(x, target)]


def _tile(tf, node, ins, at):
    return [tf.tile(ins[0], tf.cast(ins[1], tf.int64))]


def _constant_of_shape(tf, node, ins, at):
    value = at.get("value", np.zeros(1, np.float32))
    value = np.ravel(value)[0]
    s = static(tf, ins[0])
    if s is not None:
        return [np.full([int(v) for v in s], value, dtype=np.asarray(value).dtype)]
    return [tf.fill(tf.cast(ins[0], tf.int64), tf.constant(value))]


def _range(tf, node, ins, at):
    start, limit, delta = ins
    vals = [static(tf, v) for v in ins]
    if all(v is not None for v in vals):
        return [np.arange(vals[0].item(), vals[1].item(), vals[2].item(), dtype=vals[0].dtype)]
    dt = next(dtype_of(tf, v) for v in ins if not isinstance(v, np.ndarray))
    return [tf.range(*[tf.cast(tf.reshape(v, []), dt) for v in ins])]


def _where(tf, node, ins, at):
    c, a, b = ins
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        dt = dtype_of(tf, a if not isinstance(a, np.ndarray) else b)
        a = a.astype(dt.as_numpy_dtype) if isinstance(a, np.ndarray) else a
        b = b.astype(dt.as_numpy_dtype) if isinstance(b, np.ndarray) else b
    return [tf.where(c, a, b)]


def _clip(tf, node, ins, at):
    x = ins[0]
    lo = ins[1] if len(ins) > 1 else at.get("min")
    hi = ins[2] if len(ins) > 2 else at.get("max")
    dt = dtype_of(tf, x)
    if lo is not None:
        x = tf.maximum(x, tf.cast(lo, dt))
    if hi is not None:
        x = tf.minimum(x, tf.cast(hi, dt))
    return [x]


def _reduce(name):
    def op(tf, node, ins, at):
        x = ins[0]
        axes = ins[1] if len(ins) > 1 and ins[1] is not None else at.get("axes")
        keep = bool(at.get("keepdims", 1))
        if axes is not None:
            axes = _axes(axes if isinstance(axes, list) else required_static(tf, node, axes, "axes"), rank(node, x))
        if not axes:
            if at.get("noop_with_empty_axes", 0):
                return [x]
            axes = None
        return [getattr(tf.math, name)(x, axis=axes, keepdims=keep)]
    return op


def _arg(name):
    def op(tf, node, ins, at):
        x = ins[0]
        r = rank(node, x)
        axis = at.get("axis", 0)
        axis = axis + r if axis < 0 else axis
        if at.get("select_last_index", 0):
            n = shape_of(tf, x)[axis]
            y = n - 1 - getattr(tf.math, name)(tf.reverse(x, [axis]), axis=axis, output_type=tf.int64)
        else:
            y = getattr(tf.math, name)(x, axis=axis, output_type=tf.int64)
        return [tf.expand_dims(y, axis) if at.get("keepdims", 1) else y]
    return op


def _softmax(log: bool):
    def op(tf, node, ins, at):
        x = ins[0]
        r = rank(node, x)
        axis = at.get("axis", -1)
        axis = axis + r if axis < 0 else axis
        if at.get("_opset", 13) < 13:  # the input flattened to 2-D at axis
            s = tf.shape(x)
            flat = tf.reshape(x, tf.stack([tf.reduce_prod(s[:axis]), tf.reduce_prod(s[axis:])]))
            y = (tf.nn.log_softmax if log else tf.nn.softmax)(flat, axis=-1)
            return [tf.reshape(y, s)]
        return [(tf.nn.log_softmax if log else tf.nn.softmax)(x, axis=axis)]
    return op


def _matmul(tf, node, ins, at):
    a, b = ins
    ra, rb = rank(node, a), rank(node, b)
    if ra == 1:
        return [tf.squeeze(tf.matmul(tf.expand_dims(a, 0), b), -2)]
    if rb == 1:
        return [tf.squeeze(tf.matmul(a, tf.expand_dims(b, -1)), -1)]
    return [tf.matmul(a, b)]


def _gemm(tf, node, ins, at):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    y = tf.matmul(a, b, transpose_a=bool(at.get("transA", 0)), transpose_b=bool(at.get("transB", 0)))
    alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return [y]


def _einsum(tf, node, ins, at):
    return [tf.einsum(at["equation"].replace(" ", ""), *ins)]


def _layer_norm(tf, node, ins, at):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    r = rank(node, x)
    axis = at.get("axis", -1)
    axis = axis + r if axis < 0 else axis
    axes = list(range(axis, r))
    mean, var = tf.nn.moments(x, axes, keepdims=True)
    inv = tf.math.rsqrt(var + at.get("epsilon", 1e-5))
    y = (x - mean) * inv * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inv][:len(node.output)]


def _batch_norm(tf, node, ins, at):
    x, scale, bias, mean, var = ins[:5]
    r = rank(node, x)
    shape = [1, -1] + [1] * (r - 2)
    eps = at.get("epsilon", 1e-5)
    k = np.reshape(scale / np.sqrt(var + eps), shape) if isinstance(var, np.ndarray) and isinstance(scale, np.ndarray) \
        else tf.reshape(scale * tf.math.rsqrt(var + eps), shape)
    return [(x - tf.reshape(mean, shape)) * k + tf.reshape(bias, shape)]


def _instance_norm(tf, node, ins, at):
    x, scale, bias = ins
    r = rank(node, x)
    mean, var = tf.nn.moments(x, list(range(2, r)), keepdims=True)
    shape = [1, -1] + [1] * (r - 2)
    return [(x - mean) * tf.math.rsqrt(var + at.get("epsilon", 1e-5)) * tf.reshape(scale, shape) + tf.reshape(bias, shape)]


def _gelu(tf, node, ins, at):
    return [tf.nn.gelu(ins[0], approximate=at.get("approximate", "none") == "tanh")]


def _leaky(tf, node, ins, at):
    return [tf.nn.leaky_relu(ins[0], alpha=at.get("alpha", 0.01))]


def _elu(tf, node, ins, at):
    x, alpha = ins[0], at.get("alpha", 1.0)
    return [tf.nn.elu(x) if alpha == 1.0 else tf.where(x > 0, x, alpha * (tf.exp(x) - 1))]


def _hard_sigmoid(tf, node, ins, at):
    return [tf.clip_by_value(ins[0] * at.get("alpha", 0.2) + at.get("beta", 0.5), 0.0, 1.0)]


def _hard_swish(tf, node, ins, at):
    x = ins[0]
    return [x * tf.clip_by_value(x / 6.0 + 0.5, 0.0, 1.0)]


def _prelu(tf, node, ins, at):
    x, slope = ins
    return [tf.where(x >= 0, x, x * slope)]


def _pow(tf, node, ins, at):
    x, p = ins
    sp = static(tf, p)
    if sp is not None and sp.size == 1 and float(sp) == 2.0:
        return [tf.square(x)]
    if sp is not None and sp.size == 1 and float(sp) == 0.5:
        return [tf.sqrt(x)]
    return [tf.pow(x, tf.cast(p, dtype_of(tf, x)))]


def _mod(tf, node, ins, at):
    a, b = ins
    return [tf.math.truncatemod(a, b) if at.get("fmod", 0) else tf.math.floormod(a, b)]


def _trilu(tf, node, ins, at):
    x = ins[0]
    k = int(required_static(tf, node, ins[1], "k")) if len(ins) > 1 and ins[1] is not None else 0
    n, m = shape_of(tf, x)[-2], shape_of(tf, x)[-1]
    rows = tf.range(n, dtype=tf.int64)[:, None]
    cols = tf.range(m, dtype=tf.int64)[None, :]
    keep = cols - rows >= k if at.get("upper", 1) else cols - rows <= k
    return [tf.where(keep, x, tf.zeros_like(x))]


def _cumsum(tf, node, ins, at):
    axis = int(np.ravel(required_static(tf, node, ins[1], "axis"))[0])
    return [tf.math.cumsum(ins[0], axis=axis, exclusive=bool(at.get("exclusive", 0)), reverse=bool(at.get("reverse", 0)))]


def _pad(tf, node, ins, at):
    x = ins[0]
    r = rank(node, x)
    pads = ins[1] if len(ins) > 1 else at["pads"]
    pads = [int(v) for v in required_static(tf, node, pads, "pads")]
    value = ins[2] if len(ins) > 2 and ins[2] is not None else at.get("value", 0.0)
    axes = _axes(required_static(tf, node, ins[3], "axes"), r) if len(ins) > 3 and ins[3] is not None else list(range(r))
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


def _topk(tf, node, ins, at):
    x, k = ins
    r = rank(node, x)
    axis = at.get("axis", -1)
    axis = axis + r if axis < 0 else axis
    if not at.get("largest", 1):
        raise UnsupportedError(f"TopK node '{node.name}': smallest-k is not lowered")
    perm = list(range(r))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    xt = tf.transpose(x, perm) if axis != r - 1 else x
    v, i = tf.math.top_k(xt, k=tf.cast(tf.reshape(k, []), tf.int32))
    if axis != r - 1:
        v, i = tf.transpose(v, perm), tf.transpose(i, perm)
    return [v, tf.cast(i, tf.int64)]


def _one_hot(tf, node, ins, at):
    idx, depth, values = ins
    axis = at.get("axis", -1)
    depth = tf.cast(tf.reshape(depth, []), tf.int32)
    idx = tf.cast(idx, tf.int64)
    idx = tf.where(idx < 0, idx + tf.cast(depth, tf.int64), idx)
    return [tf.one_hot(idx, depth, on_value=values[1], off_value=values[0], axis=axis)]


def _scatter_nd(tf, node, ins, at):
    if at.get("reduction", "none") != "none":
        raise UnsupportedError(f"ScatterND node '{node.name}': reduction '{at['reduction']}' is not lowered")
    return [tf.tensor_scatter_nd_update(ins[0], tf.cast(ins[1], tf.int64), ins[2])]


def _dropout(tf, node, ins, at):
    return [ins[0], tf.ones_like(ins[0], tf.bool)][:len(node.output)]


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


def _conv(tf, node, ins, at):
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
    return [_drop_axes(tf, y, [2]) if spatial == 1 else y]


def _pool(kind):
    def op(tf, node, ins, at):
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
    return op


def _global_pool(kind):
    def op(tf, node, ins, at):
        x = ins[0]
        axes = list(range(2, rank(node, x)))
        return [(tf.reduce_max if kind == "max" else tf.reduce_mean)(x, axis=axes, keepdims=True)]
    return op


OPS = {
    "Identity": lambda tf, node, ins, at: [ins[0]],
    "Constant": _constant, "Cast": _cast, "CastLike": _cast_like, "Dropout": _dropout,
    "Add": _binary(lambda tf: tf.math.add), "Sub": _binary(lambda tf: tf.math.subtract),
    "Mul": _binary(lambda tf: tf.math.multiply), "Div": _binary(_div),
    "Equal": _binary(lambda tf: tf.math.equal), "Less": _binary(lambda tf: tf.math.less),
    "LessOrEqual": _binary(lambda tf: tf.math.less_equal), "Greater": _binary(lambda tf: tf.math.greater),
    "GreaterOrEqual": _binary(lambda tf: tf.math.greater_equal),
    "And": _binary(lambda tf: tf.math.logical_and), "Or": _binary(lambda tf: tf.math.logical_or),
    "Xor": _binary(lambda tf: tf.math.logical_xor),
    "Max": _variadic("maximum"), "Min": _variadic("minimum"), "Sum": _variadic("add"),
    "Pow": _pow, "Mod": _mod,
    "Neg": _unary("negative"), "Abs": _unary("abs"), "Sqrt": _unary("sqrt"), "Reciprocal": _unary("reciprocal"),
    "Exp": _unary("exp"), "Log": _unary("log"), "Erf": _unary("erf"), "Tanh": _unary("tanh"),
    "Sigmoid": _unary("sigmoid"), "Sin": _unary("sin"), "Cos": _unary("cos"), "Floor": _unary("floor"),
    "Ceil": _unary("ceil"), "Round": _unary("round"), "Sign": _unary("sign"), "Not": _unary("logical_not"),
    "IsNaN": _unary("is_nan"), "IsInf": _unary("is_inf"), "Softplus": _unary("softplus"),
    "Relu": lambda tf, node, ins, at: [tf.nn.relu(ins[0])],
    "LeakyRelu": _leaky, "Elu": _elu, "Gelu": _gelu, "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish,
    "PRelu": _prelu, "Clip": _clip, "Where": _where,
    "MatMul": _matmul, "Gemm": _gemm, "Einsum": _einsum,
    "Softmax": _softmax(False), "LogSoftmax": _softmax(True),
    "LayerNormalization": _layer_norm, "BatchNormalization": _batch_norm, "InstanceNormalization": _instance_norm,
    "Shape": _shape, "Size": _size, "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Concat": _concat, "Split": _split, "Slice": _slice,
    "Gather": _gather, "GatherElements": _gather_elements, "GatherND": _gather_nd, "Expand": _expand, "Tile": _tile,
    "ConstantOfShape": _constant_of_shape, "Range": _range, "Trilu": _trilu, "CumSum": _cumsum, "Pad": _pad,
    "ReduceMean": _reduce("reduce_mean"), "ReduceSum": _reduce("reduce_sum"), "ReduceMax": _reduce("reduce_max"),
    "ReduceMin": _reduce("reduce_min"), "ReduceProd": _reduce("reduce_prod"),
    "ArgMax": _arg("argmax"), "ArgMin": _arg("argmin"), "TopK": _topk, "OneHot": _one_hot, "ScatterND": _scatter_nd,
    "Conv": _conv, "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "GlobalAveragePool": _global_pool("avg"), "GlobalMaxPool": _global_pool("max"),
}
