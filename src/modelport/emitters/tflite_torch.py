"""The native TFLite route for PyTorch sources: litert-torch (Google's `torch.export` → LiteRT
converter), no ONNX in between (`emitters/routes.py`).

The module is loaded again as the parser loaded it (`parsers.pytorch.load_module`, from a copy of
the file: a `.pt2`'s program, a state dict on its `--arch`, a trusted TorchScript or pickle, an
`nn.Module` object) and converted on the reference's sample inputs. 64-bit inputs and outputs
(token ids) stay 64-bit (`enable_x64`), so the file takes what the contract says. The file is given
the contract's names (`tflite._name_io`: signature `serving_default`, I/O tensors by name).

litert-torch 0.10 converts with static shapes, so each dynamic dim is fixed (`emitters/fixed_dims.py`): at
the size the user declared (`--dim`, `--data`, a zoo entry's or a `.pt2`'s own sample size), else a
batch (a dynamic leading dim) at 1, what a caller of a one-sample file feeds, and any other dim at
its sample size. A dim declared with listed sizes (`--dim seq=128,256,512`) is kept as one
signature per size in the one file (`emitters/tflite_sizes.py`); a range (`--dim batch=1..8`) is
refused (exit 2 naming the dims; litert-torch's dynamic shapes fail on common ops, a Linear over a
3-D input among them), and the ONNX route keeps such dims dynamic where onnx2tf can. The file is converted on the reference's inputs cut to those sizes and validated
against the source run on them (`reference_at`); the artifact's `fixed_dims`, the report's
`contract_check` and a warning say which dims were fixed and at what size. It is an optional dependency, checked only when this route is
taken (exit 5 naming the install when it is missing). What the route refuses before running: a
precision other than fp32 and `--tflite-layout nhwc` (the ONNX route serves both).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.fixed_dims import dims_entry, fixed_sizes, reference_at
from modelport.emitters.norm_fallback import screened
from modelport.emitters.routes import staged_source
from modelport.emitters.tf_model import Port
from modelport.emitters.tflite import SIGNATURE, TFLiteOptions, _check_ops, _name_io
from modelport.emitters.tflite_sizes import convert_sizes, signature_key, signature_sizes, sized_dims
from modelport.errors import BadInputError, MissingDependencyError, UnsupportedError, one_line
from modelport.ir import IRModel
from modelport.parsers.pytorch import load_module
from modelport.run.quiet_call import captured_output
from modelport.runtimes.tflite import load_interpreter

NAME = "litert-torch"
AUTO = "fallback"  # measured: the ONNX route keeps dynamic dims; this one fixes them, and serves transformers
PRECISIONS = ("fp32",)  # the ONNX route quantises
SOURCE_ONLY = False
INSTALL = "pip install --no-deps litert-torch==0.10.0 with the packages of the Makefile's LITERT_TORCH (make setup does)"


def refusal(ir: IRModel, options: EmitOptions) -> str | None:

    opts = options.target or TFLiteOptions()
    if opts.layout != "source":
        return f"--tflite-layout {opts.layout} (this route keeps the source's layouts)"
    if ir.reference is None:
        return "no sample inputs to convert on"
    return None


def require_litert():
    """litert_torch, or exit 5 naming how to install it."""
    import importlib


    try:
        return importlib.import_module("litert_torch")
    except ImportError as e:
        raise MissingDependencyError(f"litert-torch is needed for the PyTorch → TFLite native route ({e})",
                                     hint=f"{INSTALL}, or take the ONNX route with --route onnx") from None


def _output_keys(data: bytes, outputs: list[Port]) -> list[Port]:
    """The ports with litert-torch's signature keys for the outputs: `output_N` in flattening order,
    or a dict output's own keys (a `transformers` ModelOutput's `last_hidden_state`, …)."""
    import re

    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(data))
    keys = [m.name.decode() for m in model.signatureDefs[0].outputs] if model.signatureDefs else []
    names = [p.name for p in outputs]
    if sorted(keys) == sorted(names):
        return [replace(p, key=p.name) for p in outputs]
    if sorted(keys) == sorted(f"output_{j}" for j in range(len(outputs))):
        return outputs
    unnumbered = [k for k in keys if not re.fullmatch(r"output_\d+", k)]
    raise UnsupportedError(f"{NAME} named the outputs {keys}; the contract's are {names} (unnumbered: {unnumbered})")


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:

    reason = refusal(model, options)
    if reason:
        raise BadInputError(f"{NAME} cannot convert to tflite: {reason}")

    with tempfile.TemporaryDirectory(prefix="modelport-litert-") as tmp:
        source, spec = staged_source(model, Path(tmp))
        module, _, _ = load_module(source, spec)
        return convert_module(model, module, out_dir)


def convert_module(model: IRModel, module, out_dir: Path, *, order: list[str] | None = None,
                   outputs_order: list[str] | None = None, run_source=None, how: str = "torch.export → LiteRT") -> Artifact:
    """`module` (an `nn.Module` computing the IR) converted by litert-torch into `out_dir/model.tflite`
    behind the contract's names, at the fixed sizes of `fixed_sizes`. The module takes the inputs
    positionally in `order` (default: the contract's) and returns the outputs in `outputs_order`
    (default: the contract's); `run_source(feeds)` recomputes the reference at the fixed sizes
    (default: the module itself, the source). `how` goes into the report's converter. Converted
    again with shifted normalisation when LiteRT's kernels miss the reference on constant frames
    (`norm_fallback`; the file's reference stays the source's)."""

    def convert(m, folder: Path) -> Artifact:
        return _convert(model, m, folder, order=order, outputs_order=outputs_order, run_source=run_source, how=how)

    def rebuild(folder: Path):
        from modelport.emitters.norm_shift_torch import Shifted

        shifted = Shifted(module)
        artifact = convert(shifted, folder)
        return artifact, shifted.shifted()

    return screened(model, convert(module, out_dir), rebuild)


def _convert(model: IRModel, module, out_dir: Path, *, order: list[str] | None, outputs_order: list[str] | None,
             run_source, how: str) -> Artifact:
    from modelport.deps import version_of

    specs = {s.name: s for s in model.inputs + model.outputs}
    in_specs = [specs[n] for n in order] if order else list(model.inputs)
    out_specs = [specs[n] for n in outputs_order] if outputs_order else list(model.outputs)
    listed = sized_dims(model, NAME)
    sizes = fixed_sizes(model, keep=tuple(listed))
    wide = any(s.dtype in ("int64", "float64", "uint64") for s in model.inputs + model.outputs)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modelport-litert-") as tmp:
        work = Path(tmp)
        log = work / "convert.log"
        with captured_output(log, NAME):  # its import prints torchao and jax notices
            litert_torch = require_litert()
        try:
            module.eval()
        except Exception:
            pass  # an ExportedProgram's module is in inference mode already and refuses train()/eval()
        combos = signature_sizes(model, listed)  # [{}] when no dim is listed: one signature
        reference = reference_at(model, module, {**sizes, **combos[0]}, NAME, run_source)
        inputs = [Port(s.name, f"args_{i}", s.dtype, list(reference.inputs[s.name].shape),
                       layout=f"{s.layout} (as source)" if s.layout else "as source") for i, s in enumerate(in_specs)]
        outputs = [Port(s.name, f"output_{j}", s.dtype, list(reference.outputs[s.name].shape),
                        layout=f"{s.layout} (as source)" if s.layout else "as source") for j, s in enumerate(out_specs)]
        try:
            with captured_output(log, NAME):
                edge = convert_sizes(litert_torch, model, module, in_specs, reference, sizes, combos, wide)
                edge.export(str(work / "model.tflite"))
        except Exception as e:
            raise UnsupportedError(f"{NAME} could not convert the model: {conversion_failure(e)}") from None
        data = (work / "model.tflite").read_bytes()
    outputs = _output_keys(data, outputs)
    path = out_dir / "model.tflite"
    keys = [signature_key(at) for at in combos] if listed else None
    path.write_bytes(_name_io(data, inputs, outputs, keys))
    ops = _check_ops(load_interpreter(path), path)
    fixed = {s.name: {d: n for d, n in zip(s.shape, p.shape, strict=False) if isinstance(d, str) and d not in listed}
             for s, p in zip(in_specs + out_specs, inputs + outputs, strict=True)
             if any(isinstance(d, str) and d not in listed for d in s.shape)}
    return Artifact(
        target="tflite", runtime="tflite", path=path, files=[path], precision="fp32",
        details={"converter": f"litert-torch {version_of('litert-torch') or version_of('litert_torch')} ({how})",
                 "layout": "source", "inputs_layout": {p.name: p.layout for p in inputs},
                 "outputs_layout": {p.name: p.layout for p in outputs},
                 "signature": {"key": SIGNATURE, "inputs": [p.name for p in inputs], "outputs": [p.name for p in outputs]},
                 "fixed_dims": fixed, "dims": dims_entry(model, sizes, listed),
                 **({"signatures": [{"key": k, "dims": at} for k, at in zip(keys, combos, strict=True)]} if keys else {}),
                 "validation": f"signature '{SIGNATURE}' fed and read by the contract's names, as the file is, with no transpose"
                               + ("" if reference is model.reference else
                                  f"; on the reference's inputs cut to the fixed sizes {sizes}, against the source run on them"),
                 "quantization": "none", "io_dtype": "as the contract (64-bit kept)" if wide else "float32",
                 "tflite_ops": len(ops)},
        runner="tflite", runner_options={"signature": SIGNATURE},
        reference=None if reference is model.reference else reference,
    )


def conversion_failure(e: Exception) -> str:
    """litert-torch's error in one line, led by the ops it names when it names any: ops with no
    TFLite builtin (its "TF Select ops: …" / "Custom ops: …" lines), or an aten op it could not lower."""
    import re

    text = str(e).strip()
    first = one_line(text, 300)
    lines = re.findall(r"^\s*((?:TF Select|Flex|Custom) ops):\s*(.+)$", text, flags=re.MULTILINE)
    if lines:
        named = "; ".join(f"{kind}: {ops.strip()}" for kind, ops in lines)
        return f"no TFLite builtin for {named} (the LiteRT interpreter has no TF Select ops)"
    op = re.search(r"\b((?:aten|prims)\.[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)", text)
    if op and op.group(1) not in first:
        return f"{type(e).__name__} on {op.group(1)}: {first}"
    return f"{type(e).__name__}: {first}"
