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

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelport.emitters import Artifact, EmitOptions
from modelport.errors import BadInputError, ModelportError, UnsupportedError
from modelport.ir import IRModel, Reference

NAME = "tflite"
RUNTIME = "tflite"
DESCRIPTION = "TFLite flatbuffer via onnx2tf (fp32/fp16/int8), validated in the LiteRT interpreter"

CHANNELS_LAST = ("NHWC", "NWC", "NDHWC")
LAYOUTS = ("source", "nhwc")
IO_DTYPES = ("float32", "int8", "uint8")
SIGNATURE = "serving_default"
_LAST_NAMES = {3: "NWC", 4: "NHWC", 5: "NDHWC"}


@dataclass(frozen=True)
class TFLiteOptions:
    """The TFLite emitter's own options, validated here and nowhere else (`--tflite-layout`, `--tflite-io-dtype`)."""

    layout: str = "source"  # source: the contract's layouts; nhwc: channels-last inputs and outputs
    io_dtype: str = "float32"  # I/O type of a full-integer model (--precision int8 --calibration)

    def __post_init__(self):
        layout, io_dtype = str(self.layout).strip().lower(), str(self.io_dtype).strip().lower()
        if layout not in LAYOUTS:
            raise BadInputError(f"--tflite-layout '{self.layout}': choose {' or '.join(LAYOUTS)}")
        if io_dtype not in IO_DTYPES:
            raise BadInputError(f"--tflite-io-dtype '{self.io_dtype}': choose {', '.join(IO_DTYPES[:-1])} or {IO_DTYPES[-1]}")
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "io_dtype", io_dtype)


OPTIONS = TFLiteOptions


def _to_last(rank: int) -> list[int]:
    return [0, *range(2, rank), 1]


def _to_first(rank: int) -> list[int]:
    return [0, rank - 1, *range(1, rank - 1)]


@dataclass
class _Port:
    """One input or output of the file: the contract's name, and where its layout differs."""

    name: str
    key: str  # the name inside the TensorFlow function (a valid TF name); renamed in the file
    dtype: str
    shape: list  # the file's shape (None for a dynamic dim)
    inner: list[int] | None = None  # an output's transpose from onnx2tf's layout to the file's, inside the file
    change: list[int] | None = None  # permutation from the contract's layout to the file's (nhwc only)
    layout: str = ""


def input_layouts(ir: IRModel, layout: str) -> tuple[list[str], list[str], dict[str, list[int]], dict[str, str]]:
    """(keep-channels-first names, keep-channels-last names, layout changes, layout per input); `layout` is
    a TFLiteOptions.layout."""
    keep_first, keep_last, transpose, described = [], [], {}, {}
    for spec in ir.inputs:
        rank = len(spec.shape)
        if rank < 3:
            described[spec.name] = spec.layout or f"rank {rank} (no channel axis)"
            continue
        src = spec.layout or ("channels-first" if rank in (3, 4, 5) else None)
        channels_last = src in CHANNELS_LAST
        if channels_last:
            keep_last.append(spec.name)
            described[spec.name] = f"{src} (as source)"
        elif layout == "source":
            keep_first.append(spec.name)
            described[spec.name] = f"{spec.layout or 'channels-first'} (as source)"
        else:
            transpose[spec.name] = _to_last(rank)
            described[spec.name] = f"{_LAST_NAMES[rank]} (transposed from the source's channels-first)"
    return keep_first, keep_last, transpose, described


def load_calibration(path: str | Path, ir: IRModel) -> dict[str, np.ndarray]:
    """Calibration inputs stacked along axis 0 per input (an .npz keyed by input name, or images)."""
    from modelport.optimize.calibration import load_calibration as load_feeds

    feeds = load_feeds(path, ir)
    return {s.name: np.concatenate([f[s.name] for f in feeds], axis=0).astype(np.float32) for s in ir.inputs}


