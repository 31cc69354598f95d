"""The ONNX target: the IR's model written as `model.onnx` (+ `model.onnx.data` when large), at the
precision asked for (FP16 / INT8 through the project's precision passes, unless an optimisation
stage already brought the IR there)."""

from __future__ import annotations

from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.preflight import Preflight, opset_of
from modelport.ir import IRModel

NAME = "onnx"
RUNTIME = "onnxruntime"
DESCRIPTION = "ONNX model file, validated in onnxruntime"


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    from modelport.emitters.precision_ir import at_precision
    from modelport.onnx_io import save_onnx, stamped_contract

    ir = at_precision(model, options.precision, calibration=options.calibration)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    with stamped_contract(ir):
        files = save_onnx(ir.model, path)
    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=files, precision=options.precision,
        details={"nodes": len(ir.model.graph.node), "opset": ir.provenance.get("opset")},
        runner="onnxruntime", reference=ir.reference if ir.reference is not model.reference else None,
    )


def preflight(ir: IRModel, options: EmitOptions | None = None) -> Preflight:
    """Nothing to refuse: the IR is ONNX, and onnxruntime has already run it on the references."""
    return Preflight(NAME, RUNTIME, None, opset_of(ir.model), None, nodes=len(ir.model.graph.node))
