"""A ModelProto read, written, measured and copied field by field, so that its weights' bytes are
never held twice.

With the upb protobuf runtime, serialising a model whole, `ByteSize` (which encodes the message to
measure it) and `ListFields` (a fresh copy of every value) each hold the weights' bytes once more.
So a model is read from the file's wire format without its initializers' `raw_data`
(`read_skeleton`), written one initializer at a time (`write_streamed`), measured without being
encoded (`serialized_size`) and copied field by field (`copy_fields`).
"""

from __future__ import annotations

import os
from pathlib import Path

from modelport.onnxfile.tensor_sizes import raw_nbytes
from modelport.run.progress import tick


def read_skeleton(path: str | Path):
    """The ModelProto in `path` with every main-graph initializer's `raw_data` left out, read from
    the file's wire format without reading those bytes (the file is mapped; the pages of the weights
    are never touched). The initializers keep their names, types, dims and external-data entries.
    Raises DecodeError for what is not a well-formed message."""
    import mmap

    import onnx
    from google.protobuf.message import DecodeError

    graph_number = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
    init_number = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
    raw_number = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
    model = onnx.ModelProto()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return model
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            out = bytearray()
            for number, start, tag_end, value, end in _wire_fields(buf, 0, len(buf)):
                if number != graph_number or value is None:
                    out += buf[start:end]
                    continue
                graph = bytearray()
                for g_number, g_start, g_tag_end, g_value, g_end in _wire_fields(buf, value, end):
                    if g_number != init_number or g_value is None:
                        graph += buf[g_start:g_end]
                        continue
                    tensor = b"".join(buf[t[1]:t[4]] for t in _wire_fields(buf, g_value, g_end) if t[0] != raw_number)
                    graph += buf[g_start:g_tag_end] + _varint(len(tensor)) + tensor
                out += buf[start:tag_end] + _varint(len(graph)) + graph
    try:
        model.ParseFromString(bytes(out))
    except Exception as e:
        raise DecodeError(str(e)) from None
    return model


class TruncatedVarint(ValueError):
    """A varint that runs past the end of its buffer (or past 64 bits)."""