def _convert(ir: IRModel, work: Path, keep_first, keep_last, log: Path):
    """onnx2tf's TensorFlow (tf_keras) model of the IR; nothing is saved, the TFLite file is written here."""
    from modelport.deps import require
    from modelport.quiet_call import captured_output, log_tail

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with captured_output(log, "onnx2tf"):
        onnx2tf = require("onnx2tf", purpose="converting to TFLite")
        _fresh_keras_names()
        kwargs = dict(
            onnx_graph=ir.clone().model, output_folder_path=str(work / "tf"), non_verbose=True, verbosity="error",
            keep_ncw_or_nchw_or_ncdhw_input_names=keep_first or None,
            keep_nwc_or_nhwc_or_ndhwc_input_names=keep_last or None, disable_model_save=True,
        )
        try:
            return onnx2tf.convert(**kwargs)
        except SystemExit as e:  # onnx2tf exits on conversion errors
            raise UnsupportedError(f"onnx2tf could not convert the model (exit {e.code}): {log_tail(log)}") from None
        except ModelportError:
            raise
        except Exception as e:
            raise UnsupportedError(f"onnx2tf could not convert the model: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} {log_tail(log, 2)}") from None


def _fresh_keras_names() -> None:
    """Restart tf_keras's layer-name counters, which onnx2tf's names (and so the .tflite bytes)
    carry: without this a second conversion in one process writes `model_35/tf.nn.relu_7`
    where the first wrote `model_17/tf.nn.relu`, and reruns are not byte-identical."""
    import tf_keras

    tf_keras.backend.clear_session()


def _fits(a, b) -> bool:
    """Same rank, and the same size wherever both shapes name one (None: dynamic)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def _probe(ir: IRModel) -> Reference:
    """Inputs and outputs to place onnx2tf's outputs by: the IR's references, else onnxruntime's."""
    if ir.reference is not None:
        return ir.reference
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
    from modelport.samples import make_inputs

    feeds = make_inputs(ir.inputs)
    return Reference(feeds, OnnxRuntimeRunner(ir.model).run(feeds))


def _plan(ir: IRModel, keras_model, changes: dict[str, list[int]], described: dict[str, str], nhwc: bool,
          log: Path) -> tuple[list[_Port], list[_Port]]:
    """The file's inputs and outputs, and the transposes that put onnx2tf's model behind them.

    Inputs: onnx2tf keeps each one as asked (`keep_*_input_names`); a shape that disagrees is an
    error. An output's layout in onnx2tf's model is read off its shape against the reference (as
    the source computes it, or channels-last); where both fit (square dims) the numbers decide.
    """
    from modelport.quiet_call import captured_output

    inputs = []
    if len(keras_model.inputs) != len(ir.inputs) or len(keras_model.outputs) != len(ir.outputs):
        raise UnsupportedError(f"onnx2tf's model has {len(keras_model.inputs)} inputs and {len(keras_model.outputs)} outputs; "
                               f"the contract has {len(ir.inputs)} and {len(ir.outputs)}")
    for i, (spec, kin) in enumerate(zip(ir.inputs, keras_model.inputs, strict=True)):
        change = changes.get(spec.name)
        shape = [d if isinstance(d, int) else None for d in spec.shape]
        if change:
            shape = [shape[k] for k in change]
        if not _fits(list(kin.shape), shape):
            raise UnsupportedError(f"onnx2tf gave input '{spec.name}' the shape {list(kin.shape)}; the file must take {shape}")
        inputs.append(_Port(spec.name, f"in_{i}", spec.dtype, shape, change=change, layout=described[spec.name]))
    ref = _probe(ir)
    feeds = [np.transpose(ref.inputs[p.name], p.change) if p.change else ref.inputs[p.name] for p in inputs]
    try:
        with captured_output(log, "TensorFlow"):
            got = keras_model([np.asarray(f, dtype=np.dtype(k.dtype.name)) for f, k in zip(feeds, keras_model.inputs, strict=True)],
                              training=False)
    except Exception as e:
        raise UnsupportedError(f"onnx2tf's TensorFlow model fails on the sample inputs: {type(e).__name__}: "
                               f"{(str(e).strip().splitlines() or [''])[0][:300]}") from None
    got = [np.asarray(g) for g in (got if isinstance(got, (list, tuple)) else [got])]
    outputs = []
    for j, (spec, y) in enumerate(zip(ir.outputs, got, strict=True)):
        want = np.asarray(ref.outputs[spec.name])
        rank = y.ndim
        # channels-last first: on a tie (a constant output) onnx2tf's own convention decides
        options = ([_to_first(rank)] if rank >= 3 else []) + [None]
        fits = [p for p in options if (y.transpose(p) if p else y).shape == want.shape]
        if not fits:
            raise UnsupportedError(f"onnx2tf's output '{spec.name}' has the shape {list(y.shape)}, the source's {list(want.shape)}, "
                                   f"and no layout change maps one onto the other")
        if len(fits) > 1:
            fits.sort(key=lambda p: _distance(y.transpose(p) if p else y, want))
        inner = fits[0]
        shape = [d if isinstance(d, int) else None for d in spec.shape]
        as_source = f"{spec.layout} (as source)" if spec.layout else "as source"
        if nhwc and inner is not None:
            change = _to_last(rank)
            outputs.append(_Port(spec.name, f"out_{j}", spec.dtype, [shape[k] for k in change], change=change,
                                 layout=f"{_LAST_NAMES.get(rank, 'channels-last')} (transposed from the source's channels-first)"))
        else:
            outputs.append(_Port(spec.name, f"out_{j}", spec.dtype, shape, inner=inner, layout=as_source))
    return inputs, outputs


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(np.nanmax(d)) if d.size and not np.all(np.isnan(d)) else float("inf")


