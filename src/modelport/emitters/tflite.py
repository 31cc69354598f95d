"""The TFLite target: `model.tflite` from the IR through onnx2tf, validated in the LiteRT interpreter.

Why onnx2tf: it converts ONNX to TensorFlow op by op and removes the NCHW↔NHWC transposes
itself (onnx-tf, the older route, is archived and leaves a transpose around every conv). Its
TensorFlow model is wrapped here in one function that honours the I/O contract, and that function
is written to TFLite by TensorFlow's own converter, so the file's ops are TFLite builtins.

I/O contract: by default the `.tflite` takes every input and returns every output with the
contract's name, shape, dtype and layout. onnx2tf returns channels-first outputs channels-last;
the wrapper transposes them back inside the file, so a user who loads it reads the source's
numbers. The file carries a `serving_default` signature whose input and output keys are the
contract's names, and its input/output tensors carry those names too (in contract order).
`tflite_layout="nhwc"` is the one way to change a layout: channels-first inputs are taken
channels-last, and outputs onnx2tf computes channels-last are returned so (no transposes at the
edges, what most mobile pipelines want); the artifact records the layout of every tensor.

Where onnx2tf cannot convert the IR (a transformer exported from PyTorch, whose attention
reshapes are computed at run time), modelport's own ONNX lowering (`emitters/onnx_tf.py`) stands
in behind the same wrapper: it keeps the ONNX layout and every dynamic dim (-1 in the signature);
the artifact's `converter` names it and onnx2tf's reason.

Validation reads the file as a user would: through its signature, by the contract's names, with
no transpose. When `nhwc` was asked for, it is the reference (inputs and outputs) that is
transposed into the file's layout, and the artifact's `validation` entry says so.

Precision: fp32, fp16 (float16 weights), int8 as dynamic-range quantization, or, with
`calibration` data, integer quantization of weights and activations. Full-integer models keep
float32 inputs and outputs unless `tflite_io_dtype` is "int8" or "uint8": then the input and
output tensors are integers; validation feeds it through the runner, which quantises the float
reference inputs and dequantises the outputs with each tensor's scale and zero point, as a
client of such a file must.

Validation loads the `.tflite` in this process: the file was written by TensorFlow's converter a
moment ago, not handed in by a user. User-supplied `.tflite` files (as sources or in `validate`)
are only ever opened in a child process (`runtimes.isolated`).
"""

from __future__ import annotations

import importlib.util
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.norm_fallback import screened_ir
from modelport.emitters.onnx_tf import converter_name
from modelport.emitters.preflight import Preflight, node_name, opset_of
from modelport.emitters.tf_model import Port, build, input_layouts, save_contract_model
from modelport.emitters.tflite_options import TFLiteOptions
from modelport.errors import BadInputError, UnsupportedError, one_line
from modelport.ir import IRModel, Reference
from modelport.optimize.calibration import load_calibration as load_feeds
from modelport.run.quiet_call import captured_output
from modelport.runtimes.tflite import load_interpreter

NAME = "tflite"
RUNTIME = "tflite"
CONVERTER = "onnx2tf"  # the ONNX route's converter, as the report names it
DESCRIPTION = "TFLite flatbuffer via onnx2tf (fp32/fp16/int8), validated in the LiteRT interpreter"

SIGNATURE = "serving_default"




def load_calibration(path: str | Path, ir: IRModel) -> dict[str, np.ndarray]:
    """Calibration inputs stacked along axis 0 per input (an .npz keyed by input name, or images)."""

    feeds = load_feeds(path, ir)
    return {s.name: np.concatenate([f[s.name] for f in feeds], axis=0).astype(np.float32) for s in ir.inputs}


def _to_tflite(keras_model, inputs: list[Port], outputs: list[Port], mode: str, calib: dict[str, np.ndarray] | None,
               io_dtype: str, work: Path, log: Path, *, save=None, what: str = "onnx2tf's TensorFlow model") -> bytes:
    """TensorFlow's converter on the wrapped model, with the precision's settings.

    The wrapper is saved as a SavedModel with its one signature first (the converter would do the
    same, but on a failure silently write a file without a signature). `save(tf, dest)` writes it
    (default: onnx2tf's `keras_model` behind the contract, `tf_model.save_contract_model`).
    """

    with captured_output(log, "TFLite converter"):
        import tensorflow as tf

        try:
            if save is None:
                save_contract_model(tf, keras_model, inputs, outputs, work / "wrapped", SIGNATURE)
            else:
                save(tf, work / "wrapped")
        except Exception as e:
            raise UnsupportedError(f"{what} could not be wrapped for TFLite: "
                                   f"{one_line(e, 300, typed=True)}") from None
        conv = tf.lite.TFLiteConverter.from_saved_model(str(work / "wrapped"), signature_keys=[SIGNATURE])
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
        conv.unfold_batchmatmul = False
        if mode == "fp16":
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            conv.target_spec.supported_types = [tf.float16]
        elif mode == "int8":
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
        elif mode.startswith("int8-full"):
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.SELECT_TF_OPS]
            count = min(len(a) for a in calib.values())

            def samples():
                for i in range(count):
                    yield {p.key: calib[p.name][i:i + 1] for p in inputs}

            conv.representative_dataset = samples
            if mode == "int8-full-io":
                conv.inference_input_type = conv.inference_output_type = tf.as_dtype(io_dtype)
        try:
            return conv.convert()
        except Exception as e:
            raise UnsupportedError(f"TensorFlow's TFLite converter failed: "
                                   f"{one_line(e, 300, typed=True)}") from None


