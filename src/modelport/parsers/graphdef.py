"""Frozen TensorFlow GraphDefs (`.pb`): the TF1-era format tf2onnx reads with node names given.

`--inputs` names the graph's input tensors (`x:0` or `x`, optionally with a shape and dtype, as
in `--inputs x:0:batch,28,28,1`) and `--outputs` its output tensors; both are required, as for
tf2onnx. The ONNX names drop the `:0`. The protobuf is decoded and screened for file and Python
ops before anything runs; references come from TensorFlow running the pruned graph. All of it, and
the tf2onnx conversion, runs in one child process with a timeout (a TensorFlow abort on a hostile
graph becomes exit 2 naming the signal).
"""

from __future__ import annotations

from pathlib import Path

from modelport.errors import BadInputError
from modelport.ir import IRModel
from modelport.parsers import tf_common
from modelport.parsers.tf_common import graph_ops, import_tf, parse_isolated, parse_proto, plain_name, stdout_to_stderr, tf_reason
from modelport.reference.sample_sets import reference_samples
from modelport.reference.samples import make_inputs
from modelport.run.file_checks import check_model_file

NAME = "graphdef"
DESCRIPTION = "frozen TensorFlow GraphDef (.pb) with --inputs/--outputs tensor names"


def sniff(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".pb" and path.name != "saved_model.pb"


def tensor_name(name: str) -> str:
    """'x' -> 'x:0'; 'x:0' stays."""
    return name if plain_name(name) != name else f"{name}:0"


def read_graph_def(path: Path):
    path = check_model_file(path, kind="GraphDef")
    tf = import_tf()
    graph_def = parse_proto(tf.compat.v1.GraphDef(), path, "truncated or not a GraphDef")
    if not graph_def.node:
        raise BadInputError("the GraphDef has no nodes (truncated or not a GraphDef)", path=path)
    return graph_def


def placeholders(graph_def) -> list[str]:
    return [n.name for n in graph_def.node if n.op in ("Placeholder", "PlaceholderWithDefault")]


def parse(source, spec) -> IRModel:
    """Decode, screen, run and convert the GraphDef in one child process (see parse_isolated)."""

    path = check_model_file(Path(source), kind="GraphDef")
    return parse_isolated(__name__, path, spec, path=path, what="the GraphDef conversion")


def parse_here(source, spec) -> IRModel:
    """The conversion itself, in this process: what the child of `parse` runs."""
    import numpy as np


    path = Path(source)
    graph_def = read_graph_def(path)
    tf_common.screen_ops(graph_def, trust=spec.trust, path=path)
    if not spec.inputs or not spec.output_names:
        found = placeholders(graph_def)
        raise BadInputError(
            "a GraphDef needs --inputs and --outputs tensor names", path=path,
            hint=f"placeholders in the graph: {found[:10]}; e.g. --inputs {found[0] if found else 'x'}:0 --outputs NAME:0",
        )
    tf = import_tf()

    def body():
        tf.compat.v1.import_graph_def(graph_def, name="")

    try:
        with stdout_to_stderr():
            wrapped = tf.compat.v1.wrap_function(body, [])
            graph = wrapped.graph
            in_tensors = [graph.get_tensor_by_name(tensor_name(s.name)) for s in spec.inputs]
            out_tensors = [graph.get_tensor_by_name(tensor_name(n)) for n in spec.output_names]
    except (KeyError, ValueError) as e:
        raise BadInputError(f"{tf_reason(e)}; placeholders: {placeholders(graph_def)[:10]}", path=path) from None
    except Exception as e:
        raise BadInputError(f"cannot import the GraphDef: {tf_reason(e)}", path=path) from None
    in_names = [t.name for t in in_tensors]
    out_names = [t.name for t in out_tensors]
    graph_specs = [tf_common.spec_from_tf(plain_name(t.name), t.shape.as_list() if t.shape.rank is not None else [], t.dtype)
                   for t in in_tensors]
    for g, u in zip(graph_specs, spec.inputs, strict=True):
        u.name = g.name  # the user named tensors; the IR names drop ':0'
        if not g.shape and not u.shape:
            raise BadInputError(f"input '{g.name}' has no shape in the graph", path=path, hint=f"give one: --inputs {g.name}:0:1,224,224,3")
    specs = tf_common.merge_inputs(graph_specs, spec, path)
    names = [plain_name(n) for n in out_names]
    spec.output_names = None  # they were TF tensor names, not renames
    sample = make_inputs(specs, spec.sample_dims, seed=spec.seed, given=spec.given, path=spec.path)
    def call(sample):
        with stdout_to_stderr():
            result = pruned(*[tf.constant(sample[s.name]) for s in specs])
        return {n: np.asarray(v) for n, v in zip(names, tf.nest.flatten(result), strict=True)}

    try:
        with stdout_to_stderr():
            pruned = wrapped.prune(in_tensors, out_tensors)
        ref = call(sample)
    except Exception as e:
        raise BadInputError(f"TensorFlow cannot run the graph on the sample inputs: {tf_reason(e)}", path=path) from None
    varies, extra, skipped = reference_samples(call, specs, sample, ref, spec.sample_dims, seed=spec.seed,
                                               given=spec.given, path=spec.path, **spec.sampling)
    renames = {**dict(zip(in_names, [s.name for s in specs], strict=True)), **dict(zip(out_names, names, strict=True))}
    model = tf_common.graphdef_to_onnx(graph_def, in_names, out_names, renames, opset=spec.opset, path=path)
    out_shapes = {n: t.shape.as_list() if t.shape.rank is not None else None for n, t in zip(names, out_tensors, strict=True)}
    return tf_common.build_ir(
        model, specs, out_shapes, sample, ref, producer=f"tensorflow {tf.__version__} graph",
        provenance={"framework": "tensorflow", "format": "graphdef", "path": str(path), "tensorflow": tf.__version__,
                    "reference_varies": varies, "samples_skipped": skipped or None},
        extra=extra, spec=spec, path=path,
    )


def inspect(path: Path) -> dict:
    """Placeholders, op histogram and constant sizes of a GraphDef, without running it."""

    graph_def = read_graph_def(Path(path))
    inputs = []
    for n in graph_def.node:
        if n.op in ("Placeholder", "PlaceholderWithDefault"):
            shape = n.attr["shape"].shape
            dims = None if shape.unknown_rank else [d.size if d.size >= 0 else "?" for d in shape.dim]
            from tensorflow.core.framework import types_pb2

            inputs.append({"name": f"{n.name}:0", "dtype": types_pb2.DataType.Name(n.attr["dtype"].type).replace("DT_", "").lower(),
                           "shape": dims})
    consumed = {i.split(":")[0].lstrip("^") for n in graph_def.node for i in n.input}
    outputs = [{"name": f"{n.name}:0"} for n in graph_def.node if n.name not in consumed and n.op not in ("Const", "NoOp")]
    return {
        "format": "graphdef",
        "inputs": inputs,
        "outputs": outputs,
        "nodes": len(graph_def.node),
        "ops": dict(graph_ops(graph_def).most_common()),
        "size": Path(path).stat().st_size,
    }
