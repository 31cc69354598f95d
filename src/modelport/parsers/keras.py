"""Keras sources: `.keras` archives, `.h5` files, `keras.Model` objects and Keras zoo entries.

Files are screened first (parsers/keras_safety.py: config read as JSON, Lambda and foreign
classes refused unless `--trust`), then loaded with `safe_mode=True` and `compile=False`.
The model is traced as a `tf.function` over its inputs (this avoids tf2onnx's `from_keras`, which
fails on Keras 3 Sequential models), frozen and converted with tf2onnx. References come from
Keras `predict` on the sample inputs. Inputs keep their Keras layout (NHWC stays NHWC).
"""

from __future__ import annotations

from pathlib import Path

from modelport.deps import require
from modelport.errors import BadInputError, UnsafeInputError
from modelport.ir import IRModel
from modelport.parsers import keras_safety, tf_common
from modelport.parsers.tf_common import import_tf, stdout_to_stderr, tf_reason
from modelport.reference.sample_sets import reference_samples
from modelport.reference.samples import make_inputs
from modelport.run.file_checks import check_model_file

NAME = "keras"
DESCRIPTION = "Keras model (.keras archive, .h5) or a keras.Model object"
SUFFIXES = {".keras", ".h5", ".hdf5", ".json"}  # .json: an architecture, its weights named by `-iw` (spec.options["weights"])


def sniff(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in SUFFIXES


def is_keras_model(obj) -> bool:
    """True for keras.Model instances, without importing Keras."""
    return any(c.__module__.split(".")[0] in ("keras", "tf_keras") and c.__name__ in ("Model", "Functional", "Sequential")
               for c in type(obj).__mro__)


def load(source, spec):
    """(keras.Model, how it was loaded) for a path, 'zoo:NAME' or a model object."""
    if is_keras_model(source):
        return source, "keras.Model"
    if isinstance(source, str) and source.startswith("zoo:"):
        from modelport import zoo
        import_tf()
        return zoo.build(source[4:], seed=spec.seed), "zoo"
    path = check_model_file(source, kind="Keras model")
    keras_safety.screen(path, trust=spec.trust)
    keras_safety.check_keras_version()
    import_tf()

    keras = require("keras", purpose="Keras sources")
    if path.suffix.lower() == ".json":
        return load_json(keras, path, spec), "keras json + weights"
    legacy_h5 = path.suffix.lower() in (".h5", ".hdf5")
    try:
        with stdout_to_stderr():
            model = keras.saving.load_model(str(path), compile=False, safe_mode=not spec.trust,
                                            custom_objects=h5_custom_objects(keras) if legacy_h5 else None)
    except ValueError as e:
        text = str(e)
        if "safe_mode" in text or "unsafe" in text.lower() or "Lambda" in text:
            raise UnsafeInputError(f"Keras refused to load: {tf_reason(e)}", path=path,
                                   hint="pass --trust only if you trust the file") from None
        raise BadInputError(f"cannot load the Keras model: {tf_reason(e)}", path=path) from None
    except Exception as e:
        raise BadInputError(f"truncated or not a Keras model: {tf_reason(e)}", path=path) from None
    fmt = "keras archive" if path.suffix.lower() == ".keras" else "keras h5"
    return model, fmt


def load_json(keras, path: Path, spec):
    """MMdnn's Keras form: an architecture JSON (`model.to_json()`, Keras 3 or Keras 2 / tf.keras)
    with its weights in an HDF5 file (`-iw`: Keras 2's `save_weights` layout, or Keras 3's
    `.weights.h5`, whatever the file is called). The JSON was screened like any Keras config."""
    import shutil
    import tempfile

    import h5py

    weights = spec.options.get("weights")
    if not weights:
        raise BadInputError("a Keras architecture JSON needs its weights", path=path, hint="pass the weights file with -iw WEIGHTS.h5")
    weights = check_model_file(weights, kind="Keras weights")
    from keras.src.saving import serialization_lib

    config = keras_safety.read_config(path)
    try:
        with stdout_to_stderr(), serialization_lib.SafeModeScope(not spec.trust):
            try:
                model = keras.models.model_from_json(path.read_text())
            except (TypeError, ValueError):  # a Keras 2 config ('Functional', 'batch_input_shape'): Keras's legacy reader
                from keras.src.legacy.saving import saving_utils

                model = saving_utils.model_from_config(config)
    except Exception as e:
        raise BadInputError(f"cannot build the Keras model from its JSON: {tf_reason(e)}", path=path) from None
    try:
        with h5py.File(weights, "r") as f:
            legacy = "layer_names" in f.attrs
    except OSError as e:
        raise BadInputError(f"truncated or not an HDF5 weights file: {tf_reason(e)}", path=weights) from None
    try:
        with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="modelport-weights-") as tmp:
            # Keras picks the reader by the name: `.weights.h5` is its own layout, any other `.h5` Keras 2's
            named = weights
            if not legacy and not weights.name.endswith(".weights.h5"):
                named = Path(tmp) / "model.weights.h5"
                shutil.copyfile(weights, named)
            elif legacy and not weights.name.endswith((".h5", ".hdf5")) or legacy and weights.name.endswith(".weights.h5"):
                named = Path(tmp) / "model.h5"
                shutil.copyfile(weights, named)
            model.load_weights(str(named))
    except Exception as e:
        raise BadInputError(f"the weights do not fit the architecture {path.name}: {tf_reason(e)}", path=weights) from None
    return model
