"""The TF.js target: a TF.js graph model (`tfjs/model.json` + `group1-shard*.bin`), the format
`tf.loadGraphModel` reads in a web page, validated by running it in Node.js with @tensorflow/tfjs
(CPU backend) fed and read through `model.json`'s signature (`runtimes/tfjs.py`).

Route: every source through a SavedModel. ONNX-side sources (PyTorch, ONNX, TFLite, ...) through
the savedmodel target's ONNX route (onnx2tf, `emitters/savedmodel.py`, or where onnx2tf cannot
convert the IR, modelport's own ONNX lowering, `emitters/onnx_tf.py`, which keeps every dynamic
dim: a transformer encoder's batch and sequence stay -1 in the graph model); Keras and SavedModel
sources natively (`emitters/tfjs_tf.py`: Keras's export or the signature saved again, no ONNX).
The SavedModel's `serving_default` signature, whose keys are the contract's names, is then
frozen, optimised and written as a graph model by modelport's own writer (`emitters/tfjs_graph.py`):
the `tensorflowjs` pip converter pins tensorflow 2.19, tf_keras 2.19, protobuf 5 and numpy 2.1,
below this environment's, so it is not used.

Precisions (`--precision`): `fp32`, `fp16` (float16 weights) and `uint8` (affine uint8 weights
with per-tensor min/scale in the manifest), the weight quantisations of tfjs-converter; TF.js
decodes them to float32 at load and computes in float32.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions, savedmodel
from modelport.emitters.preflight import Preflight
from modelport.emitters.tfjs_graph import convert_saved_model
from modelport.frameworks.tensorflow import import_tf
from modelport.ir import IRModel
from modelport.run.quiet_call import captured_output
from modelport.runtimes.tfjs import require_tfjs

NAME = "tfjs"
RUNTIME = "tfjs"
DESCRIPTION = "TF.js graph model (model.json + weight shards; fp32, fp16 or uint8 weights), run in Node.js by @tensorflow/tfjs"
CONVERTER = "onnx2tf (or modelport's ONNX lowering) SavedModel -> TF.js graph model"
FOLDER = "tfjs"



def preflight(ir: IRModel, options: EmitOptions | None = None) -> Preflight:
    from modelport.emitters.tflite import check

    require_tfjs("validating the tfjs target")  # exit 5 before any work: its artifact is proven in Node.js
    pre = check(ir)[1]
    pre.target, pre.runtime = NAME, "onnx2tf"
    return pre


def saved_model_options(options: EmitOptions) -> EmitOptions:
    """The options of the SavedModel step: fp32 (the precision applies to the graph model's weights)."""
    return dataclasses.replace(options, precision="fp32", target=None)


def dims_metadata(ir: IRModel) -> dict:
    """The contract's dynamic dims for `model.json`'s metadata (a graph model's shapes say -1 only):
    `dims` names them per tensor and axis, `bounds` gives each declared one its range or sizes."""
    named = {spec.name: {str(axis): d for axis, d in enumerate(spec.shape) if isinstance(d, str)}
             for spec in [*ir.inputs, *ir.outputs]}
    named = {k: v for k, v in named.items() if v}
    bounds = {name: spec.to_dict() for name, spec in ir.dim_bounds.items()}
    return {**({"dims": named} if named else {}), **({"bounds": bounds} if bounds else {})}


def write(saved: Artifact, out_dir: Path, precision: str, converter: str, metadata: dict | None = None) -> Artifact:
    """The graph model of a SavedModel artifact (written in a temporary folder), in `out_dir/tfjs`;
    `metadata` joins model.json's `userDefinedMetadata.modelport`."""

    tf = import_tf("writing a TF.js graph model")
    dest = out_dir / FOLDER
    with captured_output(saved.path.parent / "tfjs.log", "TF.js graph model"):
        details = convert_saved_model(tf, saved.path, dest, precision, metadata=metadata)
    path = dest / "model.json"
    files = [path, *sorted(p for p in dest.glob("group*-shard*.bin"))]
    keep = {k: saved.details[k] for k in ("inputs_layout", "outputs_layout") if k in saved.details}
    return Artifact(target=NAME, runtime=RUNTIME, path=path, files=files, precision=precision,
                    details={"converter": f"{converter} -> TF.js graph model (modelport writer)",
                             "saved_model": saved.details.get("converter"), **details, **keep,
                             "validation": "Node.js @tensorflow/tfjs (cpu backend): tf.loadGraphModel, executeAsync "
                                           "by the signature's input and output keys"},
                    runner="tfjs")


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:

    precision = options.precision
    preflight(model).raise_if_unsupported()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modelport-tfjs-") as tmp:
        saved = savedmodel.emit(model, Path(tmp), saved_model_options(options))
        return write(saved, out_dir, precision, saved.details.get("converter", "onnx2tf"), dims_metadata(model))
