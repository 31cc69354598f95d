"""The native TFLite route for TensorFlow sources (Keras models and SavedModels): TensorFlow's own
`TFLiteConverter` on the source, no ONNX in between (`emitters/routes.py`).

The source is loaded again from a copy (`routes.staged_source`; a Keras file goes through the same
safety screen as when it was parsed) and wrapped in one `tf.function` that takes the contract's
inputs in order and returns the contract's outputs, in the same flattening order the parser named
them. That function is what the converter reads (through a SavedModel with one signature, as the
ONNX route does), and the file is then given the contract's names (`tflite._name_io`), so both
routes write files a user reads the same way: signature `serving_default`, inputs and outputs by
the contract's names, in the source's layouts (a TensorFlow source is channels-last already).

Precision and I/O types are those of the ONNX route: fp16 weights, int8 dynamic range, or with
`--calibration` integer quantisation with float or `--tflite-io-dtype` integer I/O. What the
route refuses (checked before anything runs): `--tflite-layout nhwc` on a source with
channels-first tensors (the route keeps the source's layouts).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.routes import staged_source
from modelport.emitters.tf_model import Port, stable_saved_model
from modelport.emitters.tflite import SIGNATURE, TFLiteOptions, _check_ops, _name_io, _to_tflite, load_calibration, quantization
from modelport.errors import BadInputError, UnsupportedError
from modelport.frameworks.savedmodel import folder_of
from modelport.frameworks.tensorflow import import_tf, stdout_to_stderr
from modelport.ir import IRModel
from modelport.parsers.tf_common import rename_outputs
from modelport.run.quiet_call import captured_output
from modelport.runtimes.tflite import load_interpreter

NAME = "TFLiteConverter"
AUTO = "first"
PRECISIONS = ("fp32", "fp16", "int8")
SOURCE_ONLY = False
CHANNELS_FIRST = ("NCHW", "NCW", "NCDHW")


def refusal(ir: IRModel, options: EmitOptions) -> str | None:

    opts = options.target or TFLiteOptions()
    first = [s.name for s in ir.inputs + ir.outputs if s.layout in CHANNELS_FIRST]
    if opts.layout == "nhwc" and first:
        return f"--tflite-layout nhwc: the route keeps the source's layouts, and {first} are channels-first"
    return None


def ports(ir: IRModel) -> tuple[list[Port], list[Port]]:
    """The file's inputs and outputs: the contract's, in its order, as the source has them."""
    def port(s, key):
        return Port(s.name, key, s.dtype, [d if isinstance(d, int) else None for d in s.shape],
                    layout=f"{s.layout} (as source)" if s.layout else "as source")

    return [port(s, f"in_{i}") for i, s in enumerate(ir.inputs)], [port(s, f"out_{j}") for j, s in enumerate(ir.outputs)]


def keras_function(tf, ir: IRModel, work: Path):
    """(the Keras model, call(*inputs) -> {output name: tensor}) for the IR's Keras source."""
    from modelport.parsers.keras import load, output_names

    source, spec = staged_source(ir, work)
    with stdout_to_stderr():
        model, _ = load(source, spec)
    structure = getattr(model, "input", None)

    def pack(xs):
        if len(xs) == 1 and not isinstance(structure, (dict, list, tuple)):
            return xs[0]
        return tf.nest.pack_sequence_as(structure, list(xs)) if structure is not None else list(xs)

    signature = [tf.TensorSpec([d if isinstance(d, int) else None for d in s.shape], tf.as_dtype(s.dtype)) for s in ir.inputs]
    structured = tf.function(lambda *xs: model(pack(xs), training=False), input_signature=signature)
    names = rename_outputs(output_names(model, structured.get_concrete_function().structured_outputs), spec)

    def call(*xs):
        return dict(zip(names, tf.nest.flatten(model(pack(xs), training=False)), strict=True))

    return model, call


def savedmodel_function(tf, ir: IRModel, work: Path):
    """(the loaded SavedModel, call(*inputs) -> {output name: tensor}) for the IR's signature."""
    from modelport.frameworks.savedmodel import load as load_savedmodel

    source, spec = staged_source(ir, work)
    loaded = load_savedmodel(folder_of(Path(source)))
    name = ir.provenance.get("signature") or "serving_default"
    fn = loaded.signatures[name]
    args, kwargs = fn.structured_input_signature
    flat = [t for t in tf.nest.flatten((args, kwargs)) if isinstance(t, tf.TensorSpec)]
    keyword = bool(kwargs) and not args
    keys = sorted(kwargs) if keyword else [t.name for t in flat]
    outputs = fn.structured_outputs
    out_keys = sorted(outputs) if isinstance(outputs, dict) else [f"output_{i}" for i in range(len(tf.nest.flatten(outputs)))]
    names = rename_outputs(out_keys, spec)

    def call(*xs):
        result = fn(**dict(zip(keys, xs, strict=True))) if keyword else fn(*xs)
        return dict(zip(names, tf.nest.flatten(result), strict=True))

    return loaded, call


