"""The ORT-format target: `model.ort` for onnxruntime mobile and minimal builds, validated in onnxruntime.

The file is written by onnxruntime itself (a session saves its graph in ORT format) after the
hardware-independent "basic" optimizations only, so the same file runs on ARM phones and x86
servers. `required_operators.config` beside it lists the kernels a reduced onnxruntime build
needs. Precision fp16/int8 comes from the project's precision passes before saving.
"""

from __future__ import annotations

from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.errors import BadInputError
from modelport.ir import IRModel

NAME = "ort"
RUNTIME = "onnxruntime"
DESCRIPTION = "ORT format (.ort) for onnxruntime mobile, validated in onnxruntime"


def save_ort(model, path: Path) -> str:
    """Save `model` as an ORT file at `path`; returns its layout ("canonical", or why not).

    onnxruntime places part of the file in a per-process order; the canonical layout makes reruns
    byte-identical (emitters/ort_canonical.py).
    """
    import onnxruntime as ort

    from modelport.emitters.ort_canonical import LayoutError, canonical_ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(path)
    so.add_session_config_entry("session.save_model_format", "ORT")
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise BadInputError(f"onnxruntime cannot save the model in ORT format: {str(e).splitlines()[0]}") from None
    try:
        data = canonical_ort(path.read_bytes())
    except LayoutError as e:
        return f"as written by onnxruntime ({e})"
    path.write_bytes(data)
    return "canonical"


def required_operators(model) -> str:
    """The reduced-build config line set: 'domain;opset;Op1,Op2'."""
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    ops: dict[str, set[str]] = {}
    for n in model.graph.node:
        ops.setdefault(n.domain or "ai.onnx", set()).add(n.op_type)
    lines = [f"{d};{opsets.get(d, 1)};{','.join(sorted(o))}" for d, o in sorted(ops.items())]
    return "\n".join(lines) + "\n"


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    from modelport.emitters import preflight
    from modelport.emitters.precision_ir import at_precision

    ir, pre = preflight.check_ort(model)
    pre.raise_if_unsupported()
    fp32_reference = ir.reference
    ir = at_precision(ir, options.precision, calibration=options.calibration)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.ort"
    layout = save_ort(ir.model, path)
    config = out_dir / "required_operators.config"
    config.write_text(required_operators(ir.model))
    import onnxruntime

    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=[path, config], precision=options.precision,
        details={"format": "ort", "onnxruntime": onnxruntime.__version__, "optimization": "basic", "file_layout": layout,
                 "nodes": len(ir.model.graph.node), "preflight": pre.to_dict()},
        runner="onnxruntime", reference=ir.reference if ir.reference is not fp32_reference else None,
    )
