"""TensorFlow SavedModel folders (`saved_model.pb` + `variables/`), e.g. from Keras `model.export(dir)`.

One signature is converted: `--signature NAME` (default `serving_default`, or the only one there
is). Its input names are the signature's keyword names (`--input-names` renames them); its
outputs are the signature's output keys, in the sorted order TensorFlow flattens them. The
saved_model.pb is decoded before TensorFlow loads the folder, and the signature's graph is
screened for file and Python ops before it runs. References come from calling the signature.
All of that, and the tf2onnx conversion, runs in one child process with a timeout: TensorFlow may
abort on a hostile graph, and then the run ends with exit 2 naming the signal.
"""

from __future__ import annotations

from pathlib import Path

from modelport.errors import BadInputError
from modelport.frameworks.savedmodel import folder_of, load  # noqa: F401  (the parser's own names for them)
from modelport.frameworks.tensorflow import import_tf, stdout_to_stderr, tf_reason
from modelport.ir import IRModel
from modelport.parsers import get_parser, tf_common
from modelport.parsers.tf_common import parse_isolated, parse_proto
from modelport.reference.sample_sets import reference_samples
from modelport.reference.samples import make_inputs

NAME = "savedmodel"
DESCRIPTION = "TensorFlow SavedModel folder (saved_model.pb inside); --signature picks the function"
DEFAULT_SIGNATURE = "serving_default"


def sniff(path: Path) -> bool:
    return (path.is_dir() and (path / "saved_model.pb").is_file()) or (path.is_file() and path.name == "saved_model.pb")


def read_proto(folder: Path):
    """The SavedModel protobuf, decoded; a truncated or foreign file is exit 2."""
    pb = folder / "saved_model.pb"
    if not pb.is_file():
        raise BadInputError("not a SavedModel folder: no saved_model.pb inside", path=folder)
    if pb.stat().st_size == 0:
        raise BadInputError("empty saved_model.pb", path=pb)
    import_tf()
    from tensorflow.core.protobuf import saved_model_pb2

    proto = parse_proto(saved_model_pb2.SavedModel(), pb, "truncated or corrupt saved_model.pb")
    if not proto.meta_graphs:
        raise BadInputError("saved_model.pb holds no meta graph (truncated or not a SavedModel)", path=pb)
    return proto


def signature_names(proto) -> list[str]:
    names: list[str] = []
    for mg in proto.meta_graphs:
        names += [k for k in mg.signature_def if not k.startswith("__")]
    return sorted(set(names))


def choose_signature(available: list[str], wanted: str | None, path=None) -> str:
    if wanted:
        if wanted not in available:
            raise BadInputError(f"no signature '{wanted}'; the SavedModel has {available}", path=path)
        return wanted
    if DEFAULT_SIGNATURE in available:
        return DEFAULT_SIGNATURE
    if len(available) == 1:
        return available[0]
    if not available:
        raise BadInputError("the SavedModel has no signatures to convert", path=path,
                            hint="export it with signatures, e.g. Keras model.export(dir)")
    raise BadInputError(f"the SavedModel has several signatures {available}", path=path, hint="pick one with --signature NAME")


def _other_tf_format(source, spec) -> IRModel:
    """`--from tensorflow` (MMdnn's spelling) on a .pb, .keras/.h5 or .tflite file."""

    for name in ("graphdef", "keras", "tflite"):
        parser = get_parser(name)
        if parser.sniff(Path(source)):
            return parser.parse(source, spec)
    raise BadInputError("not a TensorFlow model: no saved_model.pb, .pb, .keras, .h5 or .tflite", path=source)


def parse(source, spec) -> IRModel:
    """Decode, load, screen, run and convert the SavedModel in one child process (see parse_isolated)."""

    if not sniff(Path(source)):
        return _other_tf_format(source, spec)
    folder = folder_of(Path(source))
    return parse_isolated(__name__, folder, spec, path=folder, what="the SavedModel conversion")