def h5_custom_objects(keras) -> dict:
    """Keras' own classes that a legacy `.h5` config names without the module they come from.

    An `.h5` config records only class names, looked up among `keras.layers`, so two kinds of
    Keras' own objects do not load back: layers defined inside `keras.applications` (ConvNeXt's
    `LayerScale`, Inception-ResNet's `CustomScaleLayer`) and graph operations (`x + 3.0` in
    MobileNetV3 is recorded as class `Add` called on a tensor and a float, which `keras.layers.Add`
    refuses). The first are mapped to their classes; an operation whose name is also a layer's
    is told apart by its config, which lacks the `trainable`/`dtype` entries every layer writes.
    All of these are Keras' own code, so this widens nothing the safety screen allows.
    """
    import importlib
    import inspect
    import pkgutil

    import keras.src.applications as apps
    from keras.src import ops
    from keras.src.ops.operation import Operation

    found: dict = {}
    for mod in pkgutil.iter_modules(apps.__path__):
        if mod.name.endswith("_test"):
            continue
        module = importlib.import_module(f"{apps.__name__}.{mod.name}")
        for name, cls in vars(module).items():
            if (inspect.isclass(cls) and cls.__module__ == module.__name__ and issubclass(cls, keras.layers.Layer)
                    and not issubclass(cls, keras.Model)):
                found[name] = cls
    for module in (ops.numpy, ops.nn, ops.math, ops.core, ops.image, ops.linalg):
        for name, cls in vars(module).items():
            if not (inspect.isclass(cls) and issubclass(cls, Operation) and cls.__module__ == module.__name__):
                continue
            layer = getattr(keras.layers, name, None)
            if layer is None:
                found.setdefault(name, cls)
            elif inspect.isclass(layer) and name not in found:
                found[name] = _layer_or_operation(layer, cls)
    return found


def _layer_or_operation(layer, operation):
    """A stand-in for a class name shared by a layer and an operation: builds whichever the config is."""

    class LayerOrOperation:
        @classmethod
        def from_config(cls, config):
            if "trainable" in config or "dtype" in config:
                return layer.from_config(config)
            return operation.from_config(config)

    LayerOrOperation.__name__ = layer.__name__
    return LayerOrOperation


def _layer_name(tensor, default: str) -> str:
    history = getattr(tensor, "_keras_history", None)
    op = getattr(history, "operation", None)
    return getattr(op, "name", None) or getattr(tensor, "name", None) or default


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if n in seen:
            seen[n] += 1
            n = f"{n}_{seen[n]}"
        else:
            seen[n] = 0
        out.append(n)
    return out


def output_names(model, outputs) -> list[str]:
    """Names for the flattened outputs: dict keys (sorted, as tf.nest flattens), else layer names."""
    import tensorflow as tf

    flat = tf.nest.flatten(outputs)
    if isinstance(outputs, dict):
        return [str(k) for k in sorted(outputs)]
    layers = [_layer_name(t, f"output_{i}") for i, t in enumerate(getattr(model, "outputs", None) or [])]
    if len(layers) == len(flat):
        return _unique(layers)
    return ["output"] if len(flat) == 1 else [f"output_{i}" for i in range(len(flat))]


