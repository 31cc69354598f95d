"""TFLite → TFLite: a `.tflite` source asked `--to tflite` is emitted again from its own
flatbuffer, not converted (`emitters/routes.py`: the native route of tflite sources, tried first
under `--route auto`; the ONNX route, tf2onnx then onnx2tf, follows when it fails).

The graph is kept: operators, tensors and weights are the source's. What changes is what the
contract and the options say: the file gets one signature, `serving_default`, whose keys are the
contract's names (a file without a signature gets one over its graph's inputs and outputs), and
its input and output tensors carry those names, as every TFLite file modelport writes does. At
fp32 nothing else changes, so the file computes what the source computes, bit for bit. fp16 and
int8 re-quantise the float weights with ai-edge-quantizer: fp16 casts the weights of the ops it
takes (fully connected, convolutions, embedding lookups) to float16; int8 is dynamic-range
quantisation (int8 weights per channel, float activations), what `--precision int8` without
calibration means on the other TFLite routes.

FlatBuffers have no bounds checks of their own (see `parsers/tflite.py`), so every read of the
source file, the quantiser's included, happens in a child process (`runtimes.isolated`); the
parent copies the written file into the output folder. Refused before running: `--tflite-layout
nhwc` (the file keeps its layouts) and full-integer quantisation (`--calibration`: the ONNX route
calibrates); a source whose own tensors are quantised already, asked for fp16 or int8, is exit 2.

The route never reads the ONNX IR, only the source file and the reference the source itself gave
(`SOURCE_ONLY`): when the IR that tf2onnx made fails parity with the source and every target of
the run is re-emitted, the run goes on from the source with a warning, and the ONNX route is not
taken (`orchestration.convert.from_source_alone`).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from modelport.deps import require
from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.routes import staged_source
from modelport.emitters.tflite import SIGNATURE, TFLiteOptions, _check_ops, quantization
from modelport.errors import BadInputError, UnsupportedError, one_line
from modelport.ir import IRModel
from modelport.parsers.tf_common import spec_to_dict
from modelport.run.quiet_call import captured_output
from modelport.runtimes.isolated import CONVERT_TIMEOUT_S, call_in_child, timeout_for
from modelport.runtimes.tflite import load_interpreter

NAME = "TFLite re-emission"
AUTO = "first"  # the source's own graph: nothing is converted
PRECISIONS = ("fp32", "fp16", "int8")  # fp16/int8 by ai-edge-quantizer
SOURCE_ONLY = True  # reads the source file and its reference, never the ONNX IR: a run may go on when the IR drifts
QUANTIZER = "ai-edge-quantizer"


def refusal(ir: IRModel, options: EmitOptions) -> str | None:

    opts = options.target or TFLiteOptions()
    if opts.layout != "source":
        return f"--tflite-layout {opts.layout} (a re-emission keeps the file's layouts)"
    if options.calibration and options.precision == "int8":
        return "full-integer quantisation with --calibration (the ONNX route calibrates)"
    if ir.source is None:
        return "no source file to emit again"
    return None


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    from modelport.deps import version_of

    reason = refusal(model, options)
    if reason:
        raise BadInputError(f"{NAME} cannot emit tflite: {reason}")
    precision = options.precision
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.tflite"
    with tempfile.TemporaryDirectory(prefix="modelport-retfl-") as tmp:
        source, spec = staged_source(model, Path(tmp))
        request = {"path": str(source), "spec": spec_to_dict(spec), "precision": precision,
                   "inputs": [s.name for s in model.inputs], "outputs": [s.name for s in model.outputs]}

        def collect(work: Path, response: dict) -> dict:
            shutil.copyfile(work / "model.tflite", path)
            return response

        done = call_in_child("modelport.emitters.tflite_copy:reemit_in_child", request, path=model.provenance.get("path"),
                             timeout=timeout_for(CONVERT_TIMEOUT_S), what="the TFLite re-emission", collect=collect,
                             unexpected=UnsupportedError)
    quantizer = f"{QUANTIZER} {version_of('ai-edge-quantizer') or version_of('ai_edge_quantizer')}"
    how = {"fp32": "the source's flatbuffer, its graph unchanged",
           "fp16": f"the source's flatbuffer, float16 weights by {quantizer}",
           "int8": f"the source's flatbuffer, int8 weights by {quantizer}"}[precision]
    return Artifact(
        target="tflite", runtime="tflite", path=path, files=[path], precision=precision,
        details={"converter": f"TFLite re-emission ({how})", "layout": "source",
                 "inputs_layout": {s.name: "as source" for s in model.inputs},
                 "outputs_layout": {s.name: "as source" for s in model.outputs},
                 "signature": {"key": SIGNATURE, "inputs": [s.name for s in model.inputs],
                               "outputs": [s.name for s in model.outputs]},
                 "source_signature": done["source_signature"],
                 "validation": f"signature '{SIGNATURE}' fed and read by the contract's names, as the file is, with no "
                               "transpose, against the source file run in LiteRT",
                 "quantization": quantization(precision, "float32"), "io_dtype": done.get("integer_io") or "as the source",
                 "tflite_ops": done["ops"], "quantized_ops": done.get("quantized_ops")},
        # a source with integer I/O was referenced as stored (`parsers.tflite`): its outputs are read so too
        runner="tflite", runner_options={"signature": SIGNATURE, "dequantize_outputs": False},
    )


# --- in the child: every read of the source flatbuffer --------------------------------------

def reemit_in_child(work: Path, request: dict) -> dict:
    """The source's flatbuffer under the contract's names, re-quantised as asked, written to
    `work/model.tflite`; returns what the report says about it."""
    import numpy as np


    path = Path(request["path"])
    try:
        interp = load_interpreter(path)
        ins, outs = interp.get_input_details(), interp.get_output_details()
    except (ValueError, RuntimeError) as e:
        raise BadInputError(f"not a valid TFLite model: {one_line(e, 300)}",
                            path=path) from None
    names_in, names_out = request["inputs"], request["outputs"]
    if len(ins) != len(names_in) or len(outs) != len(names_out):
        raise UnsupportedError(f"the TFLite file has {len(ins)} inputs and {len(outs)} outputs; the contract "
                               f"{len(names_in)} and {len(names_out)}", path=path)
    data = path.read_bytes()
    quantized = []
    if request["precision"] != "fp32":
        if any((d.get("quantization") or (0.0, 0))[0] for d in _tensors(interp)):
            raise UnsupportedError(f"the TFLite file is quantised already; --precision {request['precision']} re-quantises "
                                   "float weights only", path=path, hint="convert it at --precision fp32")
        data, quantized = _quantise(data, request["precision"], work)
    renamed, source_signature = _name_io(data, [int(d["index"]) for d in ins], names_in,
                                         [int(d["index"]) for d in outs], names_out, SIGNATURE, path)
    out = work / "model.tflite"
    out.write_bytes(renamed)
    ops = _check_ops(load_interpreter(out), out)
    integer = sorted({np.dtype(d["dtype"]).name for d in ins + outs if (d.get("quantization") or (0.0, 0))[0]})
    return {"ops": len(ops), "source_signature": source_signature, "quantized_ops": quantized or None,
            "integer_io": integer[0] if len(integer) == 1 else None}


def _tensors(interp) -> list[dict]:
    try:
        return interp.get_tensor_details()
    except Exception:
        return []


def _name_io(data: bytes, in_index: list[int], in_names: list[str], out_index: list[int], out_names: list[str],
             key: str, path: Path) -> tuple[bytes, str | None]:
    """The file with one signature `key` on its main graph whose keys are the contract's names
    (the tensors at `in_index`/`out_index`, in the interpreter's order), and those tensors so named.
    Returns the bytes and the key of the signature it replaced (None: the file had none)."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(data))
    signatures = list(model.signatureDefs or [])
    if len(signatures) > 1:
        raise UnsupportedError(f"the TFLite file has {len(signatures)} signatures; a re-emission keeps one", path=path)
    sig = signatures[0] if signatures else schema.SignatureDefT(inputs=[], outputs=[], subgraphIndex=0)
    if int(sig.subgraphIndex or 0) != 0:
        raise UnsupportedError("the TFLite file's signature is not on its main graph", path=path)
    before = sig.signatureKey.decode() if signatures and sig.signatureKey else None
    graph = model.subgraphs[0]
    if sorted(in_index) != sorted(int(i) for i in graph.inputs) or sorted(out_index) != sorted(int(i) for i in graph.outputs):
        raise UnsupportedError("the TFLite file's inputs and outputs are not its main graph's", path=path)
    sig.inputs = [schema.TensorMapT(name=n.encode(), tensorIndex=i) for n, i in zip(in_names, in_index, strict=True)]
    sig.outputs = [schema.TensorMapT(name=n.encode(), tensorIndex=i) for n, i in zip(out_names, out_index, strict=True)]
    sig.signatureKey = key.encode()
    model.signatureDefs = [sig]
    for name, i in [*zip(out_names, out_index, strict=True), *zip(in_names, in_index, strict=True)]:
        graph.tensors[i].name = name.encode()  # an output that is an input passed through keeps the input's name
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model)), before


