"""Loading and saving ONNX models safely.

Before onnx or onnxruntime reads an external-data file, every reference is checked here:
known keys only, a relative location that resolves inside the model's folder, no symlinks or
hard links, and `offset + length` within the file. (CVE-2022-25882, CVE-2024-27318 and the
symlink advisories of onnx < 1.21 are the cases this guards; it does not rely on the installed
onnx version having the fixes.) Saving switches to external data when the proto would pass the
2 GiB protobuf limit, and always writes the data file afresh, so a rerun never grows it.
"""

from __future__ import annotations

import os
from pathlib import Path

from modelport.errors import BadInputError, UnsafeInputError
from modelport.file_checks import check_model_file

EXTERNAL_KEYS = {"location", "offset", "length", "checksum", "basename"}
# Above this many bytes of tensor data a model is saved with its weights in a side file.
EXTERNAL_DATA_THRESHOLD = 1 << 30


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


def check_external_data(model, base_dir: Path, model_path: Path) -> list[Path]:
    """Validate every external-data reference of `model`; return the files it reads."""
    base = base_dir.resolve()
    used: list[Path] = []
    for tensor in iter_tensors(model.graph):
        if tensor.data_location != 1:  # TensorProto.EXTERNAL
            continue
        info = {e.key: e.value for e in tensor.external_data}
        unknown = set(info) - EXTERNAL_KEYS
        if unknown:
            raise BadInputError(f"tensor '{tensor.name}' has unknown external-data keys {sorted(unknown)}", path=model_path)
        loc = info.get("location", "")
        if not loc:
            raise BadInputError(f"tensor '{tensor.name}' has external data without a location", path=model_path)
        if os.path.isabs(loc) or loc.startswith(("/", "\\")) or (len(loc) > 1 and loc[1] == ":"):
            raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' is an absolute path outside the model folder", path=model_path)
        if ".." in Path(loc).parts:
            raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' resolves outside the model folder", path=model_path)
        target = base / loc
        # Check every component for symlinks, not just the leaf.
        probe = base
        for part in Path(loc).parts:
            probe = probe / part
            if probe.is_symlink():
                raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' goes through a symlink", path=model_path)
        resolved = target.resolve()
        if os.path.commonpath([str(resolved), str(base)]) != str(base):
            raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' resolves outside the model folder", path=model_path)
        if not resolved.is_file():
            raise BadInputError(f"external data file '{loc}' of tensor '{tensor.name}' is missing", path=model_path)
        st = resolved.stat()
        if st.st_nlink > 1:
            raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' is a hard link", path=model_path)
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise BadInputError(f"tensor '{tensor.name}' has a non-numeric external-data offset or length", path=model_path) from None
        if offset < 0 or (length is not None and length < 0):
            raise BadInputError(f"tensor '{tensor.name}' has a negative external-data offset or length", path=model_path)
        end = offset + (length if length is not None else 0)
        if offset > st.st_size or end > st.st_size:
            raise BadInputError(
                f"external data of tensor '{tensor.name}' ends at byte {end}, past the end of '{loc}' ({st.st_size} bytes)",
                path=model_path,
            )
        used.append(resolved)
    return sorted(set(used))


def _parse(path: Path, *, weights: bool = True):
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False) if weights else read_skeleton(path)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise BadInputError(f"truncated or not an ONNX model ({type(e).__name__})", path=path) from None
    if not model.HasField("graph") or model.ir_version == 0 or (not model.graph.node and not model.graph.output):
        raise BadInputError("truncated or not an ONNX model (no graph)", path=path)
    return model


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


def _wire_fields(buf, pos: int, end: int):
    """(field number, field start, end of its key, value start of a length-delimited field or None,
    field end) for each field of the message in buf[pos:end]."""
    from google.protobuf.message import DecodeError

    def varint(at):
        value, shift = 0, 0
        while True:
            if at >= end or shift > 63:
                raise DecodeError("truncated varint")
            byte = buf[at]
            value |= (byte & 0x7F) << shift
            at += 1
            if not byte & 0x80:
                return value, at
            shift += 7

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


