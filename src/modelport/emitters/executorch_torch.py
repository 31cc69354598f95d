"""The native ExecuTorch route for PyTorch sources: the source module itself through `torch.export`
→ ExecuTorch (`emitters/executorch.py:lower`), no ONNX in between (`emitters/routes.py`).

The module is loaded again as the parser loaded it (`parsers.pytorch.load_module`, from a copy of
the file: a `.pt2`'s program, a state dict on its `--arch`, a trusted TorchScript or pickle, an
`nn.Module` object). Under `--route auto` it is tried first; when it fails, the ONNX route (the
IR's generated PyTorch code) is tried next.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.executorch import lower, require_executorch, target_options
from modelport.emitters.routes import staged_source
from modelport.ir import IRModel
from modelport.parsers.pytorch import load_module

NAME = "torch.export → ExecuTorch"
AUTO = "first"
PRECISIONS = ("fp32", "int8")
SOURCE_ONLY = False


def refusal(ir: IRModel, options: EmitOptions) -> str | None:

    target_options(options)  # int8 on portable is exit 2 here, before any work
    if ir.reference is None:
        return "no sample inputs to export on"
    return None


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:

    require_executorch()
    with tempfile.TemporaryDirectory(prefix="modelport-executorch-") as tmp:
        source, spec = staged_source(model, Path(tmp))
        module, _, _ = load_module(source, spec)
        try:
            module.eval()
        except Exception:
            pass  # an ExportedProgram's module is in inference mode already and refuses train()/eval()
        return lower(model, module, out_dir, options, NAME)
