"""`inspect`: what a model file is: format, inputs/outputs, opset, op histogram, parameters, size.

Each parser module may provide `inspect(path) -> dict`, registered in INSPECTORS with the file
endings it reads; ONNX is handled here without reading external data (parameter counts come from
tensor dims).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from modelport.errors import BadInputError
from modelport.ir import contract_from_onnx
from modelport.onnxfile.contract_stamp import read_contract
from modelport.onnxfile.external_data_checks import check_external_data
from modelport.onnxfile.onnx_io import _parse
from modelport.onnxfile.tensor_sizes import iter_tensors
from modelport.parsers import INSPECTORS as PARSER_INSPECTORS
from modelport.registry import from_targets
from modelport.run.file_checks import check_model_file


def inspect_onnx(path: Path) -> dict:
    import math


    model = _parse(path)
    data_files = check_external_data(model, path.parent, path)
    inputs, outputs, _ = contract_from_onnx(model)

    declared = (read_contract(model) or {}).get("dims") or {}  # a modelport-written file's declared bounds
    ops = Counter((f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type) for n in model.graph.node)
    params = sum(math.prod(t.dims) for t in iter_tensors(model.graph))
    return {
        "format": "onnx",
        "ir_version": model.ir_version,
        "opsets": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": [s.to_dict() for s in inputs],
        "outputs": [s.to_dict() for s in outputs],
        **({"dynamic_dims": bounded} if (bounded := {s.name: {d: declared[d] for d in s.shape if isinstance(d, str) and d in declared}
                                                     for s in inputs if any(isinstance(d, str) and d in declared for d in s.shape)})
           else {}),
        "nodes": len(model.graph.node),
        "ops": dict(ops.most_common()),
        "parameters": int(params),
        "files": [str(path), *map(str, data_files)],
        "size": path.stat().st_size + sum(f.stat().st_size for f in data_files),
    }


# format -> "module:function" returning inspect(path)'s dict; `suffixes` pick one by file name
# (first match wins, "/" is any folder). The targets' artifact formats come from their descriptors
# (`modelport.targets`: inspector, suffixes); the source formats parsers read follow.
INSPECTORS = from_targets("inspector", lambda t: t.inspector, suffixes=True)
for _name, _inspector, _suffixes in PARSER_INSPECTORS:
    INSPECTORS.register(_name, _inspector, suffixes=_suffixes)
register_inspector = INSPECTORS.register


def inspect(path: str | Path) -> dict:

    p = check_model_file(path)
    name = INSPECTORS.name_for(p)
    if name is None:
        raise BadInputError("no inspector for this kind of file", path=p, hint="known: " + ", ".join(INSPECTORS.suffixes))
    info = INSPECTORS.load(name)(p)
    info.setdefault("path", str(p))
    add_dims(info)
    return info


def add_dims(info: dict) -> None:
    """Each input's and output's `dims`: per axis, fixed (its size), or dynamic under its name with
    the bounds the file declares where it does (`dynamic_dims`: {input: {dim: form}}, a range or
    enumerated sizes; an ExecuTorch program's, a Core ML package's flexible shapes, a stamped ONNX
    contract's), else dynamic with no bounds."""
    bounds = info.get("dynamic_dims") or {}
    for kind in ("inputs", "outputs"):
        for tensor in info.get(kind) or []:
            shape = tensor.get("shape")
            if not isinstance(shape, list):
                continue
            forms = []
            for d in shape:
                if isinstance(d, int) and d >= 0:
                    forms.append({"kind": "fixed", "size": d})
                else:
                    name = d if isinstance(d, str) else None
                    declared = next((per[name] for per in ([bounds.get(tensor.get("name"), {})] if kind == "inputs" else [])
                                     + list(bounds.values()) if name in per), None)
                    forms.append({"name": name, **(declared or {"kind": "dynamic"})})
            tensor["dims"] = forms
