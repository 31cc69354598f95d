"""What the TensorFlow-family parsers share: a quiet TensorFlow import, TF → IR tensor specs,
a graph op screen, tf2onnx conversion of a concrete function or a frozen GraphDef, and the
IRModel assembly.

TensorFlow and tf2onnx are imported inside these functions only (about 4 s), never when the CLI
starts. TensorFlow's C++ logs are silenced through TF_CPP_MIN_LOG_LEVEL, and anything printed on
stdout while TensorFlow or tf2onnx works is sent to stderr, so `--json` output stays one document.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

from modelport.deps import require
from modelport.errors import BadInputError, ModelportError, UnsafeInputError, UnsupportedError
from modelport.frameworks.tensorflow import import_tf, stdout_to_stderr, tf_reason  # noqa: F401  (parsers import them from here)
from modelport.ir import IRModel, Reference, TensorSpec, guess_layout, specs_from_onnx
from modelport.onnxfile.ir_version_fit import fit_ir_version
from modelport.parsers import SourceSpec
from modelport.parsers.contract import merge_specs
from modelport.parsers.onnx import convert_opset, infer_and_check
from modelport.run.progress import doing
from modelport.runtimes.isolated import CONVERT_TIMEOUT_S, call_in_child, timeout_for


@dataclass(frozen=True)
class TFSourceOptions:
    """The TensorFlow-family parsers' own options (SavedModel, frozen GraphDef, Keras, TFLite)."""

    signature: str | None = None  # SavedModel/TFLite signature (default serving_default)
    input_names: tuple[str, ...] = ()  # new names for the model's inputs, in order
    weights: str | None = None  # the weights file of a Keras architecture JSON (MMdnn's -in model.json -iw weights.h5)

    def __post_init__(self):
        names = (self.input_names,) if isinstance(self.input_names, str) else tuple(self.input_names or ())
        object.__setattr__(self, "input_names", tuple(n.strip() for item in names for n in item.split(",") if n.strip()))
        if self.weights is not None:
            object.__setattr__(self, "weights", str(self.weights))

    def spec_options(self) -> dict:
        """The SourceSpec.options entries the parsers read (only those given)."""
        return {k: v for k, v in (("signature", self.signature), ("input_names", list(self.input_names)),
                                  ("weights", self.weights)) if v}


# Ops that touch the file system or run Python: a model that needs them is a program, not data.
UNSAFE_OPS = {
    "WriteFile", "ReadFile", "MatchingFiles", "PyFunc", "PyFuncStateless", "EagerPyFunc",
    "Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2", "RestoreSlice", "MergeV2Checkpoints",
    "PrintV2", "Print", "ImmutableConst", "WholeFileReader", "WholeFileReaderV2", "FixedLengthRecordDataset",
    "TFRecordDataset", "TextLineDataset", "WriteSummary", "CreateSummaryFileWriter", "DebugIdentityV2",
}
LAYOUT_BY_RANK = {4: "NHWC", 5: "NDHWC", 2: "NC"}


def import_tf2onnx():

    with stdout_to_stderr():
        tf2onnx = require("tf2onnx", purpose="converting TensorFlow models to ONNX")
    logging.getLogger("tf2onnx").setLevel(logging.ERROR)
    return tf2onnx


def parse_proto(message, path: Path, reason: str):
    """Decode `path` into the protobuf `message`; a decoding failure is exit 2, `reason: <error>`."""
    from google.protobuf.message import DecodeError

    try:
        message.ParseFromString(path.read_bytes())
    except (DecodeError, ValueError, RuntimeError) as e:
        raise BadInputError(f"{reason}: {tf_reason(e)}", path=path) from None
    return message


def plain_name(name: str) -> str:
    """TensorFlow tensor name without the output index: 'x:0' -> 'x'."""
    base, sep, index = name.rpartition(":")
    return base if sep and index.isdigit() else name


def symbolic_shape(name: str, dims) -> list:
    """A TF shape as an IR shape: an unknown first dim is 'batch', any other 'NAME_dimI'."""
    shape: list = []
    for i, d in enumerate(dims):
        if d is None or (isinstance(d, int) and d < 0):
            shape.append("batch" if i == 0 else f"{name}_dim{i}")
        else:
            shape.append(int(d))
    return shape


