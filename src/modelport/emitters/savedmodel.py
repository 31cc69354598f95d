"""The SavedModel target through the ONNX route: onnx2tf's TensorFlow model of the IR behind the
I/O contract (`emitters/tf_model.py`, as the TFLite emitter and the TF Serving packager build it),
saved as `saved_model/` with one `serving_default` signature whose inputs and outputs are the
contract's names, shapes, dtypes and layouts. Validated by loading the folder as a user would
(`tf.saved_model.load`, the signature called by name: `runtimes/savedmodel.py`).

Where onnx2tf cannot convert the IR, modelport's own ONNX lowering (`emitters/onnx_tf.py`) stands
in (`tf_model.build`; the artifact's `converter` names it and onnx2tf's reason).

A Keras or SavedModel source reaches this target natively instead (`emitters/savedmodel_tf.py`,
chosen by `emitters/routes.py`). FP32 only: TensorFlow has no weight-only FP16 or INT8 SavedModel.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.onnx_tf import converter_name
from modelport.emitters.preflight import Preflight
from modelport.emitters.tf_model import build, save_contract_model
from modelport.frameworks.tensorflow import import_tf
from modelport.ir import IRModel
from modelport.run.quiet_call import captured_output

NAME = "savedmodel"
RUNTIME = "savedmodel"
DESCRIPTION = "TensorFlow SavedModel folder (serving_default signature by the contract's names), loaded and run by TensorFlow"
CONVERTER = "onnx2tf"
SIGNATURE = "serving_default"
FOLDER = "saved_model"



def preflight(ir: IRModel, options: EmitOptions | None = None) -> Preflight:
    from modelport.emitters.tflite import check

    pre = check(ir)[1]
    pre.target, pre.runtime = NAME, "onnx2tf"
    return pre


def artifact(path: Path, converter: str, inputs: list[str], outputs: list[str], **details) -> Artifact:
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return Artifact(target=NAME, runtime=RUNTIME, path=path, files=files, precision="fp32",
                    details={"converter": converter, "signature": {"key": SIGNATURE, "inputs": inputs, "outputs": outputs},
                             "validation": f"tf.saved_model.load, signature '{SIGNATURE}' called by the contract's names",
                             **details},
                    runner="savedmodel", runner_options={"signature": SIGNATURE})


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    from modelport.deps import version_of

    preflight(model).raise_if_unsupported()
    tf = import_tf("writing a SavedModel")
    dest = out_dir / FOLDER
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modelport-savedmodel-") as tmp:
        work = Path(tmp)
        log = work / "convert.log"
        keras_model, inputs, outputs = build(model, work, log)
        with captured_output(log, "TensorFlow"):
            save_contract_model(tf, keras_model, inputs, outputs, dest, SIGNATURE, by_name=True)
    return artifact(dest, f"{converter_name(keras_model)} + TensorFlow {version_of('tensorflow')}",
                    [p.name for p in inputs], [p.name for p in outputs],
                    inputs_layout={p.name: p.layout for p in inputs}, outputs_layout={p.name: p.layout for p in outputs})