def _quantise(data: bytes, precision: str, work: Path) -> tuple[bytes, list[str]]:
    """ai-edge-quantizer on the float model: fp16 weights (float casting) or int8 dynamic range."""

    with captured_output(work / "quantizer.log", QUANTIZER):
        require("ai_edge_quantizer", purpose="re-quantising a TFLite model")
        from ai_edge_quantizer import algorithm_manager, qtyping, recipe
        from ai_edge_quantizer.quantizer import Quantizer

        q = Quantizer(bytearray(data))
        if precision == "int8":
            q.load_quantization_recipe(recipe.dynamic_wi8_afp32())
        else:
            config = qtyping.OpQuantizationConfig(
                weight_tensor_config=qtyping.TensorQuantizationConfig(num_bits=16, dtype=qtyping.TensorDataType.FLOAT),
                compute_precision=qtyping.ComputePrecision.FLOAT, explicit_dequantize=True)
            for op in FP16_OPS:
                q.update_quantization_recipe(regex=".*", operation_name=getattr(qtyping.TFLOperationName, op),
                                             algorithm_key=algorithm_manager.AlgorithmName.FLOAT_CASTING, op_config=config)
        try:
            result = q.quantize(enable_progress_report=False)
        except Exception as e:
            raise UnsupportedError(f"{QUANTIZER} could not quantise the model to {precision}: "
                                   f"{one_line(e, 300, typed=True)}") from None
    quantized = sorted({str(r.get("operation", "")) for r in q.get_quantization_recipe() if isinstance(r, dict)} - {""})
    return bytes(result.quantized_model), quantized


FP16_OPS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D_TRANSPOSE", "EMBEDDING_LOOKUP")
