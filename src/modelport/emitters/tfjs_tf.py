"""The native TF.js route for TensorFlow sources (`emitters/routes.py`): no ONNX in between. The
Keras or SavedModel source is written as the savedmodel target's native route writes it
(`emitters/savedmodel_tf.py`: Keras's export, or the signature saved again behind the contract's
names), and that SavedModel as a graph model (`emitters/tfjs.py`, `emitters/tfjs_graph.py`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions, savedmodel_tf
from modelport.emitters.tfjs import dims_metadata, saved_model_options, write
from modelport.ir import IRModel
from modelport.runtimes.tfjs import require_tfjs

NAME = "Keras export / tf.saved_model.save -> TF.js graph model"
AUTO = "first"
PRECISIONS = ("fp32", "fp16", "uint8")  # the weights of the graph model (the SavedModel step is fp32)
SOURCE_ONLY = False


def refusal(ir: IRModel, options: EmitOptions) -> str | None:

    require_tfjs("validating the tfjs target")  # exit 5 before any work: its artifact is proven in Node.js
    return None


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    precision = options.precision
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modelport-tfjs-native-") as tmp:
        saved = savedmodel_tf.emit(model, Path(tmp), saved_model_options(options))
        return write(saved, out_dir, precision, saved.details.get("converter", savedmodel_tf.NAME), dims_metadata(model))