def tf_layout(shape: list, dtype: str) -> str | None:
    """TensorFlow's convention is channels-last: rank-4 image inputs are NHWC, kept as they are."""
    if not dtype.startswith(("float", "bfloat")):
        return "NT" if len(shape) == 2 else None  # token ids and the like
    return LAYOUT_BY_RANK.get(len(shape)) or guess_layout(shape)


def spec_from_tf(name: str, shape, dtype) -> TensorSpec:
    """An IR TensorSpec from a TF shape (list with None) and a tf.DType or numpy dtype."""
    import numpy as np

    np_dtype = getattr(dtype, "as_numpy_dtype", dtype)
    dt = "bool" if np_dtype is bool else np.dtype(np_dtype).name
    if dt == "object" or dt.startswith(("str", "bytes")):
        raise UnsupportedError(f"input '{name}' is a string tensor; ONNX conversion needs numeric inputs")
    dims = [None if d is None else int(d) for d in shape] if shape is not None else []
    sym = symbolic_shape(name, dims)
    return TensorSpec(name=name, dtype=dt, shape=sym, layout=tf_layout(sym, dt))


def graph_ops(graph_def) -> Counter:
    """Op histogram of a GraphDef, its function library included."""
    ops = Counter(n.op for n in graph_def.node)
    for f in graph_def.library.function:
        ops.update(n.op for n in f.node_def)
    return ops


def screen_ops(graph_def, *, trust: bool, path=None) -> None:
    """Refuse graphs with file-system or Python ops before anything runs them."""
    bad = sorted(set(graph_ops(graph_def)) & UNSAFE_OPS)
    if bad and not trust:
        raise UnsafeInputError(
            f"the graph holds ops that read or write files or run Python: {', '.join(bad)}",
            path=path, hint="pass --trust only if you trust the model",
        )


def freeze(concrete_func, path=None):
    """A frozen GraphDef of a concrete function (variables folded into constants)."""
    tf = import_tf()
    import_tf2onnx()
    from tf2onnx import tf_loader

    # the graph's inputs are the caller's followed by its captures (variables, and plain tensors such
    # as a Keras Normalization layer's mean and variance), which freezing turns into constants
    user_inputs = concrete_func.inputs[:len(concrete_func.inputs) - len(concrete_func.captured_inputs)]
    in_names = [t.name for t in user_inputs if t.dtype != tf.resource]
    out_names = [t.name for t in concrete_func.outputs if t.dtype != tf.resource]
    try:
        with stdout_to_stderr():
            graph_def = tf_loader.from_function(concrete_func, in_names, out_names)
            graph_def = inline_compiled_functions(graph_def, in_names, out_names)
    except Exception as e:
        raise BadInputError(f"cannot freeze the TensorFlow graph: {tf_reason(e)}", path=path) from None
    return graph_def, in_names, out_names


CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")
NO_INLINE_ATTRS = ("_XlaMustCompile", "_noinline")


def inline_compiled_functions(graph_def, in_names: list[str], out_names: list[str]):
    """The graph with calls to XLA-compiled functions inlined, which freezing leaves as calls.

    Keras' TensorFlow backend runs a grouped convolution (ConvNeXt's depthwise `Conv2D(groups=C)`)
    in a `tf.function(jit_compile=True)`, because TensorFlow's CPU kernels lack it; grappler never
    inlines a function marked for XLA, and tf2onnx cannot convert the call. Without the marks the
    body inlines into a plain `Conv2D` over grouped filters, which tf2onnx converts.
    """
    tf = import_tf()
    from tf2onnx import tf_loader

    calls = [n for n in graph_def.node if n.op in CALL_OPS and any(a in n.attr for a in NO_INLINE_ATTRS)]
    if not calls:
        return graph_def
    for node in calls:
        for attr in NO_INLINE_ATTRS:
            node.attr.pop(attr, None)
    for fn in graph_def.library.function:
        for attr in NO_INLINE_ATTRS:
            fn.attr.pop(attr, None)
    with tf.Graph().as_default():
        return tf_loader.tf_optimize(in_names, out_names, graph_def)


