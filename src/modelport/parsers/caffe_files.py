"""Reading a Caffe source's two files: the `.prototxt` network (text NetParameter, refused where it
would run code or names a file: exit 3) and the `.caffemodel` weights (binary NetParameter, its
blobs checked against their shapes, a file cut short located by walking its fields); and the
layers of the TEST phase."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError, UnsafeInputError
from modelport.onnxfile.proto_pieces import TruncatedVarint, read_varint
from modelport.run.file_checks import check_model_file

MAX_PROTOTXT = 16 << 20  # a network description; real ones are a few hundred KB
MAX_CAFFEMODEL = (2 << 30) - 1  # protobuf's limit for one message

# layer parameters that name files, and the layer types that read them: refused as they are
FILE_FIELDS = ("source", "mean_file", "meanfile", "file_name", "root_folder", "label_map_file", "name_size_file",
               "output_directory", "output_name_prefix")


def _read(path: Path, cap: int, kind: str) -> bytes:
    path = check_model_file(path, kind=kind)
    if path.is_dir():
        raise BadInputError(f"a folder, not a {kind}", path=path)
    size = path.stat().st_size
    if size > cap:
        raise BadInputError(f"{size} bytes, more than a {kind} can hold ({cap} bytes)", path=path)
    return path.read_bytes()


def _strip_text(text: str) -> str:
    """The prototxt with its comments removed and its strings emptied (what names a field)."""
    return re.sub(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*',
                  lambda m: '""' if m.group()[0] in "\"'" else "", text)


def read_network(path: Path):
    """The NetParameter of a prototxt, refused where it names a file or holds legacy V1 layers."""
    from google.protobuf import text_format

    from modelport.parsers.caffe_schema import NetParameter

    raw = _read(path, MAX_PROTOTXT, "Caffe prototxt")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInputError("not a Caffe prototxt (not UTF-8 text; is it the .caffemodel?)", path=path) from None
    net = NetParameter()
    try:
        text_format.Parse(text, net, allow_unknown_field=True)
    except text_format.ParseError as e:
        raise BadInputError(f"not a valid Caffe prototxt: {e}", path=path) from None
    for layer in net.layer:
        if layer.type == "Python":
            module = layer.python_param.module if layer.HasField("python_param") else ""
            raise UnsafeInputError(f"layer '{layer.name}' of type Python runs Python code"
                                   + (f" (module '{module}')" if module else "")
                                   + "; modelport never runs code from a model", path=path)
    bare = _strip_text(text)
    for key in FILE_FIELDS:
        m = re.search(rf"(?<![\w.]){key}\s*:", bare)
        if m:
            line = bare.count("\n", 0, m.start()) + 1
            raise UnsafeInputError(f"line {line}: '{key}' names a file; modelport reads only the network and its "
                                   "weights, never files a prototxt points to (remove the data layers: a deploy "
                                   "prototxt declares its inputs with an Input layer)", path=path)
    if len(net.layers):
        raise BadInputError(f"legacy V1 Caffe format ('layers' with {len(net.layers)} entries, e.g. "
                            f"'{net.layers[0].name}'): upgrade it to the 'layer' format with Caffe's "
                            "upgrade_net_proto_text tool", path=path)
    return net


def _fields(buf: bytes, start: int, end: int):
    """(field number, wire type, value start, value end) of each field in buf[start:end]; the
    last one's end may lie past `end` (a cut message)."""
    pos = start
    while pos < end:
        tag, pos = read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, after = read_varint(buf, pos)
        elif wire == 1:
            after = pos + 8
        elif wire == 5:
            after = pos + 4
        elif wire == 2:
            length, pos = read_varint(buf, pos)
            after = pos + length
        else:
            raise TruncatedVarint(f"wire type {wire}")  # garbled: read as where the file stops making sense
        yield number, wire, pos, after
        pos = after


