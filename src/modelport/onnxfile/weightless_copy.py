"""A copy of a model whose large initializers refer to a placeholder data file instead of holding
their bytes, and onnx's checker run on such a copy against a sparse file of the right size.

The copy hashes, infers shapes and checks like the model itself while holding none of its large weights.
"""

from __future__ import annotations

from pathlib import Path

from modelport.onnxfile.proto_pieces import copy_fields
from modelport.onnxfile.tensor_sizes import raw_nbytes, stored_length

WEIGHTLESS_DATA = "weights.bin"


def weightless(model):
    """(a copy of `model` whose initializers of 1 KB or more, in every graph, carry their dims and
    dtype but refer to external data in WEIGHTLESS_DATA instead of holding it, that file's size)."""
    import onnx

    offset = 0

    def strip(src, dst):
        nonlocal offset
        copy_fields(src, dst, skip=("initializer", "node"))
        for t in src.initializer:
            out = dst.initializer.add()
            stored = t.data_location == onnx.TensorProto.EXTERNAL
            length = stored_length(t) if stored else raw_nbytes(t)
            if length >= 1024 or stored:
                copy_fields(t, out, skip=("raw_data", "external_data", "data_location"))
                out.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", WEIGHTLESS_DATA), ("offset", str(offset)), ("length", str(length))):
                    entry = out.external_data.add()
                    entry.key, entry.value = key, value
                offset += length
            else:
                out.CopyFrom(t)
        for node in src.node:
            new = dst.node.add()
            copy_fields(node, new, skip=("attribute",))
            for attr in node.attribute:
                a = new.attribute.add()
                copy_fields(attr, a, skip=("g", "graphs"))
                if attr.HasField("g"):
                    strip(attr.g, a.g)
                for g in attr.graphs:
                    strip(g, a.graphs.add())

    out = onnx.ModelProto()
    copy_fields(model, out, skip=("graph",))
    strip(model.graph, out.graph)
    return out, offset


def check_weightless(model) -> None:
    """onnx's checker on `model` without serialising its weights (see `check_skeleton`). Raises what
    the checker raises."""
    check_skeleton(*weightless(model))


def check_skeleton(skeleton, size: int) -> None:
    """onnx's checker on a `weightless` copy (`size`: its data file's), read from a file whose large
    tensors refer to a sparse file of that size: the checker verifies each tensor's bytes are there,
    not what they are. Raises what the checker raises."""
    import tempfile

    import onnx
    import onnx.checker

    with tempfile.TemporaryDirectory(prefix="modelport-check-") as tmp:
        with open(Path(tmp) / WEIGHTLESS_DATA, "wb") as f:
            f.truncate(size)  # sparse: takes neither disk nor memory
        onnx.save_model(skeleton, str(Path(tmp) / "model.onnx"))
        onnx.checker.check_model(str(Path(tmp) / "model.onnx"))