def graphdef_to_onnx(graph_def, in_names: list[str], out_names: list[str], renames: dict[str, str], *,
                     opset: int | None, path=None):
    """tf2onnx on a frozen GraphDef; ops tf2onnx cannot convert are listed in one error."""
    import_tf()
    tf2onnx = import_tf2onnx()

    try:
        with stdout_to_stderr(), doing("tf2onnx"), optimizers_collecting():
            model, _ = tf2onnx.convert.from_graph_def(
                graph_def, input_names=in_names, output_names=out_names, opset=opset, tensors_to_rename=renames,
                custom_op_handlers=extra_handlers(),
            )
    except Exception as e:
        raise UnsupportedError(f"tf2onnx failed: {tf_reason(e)}", path=path) from None
    check_converted(model, path)
    return model


@contextlib.contextmanager
def optimizers_collecting():
    """tf2onnx's graph optimizers, each started on a full garbage collection.

    tf2onnx's `optimize_graph` deep-copies the whole ONNX graph, its constants included, before
    each of its dozen optimizers (and again, round after round, until none changes anything), so
    that a failing optimizer can be skipped. The graph a copy replaces is a reference cycle (each
    node points at its graph) that only a full collection frees, and Python's collections, counted
    in objects, seldom run one here: a few hundred nodes hold the weights in a few large arrays.
    Converting ResNet50 (100 MB of weights) piled up 3.5 to 5 GB of dead copies that way.
    The objects alive before the conversion (TensorFlow's, the source model's) are frozen out of
    these collections (`gc.freeze`), so each one walks only the conversion's own objects.
    """
    from tf2onnx import optimizer

    listed = getattr(optimizer, "_get_optimizers", None)
    if listed is None:  # a tf2onnx whose optimizer table is not where 1.16-1.17 keep it
        yield
        return

    def collecting(factory):
        def start():
            gc.collect()
            return factory()
        return start

    frozen = gc.get_freeze_count() > 0  # someone else's freeze: theirs to undo
    gc.collect()
    if not frozen:
        gc.freeze()
    optimizer._get_optimizers = lambda: OrderedDict((name, collecting(f)) for name, f in listed().items())
    try:
        yield
    finally:
        optimizer._get_optimizers = listed
        if not frozen:
            gc.unfreeze()


def _erfc(ctx, node, name, args):
    """Erfc(x) = 1 - Erf(x). Keras 3's exact GELU is built on Erfc, which tf2onnx 1.17 lacks."""
    import numpy as np
    from tf2onnx import utils

    node.type = "Erf"
    np_type = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.output[0]))
    one = ctx.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype=np_type))
    ctx.insert_new_node_on_output("Sub", node.output[0], name=utils.make_name(f"{name}_sub"),
                                  inputs=[one.output[0], node.output[0]])


def extra_handlers() -> dict:
    """Conversions tf2onnx is missing, as its custom op handlers: {tf op: (handler, args)}."""
    return {"Erfc": (_erfc, [])}


def check_converted(model, path=None) -> None:
    """tf2onnx keeps ops it cannot convert as TensorFlow ops; name every one with its count."""
    import onnx.defs

    missing: Counter = Counter()
    for node in model.graph.node:
        domain = node.domain or ""
        if domain in ("", "ai.onnx", "ai.onnx.ml", "com.microsoft"):
            if domain in ("", "ai.onnx", "ai.onnx.ml") and not onnx.defs.has(node.op_type, domain):
                missing[node.op_type] += 1
        else:
            missing[f"{domain}::{node.op_type}"] += 1
    if missing:
        listed = ", ".join(f"{op} ({n})" for op, n in missing.most_common())
        raise UnsupportedError(
            f"tf2onnx could not convert these TensorFlow ops: {listed}", path=path,
            hint="see docs/tensorflow.md for workarounds",
        )