def source_function(tf, ir: IRModel, work: Path):
    """(what holds the source's variables, call(*inputs) -> {output name: tensor})."""
    kind = ir.source.kind if ir.source else None
    if kind == "keras":
        return keras_function(tf, ir, work)
    if kind == "savedmodel":
        return savedmodel_function(tf, ir, work)
    raise UnsupportedError(f"no TensorFlow source to convert natively (source kind {kind})")


def serving_state(tf, holder, fn) -> tuple[list, list]:
    """(variables, other resources such as lookup tables) that `fn` captures, the resources found
    among `holder`'s objects: with `fn` itself, all that serving it needs saved.

    Only these are tracked by the module that is saved: tracking the source itself would save all
    it holds, e.g. an optimizer with its slot variables, which plain TensorFlow cannot load back
    without `tf_keras` ("'_UserObject' object has no attribute 'add_slot'"). Both lists are in
    `fn`'s capture order (`fn.variables` comes in another order in each process), so the same
    source gives the same files."""
    order = {id(t): i for i, t in enumerate(fn.captured_inputs)}
    variables = sorted(fn.variables, key=lambda v: order.get(id(v.handle), len(order)))
    resources = [obj for obj in tf.train.TrackableView(holder).descendants()
                 if isinstance(obj, tf.saved_model.experimental.TrackableResource) and id(obj.resource_handle) in order]
    return variables, sorted(resources, key=lambda r: order[id(r.resource_handle)])


def contract_saver(holder, call, inputs: list[Port], outputs: list[Port], *, by_name: bool = False, signature: str):
    """save(tf, dest): the source behind the contract (keys or, with `by_name`, the contract's names),
    saved as a SavedModel whose one signature is `signature`. A fresh module holds that function
    and what it uses (`serving_state`), nothing else of the source."""
    def save(tf, dest: Path) -> None:

        def serve(*xs):
            got = call(*xs)
            out = {}
            for p in outputs:
                y, want = got[p.name], tf.as_dtype(p.dtype)
                out[p.name if by_name else p.key] = tf.cast(y, want) if y.dtype != want else tf.identity(y)
            return out

        module = tf.Module()
        module.serve = tf.function(serve, input_signature=[
            tf.TensorSpec(p.shape, tf.as_dtype(p.dtype), name=p.name if by_name else p.key) for p in inputs])
        fn = module.serve.get_concrete_function()
        module.captured, module.resources = serving_state(tf, holder, fn)
        tf.saved_model.save(module, str(dest), signatures={signature: fn})
        stable_saved_model(Path(dest))

    return save


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    from modelport.deps import version_of

    reason = refusal(model, options)
    if reason:
        raise BadInputError(f"{NAME} cannot convert to tflite: {reason}")
    opts = options.target or TFLiteOptions()
    io_dtype, precision = opts.io_dtype, options.precision
    calib = load_calibration(options.calibration, model) if options.calibration and precision == "int8" else None
    if io_dtype != "float32" and not calib:
        raise BadInputError(f"--tflite-io-dtype {io_dtype} needs a full-integer model", hint="pass --precision int8 --calibration DATA")
    mode = ("int8-full-io" if io_dtype != "float32" else "int8-full") if calib else precision
    inputs, outputs = ports(model)
    tf = import_tf("converting to TFLite")
    kind = model.source.kind if model.source else "?"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modelport-tflite-native-") as tmp:
        work = Path(tmp)
        log = work / "convert.log"
        with captured_output(log, f"{kind} source"):
            holder, call = source_function(tf, model, work)
        save = contract_saver(holder, call, inputs, outputs, signature=SIGNATURE)
        data = _to_tflite(None, inputs, outputs, mode, calib, io_dtype, work, log, save=save, what=f"the {kind} model")
    path = out_dir / "model.tflite"
    path.write_bytes(_name_io(data, inputs, outputs))
    ops = _check_ops(load_interpreter(path), path)
    return Artifact(
        target="tflite", runtime="tflite", path=path, files=[path], precision=precision,
        details={"converter": f"TensorFlow {version_of('tensorflow')} TFLite converter (from the {kind} source)",
                 "layout": "source", "inputs_layout": {p.name: p.layout for p in inputs},
                 "outputs_layout": {p.name: p.layout for p in outputs},
                 "signature": {"key": SIGNATURE, "inputs": [p.name for p in inputs], "outputs": [p.name for p in outputs]},
                 "validation": f"signature '{SIGNATURE}' fed and read by the contract's names, as the file is, with no transpose",
                 "quantization": quantization(mode, io_dtype), "io_dtype": io_dtype, "tflite_ops": len(ops)},
        runner="tflite", runner_options={"signature": SIGNATURE},
    )
