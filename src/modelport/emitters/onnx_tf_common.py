"""What every op function of modelport's ONNX → TensorFlow lowering (`emitters/onnx_tf.py`) shares:
the registry they register in (`OPS`, an `OpRegistry` as the PyTorch code generator's converters
have) and the helpers that read their inputs (static values, ranks, shapes, axes, dtypes). The
functions themselves are in `onnx_tf_ops.py` (tensor and shape ops) and `onnx_tf_math.py` (math,
normalisation and window ops).

Each registers with `@OPS.register("Op")` (a tuple for several op types; `since=`/`until=` for an
opset range) and takes `(tf, node, ins, at, opset)`: the node, its inputs (a `tf.Tensor`, a numpy
array for a constant, or None for an omitted optional input), its attributes as Python values and
the model's opset (the one its entry was looked up at), and returns the node's outputs in order.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.op_registry import OpRegistry
from modelport.errors import UnsupportedError

# ONNX TensorProto element types -> numpy dtype names
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}
# op type -> its function: `onnx_tf_ops.py` and `onnx_tf_math.py` register into it, `onnx_tf.ops()` loads both
OPS = OpRegistry("TensorFlow form")


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


def axes_of(at_or_input, r: int) -> list[int]:
    return [int(a) + r if int(a) < 0 else int(a) for a in np.ravel(at_or_input)]


def axis_of(at: dict, r: int, default: int) -> int:
    """The node's `axis` attribute (else `default`) counted from 0 in a tensor of rank `r`."""
    return axes_of(at.get("axis", default), r)[0]


def like(x, dtype):
    """A numpy constant `x` in `dtype` (a tensor's), so an op may take it beside that tensor; tensors as they are."""
    return x.astype(dtype.as_numpy_dtype) if isinstance(x, np.ndarray) and x.dtype != dtype.as_numpy_dtype else x
