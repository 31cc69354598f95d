"""The TFLite target: `model.tflite` from the IR through onnx2tf, validated in the LiteRT interpreter.

Why onnx2tf: it converts ONNX to TensorFlow op by op and removes the NCHW↔NHWC transposes
itself (onnx-tf, the older route, is archived and leaves a transpose around every conv). The
TFLite file is then written by TensorFlow's own converter, so its ops are TFLite builtins.

Layout: by default the `.tflite` takes its inputs in the source model's layout (an NCHW PyTorch
model keeps NCHW inputs, an NHWC Keras model keeps NHWC), so client code does not change.
`tflite_layout="nhwc"` exposes channels-last inputs instead (what most mobile pipelines feed);
the artifact records which layout each input has. Outputs are returned in the source layout.

Precision: fp32, fp16 (float16 weights), int8 as dynamic-range quantization, or, with
`calibration` data, integer quantization of weights and activations. Full-integer models keep
float32 inputs and outputs unless `tflite_io_dtype` is "int8" or "uint8": then onnx2tf's
full-integer file (`-oiqt -iqd int8 -oqd int8`) is taken, whose input and output tensors are
integers; validation feeds it through the runner, which quantises the float reference inputs and
dequantises the outputs with each tensor's scale and zero point.

Validation loads the `.tflite` in this process: the file was written by onnx2tf and TensorFlow's
converter a moment ago, not handed in by a user. User-supplied `.tflite` files (as sources or
in `validate`) are only ever opened in a child process (`runtimes.isolated`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from modelport.emitters import Artifact, EmitOptions
from modelport.errors import BadInputError, ModelportError, UnsupportedError
from modelport.ir import IRModel

NAME = "tflite"
RUNTIME = "tflite"
DESCRIPTION = "TFLite flatbuffer via onnx2tf (fp32/fp16/int8), validated in the LiteRT interpreter"

CHANNELS_LAST = ("NHWC", "NWC", "NDHWC")
LAYOUTS = ("source", "nhwc")
_FILES = {"fp32": "float32", "fp16": "float16", "int8": "dynamic_range_quant", "int8-full": "integer_quant",
          "int8-full-io": "full_integer_quant"}
IO_DTYPES = ("float32", "int8", "uint8")


def _to_last(rank: int) -> list[int]:
    return [0, *range(2, rank), 1]


def _to_first(rank: int) -> list[int]:
    return [0, rank - 1, *range(1, rank - 1)]


def input_layouts(ir: IRModel, layout: str) -> tuple[list[str], list[str], dict[str, list[int]], dict[str, str]]:
    """(keep-channels-first names, keep-channels-last names, feed transposes, layout per input)."""
    if layout not in LAYOUTS:
        raise BadInputError(f"unknown TFLite layout '{layout}'; choose one of {list(LAYOUTS)}")
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
            described[spec.name] = {3: "NWC", 4: "NHWC", 5: "NDHWC"}[rank] + " (transposed from the source's channels-first)"
    return keep_first, keep_last, transpose, described


def load_calibration(path: str | Path, ir: IRModel) -> dict[str, np.ndarray]:
    """Calibration inputs stacked along axis 0 per input (an .npz keyed by input name, or images)."""
    from modelport.optimize.calibration import load_calibration as load_feeds

    feeds = load_feeds(path, ir)
    return {s.name: np.concatenate([f[s.name] for f in feeds], axis=0).astype(np.float32) for s in ir.inputs}


def _convert(ir: IRModel, work: Path, keep_first, keep_last, calibration: dict[str, Path] | None, log: Path,
             io_dtype: str = "float32") -> Path:
    from modelport.deps import require
    from modelport.emitters.quiet_call import captured_output, log_tail

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with captured_output(log):
        onnx2tf = require("onnx2tf", purpose="converting to TFLite")
        _fresh_keras_names()
        kwargs = dict(
            onnx_graph=ir.clone().model, output_folder_path=str(work / "tf"), non_verbose=True, verbosity="error",
            copy_onnx_input_output_names_to_tflite=True, output_dynamic_range_quantized_tflite=True,
            keep_ncw_or_nchw_or_ncdhw_input_names=keep_first or None,
            keep_nwc_or_nhwc_or_ndhwc_input_names=keep_last or None,
        )
        if calibration:
            kwargs.update(output_integer_quantized_tflite=True, input_quant_dtype=io_dtype, output_quant_dtype=io_dtype,
                          custom_input_op_name_np_data_path=[[n, str(p), 0.0, 1.0] for n, p in calibration.items()])
        try:
            onnx2tf.convert(**kwargs)
        except SystemExit as e:  # onnx2tf exits on conversion errors
            raise UnsupportedError(f"onnx2tf could not convert the model (exit {e.code}): {log_tail(log)}") from None
        except ModelportError:
            raise
        except Exception as e:
            raise UnsupportedError(f"onnx2tf could not convert the model: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} {log_tail(log, 2)}") from None
    return work / "tf"


def _fresh_keras_names() -> None:
    """Restart tf_keras's layer-name counters, which onnx2tf's names (and so the .tflite bytes)
    carry: without this a second conversion in one process writes `model_35/tf.nn.relu_7`
    where the first wrote `model_17/tf.nn.relu`, and reruns are not byte-identical."""
    import tf_keras

    tf_keras.backend.clear_session()


def _output_transposes(ir: IRModel, details: list[dict]) -> dict[str, list[int]]:
    """Outputs the TFLite graph returns channels-last where the source returns channels-first."""
    out = {}
    refs = ir.reference.outputs if ir.reference else {}
    for spec, d in zip(ir.outputs, details, strict=False):
        ref = refs.get(spec.name)
        rank = len(d["shape_signature"])
        if ref is None or rank < 3 or ref.ndim != rank:
            continue
        sig = [int(x) for x in d["shape_signature"]]
        if not _fits(sig, ref.shape) and _fits(sig, [ref.shape[i] for i in _to_last(rank)]):
            out[spec.name] = _to_first(rank)
    return out


def _fits(sig: list[int], shape) -> bool:
    return len(sig) == len(shape) and all(s in (-1, r) for s, r in zip(sig, shape, strict=True))


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


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    import shutil

    from modelport.deps import version_of
    from modelport.emitters import preflight
    from modelport.emitters.quiet_call import log_tail
    from modelport.runtimes.tflite import load_interpreter

    opts = options.options
    layout = str(opts.get("tflite_layout") or "source").lower()
    precision = options.precision
    if precision not in ("fp32", "fp16", "int8"):
        raise BadInputError(f"TFLite precision '{precision}' is not one of fp32, fp16, int8")
    keep_first, keep_last, in_transpose, described = input_layouts(model, layout)
    ir, pre = preflight.check_tflite(model)
    pre.raise_if_unsupported()
    calib = load_calibration(opts["calibration"], ir) if opts.get("calibration") and precision == "int8" else None
    io_dtype = str(opts.get("tflite_io_dtype") or "float32").lower()
    if io_dtype not in IO_DTYPES:
        raise BadInputError(f"TFLite I/O dtype '{io_dtype}' is not one of {', '.join(IO_DTYPES)}")
    if io_dtype != "float32" and not calib:
        raise BadInputError(f"--tflite-io-dtype {io_dtype} needs a full-integer model",
                            hint="pass --precision int8 --calibration DATA")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modelport-tflite-") as tmp:
        work = Path(tmp)
        calib_files = None
        if calib:
            calib_files = {}
            for name, arr in calib.items():
                if name in in_transpose:
                    arr = np.transpose(arr, in_transpose[name])
                calib_files[name] = work / f"calib_{len(calib_files)}.npy"
                np.save(calib_files[name], arr)
        log = work / "onnx2tf.log"
        tf_dir = _convert(ir, work, keep_first, keep_last, calib_files, log, io_dtype)
        mode = ("int8-full-io" if io_dtype != "float32" else "int8-full") if calib else precision
        produced = tf_dir / f"model_{_FILES[mode]}.tflite"
        if not produced.exists():
            raise UnsupportedError(f"onnx2tf wrote no {produced.name}: {log_tail(log)}")
        path = out_dir / "model.tflite"
        shutil.copyfile(produced, path)
    interpreter = load_interpreter(path)
    ops = _check_ops(interpreter, path)
    in_details = interpreter.get_input_details()
    out_details = interpreter.get_output_details()
    input_names = _match_inputs(ir, in_details)
    out_transpose = _output_transposes(ir, out_details)
    quant = {"fp32": "none", "fp16": "float16 weights", "int8": "dynamic range (int8 weights, float activations)",
             "int8-full": "integer (int8 weights and activations, float I/O), calibrated",
             "int8-full-io": f"full integer (int8 weights and activations, {io_dtype} I/O), calibrated; validated by "
                             f"quantising float inputs and dequantising outputs with each tensor's scale and zero point"}[mode]
    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=[path], precision=precision,
        details={"converter": f"onnx2tf {version_of('onnx2tf')}", "layout": layout, "inputs_layout": described,
                 "quantization": quant, "io_dtype": io_dtype, "tflite_ops": len(ops), "preflight": pre.to_dict(),
                 "input_transpose": in_transpose, "output_transpose": out_transpose},
        runner="tflite",
        runner_options={"input_names": input_names, "output_names": [o.name for o in ir.outputs],
                        "input_transpose": in_transpose, "output_transpose": out_transpose},
    )


def _match_inputs(ir: IRModel, details: list[dict]) -> list[str]:
    """Our input names in the interpreter's input order (by sanitised name, else by position)."""
    from modelport.runtimes.tflite import tflite_name

    def norm(s: str) -> str:
        return "".join(c for c in s if c.isalnum()).lower()

    ours = {norm(s.name): s.name for s in ir.inputs}
    names = [ours.get(norm(tflite_name(d["name"]))) for d in details]
    if None in names or len(set(names)) != len(names):
        return [s.name for s in ir.inputs]
    return names
