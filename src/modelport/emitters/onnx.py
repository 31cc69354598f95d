"""The ONNX target: the IR's model written as `model.onnx` (+ `model.onnx.data` when large), at the
precision the optimisation stage brought it to (modelport.resolve.precisions: FP16 / INT8 through the
project's precision passes, a decoder's weight-only quantiser).

A decoder LM's model (`--task text-generation`) keeps its weights in `model.onnx.data` from
DECODER_EXTERNAL_BYTES on, as onnxruntime-genai's model builder writes them: onnxruntime then
reads each weight from that file, where a single file is held whole while the session is built
(a 474 MB fp32 model: session peak 1.07 GB single, 0.78 GB with external data). An IR whose
weights wait in a data file (`IRModel.stored`) is copied from it tensor by tensor.
"""

from __future__ import annotations

from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.preflight import Preflight, opset_of
from modelport.ir import IRModel
from modelport.onnxfile.contract_stamp import stamped_contract
from modelport.onnxfile.external_data_files import attach_external
from modelport.onnxfile.onnx_io import save_onnx
from modelport.onnxfile.tensor_sizes import tensor_bytes

NAME = "onnx"
RUNTIME = "onnxruntime"
DESCRIPTION = "ONNX model file, validated in onnxruntime"
DECODER_EXTERNAL_BYTES = 256 << 20


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    with stamped_contract(model):
        files = write_model(model, path)
    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=files, precision=options.precision,
        details={"nodes": len(model.model.graph.node), "opset": model.provenance.get("opset")},
        runner="onnxruntime",
    )


def write_model(ir: IRModel, path: Path) -> list[Path]:
    """The IR's model at `path`; returns the files written. A decoder's weights go to a data file
    from DECODER_EXTERNAL_BYTES on (else onnx_io decides); weights that wait in a data file
    (`ir.stored`) are copied from it one tensor at a time into the new one, or read into a copy of
    the graph otherwise."""
    import onnx


    model, stored = ir.model, ir.stored
    external = tensor_bytes(model) >= DECODER_EXTERNAL_BYTES if ir.provenance.get("decoder") else None
    if stored is not None and not external:  # the weights go inside the model file, or onnx_io decides
        held = onnx.ModelProto()
        held.CopyFrom(model)
        attach_external(held, stored)
        model, stored = held, None
    return save_onnx(model, path, external=external, base_dir=stored)


def preflight(ir: IRModel, options: EmitOptions | None = None) -> Preflight:
    """Nothing to refuse: the IR is ONNX, and onnxruntime has already run it on the references."""
    return Preflight(NAME, RUNTIME, None, opset_of(ir.model), None, nodes=len(ir.model.graph.node))
