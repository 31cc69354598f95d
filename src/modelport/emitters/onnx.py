"""The ONNX target: the IR's model written as `model.onnx` (+ `model.onnx.data` when large)."""

from __future__ import annotations

from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.ir import IRModel

NAME = "onnx"
RUNTIME = "onnxruntime"
DESCRIPTION = "ONNX model file, validated in onnxruntime"


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    from modelport.onnx_io import save_onnx, stamped_contract

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    with stamped_contract(model):
        files = save_onnx(model.model, path)
    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=files, precision=options.precision,
        details={"nodes": len(model.model.graph.node), "opset": model.provenance.get("opset")},
        runner="onnxruntime",
    )