def external_files(path: str | Path) -> list[Path]:
    """The external-data files an ONNX file references (after the safety checks)."""
    path = Path(path)
    return check_external_data(_parse(path), path.parent, path)


def load_onnx(path: str | Path, *, load_external: bool = True, weights: bool = True):
    """Load an ONNX model; external data is checked, then read. `weights=False`: the graph, its
    contract and its initializers' names, types and shapes, none of their bytes (`read_skeleton`),
    for a caller that reads what the model takes and gives: a one-file model's weights are never
    read into memory."""
    import onnx.external_data_helper as edh

    path = check_model_file(path, kind="ONNX model")
    if path.is_dir():
        raise BadInputError("is a folder, expected an .onnx file", path=path)
    model = _parse(path, weights=weights)
    check_external_data(model, path.parent, path)
    if load_external and weights:
        try:
            edh.load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError) as e:
            raise BadInputError(f"cannot read external data: {e}", path=path) from None
    return model


def is_large(model) -> bool:
    """True when the model would not fit a single protobuf (with 1 MiB of slack for the graph)."""
    return tensor_bytes(model) + (1 << 20) > protobuf_limit()


def tensor_bytes(model) -> int:
    """Bytes of tensor data held in (or referenced by) the model's initializers."""
    total = 0
    for t in iter_tensors(model.graph):
        if t.data_location == 1:
            total += _stored_length(t)
        else:
            total += raw_nbytes(t) + 4 * (len(t.float_data) + len(t.int32_data)) + 8 * (len(t.int64_data) + len(t.double_data))
    return total


def stored_bytes(model) -> int:
    """Bytes of tensor data the model's tensors refer to in external-data files."""
    return sum(_stored_length(t) for t in iter_tensors(model.graph) if t.data_location == 1)


def _stored_length(tensor) -> int:
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


def save_onnx(model, path: str | Path, *, external: bool | None = None, base_dir: str | Path | None = None) -> list[Path]:
    """Save `model` (with all data in memory) to `path`; returns the files written. `model` is not changed.

    External data goes to `<name>.data` beside the model when asked for or when the tensors
    would not fit the protobuf limit. Any existing data file is removed first (onnx appends).
    `base_dir`: `model`'s initializers that refer to external data are read from there, one at a
    time, and copied into the new data file (`external` must then be true): a model whose weights
    are in files is saved without ever being held in memory.
    """

    path = Path(path)
    data_name = path.name + ".data"
    data_path = path.parent / data_name
    if data_path.exists():
        data_path.unlink()
    if external is None:
        external = tensor_bytes(model) + (1 << 20) > min(EXTERNAL_DATA_THRESHOLD, protobuf_limit())
    if external:
        write_external(model, path, data_name, base_dir=Path(base_dir) if base_dir is not None else None)
        return [path, data_path] if data_path.exists() else [path]
    if base_dir is not None:
        raise ValueError(f"{path.name}: weights read from {base_dir} are saved as external data only")
    if tensor_bytes(model) + (1 << 20) > protobuf_limit():
        raise ValueError(f"{path.name}: the model's tensors pass the 2 GiB protobuf limit; save it with external data")
    write_streamed(model, path)
    return [path]


EXTERNAL_MIN_BYTES = 1024  # initializers at least this large go to the data file (onnx's own size_threshold)
EXTERNAL_ALIGN = 4096  # each tensor starts on a page boundary of the data file