def rename_values(model, mapping: dict[str, str]) -> None:
    """Rename graph values in place (inputs, outputs, node references); identical names are skipped."""
    mapping = {k: v for k, v in mapping.items() if k != v}
    if not mapping:
        return
    g = model.graph
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.name in mapping:
            v.name = mapping[v.name]
    for node in g.node:
        for i, n in enumerate(node.input):
            if n in mapping:
                node.input[i] = mapping[n]
        for i, n in enumerate(node.output):
            if n in mapping:
                node.output[i] = mapping[n]


def set_dims(values, specs: list[TensorSpec]) -> None:
    """Write the specs' symbolic dims onto ONNX graph inputs/outputs (tf2onnx names them unk__N)."""
    by_name = {s.name: s for s in specs}
    for v in values:
        s = by_name.get(v.name)
        if s is None:
            continue
        dims = v.type.tensor_type.shape.dim
        if len(dims) != len(s.shape):
            continue
        for d, want in zip(dims, s.shape, strict=True):
            if isinstance(want, str):
                d.dim_param = want
            elif not d.HasField("dim_value"):
                d.dim_value = want


def output_specs(model, tf_shapes: dict[str, list] | None, has_batch: bool) -> list[TensorSpec]:
    """The ONNX graph's outputs, with tf2onnx's unk__N dims renamed after the TF shapes."""
    outs = specs_from_onnx(model.graph.output)
    for o in outs:
        tf_shape = (tf_shapes or {}).get(o.name)
        shape = []
        for i, d in enumerate(o.shape):
            if isinstance(d, str) and d.startswith("unk__"):
                d = "batch" if i == 0 and has_batch else f"{o.name}_dim{i}"
            elif isinstance(d, str) and tf_shape and i < len(tf_shape) and tf_shape[i] is not None:
                d = int(tf_shape[i])
            shape.append(d)
        o.shape = shape
        o.layout = "NC" if len(shape) == 2 else None
    set_dims(model.graph.output, outs)
    return outs


def merge_inputs(graph_specs: list[TensorSpec], spec, path=None) -> list[TensorSpec]:
    """Graph input specs, renamed by `--input-names`, then merged with the user's --input specs.

    User specs may name an input by its original or its new name, or by position.
    """

    new_names = spec.options.get("input_names")
    renamed: dict[str, str] = {}
    if new_names:
        if len(new_names) != len(graph_specs):
            raise BadInputError(
                f"--input-names gives {len(new_names)} names, the model has {len(graph_specs)} inputs: "
                f"{[s.name for s in graph_specs]}", path=path,
            )
        for s, n in zip(graph_specs, new_names, strict=True):
            renamed[s.name] = n
            s.name = n
    for u in spec.inputs:
        if u.name in renamed:
            u.name = renamed[u.name]
        elif u.name not in {s.name for s in graph_specs} and plain_name(u.name) in renamed:
            u.name = renamed[plain_name(u.name)]
    return merge_specs(graph_specs, spec.inputs, fixed=True)


def rename_outputs(names: list[str], spec, path=None) -> list[str]:
    """The model's output names, or the user's `--outputs` names in order."""
    wanted = spec.output_names
    if not wanted:
        return names
    if len(wanted) != len(names):
        raise BadInputError(f"--outputs gives {len(wanted)} names, the model has {len(names)} outputs: {names}", path=path)
    return list(wanted)


def build_ir(model, inputs: list[TensorSpec], output_tf_shapes: dict[str, list] | None, sample: dict,
             ref_outputs: dict, *, producer: str, provenance: dict, spec, path=None, extra=None) -> IRModel:
    """Shape inference + checker, symbolic dims on the graph, and the IRModel with references."""
    import numpy as np


    fit_ir_version(model)
    set_dims(model.graph.input, inputs)
    if spec.opset:
        model = convert_opset(model, spec.opset, path)
    model = infer_and_check(model, path)
    graph_in = {s.name: s for s in specs_from_onnx(model.graph.input)}
    for s in inputs:
        if s.name not in graph_in:
            raise BadInputError(f"input '{s.name}' is not in the converted graph: {sorted(graph_in)}", path=path)
    has_batch = any("batch" in s.shape for s in inputs)
    outputs = output_specs(model, output_tf_shapes, has_batch)
    missing = [o.name for o in outputs if o.name not in ref_outputs]
    if missing:
        raise BadInputError(f"outputs {missing} have no reference values; the model gives {sorted(ref_outputs)}", path=path)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    import tf2onnx

    provenance = {**provenance, "opset": opset, "exporter": f"tf2onnx {tf2onnx.__version__}"}
    return IRModel(
        model=model, inputs=inputs, outputs=outputs, provenance=provenance,
        reference=Reference(sample, {o.name: np.asarray(ref_outputs[o.name]) for o in outputs}, producer=producer,
                            extra=[replace(s, outputs={o.name: s.outputs[o.name] for o in outputs},
                                           nudged={o.name: s.nudged[o.name] for o in outputs} if s.nudged else None)
                                   for s in extra or []]),
        sample_dims=dict(spec.sample_dims),
    )