def read_varint(buf, at: int, end: int | None = None) -> tuple[int, int]:
    """(the protobuf varint at buf[at], the position after it), reading no further than `end`."""
    end = len(buf) if end is None else end
    value = shift = 0
    while True:
        if at >= end or shift > 63:
            raise TruncatedVarint("a truncated varint")
        byte = buf[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def _wire_fields(buf, pos: int, end: int):
    """(field number, field start, end of its key, value start of a length-delimited field or None,
    field end) for each field of the message in buf[pos:end]."""
    from google.protobuf.message import DecodeError

    def varint(at):
        try:
            return read_varint(buf, at, end)
        except TruncatedVarint as e:
            raise DecodeError("truncated varint") from e

    while pos < end:
        start = pos
        key, pos = varint(pos)
        tag_end, number, wire = pos, key >> 3, key & 7
        value = None
        if wire == 0:
            _, pos = varint(pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = varint(pos)
            value, pos = pos, pos + length
        else:
            raise DecodeError(f"wire type {wire} at byte {start}")
        if pos > end or number == 0:
            raise DecodeError(f"field at byte {start} runs past its message")
        yield number, start, tag_end, value, pos


def write_streamed(model, path: Path) -> None:
    """`model.SerializeToString()` written to `path` piece by piece, the same bytes: the model's and
    the graph's fields in field-number order, each initializer serialised on its own. Serialising the
    whole model at once holds its size in memory once more, and the upb runtime's growing output
    buffer up to twice that again (a 390 MB model measured +1.2 GB while `onnx.save_model` ran)."""

    pieces = _Pieces(model)
    graph = model.graph
    with open(path, "wb") as f:
        f.write(pieces.head.SerializeToString())
        if model.HasField("graph"):
            f.write(pieces.graph_tag + _varint(pieces.graph_size))
            f.write(pieces.graph_head.SerializeToString())
            for index, (tensor, size) in enumerate(zip(graph.initializer, pieces.sizes, strict=True)):
                if size >= 1 << 20:  # the ones that take time
                    tick("writing", tensor.name, index, len(pieces.sizes))
                f.write(pieces.init_tag + _varint(size))
                start = f.tell()
                _write_tensor(f, tensor)
                if f.tell() - start != size:
                    raise ValueError(f"initializer {tensor.name!r} serialised to {f.tell() - start} bytes, not {size}")
            f.write(pieces.graph_tail.SerializeToString())
        f.write(pieces.tail.SerializeToString())


def serialized_size(model) -> int:
    """`model.ByteSize()`, counted piece by piece. The upb runtime's ByteSize encodes the whole
    message to measure it: a 0.94 GB model's ByteSize raised the process's peak by 2.9 GB."""
    pieces = _Pieces(model)
    size = pieces.head.ByteSize() + pieces.tail.ByteSize()
    if model.HasField("graph"):
        size += len(pieces.graph_tag) + len(_varint(pieces.graph_size)) + pieces.graph_size
    return size


class _Pieces:
    """A ModelProto cut where its initializers are: the model's fields before and after `graph`, the
    graph's before and after `initializer`, and each initializer's serialised size."""

    def __init__(self, model):
        import onnx

        graph_field = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"]
        init_field = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"]
        self.head, self.tail, self.graph_head, self.graph_tail = (onnx.ModelProto(), onnx.ModelProto(),
                                                                  onnx.GraphProto(), onnx.GraphProto())
        graph = model.graph
        fields = _set_fields(model)
        copy_fields(model, self.head, only=[f for f in fields if f.number < graph_field.number])
        copy_fields(model, self.tail, only=[f for f in fields if f.number > graph_field.number])
        fields = _set_fields(graph)
        copy_fields(graph, self.graph_head, only=[f for f in fields if f.number < init_field.number])
        copy_fields(graph, self.graph_tail, only=[f for f in fields if f.number > init_field.number])
        self.sizes = [_serialized_size(t) for t in graph.initializer]
        self.graph_tag = _varint(graph_field.number << 3 | 2)
        self.init_tag = _varint(init_field.number << 3 | 2)
        self.graph_size = (self.graph_head.ByteSize() + sum(len(self.init_tag) + len(_varint(n)) + n for n in self.sizes)
                           + self.graph_tail.ByteSize())


def _write_tensor(f, tensor) -> None:
    """`tensor.SerializeToString()` written to `f` with its raw_data passed through as it is (encoding
    a tensor whole holds its bytes up to three times)."""
    import onnx

    if not tensor.HasField("raw_data"):
        f.write(tensor.SerializeToString())
        return
    field = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"]
    head, tail = onnx.TensorProto(), onnx.TensorProto()
    fields = _set_fields(tensor)
    copy_fields(tensor, head, only=[f for f in fields if f.number < field.number])
    copy_fields(tensor, tail, only=[f for f in fields if f.number > field.number])
    data = tensor.raw_data
    f.write(head.SerializeToString() + _varint(field.number << 3 | 2) + _varint(len(data)))
    f.write(data)
    del data
    f.write(tail.SerializeToString())


def _serialized_size(tensor) -> int:
    """`tensor.ByteSize()`, without encoding its raw_data to count it (as long as ByteSize itself)."""
    import onnx

    if not tensor.HasField("raw_data"):
        return tensor.ByteSize()
    meta = onnx.TensorProto()
    copy_fields(tensor, meta, skip=("raw_data",))
    field = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"]
    n = raw_nbytes(tensor)
    return meta.ByteSize() + len(_varint(field.number << 3 | 2)) + len(_varint(n)) + n


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _is_repeated(field) -> bool:
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED


def _set_fields(message) -> list:
    """The field descriptors set in `message`, in field-number order. (Unlike `ListFields()`, which
    hands out every value, a tensor's raw_data included, as a fresh copy.)"""
    fields = sorted(message.DESCRIPTOR.fields, key=lambda f: f.number)
    return [f for f in fields if (len(getattr(message, f.name)) if _is_repeated(f) else message.HasField(f.name))]


def copy_fields(src, dst, *, skip=(), only=None) -> None:
    """Copy the set fields of protobuf message `src` into `dst`: those in `only` (descriptors) or
    else all, except the ones named in `skip`."""
    for field in only if only is not None else _set_fields(src):
        if field.name in skip:
            continue
        value = getattr(src, field.name)
        if _is_repeated(field):
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)
