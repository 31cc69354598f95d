"""The second TFLite route for ONNX-side sources (ONNX, GraphDef, Hugging Face folders): the IR
written as modelport's PyTorch code (`emitters/pytorch_code`, the `--to pytorch` target) and that
module converted by litert-torch (`tflite_torch.convert_module`), no onnx2tf in between.

Under `--route auto` it is tried when the ONNX route (onnx2tf) fails to convert or to validate
(`AUTO = "fallback"`), and `--route native` takes it alone (`emitters/routes.py`). The file has the
contract's names (signature `serving_default`), keeps 64-bit I/O, and fixes each dynamic dim as
litert-torch's static shapes need (`fixed_dims.fixed_sizes`: a batch at 1, declared sizes
kept); when a dim was cut, the reference is recomputed by ONNX Runtime on the IR's graph at those
sizes, so the file is judged against the source graph, never against the generated code.

What it refuses before running: what the litert-torch route refuses (a precision other than
fp32, `--tflite-layout nhwc`; the ONNX route serves both) and a graph with an op the code
generator has no converter for, named with its count. An op litert-torch cannot lower is named in
the exit-2 reason.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions, pytorch_code, tflite_torch
from modelport.emitters.pytorch_code import module_from_ir
from modelport.emitters.tflite_torch import convert_module
from modelport.errors import BadInputError
from modelport.ir import IRModel
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

NAME = "PyTorch code + litert-torch"
AUTO = "fallback"  # onnx2tf first: it keeps dynamic dims and quantises; this route fixes them
PRECISIONS = ("fp32",)  # the ONNX route quantises
SOURCE_ONLY = False


def refusal(ir: IRModel, options: EmitOptions) -> str | None:

    reason = tflite_torch.refusal(ir, options)
    if reason:
        return reason
    if ir.model is None:
        return "no ONNX graph to write as PyTorch code"
    pre = pytorch_code.preflight(ir)
    if pre.unsupported:
        return f"the PyTorch code generator has no converter for {pre.op_counts()}"
    return None


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:

    reason = refusal(model, options)
    if reason:
        raise BadInputError(f"{NAME} cannot convert to tflite: {reason}")
    graph = model.model.graph
    inits = {t.name for t in graph.initializer}
    order = [i.name for i in graph.input if i.name not in inits]  # the generated forward's arguments
    outputs = [o.name for o in graph.output]
    session = []

    def run_source(feeds):  # the IR's graph in ONNX Runtime, opened when a dim was cut
        if not session:
            session.append(OnnxRuntimeRunner(model.model))
        return session[0].run(feeds)

    with tempfile.TemporaryDirectory(prefix="modelport-code-") as tmp:
        module = module_from_ir(model, Path(tmp))
        artifact = convert_module(model, module, out_dir, order=order, outputs_order=outputs, run_source=run_source,
                                  how="ONNX IR → modelport PyTorch code → torch.export → LiteRT")
    artifact.details["route_steps"] = ["ONNX IR", "modelport PyTorch code (pytorch/model.py)", "litert-torch", "LiteRT"]
    return artifact