def parse(source, spec) -> IRModel:
    import numpy as np


    model, how = load(source, spec)
    tf = import_tf()
    path = tf_common.source_path(source) if not isinstance(source, str) or not source.startswith("zoo:") else None
    keras_inputs = list(getattr(model, "inputs", None) or [])
    if not keras_inputs:
        raise BadInputError("the Keras model has no defined inputs", path=path,
                            hint="build it on keras.Input(...) (a Sequential model needs an Input layer)")
    orig_names = _unique([_layer_name(t, f"input_{i}") for i, t in enumerate(keras_inputs)])
    graph_specs = [tf_common.spec_from_tf(n, list(t.shape), t.dtype) for n, t in zip(orig_names, keras_inputs, strict=True)]
    specs = tf_common.merge_inputs(graph_specs, spec, path)
    sample = make_inputs(specs, spec.sample_dims, seed=spec.seed, given=spec.given, path=spec.path)
    structure = getattr(model, "input", None)

    def pack(xs):
        if len(xs) == 1 and not isinstance(structure, (dict, list, tuple)):
            return xs[0]
        return tf.nest.pack_sequence_as(structure, list(xs)) if structure is not None else list(xs)

    signature = [tf.TensorSpec([None if isinstance(d, str) else d for d in s.shape], tf.as_dtype(s.dtype), name=s.name)
                 for s in specs]

    @tf.function(input_signature=signature)
    def serve(*xs):
        return model(pack(xs), training=False)

    with stdout_to_stderr():
        try:
            concrete = serve.get_concrete_function()
        except Exception as e:
            raise BadInputError(f"cannot trace the Keras model on inputs {[s.shape for s in specs]}: {tf_reason(e)}",
                                path=path) from None
        names = tf_common.rename_outputs(output_names(model, concrete.structured_outputs), spec, path)
        try:
            predicted = model.predict(pack([sample[s.name] for s in specs]), verbose=0)
        except Exception as e:
            raise BadInputError(f"Keras predict failed on the sample inputs: {tf_reason(e)}", path=path) from None
    ref = {n: np.asarray(v) for n, v in zip(names, tf.nest.flatten(predicted), strict=True)}

    def predict(feeds):
        with stdout_to_stderr():
            out = model.predict(pack([feeds[s.name] for s in specs]), verbose=0)
        return {n: np.asarray(v) for n, v in zip(names, tf.nest.flatten(out), strict=True)}

    varies, extra, skipped = reference_samples(predict, specs, sample, ref, spec.sample_dims, seed=spec.seed,
                                               given=spec.given, path=spec.path, **spec.sampling)
    graph_def, in_names, out_names = tf_common.freeze(concrete, path)
    tf_common.screen_ops(graph_def, trust=spec.trust, path=path)
    renames = {**dict(zip(in_names, [s.name for s in specs], strict=True)), **dict(zip(out_names, names, strict=True))}
    onnx_model = tf_common.graphdef_to_onnx(graph_def, in_names, out_names, renames, opset=spec.opset, path=path)
    out_shapes = {n: list(t.shape) for n, t in zip(names, concrete.outputs, strict=True)}
    import keras

    src = str(path) if path else (source if isinstance(source, str) else type(model).__name__)
    return tf_common.build_ir(
        onnx_model, specs, out_shapes, sample, ref, producer=f"keras {keras.__version__} predict",
        provenance={"framework": "keras", "format": how, "path": src, "model_name": getattr(model, "name", None),
                    "tensorflow": tf.__version__, "reference_varies": varies, "samples_skipped": skipped or None},
        extra=extra, spec=spec, path=path,
    )


def inspect(path: Path) -> dict:
    """Layers, inputs and outputs of a Keras file, read from its config without loading it."""
    from collections import Counter

    path = check_model_file(path, kind="Keras model")
    config = keras_safety.read_config(path)
    layers: Counter = Counter()
    inputs = []

    def walk(node):
        if isinstance(node, dict):
            cls = node.get("class_name")
            inner = node.get("config")
            if isinstance(cls, str) and isinstance(inner, dict) and "name" in inner:
                layers[cls] += 1
                if cls == "InputLayer":
                    shape = inner.get("batch_shape") or inner.get("batch_input_shape") or []
                    inputs.append({"name": inner["name"], "dtype": inner.get("dtype"),
                                   "shape": ["batch" if d is None and i == 0 else d for i, d in enumerate(shape)]})
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(config.get("config", {}))
    inner = config.get("config", {}) if isinstance(config.get("config"), dict) else {}
    outs = inner.get("output_layers") or []
    unsafe = list(dict.fromkeys(keras_safety.find_unsafe(config)))
    info = {
        "format": "keras archive" if path.suffix.lower() == ".keras" else "keras h5",
        "model_class": config.get("class_name"),
        "inputs": inputs,
        "outputs": [{"name": o[0]} for o in outs if isinstance(o, list) and o] if outs else None,
        "layers": sum(layers.values()),
        "ops": dict(layers.most_common()),
        "size": path.stat().st_size,
    }
    if unsafe:
        info["refused_without_trust"] = unsafe
    return info
