"""The Core ML target: `model.mlpackage`, an ML Program, through coremltools from a PyTorch module.

Routes: from a PyTorch source, the source module itself (`emitters/coreml_torch.py`, the native
route, tried first); from every source (ONNX, TensorFlow, TFLite, and PyTorch when the native
route fails), the IR through modelport's generated PyTorch code (`pytorch_code.module_from_ir`),
the ONNX route here. Either way the module is exported with `torch.export` (falling back to
`torch.jit.trace` where export fails, or where coremltools cannot convert the exported program)
and converted with `coremltools.convert(convert_to="mlprogram")`.

- precision: `fp16` (the default: Core ML's GPU and Neural Engine compute in fp16) converts with
  `compute_precision=FLOAT16`, `fp32` with FLOAT32. Inputs and outputs stay fp32 either way, so
  the contract holds; the precision is recorded in the package's metadata and is visible in its
  program (fp16 tensors between a cast at each input and output).
- shapes: a dim declared with bounds (`--dim batch=1..8`) is a flexible shape: `ct.RangeDim`
  within them, or, where every such dim of an input lists sizes (`--dim seq=128,256,512`),
  `ct.EnumeratedShapes` of those sizes (at most MAX_ENUMERATED shapes; beyond, a range from the
  smallest to the largest); the package's metadata keeps the contract's dim names. Every other
  dynamic dim is fixed (`fixed_dims.fixed_sizes`: a declared size, else a batch at 1 and any other
  dim at its sample size); the artifact's `dims`, `fixed_dims` and a warning say which.
- names: the contract's; where Core ML renames one (feature names are identifiers: `input.1`
  becomes `input_1`) the package's metadata maps them (`runtimes/coreml.py`) and the artifact's
  `io_names` lists them. int64 I/O is int32 (Core ML has no 64-bit integer I/O), in `io_dtypes`.
- validation: Core ML runs on macOS only. Elsewhere the artifact says so (`not_validated`): the
  package's spec is read back in a clean child and checked against the contract (names, dtypes,
  ranks, fixed dims), the report records `validated: false` with the reason, the terminal warns,
  and `--strict` fails the run (exit 4). On macOS it is run and compared like any other artifact.
  Before conversion the module is run in PyTorch on the sample inputs and must reproduce the
  source's outputs (the generated code, or the source module at fixed sizes): what is converted is
  known to be right, only Core ML's execution of it is unchecked.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.coreml_options import CoreMLOptions
from modelport.emitters.fixed_dims import dims_entry, export_dynamic_shapes, fixed_sizes, kept_bounds, reference_at
from modelport.emitters.pytorch_code import module_from_ir
from modelport.emitters.pytorch_code import preflight as code_preflight
from modelport.errors import UnsupportedError, one_line
from modelport.ir import IRModel
from modelport.run.quiet_call import captured_output
from modelport.runtimes.coreml import (
    META_CONTRACT,
    META_DIMS,
    META_DTYPES,
    META_NAMES,
    META_PRECISION,
    cannot_run_reason,
    make_reproducible,
    require_coremltools,
)

NAME = "coreml"
RUNTIME = "coreml"
CONVERTER = "modelport PyTorch code → coremltools"
DESCRIPTION = "Core ML ML Program (.mlpackage, fp16 or fp32 compute) via coremltools; runs on macOS only, spec-checked elsewhere"
FILE = "model.mlpackage"
ALLOWED_TOLERANCE = 0.02  # the converted module vs the source in PyTorch: the generated code's own parity class
MAX_ENUMERATED = 128  # the most enumerated shapes an input takes (Core ML's limit)




def preflight(ir: IRModel, options: EmitOptions | None = None):
    """The ONNX route writes PyTorch code first: the ops the code generator cannot write."""

    pre = code_preflight(ir, options)
    pre.target, pre.runtime = NAME, "PyTorch code generator (for Core ML)"
    if pre.unsupported:
        nodes = ", ".join(f"{u['node']} ({u['op']})" for u in pre.unsupported[:5]) + (" …" if len(pre.unsupported) > 5 else "")
        pre.reason = f"cannot write the PyTorch code Core ML is converted from: unsupported ops: {pre.op_counts()}: {nodes}"
    return pre


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    """The ONNX route: the IR's generated PyTorch module converted to Core ML."""

    require_coremltools("the Core ML target")
    with tempfile.TemporaryDirectory(prefix="modelport-coreml-") as tmp:
        module = module_from_ir(model, Path(tmp))
        return convert_module(module, model, out_dir, options, route="onnx → generated PyTorch code")


