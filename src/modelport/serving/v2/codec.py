"""Request bodies to numpy arrays and answers back, costing what the data costs.

JSON (`orjson`; a tensor's `data` goes to numpy in one call, flat or nested, row-major), the HTTP
binary-data extension (a JSON header of `Inference-Header-Content-Length` bytes, then each
tensor's raw bytes in order: `np.frombuffer`, no copy) and gRPC's `raw_input_contents` or typed
`contents`. A request that does not parse is a `RequestError`: 422 for a body that is not JSON or
not a v2 request, 400 for data that does not fit its datatype or shape (as KServe and Triton answer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import orjson

from modelport.errors import one_line
from modelport.packaging.requests import V2_DATATYPES

NUMPY_OF = {v: k for k, v in V2_DATATYPES.items() if k != "string"}
HEADER_LENGTH = "inference-header-content-length"


class RequestError(Exception):
    """A request that cannot run: `status` (HTTP) and the reason a client reads."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass
class Decoded:
    """One inference request: its arrays, and how it wants its outputs."""

    feeds: dict[str, np.ndarray]
    id: str = ""
    outputs: list[str] | None = None  # the outputs asked for by name (None: all)
    binary: set[str] = field(default_factory=set)  # outputs to send as raw bytes (HTTP binary extension)
    binary_all: bool = False


def _dtype(datatype: str, name: str) -> np.dtype:
    if datatype == "BYTES":
        return np.dtype(object)
    try:
        return np.dtype(NUMPY_OF[datatype])
    except KeyError:
        raise RequestError(400, f"input '{name}': unknown datatype '{datatype}'") from None


def _shape(value, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and d >= 0 for d in value):
        raise RequestError(400, f"input '{name}': shape must be a list of non-negative integers, got {value!r}")
    return tuple(value)


def _bytes_items(raw: memoryview, count: int, name: str) -> np.ndarray:
    """BYTES in binary form: each element a 4-byte little-endian length, then its bytes."""
    out, at = np.empty(count, dtype=object), 0
    for i in range(count):
        if at + 4 > len(raw):
            raise RequestError(400, f"input '{name}': its binary BYTES data ends before element {i}")
        n = int.from_bytes(raw[at:at + 4], "little")
        out[i] = bytes(raw[at + 4:at + 4 + n])
        at += 4 + n
    return out


def from_raw(raw, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A tensor from its raw bytes (row-major, little-endian): a view, not a copy."""
    dtype = _dtype(datatype, name)
    count = math.prod(shape)
    if dtype.kind == "O":
        return _bytes_items(memoryview(raw), count, name).reshape(shape)
    if len(raw) != count * dtype.itemsize:
        raise RequestError(400, f"input '{name}': {len(raw)} bytes of data for shape {list(shape)} of {datatype} "
                                f"({count * dtype.itemsize} expected)")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _from_data(data, dtype: np.dtype, shape: tuple[int, ...], name: str, datatype: str) -> np.ndarray:
    try:
        a = np.asarray(data, dtype=dtype) if dtype.kind != "O" else np.asarray(
            [d.encode() if isinstance(d, str) else d for d in np.asarray(data, dtype=object).ravel()], dtype=object)
    except (TypeError, ValueError, OverflowError) as e:
        raise RequestError(400, f"input '{name}': its data is not {datatype} ({one_line(e)})") from None
    if a.size != math.prod(shape):
        raise RequestError(400, f"input '{name}': {a.size} values for shape {list(shape)} ({math.prod(shape)} expected)")
    return a.reshape(shape)


def decode_json(body: bytes, header_length: int | None = None) -> Decoded:
    """An HTTP v2 request: all JSON, or a JSON header of `header_length` bytes and binary tensors after it."""
    head = body if header_length is None else body[:header_length]
    if header_length is not None and not 0 <= header_length <= len(body):
        raise RequestError(400, f"Inference-Header-Content-Length {header_length} is beyond the body's {len(body)} bytes")
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as e:
        raise RequestError(422, f"JSON decode error: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise RequestError(422, "the request is not a v2 inference request: it needs an 'inputs' list")
    view, at = memoryview(body), header_length or 0
    feeds: dict[str, np.ndarray] = {}
    for item in doc["inputs"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("datatype"), str):
            raise RequestError(422, "each input needs a 'name', a 'shape' and a 'datatype'")
        name, datatype = item["name"], item["datatype"]
        shape = _shape(item.get("shape"), name)
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if header_length is None:
                raise RequestError(400, f"input '{name}' has binary data but the Inference-Header-Content-Length header is missing")
            if not isinstance(size, int) or size < 0 or at + size > len(body):
                raise RequestError(400, f"input '{name}': binary_data_size {size} is beyond the body")
            feeds[name] = from_raw(view[at:at + size], datatype, shape, name)
            at += size
        elif "data" in item:
            feeds[name] = _from_data(item["data"], _dtype(datatype, name), shape, name, datatype)
        else:
            raise RequestError(400, f"input '{name}' has no data")
    params = doc.get("parameters") or {}
    outputs, binary = None, set()
    if isinstance(doc.get("outputs"), list):
        outputs = []
        for o in doc["outputs"]:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise RequestError(422, "each requested output needs a 'name'")
            outputs.append(o["name"])
            if (o.get("parameters") or {}).get("binary_data"):
                binary.add(o["name"])
    rid = doc.get("id")
    return Decoded(feeds, rid if isinstance(rid, str) else "", outputs, binary, bool(params.get("binary_data_output")))


def _bytes_raw(a: np.ndarray) -> bytes:
    return b"".join(len(b).to_bytes(4, "little") + b for b in (x if isinstance(x, bytes) else str(x).encode() for x in a.ravel()))


def raw_bytes(a: np.ndarray) -> bytes | memoryview:
    """A tensor's raw row-major bytes (BYTES: length-prefixed elements)."""
    if a.dtype == object:
        return _bytes_raw(a)
    return memoryview(np.ascontiguousarray(a)).cast("B")


def encode_json(model: str, version: str, rid: str, outputs: list[tuple[str, str, np.ndarray]], binary: set[str],
                parameters: dict | None = None) -> tuple[bytes, int | None]:
    """The response body and, when some outputs are binary, its JSON header's length. `outputs`:
    (name, v2 datatype, array) in order."""
    tensors, tails = [], []
    for name, datatype, a in outputs:
        t = {"name": name, "datatype": datatype, "shape": list(a.shape)}
        if name in binary:
            raw = raw_bytes(a)
            t["parameters"] = {"binary_data_size": len(raw) if isinstance(raw, bytes) else raw.nbytes}
            tails.append(raw)
        elif a.dtype == object:
            t["data"] = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in a.ravel()]
        else:
            t["data"] = np.ascontiguousarray(a).ravel()
        tensors.append(t)
    doc = {"model_name": model, "model_version": version, "outputs": tensors}
    if rid:
        doc["id"] = rid
    if parameters:
        doc["parameters"] = parameters
    try:
        head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # a dtype orjson does not write (bfloat16): plain lists
        for t in tensors:
            if isinstance(t.get("data"), np.ndarray):
                t["data"] = t["data"].astype(np.float64 if t["data"].dtype.kind == "f" else t["data"].dtype).tolist()
        head = orjson.dumps(doc)
    if not tails:
        return head, None
    return b"".join([head, *tails]), len(head)