def source_path(source) -> Path | None:
    return Path(source) if isinstance(source, (str, Path)) else None


def spec_to_dict(spec) -> dict:
    """A SourceSpec as JSON, for a parser running in a child process."""
    return {
        "path": str(spec.path) if spec.path is not None else None, "framework": spec.framework,
        "inputs": [s.to_dict() for s in spec.inputs], "output_names": spec.output_names, "arch": spec.arch,
        "arch_args": dict(spec.arch_args), "state_dict_key": spec.state_dict_key,
        "trust": spec.trust, "opset": spec.opset, "sample_dims": dict(spec.sample_dims), "seed": spec.seed,
        "options": dict(spec.options), "sampling": dict(spec.sampling),
        "given": {k: {"dtype": str(v.dtype), "shape": list(v.shape), "values": v.ravel().tolist()} for k, v in spec.given.items()},
    }


def spec_from_dict(d: dict):
    import numpy as np


    return SourceSpec(
        path=Path(d["path"]) if d.get("path") else None, framework=d.get("framework"),
        inputs=[TensorSpec.from_dict(s) for s in d.get("inputs", [])], output_names=d.get("output_names"),
        arch=d.get("arch"), arch_args=dict(d.get("arch_args") or {}), state_dict_key=d.get("state_dict_key"),
        trust=bool(d.get("trust")), opset=d.get("opset"), sample_dims=dict(d.get("sample_dims") or {}),
        seed=int(d.get("seed", 0)), options=dict(d.get("options") or {}),
        sampling=dict(d.get("sampling") or {"randoms": 3, "structured": True}),
        given={k: np.asarray(v["values"], dtype=v["dtype"]).reshape(v["shape"]) for k, v in (d.get("given") or {}).items()},
    )


def parse_in_child(work: Path, request: dict) -> dict:
    """Child side of `parse_isolated`: run the parser's in-process `parse_here`, save the IR."""
    import importlib

    spec = spec_from_dict(request["spec"])
    parse_here = importlib.import_module(request["module"]).parse_here
    ir = parse_here(request["source"], spec)
    ir.save(work / "ir")
    return {"producer": ir.reference.producer if ir.reference else "", "spec": spec_to_dict(spec)}


def parse_isolated(module: str, source, spec, *, path: Path, what: str) -> IRModel:
    """Run `module.parse_here(source, spec)` in a child process with a timeout; return its IR.

    TensorFlow's graph import and execution may abort on a hostile graph (CHECK failures are not
    treated as vulnerabilities by TensorFlow's security policy): a child killed by a signal or
    overrunning becomes exit 2 naming the signal, and nothing is written. Errors the parser raises
    come back with their class and exit code. One child per conversion; the parent never imports
    TensorFlow for it.
    """

    request = {"module": module, "source": str(Path(source).resolve()), "spec": spec_to_dict(spec)}

    def collect(work: Path, response: dict) -> IRModel:
        ir = IRModel.load(work / "ir")
        if ir.reference is not None:
            ir.reference.producer = response.get("producer", "")
        back = spec_from_dict(response["spec"])
        spec.inputs, spec.output_names = back.inputs, back.output_names
        return ir

    return call_in_child("modelport.parsers.tf_common:parse_in_child", request, path=path,
                         timeout=timeout_for(CONVERT_TIMEOUT_S), what=what, collect=collect, unexpected=ModelportError)