def quantization(mode: str, io_dtype: str) -> str:
    """The report's words for a converter mode (`fp32`, `fp16`, `int8`, `int8-full`, `int8-full-io`)."""
    return {"fp32": "none", "fp16": "float16 weights", "int8": "dynamic range (int8 weights, float activations)",
            "int8-full": "integer (int8 weights and activations, float I/O), calibrated",
            "int8-full-io": f"full integer (int8 weights and activations, {io_dtype} I/O), calibrated; validated by "
                            f"quantising float inputs and dequantising outputs with each tensor's scale and zero point"}[mode]


def _name_io(data: bytes, inputs: list[Port], outputs: list[Port], keys: list[str] | None = None) -> bytes:
    """The file with the contract's names: signature keys, I/O tensor names, and I/O in contract order.

    `keys`: the keys of a file with one signature (and subgraph) per size, in the file's order
    (`tflite_sizes`); the first signature's graph is also `serving_default`, its main graph."""
    import copy

    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(data))
    signatures = list(model.signatureDefs or [])
    want = keys or [SIGNATURE]
    if len(signatures) != len(want) or len(model.subgraphs) != len(want):
        raise UnsupportedError(f"the TFLite converter wrote {len(signatures)} signature(s) and "
                               f"{len(model.subgraphs)} subgraph(s); the emitter writes {len(want)} of each")
    for sig, key in zip(signatures, want, strict=True):
        graph = model.subgraphs[int(sig.subgraphIndex)]
        index = {}
        for maps, ports in ((sig.inputs, inputs), (sig.outputs, outputs)):
            by_key = {p.key: p for p in ports}
            for m in maps:
                port = by_key[m.name.decode()]
                m.name = port.name.encode()
                index[port.name] = int(m.tensorIndex)
            maps.sort(key=lambda m, order=[p.name for p in ports]: order.index(m.name.decode()))
        sig.signatureKey = key.encode()
        new_in, new_out = [index[p.name] for p in inputs], [index[p.name] for p in outputs]
        if sorted(new_in) != sorted(int(i) for i in graph.inputs) or sorted(new_out) != sorted(int(i) for i in graph.outputs):
            raise UnsupportedError("the TFLite file's signature does not cover its input and output tensors")
        graph.inputs, graph.outputs = new_in, new_out
        for port in outputs + inputs:  # an output that is an input passed through keeps the input's name
            graph.tensors[index[port.name]].name = port.name.encode()
    if keys:
        alias = copy.deepcopy(signatures[0])
        alias.signatureKey = SIGNATURE.encode()
        model.signatureDefs = [alias, *signatures]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _check_ops(interpreter, path: Path) -> list[str]:
    try:
        ops = [d["op_name"] for d in interpreter._get_ops_details()]
    except Exception:
        return []
    bad = sorted({o for o in ops if o.startswith("Flex") or o in ("CUSTOM", "DELEGATE")})
    if bad:
        raise UnsupportedError(f"the TFLite model needs ops outside the TFLite builtins: {bad}", path=path,
                               hint="these need the Flex (Select TF ops) delegate, which the LiteRT interpreter lacks")
    return ops


def _reference_in_layout(ir: IRModel, inputs: list[Port], outputs: list[Port]) -> Reference | None:
    """The IR's references transposed into the file's layout (nhwc), or None when no tensor changed."""
    if ir.reference is None or not any(p.change for p in inputs + outputs):
        return None
    ref = ir.reference

    def moved(arrays, ports):
        return {p.name: np.ascontiguousarray(np.transpose(arrays[p.name], p.change)) if p.change else arrays[p.name]
                for p in ports}

    return Reference(moved(ref.inputs, inputs), moved(ref.outputs, outputs), ref.producer,
                     extra=[replace(s, inputs=moved(s.inputs, inputs), outputs=moved(s.outputs, outputs),
                                    nudged=moved(s.nudged, outputs) if s.nudged else None) for s in ref.extra],
                     first_kind=ref.first_kind)


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    """The file onnx2tf and TensorFlow's converter write; converted again with shifted normalisation
    when LiteRT's kernels miss the reference on constant frames (`norm_fallback`)."""

    return screened_ir(model, lambda ir, folder: _emit(ir, folder, options), out_dir)


