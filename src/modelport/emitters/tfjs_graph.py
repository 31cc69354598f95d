"""A SavedModel signature written as a TF.js graph model: `model.json` + binary weight shards, the
format `tf.loadGraphModel` reads (tfjs-converter's `graph-model`).

Steps: the signature's concrete function with its variables frozen into constants
(`convert_variables_to_constants_v2`, control flow lowered to the Switch/Merge ops TF.js runs);
grappler's pruning, constant folding, arithmetic and dependency passes on it (the passes
tfjs-converter runs by default); ops TF.js lacks written with ops it has (`Erfc` as `1 - Erf`);
every op checked against the ops TF.js 4.22 can run
(`tfjs_ops.py`: exit 2 naming the others); then each `Const` node's value moved out of the graph
into the weights (the node keeps its dtype and shape, TF.js finds the value by the node's name).

`model.json` holds `format: "graph-model"`, `modelTopology` (the GraphDef as protobuf JSON),
`signature` (a SignatureDef: the signature's input and output keys, here the contract's names, with
the graph tensors they stand for, dtypes and shapes), `weightsManifest` (one group: its shard
files and each weight's name, shape, dtype and, when stored quantised, `quantization`) and
`userDefinedMetadata.modelport`. The weights are concatenated in manifest order and cut into
4 MiB shards (`group1-shard1of2.bin`, ...), as tfjs-converter does. TF.js has no 64-bit types:
int64 constants are stored as int32, float64 as float32 (tfjs-converter's conversion too).

Precisions, for float32 weights of more than one element (scalars, such as epsilons, stay
float32; integer and boolean weights are never quantised):

- `fp32`: stored as is.
- `fp16`: stored as float16 (`quantization: {dtype: "float16"}`), half the bytes; TF.js
  decodes them to float32 at load and computes in float32.
- `uint8`: affine quantisation per tensor, `q = round((w - min) / scale)`, with `min` nudged so
  that 0.0 is exact (TFLite's rule, tfjs-converter's too), stored with `quantization:
  {dtype: "uint8", min, scale}`; a quarter of the bytes, decoded to float32 at load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from modelport.emitters.tfjs_ops import SUPPORTED_OPS, TFJS_VERSION
from modelport.errors import BadInputError, UnsupportedError, one_line
from modelport.version import __version__

FORMAT = "graph-model"
SHARD_BYTES = 4 * 1024 * 1024
GRAPPLER_PASSES = ["pruning", "constfold", "arithmetic", "dependency", "pruning", "constfold", "arithmetic", "dependency"]
# tensor fields of a Const node's value that move to the weights
_VALUE_FIELDS = ("tensor_content", "half_val", "float_val", "double_val", "int_val", "string_val", "scomplex_val",
                 "int64_val", "bool_val", "resource_handle_val", "variant_val", "uint32_val", "uint64_val")
# numpy dtype of a weight -> (the dtype it is stored as, TF.js's dtype name)
_STORED = {"float32": ("float32", "float32"), "float64": ("float32", "float32"), "float16": ("float32", "float32"),
           "int32": ("int32", "int32"), "int64": ("int32", "int32"), "int16": ("int32", "int32"), "int8": ("int32", "int32"),
           "uint8": ("int32", "int32"), "uint16": ("int32", "int32"), "bool": ("bool", "bool")}


def frozen_signature(tf, saved_model: Path, signature: str):
    """(the signature's function with variables frozen, its input keys, its output keys), keys in
    the order of the frozen function's inputs and outputs."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    try:
        loaded = tf.saved_model.load(str(saved_model))
    except Exception as e:
        raise BadInputError(f"not a loadable SavedModel: {one_line(e)}", path=saved_model) from None
    if signature not in loaded.signatures:
        raise BadInputError(f"the SavedModel has no '{signature}' signature (has {list(loaded.signatures)})", path=saved_model)
    fn = loaded.signatures[signature]
    in_specs = tf.nest.flatten(fn.structured_input_signature)
    out_keys = sorted(fn.structured_outputs)  # nest.flatten's order of a dict
    frozen = convert_variables_to_constants_v2(fn)
    if len(frozen.inputs) != len(in_specs) or len(frozen.outputs) != len(out_keys):
        raise UnsupportedError(f"the frozen '{signature}' function has {len(frozen.inputs)} inputs and {len(frozen.outputs)} "
                               f"outputs, its signature {len(in_specs)} and {len(out_keys)}", path=saved_model)
    return loaded, frozen, [s.name for s in in_specs], out_keys


def signature_def(tf, frozen, in_keys: list[str], out_keys: list[str]):
    """A SignatureDef naming the frozen graph's tensors by the signature's keys."""
    from tensorflow.core.protobuf import meta_graph_pb2

    sig = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    for keys, tensors, field in ((in_keys, frozen.inputs, sig.inputs), (out_keys, frozen.outputs, sig.outputs)):
        for key, t in zip(keys, tensors, strict=True):
            info = field[key]
            info.name = t.name
            info.dtype = t.dtype.as_datatype_enum
            info.tensor_shape.CopyFrom(t.shape.as_proto())
    return sig


def optimize(tf, frozen, sig):
    """The frozen graph after grappler's default tfjs-converter passes (signature tensors kept)."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer
    from tensorflow.python.training.saver import export_meta_graph

    graph_def = frozen.graph.as_graph_def()
    meta = export_meta_graph(graph_def=graph_def, graph=frozen.graph)
    meta.signature_def["serving_default"].CopyFrom(sig)
    fetch = meta.collection_def["train_op"].node_list.value
    fetch.extend(sorted({info.name.split(":")[0] for info in sig.outputs.values()}))
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers[:] = GRAPPLER_PASSES
    return tf_optimizer.OptimizeGraph(config, meta)


def rewrite_for_tfjs(tf, graph_def) -> dict[str, int]:
    """Ops TF.js lacks written with ops it has, in place: `Erfc(x)` as `1 - Erf(x)` (Keras's exact
    GELU). Returns op -> nodes rewritten."""
    done: dict[str, int] = {}
    added = []
    for node in graph_def.node:
        if node.op == "Erfc":
            dtype = tf.as_dtype(node.attr["T"].type).as_numpy_dtype
            one = type(node)(name=f"{node.name}/one", op="Const")
            one.attr["dtype"].type = node.attr["T"].type
            one.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.array(1, dtype=dtype)))
            erf = type(node)(name=f"{node.name}/erf", op="Erf", input=list(node.input[:1]), device=node.device)
            erf.attr["T"].CopyFrom(node.attr["T"])
            added += [one, erf]
            node.op = "Sub"
            del node.input[:]
            node.input.extend([one.name, erf.name])
            done["Erfc"] = done.get("Erfc", 0) + 1
    graph_def.node.extend(added)
    return done


def unsupported_ops(graph_def) -> dict[str, list[str]]:
    """op -> the nodes (graph and functions) whose op TF.js cannot run."""

    found: dict[str, list[str]] = {}
    for n in graph_def.node:
        if n.op not in SUPPORTED_OPS:
            found.setdefault(n.op, []).append(n.name)
    for fn in graph_def.library.function:
        for n in fn.node_def:
            if n.op not in SUPPORTED_OPS:
                found.setdefault(n.op, []).append(f"{fn.signature.name}/{n.name}")
    return found


def check_ops(graph_def, path=None) -> None:
    found = unsupported_ops(graph_def)
    if found:
        listed = ", ".join(f"{op} ({len(nodes)}: {nodes[0]}{', ...' if len(nodes) > 1 else ''})" for op, nodes in sorted(found.items()))
        raise UnsupportedError(f"TF.js cannot run {len(found)} op type(s) of this graph: {listed}", path=path,
                               hint="TF.js 4.22 runs the ops of tfjs-converter's op list; convert a model without them")


def _quantise_uint8(w: np.ndarray) -> tuple[np.ndarray, dict]:
    lo, hi = float(w.min()), float(w.max())
    if lo == hi:
        return np.zeros(w.shape, np.uint8), {"min": lo, "scale": 1.0}
    scale = (hi - lo) / 255.0
    if lo <= 0.0 <= hi:  # nudge so that 0.0 is a code: zero padding stays exact
        lo = -round(-lo / scale) * scale
    q = np.round((np.clip(w, lo, lo + 255 * scale) - lo) / scale).astype(np.uint8)
    return q, {"min": lo, "scale": scale}


def extract_weights(tf, graph_def, precision: str) -> tuple[list[dict], list[bytes]]:
    """(manifest entries, their bytes) for every graph-level Const node, its value cleared from the graph."""
    from tensorflow.python.framework import tensor_util

    entries, blobs = [], []
    for node in graph_def.node:
        if node.op != "Const":
            continue
        value = node.attr["value"].tensor
        data = tensor_util.MakeNdarray(value)
        name = np.dtype(data.dtype).name
        if name not in _STORED:
            raise UnsupportedError(f"TF.js cannot hold the {name} constant '{node.name}' (weights are float32, int32 or bool)")
        stored, js_dtype = _STORED[name]
        data = np.ascontiguousarray(data.astype(stored))
        entry = {"name": node.name, "shape": [int(d) for d in data.shape], "dtype": js_dtype}
        if js_dtype == "float32" and data.size > 1 and precision != "fp32":
            if precision == "fp16":
                data = data.astype(np.float16)
                entry["quantization"] = {"dtype": "float16", "original_dtype": "float32"}
            else:
                data, meta = _quantise_uint8(data)
                entry["quantization"] = {"dtype": "uint8", **meta, "original_dtype": "float32"}
        entries.append(entry)
        blobs.append(data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes())
        for field in _VALUE_FIELDS:
            value.ClearField(field)
    return entries, blobs


def write_shards(blobs: list[bytes], out_dir: Path, shard_bytes: int = SHARD_BYTES) -> list[str]:
    data = b"".join(blobs)
    count = max(1, math.ceil(len(data) / shard_bytes))
    names = []
    for i in range(count):
        name = f"group1-shard{i + 1}of{count}.bin"
        (out_dir / name).write_bytes(data[i * shard_bytes:(i + 1) * shard_bytes])
        names.append(name)
    return names


def convert_saved_model(tf, saved_model: Path, out_dir: Path, precision: str = "fp32", *, signature: str = "serving_default",
                        metadata: dict | None = None) -> dict:
    """Write `out_dir/model.json` and its shards from `saved_model`'s `signature`; the details for the report."""
    from google.protobuf import json_format


    _loaded, frozen, in_keys, out_keys = frozen_signature(tf, saved_model, signature)
    sig = signature_def(tf, frozen, in_keys, out_keys)
    graph_def = optimize(tf, frozen, sig)
    rewritten = rewrite_for_tfjs(tf, graph_def)
    check_ops(graph_def)
    entries, blobs = extract_weights(tf, graph_def, precision)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = write_shards(blobs, out_dir)

    model_json = {  # protobuf maps (node attrs, signature keys) in a fixed order: reruns write the same bytes
        "format": FORMAT,
        "generatedBy": tf.__version__,
        "convertedBy": f"modelport {__version__}",
        "signature": _ordered_signature(json_format.MessageToDict(sig), in_keys, out_keys),
        "userDefinedMetadata": {"modelport": {"precision": precision, "signature": signature, "tfjs": TFJS_VERSION,
                                              **(metadata or {})}},
        "modelTopology": _sorted_attrs(json_format.MessageToDict(graph_def)),
        "weightsManifest": [{"paths": shards, "weights": entries}],
    }
    (out_dir / "model.json").write_text(json.dumps(model_json))
    ops: dict[str, int] = {}
    for n in graph_def.node:
        ops[n.op] = ops.get(n.op, 0) + 1
    return {"format": FORMAT, "weights": {"fp32": "float32", "fp16": "float16", "uint8": "uint8 (affine, per tensor)"}[precision],
            "shards": len(shards), "weight_bytes": sum(len(b) for b in blobs), "nodes": len(graph_def.node),
            "signature": {"inputs": in_keys, "outputs": out_keys}, "grappler": GRAPPLER_PASSES,
            **({"rewritten": rewritten} if rewritten else {})}


def _sorted_attrs(topology: dict) -> dict:
    """Each node's attr map by key (grappler's maps come back in no fixed order)."""
    for node in topology.get("node", []) + [n for f in topology.get("library", {}).get("function", []) for n in f.get("nodeDef", [])]:
        if "attr" in node:
            node["attr"] = dict(sorted(node["attr"].items()))
    return topology


def _ordered_signature(signature: dict, in_keys, out_keys) -> dict:
    """The signature's inputs and outputs in the contract's order."""
    for field, keys in (("inputs", list(in_keys)), ("outputs", list(out_keys))):
        if field in signature:
            signature[field] = {k: signature[field][k] for k in keys if k in signature[field]} | signature[field]
    return signature