class _Flat:
    """`module(*args)` with its outputs flattened to a tuple of tensors (dicts, ModelOutputs, nesting)."""

    @staticmethod
    def wrap(module):
        import torch

        class Flat(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                out = self.inner(*args)
                if isinstance(out, torch.Tensor):
                    return (out,)
                if hasattr(out, "to_tuple"):  # a transformers ModelOutput
                    out = out.to_tuple()
                return tuple(torch.utils._pytree.tree_leaves(out))

        return Flat(module).eval()


def _shape(ct, spec, sample_shape, kept: dict):
    """An input's shape for coremltools: its sample shape, each dim kept with bounds flexible
    (module docstring: enumerated shapes where every kept dim lists sizes, else RangeDims)."""
    import itertools

    axes = {i: kept[d] for i, d in enumerate(spec.shape) if isinstance(d, str) and d in kept}
    sample = tuple(int(n) for n in sample_shape)
    if not axes:
        return sample
    if all(b.kind == "sizes" for b in axes.values()) and math.prod(len(b.sizes) for b in axes.values()) <= MAX_ENUMERATED:
        shapes = []
        for combo in itertools.product(*(b.sizes for b in axes.values())):
            shape = list(sample)
            for axis, n in zip(axes, combo, strict=True):
                shape[axis] = n
            shapes.append(tuple(shape))
        return ct.EnumeratedShapes(shapes=shapes, default=sample)
    return ct.Shape(shape=tuple(ct.RangeDim(lower_bound=axes[i].low, upper_bound=axes[i].high, default=n) if i in axes else n
                                for i, n in enumerate(sample)))


def _coreml_dtype(dtype: str, name: str):
    if dtype in ("float32", "float16", "float64"):
        return np.float32  # I/O stays fp32 (float64 computes in fp32 in Core ML anyway)
    if dtype in ("int64", "int32", "int16", "int8", "uint8"):
        return np.int32
    if dtype == "bool":
        return np.bool_
    raise UnsupportedError(f"Core ML has no {dtype} input or output ('{name}')")


def _check_module(flat, reference, model: IRModel, args) -> None:
    """The module to convert reproduces the reference in PyTorch: same output count, shapes, values."""
    import torch

    from modelport.validation import compare, tolerance_for

    with torch.no_grad():
        outs = flat(*args)
    if len(outs) != len(model.outputs):
        raise UnsupportedError(f"the module gives {len(outs)} outputs; the contract has {len(model.outputs)} "
                               f"({', '.join(o.name for o in model.outputs)})")
    got = {o.name: t.detach().cpu().numpy() for o, t in zip(model.outputs, outs, strict=True)}
    tol = tolerance_for("fp32", user={"atol": ALLOWED_TOLERANCE})
    result = compare(reference.outputs, got, tol, hop="module converted to Core ML (PyTorch)")
    if not result.ok:
        raise UnsupportedError(f"the module converted to Core ML does not reproduce the source in PyTorch: {result.summary()}")


def convert_module(module, model: IRModel, out_dir: Path, options: EmitOptions, *, route: str) -> Artifact:
    """`module` (taking the contract's inputs in order) as `out_dir/model.mlpackage`, at the fixed sizes."""
    import torch


    ct = require_coremltools("the Core ML target")
    opts = options.target or CoreMLOptions()
    precision = options.precision  # the target's default, fp16, unless --precision says (modelport.resolve.precisions)
    if model.reference is None:
        raise UnsupportedError("Core ML conversion needs sample inputs to trace the model on")
    try:
        module.eval()
    except Exception:
        pass  # an ExportedProgram's module is in inference mode already and refuses train()/eval()
    kept = kept_bounds(model)
    sizes = fixed_sizes(model, keep=kept)
    reference = reference_at(model, module, sizes, converter="coremltools")
    flat = _Flat.wrap(module)
    args = tuple(torch.from_numpy(np.ascontiguousarray(reference.inputs[s.name])) for s in model.inputs)
    _check_module(flat, reference, model, args)
    inputs = [ct.TensorType(name=s.name, shape=_shape(ct, s, reference.inputs[s.name].shape, kept),
                            dtype=_coreml_dtype(s.dtype, s.name)) for s in model.inputs]
    dynamic = export_dynamic_shapes(model, kept, flat)
    outputs = [ct.TensorType(name=s.name, dtype=_coreml_dtype(s.dtype, s.name)) for s in model.outputs]
    compute = ct.precision.FLOAT16 if precision == "fp16" else ct.precision.FLOAT32
    target = getattr(ct.target, opts.deployment_target)
    out_dir.mkdir(parents=True, exist_ok=True)
    attempts: list[dict] = []
    mlmodel, how = None, None
    with tempfile.TemporaryDirectory(prefix="modelport-coreml-") as tmp, captured_output(Path(tmp) / "convert.log", "coremltools"):
        for how in ("torch.export", "torch.jit.trace"):
            try:
                if how == "torch.export":
                    source = torch.export.export(flat, args, strict=False,
                                                 dynamic_shapes=dynamic).run_decompositions({})
                else:
                    with torch.no_grad():
                        source = torch.jit.trace(flat, args, check_trace=False)
                mlmodel = ct.convert(source, convert_to="mlprogram", inputs=inputs, outputs=outputs, compute_precision=compute,
                                     minimum_deployment_target=target, skip_model_load=True)
                attempts.append({"route": how, "ok": True})
                break
            except Exception as e:
                attempts.append({"route": how, "ok": False, "reason": one_line(e, 300, typed=True)})
    if mlmodel is None:
        raise UnsupportedError("coremltools could not convert the model: "
                               + "; ".join(f"{a['route']}: {a['reason']}" for a in attempts))
    spec = mlmodel.get_spec()
    d = spec.description
    renamed = {s.name: f.name for s, f in zip(model.inputs, d.input, strict=True) if s.name != f.name}
    renamed.update({s.name: f.name for s, f in zip(model.outputs, d.output, strict=True) if s.name != f.name})
    narrowed = {s.name: "int32" for s in model.inputs + model.outputs if s.dtype in ("int64", "int16", "int8", "uint8")}
    meta = mlmodel.user_defined_metadata
    if "com.github.apple.coremltools.conversion_date" in meta:  # a rerun writes the same bytes
        del meta["com.github.apple.coremltools.conversion_date"]
    meta[META_PRECISION] = precision
    meta[META_NAMES] = json.dumps(renamed)
    meta[META_DTYPES] = json.dumps(narrowed)
    if kept:
        meta[META_DIMS] = json.dumps({s.name: {str(i): d for i, d in enumerate(s.shape) if isinstance(d, str) and d in kept}
                                      for s in model.inputs if any(isinstance(d, str) and d in kept for d in s.shape)})
    meta[META_CONTRACT] = json.dumps({"inputs": [s.name for s in model.inputs], "outputs": [s.name for s in model.outputs]})
    mlmodel.short_description = f"converted by modelport from {model.provenance.get('path') or model.provenance.get('framework') or 'a model'}"
    path = out_dir / FILE
    mlmodel.save(str(path))
    make_reproducible(path)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    fixed = {s.name: {dim: int(n) for dim, n in zip(s.shape, reference.inputs[s.name].shape, strict=False)
                      if isinstance(dim, str) and dim not in kept}
             for s in model.inputs if any(isinstance(dim, str) and dim not in kept for dim in s.shape)}
    fixed.update({s.name: {dim: int(n) for dim, n in zip(s.shape, reference.outputs[s.name].shape, strict=False)
                           if isinstance(dim, str) and dim not in kept}
                  for s in model.outputs if any(isinstance(dim, str) and dim not in kept for dim in s.shape)})
    reason = cannot_run_reason()
    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=files, precision=precision,
        details={"format": "mlpackage", "model_type": "mlProgram", "spec_version": int(spec.specificationVersion),
                 "coremltools": ct.__version__, "deployment_target": opts.deployment_target,
                 "compute_precision": precision, "io_dtype": "float32 (as the contract)" if not narrowed else "float32; int64 as int32",
                 "converter": f"{route} → {how} → coremltools {ct.__version__}", "export_attempts": attempts,
                 "fixed_dims": fixed, "dims": dims_entry(model, sizes, kept), "io_names": renamed, "io_dtypes": narrowed},
        runner=RUNTIME, not_validated=reason,
        reference=None if reference is model.reference else reference,
    )
