"""The native SavedModel route for TensorFlow sources (`emitters/routes.py`): no ONNX in between.

A Keras source is written by Keras's own export (`keras.export.ExportArchive`, what
`model.export(dir)` uses), with one `serving_default` endpoint whose inputs and outputs carry the
contract's names (plain `model.export` names them after the Keras layers and `output_0`). A
SavedModel source has its converted signature saved again behind the contract's names (the
`--input-names`/`--outputs` renames applied), with only the variables and tables that signature
uses: a training checkpoint's optimizer is left out, so plain TensorFlow loads the folder without
`tf_keras`. Either is validated as the ONNX route's folder is:
loaded with `tf.saved_model.load` and called through its signature by name.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.tf_model import stable_saved_model
from modelport.emitters.tflite_tf import contract_saver, ports, source_function
from modelport.errors import BadInputError
from modelport.frameworks.tensorflow import import_tf
from modelport.ir import IRModel
from modelport.run.quiet_call import captured_output

NAME = "Keras export / tf.saved_model.save"
AUTO = "first"
PRECISIONS = ("fp32",)
SOURCE_ONLY = False


def refusal(ir: IRModel, options: EmitOptions) -> str | None:
    return None


def _keras_export(tf, model, call, inputs, outputs, dest: Path) -> None:
    import keras

    def serve(*xs):
        got = call(*xs)
        out = {}
        for p in outputs:
            y, want = got[p.name], tf.as_dtype(p.dtype)
            out[p.name] = tf.cast(y, want) if y.dtype != want else tf.identity(y)
        return out

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve,
                         input_signature=[tf.TensorSpec(p.shape, tf.as_dtype(p.dtype), name=p.name) for p in inputs])
    archive.write_out(str(dest), verbose=False)


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    from modelport.deps import version_of
    from modelport.emitters.savedmodel import FOLDER, SIGNATURE, artifact

    reason = refusal(model, options)
    if reason:
        raise BadInputError(f"{NAME} cannot write the savedmodel target: {reason}")
    tf = import_tf("writing a SavedModel")
    kind = model.source.kind if model.source else "?"
    inputs, outputs = ports(model)
    dest = out_dir / FOLDER
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modelport-savedmodel-native-") as tmp:
        work = Path(tmp)
        with captured_output(work / "convert.log", f"{kind} export"):
            holder, call = source_function(tf, model, work)
            if kind == "keras":
                _keras_export(tf, holder, call, inputs, outputs, dest)
                stable_saved_model(dest)
                converter = f"Keras {version_of('keras')} export (ExportArchive)"
            else:
                contract_saver(holder, call, inputs, outputs, by_name=True, signature=SIGNATURE)(tf, dest)
                converter = f"TensorFlow {version_of('tensorflow')} tf.saved_model.save of signature " \
                            f"'{model.provenance.get('signature') or SIGNATURE}'"
    return artifact(dest, converter, [p.name for p in inputs], [p.name for p in outputs],
                    inputs_layout={p.name: p.layout for p in inputs}, outputs_layout={p.name: p.layout for p in outputs})