def parse_here(source, spec) -> IRModel:
    """The conversion itself, in this process: what the child of `parse` runs."""
    import numpy as np


    folder = folder_of(Path(source))
    proto = read_proto(folder)
    name = choose_signature(signature_names(proto), spec.options.get("signature"), folder)
    tf = import_tf()
    loaded = load(folder)
    try:
        fn = loaded.signatures[name]
    except KeyError:
        raise BadInputError(f"signature '{name}' did not load; loaded: {sorted(loaded.signatures)}", path=folder) from None
    args, kwargs = fn.structured_input_signature
    flat = [t for t in tf.nest.flatten((args, kwargs)) if isinstance(t, tf.TensorSpec)]
    keys = sorted(kwargs) if kwargs and not args else [t.name for t in flat]
    if len(keys) != len(flat):
        keys = [t.name or f"input_{i}" for i, t in enumerate(flat)]
    graph_specs = [tf_common.spec_from_tf(k, t.shape.as_list() if t.shape.rank is not None else [], t.dtype)
                   for k, t in zip(keys, flat, strict=True)]
    original = [s.name for s in graph_specs]
    specs = tf_common.merge_inputs(graph_specs, spec, folder)

    graph_def, in_names, out_names = tf_common.freeze(fn, folder)
    tf_common.screen_ops(graph_def, trust=spec.trust, path=folder)
    outputs = fn.structured_outputs
    if isinstance(outputs, dict):
        out_keys = sorted(outputs)
    else:
        out_keys = [f"output_{i}" for i in range(len(tf.nest.flatten(outputs)))]
    names = tf_common.rename_outputs(out_keys, spec, folder)

    sample = make_inputs(specs, spec.sample_dims, seed=spec.seed, given=spec.given, path=spec.path)

    def call(sample):
        feeds = {k: tf.constant(sample[s.name]) for k, s in zip(original, specs, strict=True)}
        with stdout_to_stderr():
            result = fn(**feeds) if kwargs and not args else fn(*feeds.values())
        return {n: np.asarray(v) for n, v in zip(names, tf.nest.flatten(result), strict=True)}

    try:
        ref = call(sample)
    except Exception as e:
        raise BadInputError(f"signature '{name}' failed on the sample inputs: {tf_reason(e)}", path=folder) from None
    varies, extra, skipped = reference_samples(call, specs, sample, ref, spec.sample_dims, seed=spec.seed,
                                               given=spec.given, path=spec.path, **spec.sampling)
    renames = {**dict(zip(in_names, [s.name for s in specs], strict=True)), **dict(zip(out_names, names, strict=True))}
    model = tf_common.graphdef_to_onnx(graph_def, in_names, out_names, renames, opset=spec.opset, path=folder)
    out_shapes = {n: t.shape.as_list() if t.shape.rank is not None else None for n, t in zip(names, fn.outputs, strict=True)}
    return tf_common.build_ir(
        model, specs, out_shapes, sample, ref, producer=f"tensorflow {tf.__version__} signature '{name}'",
        provenance={"framework": "tensorflow", "format": "savedmodel", "path": str(folder), "signature": name,
                    "signatures": signature_names(proto), "tensorflow": tf.__version__,
                    "reference_varies": varies, "samples_skipped": skipped or None},
        extra=extra, spec=spec, path=folder,
    )


def inspect(path: Path) -> dict:
    """Signatures (inputs, outputs) and the op histogram of a SavedModel, without running it."""
    from collections import Counter

    folder = folder_of(Path(path))
    proto = read_proto(folder)
    from tensorflow.core.framework import types_pb2

    ops: Counter = Counter()
    signatures = {}
    for mg in proto.meta_graphs:
        gd = mg.graph_def
        ops.update(n.op for n in gd.node)
        for f in gd.library.function:
            ops.update(n.op for n in f.node_def)
        for key, sig in mg.signature_def.items():
            if key.startswith("__"):
                continue

            def tensors(m):
                return [{"name": k, "dtype": types_pb2.DataType.Name(v.dtype).replace("DT_", "").lower(),
                         "shape": [d.size if d.size >= 0 else "?" for d in v.tensor_shape.dim]}
                        for k, v in sorted(m.items())]

            signatures[key] = {"inputs": tensors(sig.inputs), "outputs": tensors(sig.outputs)}
    default = DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in signatures else next(iter(signatures), None)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {
        "format": "savedmodel",
        "tags": [list(mg.meta_info_def.tags) for mg in proto.meta_graphs],
        "signatures": signatures,
        "inputs": signatures.get(default, {}).get("inputs", []),
        "outputs": signatures.get(default, {}).get("outputs", []),
        "ops": dict(ops.most_common()),
        "size": size,
    }