def _emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    from modelport.deps import version_of

    opts = options.target or TFLiteOptions()
    layout, io_dtype = opts.layout, opts.io_dtype
    precision = options.precision
    changes = input_layouts(model, layout)[2]
    ir, pre = check(model)
    pre.raise_if_unsupported()
    calib = load_calibration(options.calibration, ir) if options.calibration and precision == "int8" else None
    if io_dtype != "float32" and not calib:
        raise BadInputError(f"--tflite-io-dtype {io_dtype} needs a full-integer model",
                            hint="pass --precision int8 --calibration DATA")
    if calib:
        calib = {n: np.ascontiguousarray(np.transpose(a, changes[n])) if n in changes else a for n, a in calib.items()}
    mode = ("int8-full-io" if io_dtype != "float32" else "int8-full") if calib else precision
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modelport-tflite-") as tmp:
        work = Path(tmp)
        log = work / "convert.log"
        keras_model, inputs, outputs = build(ir, work, log, layout=layout)
        data = _to_tflite(keras_model, inputs, outputs, mode, calib, io_dtype, work, log)
    path = out_dir / "model.tflite"
    path.write_bytes(_name_io(data, inputs, outputs))
    ops = _check_ops(load_interpreter(path), path)
    reference = _reference_in_layout(model, inputs, outputs)
    moved = [p.name for p in inputs + outputs if p.change]
    quant = quantization(mode, io_dtype)
    validation = (f"signature '{SIGNATURE}' fed and read by the contract's names, as the file is"
                  + (f"; the reference was transposed into the file's layout for {', '.join(moved)}" if moved else
                     ", with no transpose"))
    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=[path], precision=precision,
        details={"converter": f"{converter_name(keras_model)} + TensorFlow {version_of('tensorflow')} TFLite converter",
                 "layout": layout, "inputs_layout": {p.name: p.layout for p in inputs},
                 "outputs_layout": {p.name: p.layout for p in outputs},
                 "layout_changes": {p.name: p.change for p in inputs + outputs if p.change},
                 "signature": {"key": SIGNATURE, "inputs": [p.name for p in inputs], "outputs": [p.name for p in outputs]},
                 "validation": validation, "quantization": quant, "io_dtype": io_dtype, "tflite_ops": len(ops),
                 "preflight": pre.to_dict()},
        runner="tflite", runner_options={"signature": SIGNATURE}, reference=reference,
    )


# --- preflight: onnx2tf's op converters ------------------------------------------------------

def onnx2tf_ops() -> set[str]:
    """The ONNX ops onnx2tf has a converter for, read from its package without importing it."""
    spec = importlib.util.find_spec("onnx2tf")
    if spec is None or not spec.submodule_search_locations:

        require("onnx2tf", purpose="converting to TFLite")
    folder = Path(list(spec.submodule_search_locations)[0]) / "ops"
    return {p.stem for p in folder.glob("*.py") if p.stem[:1].isupper()}


def check(ir: IRModel) -> tuple[IRModel, Preflight]:
    """Every node onnx2tf has no converter for (custom domains included); the IR as it is."""
    from modelport.deps import version_of

    known = onnx2tf_ops()
    pre = Preflight("tflite", "onnx2tf", version_of("onnx2tf"), opset_of(ir.model), None)
    pre.nodes = len(ir.model.graph.node)
    for i, node in enumerate(ir.model.graph.node):
        if node.domain not in ("", "ai.onnx"):
            pre.unsupported.append({"node": node_name(node, i), "op": f"{node.domain}::{node.op_type}",
                                    "reason": "custom-domain op: no TFLite builtin for it"})
        elif node.op_type not in known:
            pre.unsupported.append({"node": node_name(node, i), "op": node.op_type,
                                    "reason": f"onnx2tf has no converter for {node.op_type}"})
    for spec in ir.inputs:
        if spec.dtype in ("float64", "bfloat16") or spec.dtype.startswith("uint") and spec.dtype != "uint8":
            pre.warnings.append({"node": spec.name, "op": "input", "reason": f"input dtype {spec.dtype} is cast by TFLite"})
    return ir, pre


def preflight(ir: IRModel, options: EmitOptions | None = None) -> Preflight:
    return check(ir)[1]
