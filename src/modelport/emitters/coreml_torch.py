"""The native Core ML route for PyTorch sources: the source module itself through `torch.export`
(or `torch.jit.trace`) and coremltools, without the ONNX IR and the generated code in between
(`emitters/routes.py`; the conversion is `emitters/coreml.py:convert_module`).

The module is loaded again as the parser loaded it (`parsers.pytorch.load_module`, from a copy of
the file: a `.pt2`'s program, a state dict on its `--arch`, a trusted TorchScript or pickle, an
`nn.Module` object). Tried first under `--route auto`; where it fails, the ONNX route (the IR's
generated PyTorch code) follows. A TorchScript source, which `torch.export` cannot take, is traced.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.coreml import convert_module
from modelport.emitters.routes import staged_source
from modelport.errors import BadInputError
from modelport.ir import IRModel
from modelport.parsers.pytorch import load_module
from modelport.runtimes.coreml import require_coremltools

NAME = "torch.export → coremltools"
AUTO = "first"  # the source module converts with its own ops; the generated code is the fallback
PRECISIONS = ("fp16", "fp32")
SOURCE_ONLY = False


def refusal(ir: IRModel, options: EmitOptions) -> str | None:
    if ir.reference is None:
        return "no sample inputs to convert on"
    return None


def emit(ir: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:

    reason = refusal(ir, options)
    if reason:
        raise BadInputError(f"{NAME} cannot convert to coreml: {reason}")
    require_coremltools("the Core ML target")
    with tempfile.TemporaryDirectory(prefix="modelport-coreml-src-") as tmp:
        source, spec = staged_source(ir, Path(tmp))
        module, _, _ = load_module(source, spec)
        return convert_module(module, ir, out_dir, options, route="the PyTorch source")
