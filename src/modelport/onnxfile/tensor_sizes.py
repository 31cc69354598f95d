"""The tensors of an ONNX model and the bytes they hold, counted without copying them.

`raw_data` is never read to learn its length (protobuf hands out a fresh copy each time), so these
are cheap on a model of any size; `is_large` tells a caller when a model will not fit one protobuf.
"""

from __future__ import annotations


def protobuf_limit() -> int:
    """The proto size limit onnx enforces (patched in tests to exercise the large-model path)."""
    import onnx.checker

    return onnx.checker.MAXIMUM_PROTOBUF


def iter_tensors(graph):
    """Every TensorProto in a graph: initializers, Constant attributes, and those of subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from iter_tensors(attr.g)
            for g in attr.graphs:
                yield from iter_tensors(g)


def is_large(model) -> bool:
    """True when the model would not fit a single protobuf (with 1 MiB of slack for the graph)."""
    return tensor_bytes(model) + (1 << 20) > protobuf_limit()


def tensor_bytes(model) -> int:
    """Bytes of tensor data held in (or referenced by) the model's initializers."""
    total = 0
    for t in iter_tensors(model.graph):
        if t.data_location == 1:
            total += stored_length(t)
        else:
            total += raw_nbytes(t) + 4 * (len(t.float_data) + len(t.int32_data)) + 8 * (len(t.int64_data) + len(t.double_data))
    return total


def stored_bytes(model) -> int:
    """Bytes of tensor data the model's tensors refer to in external-data files."""
    return sum(stored_length(t) for t in iter_tensors(model.graph) if t.data_location == 1)


def stored_length(tensor) -> int:
    """The `length` entry of an external tensor's data (0 when it has none)."""
    return int(next((e.value for e in tensor.external_data if e.key == "length"), "") or 0)


SUB_BYTE_BITS = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2}  # UINT4, INT4, FLOAT4E2M1, UINT2, INT2: packed below one byte


def raw_nbytes(tensor) -> int:
    """Bytes in a tensor's raw_data, from its dims and type: reading `raw_data` itself copies the
    whole buffer (protobuf hands out a new bytes object each time), which for a 500 MB weight costs
    500 MB and half a second just to learn its length."""
    if not tensor.HasField("raw_data"):
        return 0
    import math

    import numpy as np
    import onnx

    count = math.prod(tensor.dims)
    try:
        if tensor.data_type in SUB_BYTE_BITS:
            return (count * SUB_BYTE_BITS[tensor.data_type] + 7) // 8
        return count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return len(tensor.raw_data)