def _module(tf, keras_model, inputs: list[_Port], outputs: list[_Port]):
    """A tf.Module whose one function takes the file's inputs and returns its outputs by key."""
    graph_in = [k.dtype for k in keras_model.inputs]

    def serve(*args):
        xs = [tf.cast(a, dt) if a.dtype != dt else a for a, dt in zip(args, graph_in, strict=True)]
        ys = keras_model(xs, training=False)
        ys = ys if isinstance(ys, (list, tuple)) else [ys]
        out = {}
        for port, y in zip(outputs, ys, strict=True):
            if port.inner:
                y = tf.transpose(y, port.inner)
            want = tf.as_dtype(port.dtype)
            out[port.key] = tf.cast(y, want) if y.dtype != want else tf.identity(y)
        return out

    module = tf.Module()
    module.model = keras_model
    module.serve = tf.function(serve, input_signature=[tf.TensorSpec(p.shape, tf.as_dtype(p.dtype), name=p.key)
                                                       for p in inputs])
    return module


def _to_tflite(keras_model, inputs: list[_Port], outputs: list[_Port], mode: str, calib: dict[str, np.ndarray] | None,
               io_dtype: str, work: Path, log: Path) -> bytes:
    """TensorFlow's converter on the wrapped model, with the precision's settings.

    The wrapper is saved as a SavedModel with its one signature first (the converter would do the
    same, but on a failure silently write a file without a signature); variables that onnx2tf's
    layers capture without tracking them are attached to the module so that they are saved too.
    """
    from modelport.quiet_call import captured_output, log_tail

    with captured_output(log, "TFLite converter"):
        import tensorflow as tf

        try:
            module = _module(tf, keras_model, inputs, outputs)
            fn = module.serve.get_concrete_function()
            module.captured = list(fn.variables)
            tf.saved_model.save(module, str(work / "wrapped"), signatures={SIGNATURE: fn})
        except Exception as e:
            raise UnsupportedError(f"onnx2tf's TensorFlow model could not be wrapped for TFLite: {type(e).__name__}: "
                                   f"{(str(e).strip().splitlines() or [''])[0][:300]}") from None
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
            raise UnsupportedError(f"TensorFlow's TFLite converter failed: {type(e).__name__}: "
                                   f"{(str(e).strip().splitlines() or [''])[0][:300]} {log_tail(log, 2)}") from None


