"""`inspect`: what a model file is: format, inputs/outputs, opset, op histogram, parameters, size.

Each parser module may provide `inspect(path) -> dict`; ONNX is handled here without reading
external data (parameter counts come from tensor dims).
"""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path

from modelport.errors import BadInputError
from modelport.ir import specs_from_onnx


def inspect_onnx(path: Path) -> dict:
    import math

    from modelport.onnx_io import _parse, check_external_data, iter_tensors

    model = _parse(path)
    data_files = check_external_data(model, path.parent, path)
    init = {t.name for t in model.graph.initializer}
    ops = Counter((f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type) for n in model.graph.node)
    params = sum(math.prod(t.dims) for t in iter_tensors(model.graph))
    return {
        "format": "onnx",
        "ir_version": model.ir_version,
        "opsets": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": [s.to_dict() for s in specs_from_onnx([v for v in model.graph.input if v.name not in init])],
        "outputs": [s.to_dict() for s in specs_from_onnx(model.graph.output)],
        "nodes": len(model.graph.node),
        "ops": dict(ops.most_common()),
        "parameters": int(params),
        "files": [str(path), *map(str, data_files)],
        "size": path.stat().st_size + sum(f.stat().st_size for f in data_files),
    }


# file suffix (or folder test) -> module providing inspect(path); first match wins
INSPECTORS: list[tuple[str, str]] = [
    (".onnx", "modelport.orchestration.inspect:inspect_onnx"),
    (".pt", "modelport.parsers.pytorch:inspect"),
    (".pth", "modelport.parsers.pytorch:inspect"),
    (".pt2", "modelport.parsers.pytorch:inspect"),
    (".safetensors", "modelport.parsers.pytorch:inspect"),
    (".keras", "modelport.parsers.keras:inspect"),
    (".h5", "modelport.parsers.keras:inspect"),
    (".hdf5", "modelport.parsers.keras:inspect"),
    ("saved_model.pb", "modelport.parsers.savedmodel:inspect"),
    (".pb", "modelport.parsers.graphdef:inspect"),
    (".tflite", "modelport.parsers.tflite:inspect"),
    (".plan", "modelport.runtimes.tensorrt:engine_info"),
    (".engine", "modelport.runtimes.tensorrt:engine_info"),
    ("/", "modelport.parsers.savedmodel:inspect"),
]


def register_inspector(suffix: str, target: str) -> None:
    INSPECTORS.append((suffix, target))


def inspect(path: str | Path) -> dict:
    from modelport.file_checks import check_model_file

    p = check_model_file(path)
    for suffix, target in INSPECTORS:
        if (suffix == "/" and p.is_dir()) or p.name.lower().endswith(suffix):
            mod, _, fn = target.partition(":")
            info = getattr(importlib.import_module(mod), fn)(p)
            info.setdefault("path", str(p))
            return info
    raise BadInputError("no inspector for this kind of file", path=p,
                        hint="known: " + ", ".join(s for s, _ in INSPECTORS))