def write_external(model, path: Path, data_name: str, *, base_dir: Path | None = None) -> None:
    """`model` as `path` (the graph) and `data_name` beside it (the initializers' bytes, one after
    another), written tensor by tensor without changing `model`.

    onnx's own external-data save moves every tensor's bytes out of the model and clears them; with
    the upb protobuf runtime the cleared bytes stay allocated as long as the model lives, and putting
    them back allocates the model's size a second time. Here the model is only read: the file holds
    a copy of the graph whose large initializers name their place in the data file instead.
    `base_dir`: initializers already external are copied from their file there (chunk by chunk)."""
    import onnx

    skeleton = onnx.ModelProto()
    copy_fields(model, skeleton, skip=("graph",))
    copy_fields(model.graph, skeleton.graph, skip=("initializer",))
    from modelport.progress import tick

    total = len(model.graph.initializer)
    with open(path.parent / data_name, "wb") as data:
        for index, tensor in enumerate(model.graph.initializer):
            tick("writing", tensor.name, index, total)
            out = skeleton.graph.initializer.add()
            stored = tensor.data_location == onnx.TensorProto.EXTERNAL
            if (raw_nbytes(tensor) < EXTERNAL_MIN_BYTES and not stored) or (stored and base_dir is None):
                out.CopyFrom(tensor)
                continue
            copy_fields(tensor, out, skip=("raw_data", "external_data", "data_location"))
            offset = -data.tell() % EXTERNAL_ALIGN + data.tell()
            data.seek(offset)
            if stored:
                _copy_stored(tensor, base_dir, data)
            else:
                data.write(tensor.raw_data)
            out.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(data.tell() - offset))):
                entry = out.external_data.add()
                entry.key, entry.value = key, value
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in skeleton.graph.initializer):
        (path.parent / data_name).unlink()
    write_streamed(skeleton, path)


def _copy_stored(tensor, base_dir: Path, out, chunk: int = 64 << 20) -> None:
    """Append the bytes of external `tensor` (its file in `base_dir`) to the open file `out`."""
    info = {e.key: e.value for e in tensor.external_data}
    source = base_dir / info["location"]
    if not source.resolve().is_relative_to(base_dir.resolve()):
        raise ValueError(f"initializer {tensor.name!r} refers to data outside {base_dir}")
    offset = int(info.get("offset") or 0)
    left = int(info.get("length") or 0) or (source.stat().st_size - offset)
    with open(source, "rb") as f:
        out.flush()
        try:  # in the kernel, without passing the bytes through this process
            while left > 0:
                done = os.copy_file_range(f.fileno(), out.fileno(), min(chunk, left), offset)
                if done <= 0:
                    break
                offset, left = offset + done, left - done
        except (AttributeError, OSError):
            pass
        out.seek(0, os.SEEK_END)
        f.seek(offset)
        while left > 0:
            block = f.read(min(chunk, left))
            if not block:
                raise ValueError(f"{source.name} ends inside initializer {tensor.name!r}")
            out.write(block)
            left -= len(block)


def write_streamed(model, path: Path) -> None:
    """`model.SerializeToString()` written to `path` piece by piece, the same bytes: the model's and
    the graph's fields in field-number order, each initializer serialised on its own. Serialising the
    whole model at once holds its size in memory once more, and the upb runtime's growing output
    buffer up to twice that again (a 390 MB model measured +1.2 GB while `onnx.save_model` ran)."""
    from modelport.progress import tick

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


def model_files(path: str | Path) -> list[Path]:
    """The model file plus its external-data files."""
    path = Path(path)
    return [path, *external_files(path)]


_MAX_ORT_IR: int | None = None


def max_onnxruntime_ir_version() -> int:
    """The highest ONNX IR version the installed onnxruntime loads (probed once with a tiny model)."""
    global _MAX_ORT_IR
    if _MAX_ORT_IR is None:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper

        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        _MAX_ORT_IR = 3
        for version in range(onnx.IR_VERSION, 3, -1):
            model.ir_version = version
            try:
                ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            except Exception:
                continue
            _MAX_ORT_IR = version
            break
    return _MAX_ORT_IR


def fit_ir_version(model) -> str | None:
    """Lower the model's IR version to what onnxruntime loads, in place; returns a note when changed.

    Files written by a newer onnx (e.g. IR 14) than the runtime knows are common; the IR version
    only gates file-format features, and the opsets still decide what the graph means.
    """
    top = max_onnxruntime_ir_version()
    if model.ir_version > top:
        note = f"IR version lowered from {model.ir_version} to {top} (the newest onnxruntime {_ort_version()} loads)"
        model.ir_version = top
        return note
    return None


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


