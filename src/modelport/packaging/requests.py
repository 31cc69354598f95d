"""Sample requests written beside a bundle, in each server's own JSON format, from the contract."""

from __future__ import annotations

import json
from pathlib import Path

from modelport.errors import BadInputError
from modelport.packaging.bundle import Artifacts

# numpy dtype name -> KServe v2 / Triton datatype (Triton's config uses "TYPE_" + this)
V2_DATATYPES = {
    "float32": "FP32", "float16": "FP16", "bfloat16": "BF16", "float64": "FP64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL", "string": "BYTES",
}
# above this many elements a sample request file is not written (the README says how to build one)
MAX_SAMPLE_ELEMENTS = 1_000_000


def v2_datatype(dtype: str) -> str:

    try:
        return V2_DATATYPES[dtype]
    except KeyError:
        raise BadInputError(f"dtype '{dtype}' has no serving datatype; known: {', '.join(V2_DATATYPES)}") from None


def fits(artifacts: Artifacts) -> bool:
    """Whether a batch-1 sample request is small enough to write as a file."""
    import math

    dims = dict(artifacts.sample_dims)
    if artifacts.batch_axis():
        dims[artifacts.batch_axis()] = 1
    return sum(math.prod(s.concrete_shape(dims)) for s in artifacts.inputs) <= MAX_SAMPLE_ELEMENTS


def v2_request(artifacts: Artifacts) -> dict:
    """A KServe v2 / Triton inference request on deterministic sample inputs (batch 1)."""
    feeds = artifacts.sample_inputs(batch=1)
    return {"inputs": [
        {"name": s.name, "shape": list(feeds[s.name].shape), "datatype": v2_datatype(s.dtype),
         "data": feeds[s.name].ravel().tolist()}
        for s in artifacts.inputs
    ]}


def named_request(artifacts: Artifacts, key: str = "inputs") -> dict:
    """`{key: {name: nested list}}` (the TorchServe handler's format; TF Serving uses key 'inputs' too)."""
    feeds = artifacts.sample_inputs(batch=1)
    return {key: {s.name: feeds[s.name].tolist() for s in artifacts.inputs}}


def write_json_request(path: Path, artifacts: Artifacts, request_fn) -> Path | None:
    """Write `request_fn(artifacts)` as JSON unless the sample is too large; returns the path or None."""
    if not fits(artifacts):
        return None
    path.write_text(json.dumps(request_fn(artifacts)))
    return path