def _name_io(data: bytes, inputs: list[_Port], outputs: list[_Port]) -> bytes:
    """The file with the contract's names: signature keys, I/O tensor names, and I/O in contract order."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(data))
    if len(model.signatureDefs or []) != 1 or len(model.subgraphs) != 1:
        raise UnsupportedError(f"TensorFlow's TFLite converter wrote {len(model.signatureDefs or [])} signature(s) and "
                               f"{len(model.subgraphs)} subgraph(s); the emitter writes one of each")
    sig, graph = model.signatureDefs[0], model.subgraphs[0]
    index = {}
    for maps, ports in ((sig.inputs, inputs), (sig.outputs, outputs)):
        by_key = {p.key: p for p in ports}
        for m in maps:
            port = by_key[m.name.decode()]
            m.name = port.name.encode()
            index[id(port)] = int(m.tensorIndex)
        maps.sort(key=lambda m, order=[p.name for p in ports]: order.index(m.name.decode()))
    sig.signatureKey = SIGNATURE.encode()
    new_in, new_out = [index[id(p)] for p in inputs], [index[id(p)] for p in outputs]
    if sorted(new_in) != sorted(int(i) for i in graph.inputs) or sorted(new_out) != sorted(int(i) for i in graph.outputs):
        raise UnsupportedError("the TFLite file's signature does not cover its input and output tensors")
    graph.inputs, graph.outputs = new_in, new_out
    for port in outputs + inputs:  # an output that is an input passed through keeps the input's name
        graph.tensors[index[id(port)]].name = port.name.encode()
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


def _reference_in_layout(ir: IRModel, inputs: list[_Port], outputs: list[_Port]) -> Reference | None:
    """The IR's references transposed into the file's layout (nhwc), or None when no tensor changed."""
    if ir.reference is None or not any(p.change for p in inputs + outputs):
        return None
    ref = ir.reference

    def moved(arrays, ports):
        return {p.name: np.ascontiguousarray(np.transpose(arrays[p.name], p.change)) if p.change else arrays[p.name]
                for p in ports}

    return Reference(moved(ref.inputs, inputs), moved(ref.outputs, outputs), ref.producer)


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    from modelport.deps import version_of
    from modelport.emitters import preflight
    from modelport.runtimes.tflite import load_interpreter

    opts = options.target or TFLiteOptions()
    layout, io_dtype = opts.layout, opts.io_dtype
    precision = options.precision
    if precision not in ("fp32", "fp16", "int8"):
        raise BadInputError(f"TFLite precision '{precision}' is not one of fp32, fp16, int8")
    keep_first, keep_last, changes, described = input_layouts(model, layout)
    ir, pre = preflight.check_tflite(model)
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
        keras_model = _convert(ir, work, keep_first, keep_last, log)
        inputs, outputs = _plan(ir, keras_model, changes, described, layout == "nhwc", log)
        data = _to_tflite(keras_model, inputs, outputs, mode, calib, io_dtype, work, log)
    path = out_dir / "model.tflite"
    path.write_bytes(_name_io(data, inputs, outputs))
    ops = _check_ops(load_interpreter(path), path)
    reference = _reference_in_layout(model, inputs, outputs)
    moved = [p.name for p in inputs + outputs if p.change]
    quant = {"fp32": "none", "fp16": "float16 weights", "int8": "dynamic range (int8 weights, float activations)",
             "int8-full": "integer (int8 weights and activations, float I/O), calibrated",
             "int8-full-io": f"full integer (int8 weights and activations, {io_dtype} I/O), calibrated; validated by "
                             f"quantising float inputs and dequantising outputs with each tensor's scale and zero point"}[mode]
    validation = (f"signature '{SIGNATURE}' fed and read by the contract's names, as the file is"
                  + (f"; the reference was transposed into the file's layout for {', '.join(moved)}" if moved else
                     ", with no transpose"))
    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=[path], precision=precision,
        details={"converter": f"onnx2tf {version_of('onnx2tf')} + TensorFlow {version_of('tensorflow')} TFLite converter",
                 "layout": layout, "inputs_layout": {p.name: p.layout for p in inputs},
                 "outputs_layout": {p.name: p.layout for p in outputs},
                 "layout_changes": {p.name: p.change for p in inputs + outputs if p.change},
                 "signature": {"key": SIGNATURE, "inputs": [p.name for p in inputs], "outputs": [p.name for p in outputs]},
                 "validation": validation, "quantization": quant, "io_dtype": io_dtype, "tflite_ops": len(ops),
                 "preflight": pre.to_dict()},
        runner="tflite", runner_options={"signature": SIGNATURE}, reference=reference,
    )