CONTRACT_KEY = "modelport.contract"


class stamped_contract:
    """Within the block, the IR's ONNX model carries its I/O contract in `metadata_props`.

    The key is removed again afterwards, so the IR itself is left as it was (no copy of a
    possibly large model is made).
    """

    def __init__(self, ir):
        self.ir = ir

    def __enter__(self):
        import json

        props = self.ir.model.metadata_props
        self._old = {p.key: p.value for p in props if p.key == CONTRACT_KEY}
        _drop_prop(props, CONTRACT_KEY)
        entry = props.add()
        entry.key, entry.value = CONTRACT_KEY, json.dumps(self.ir.contract(), sort_keys=True)
        return self.ir.model

    def __exit__(self, *exc):
        props = self.ir.model.metadata_props
        _drop_prop(props, CONTRACT_KEY)
        for k, v in self._old.items():
            e = props.add()
            e.key, e.value = k, v
        return False


def _drop_prop(props, key: str) -> None:
    keep = [(p.key, p.value) for p in props if p.key != key]
    del props[:]
    for k, v in keep:
        e = props.add()
        e.key, e.value = k, v


def read_contract(model) -> dict | None:
    """The contract a modelport-written ONNX file carries, or None."""
    import json

    for p in model.metadata_props:
        if p.key == CONTRACT_KEY:
            try:
                return json.loads(p.value)
            except json.JSONDecodeError:
                return None
    return None


class DataFile:
    """An external-data file written tensor by tensor as a model is built or rewritten: `add` appends
    an array and returns the TensorProto that refers to it (small arrays stay inline), `copy` appends
    the bytes of an external TensorProto read from its own file. Nothing is held after it is written."""

    def __init__(self, path: Path):
        self.path, self.offset = Path(path), 0
        self._out = open(self.path, "wb")  # noqa: SIM115 - closed by close() / the with block

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        self._out.close()

    def _start(self) -> int:
        pad = -self.offset % EXTERNAL_ALIGN
        if pad:
            self._out.write(b"\0" * pad)
            self.offset += pad
        return self.offset

    def _refer(self, out, start: int) -> None:
        import onnx

        out.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(start)), ("length", str(self.offset - start))):
            entry = out.external_data.add()
            entry.key, entry.value = key, value

    def add(self, name: str, value):
        import numpy as np
        import onnx
        from onnx import numpy_helper

        value = np.ascontiguousarray(value)
        if value.nbytes < EXTERNAL_MIN_BYTES:
            return numpy_helper.from_array(value, name)
        start = self._start()
        self._out.write(value.data)
        self.offset += value.nbytes
        out = onnx.TensorProto(name=name, data_type=onnx.helper.np_dtype_to_tensor_dtype(value.dtype), dims=value.shape)
        self._refer(out, start)
        return out

    def copy(self, tensor, base_dir: Path):
        """`tensor` (external, its file in `base_dir`) appended here; returns the new TensorProto."""
        import onnx

        out = onnx.TensorProto()
        copy_fields(tensor, out, skip=("raw_data", "external_data", "data_location"))
        start = self._start()
        _copy_stored(tensor, base_dir, self._out)
        self.offset = self._out.tell()
        self._refer(out, start)
        return out


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
            length = _stored_length(t) if stored else raw_nbytes(t)
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


def attach_external(model, base_dir: str | Path) -> None:
    """Read, in place, the data of every external initializer of `model`'s main graph from its file
    in `base_dir` (tensor by tensor: one tensor's bytes in flight at a time)."""
    import onnx
    import onnx.external_data_helper as edh

    from modelport.progress import tick

    total = len(model.graph.initializer)
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tick("reading", tensor.name, index, total)
            edh.load_external_data_for_tensor(tensor, str(base_dir))
            tensor.ClearField("data_location")
            del tensor.external_data[:]


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