def truncation(buf: bytes) -> str | None:
    """Where a caffemodel that fails to parse is cut short: the layer (its name and type, read
    from the bytes that are there) and its blob, or None when the file is not cut but garbled."""
    count = 0
    try:
        for number, wire, start, end in _fields(buf, 0, len(buf)):
            if number in (100, 2) and wire == 2:
                count += 1
                if end > len(buf):
                    name_field, blob_field = (1, 7) if number == 100 else (4, 6)
                    name, kind, blobs = "", "", 0
                    try:
                        for n, w, s, e in _fields(buf, start, len(buf)):
                            if e > len(buf):
                                break
                            if n == name_field and w == 2:
                                name = buf[s:e].decode("utf-8", "replace")
                            elif n == 2 and w == 2 and number == 100:
                                kind = buf[s:e].decode("utf-8", "replace")
                            elif n == blob_field and w == 2:
                                blobs += 1
                    except TruncatedVarint:
                        pass
                    what = f"layer '{name}'" + (f" ({kind})" if kind else "") if name else f"layer {count}"
                    return (f"truncated: the file ends inside {what}, in its blob {blobs} "
                            f"({len(buf) - start} of its {end - start} bytes are there)")
            if end > len(buf):
                return f"truncated: the file ends inside field {number} ({len(buf)} bytes)"
    except TruncatedVarint:
        return f"truncated: the file ends inside a field tag ({len(buf)} bytes)"
    return None


@dataclass
class Blob:
    index: int
    shape: list[int]
    values: np.ndarray


def _blob(layer: str, index: int, proto) -> Blob:
    from modelport.parsers.caffe_schema import FLOAT, FLOAT16

    if any(proto.HasField(f) for f in ("num", "channels", "height", "width")):
        shape = [proto.num, proto.channels, proto.height, proto.width]
    elif proto.HasField("shape"):
        shape = list(proto.shape.dim)
    else:
        shape = [1]
    if any(d < 0 for d in shape):
        raise BadInputError(f"layer '{layer}' blob {index} has a negative dim: {shape}")
    count = math.prod(shape)
    if len(proto.data):
        values = np.asarray(proto.data, dtype=np.float32)
    elif proto.HasField("raw_data") and proto.raw_data_type in (FLOAT16, FLOAT):
        dtype = np.float16 if proto.raw_data_type == FLOAT16 else np.float32
        raw = proto.raw_data
        if len(raw) % np.dtype(dtype).itemsize:
            raise BadInputError(f"layer '{layer}' blob {index}: {len(raw)} bytes of raw data, not whole values")
        values = np.frombuffer(raw, dtype=dtype).astype(np.float32)
    elif len(proto.double_data):
        raise BadInputError(f"layer '{layer}' blob {index} holds double_data, which OpenCV (the reference) does not read")
    else:
        values = np.zeros(0, np.float32)
    if values.size != count:
        raise BadInputError(f"layer '{layer}' blob {index} holds {values.size} values, its shape {shape} needs {count} "
                            "(truncated or mismatched weights)")
    return Blob(index, shape, values.reshape(shape))


def read_weights(path: Path) -> dict[str, list[Blob]]:
    """{layer name: its blobs} of a caffemodel: the first layer of each name that has blobs (as
    OpenCV matches them), V1 layers included."""
    from google.protobuf.message import DecodeError

    from modelport.parsers.caffe_schema import WeightsNet

    buf = _read(path, MAX_CAFFEMODEL, "Caffe weights file")
    net = WeightsNet()
    try:
        net.ParseFromString(buf)
    except DecodeError:
        raise BadInputError(truncation(buf) or "not a Caffe .caffemodel (a binary NetParameter)", path=path) from None
    found: dict[str, list[Blob]] = {}
    try:
        for layer in [*net.layer, *net.layers]:
            if len(layer.blobs) and layer.name not in found:
                found[layer.name] = [_blob(layer.name, i, b) for i, b in enumerate(layer.blobs)]
    except BadInputError as e:
        raise BadInputError(e.message, path=path) from None
    if not len(net.layer) and not len(net.layers):
        raise BadInputError("no layers in the file: not a Caffe .caffemodel (a binary NetParameter)", path=path)
    return found


TRAIN, TEST = 0, 1  # caffe.Phase


def _meets(rule, level: int = 0) -> bool:
    """Caffe's NetStateRule test against the TEST phase, level 0, no stages."""
    if rule.HasField("phase") and rule.phase != TEST:
        return False
    if rule.HasField("min_level") and level < rule.min_level or rule.HasField("max_level") and level > rule.max_level:
        return False
    return not len(rule.stage)


def inference_layers(net) -> list:
    """The layers of the TEST phase: TRAIN-only ones (by `phase`, `include` or `exclude`) left out."""
    kept = []
    for layer in net.layer:
        if layer.HasField("phase") and layer.phase == TRAIN:
            continue
        if len(layer.include) and not any(_meets(r) for r in layer.include):
            continue
        if len(layer.exclude) and any(_meets(r) for r in layer.exclude):
            continue
        kept.append(layer)
    return kept
