"""onnx2tf's TensorFlow model of an IR, put behind the I/O contract: the TFLite emitter and the
TF Serving packager both start here.

onnx2tf converts ONNX to TensorFlow op by op and removes the NCHW↔NHWC transposes itself, so its
model takes and returns channels-last tensors where the source is channels-first. `plan_ports`
reads off each output's layout in onnx2tf's model (its shape against the reference, or where both
layouts fit, as with square dims, the numbers) and `contract_module` wraps the model in one
`tf.function` that takes the contract's inputs and returns the contract's outputs: names, shapes,
dtypes and layouts, transposes inside. `layout="nhwc"` is the one asked-for change: channels-first
inputs are taken channels-last, and outputs onnx2tf computes channels-last stay so.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.emitters.onnx_tf import lowered_model
from modelport.emitters.tflite_options import LAYOUTS
from modelport.errors import BadInputError, ModelportError, UnsupportedError, one_line
from modelport.frameworks.tensorflow import import_tf
from modelport.ir import IRModel, Reference
from modelport.reference.samples import make_inputs
from modelport.run.quiet_call import captured_output, converter_error
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

CHANNELS_LAST = ("NHWC", "NWC", "NDHWC")
LAST_NAMES = {3: "NWC", 4: "NHWC", 5: "NDHWC"}
# words of a converter's error that say its trouble is a shape (then sizing a dynamic dim may help)
SHAPE_WORDS = re.compile(r"shape|dimension|\bdims?\b|\brank\b|\bNone\b|broadcast|reshape|size", re.IGNORECASE)


def to_last(rank: int) -> list[int]:
    return [0, *range(2, rank), 1]


def to_first(rank: int) -> list[int]:
    return [0, rank - 1, *range(1, rank - 1)]



@dataclass
class Port:
    """One input or output of the file: the contract's name, and where its layout differs."""

    name: str
    key: str  # the name inside the TensorFlow function (a valid TF name); renamed in the file
    dtype: str
    shape: list  # the file's shape (None for a dynamic dim)
    inner: list[int] | None = None  # an output's transpose from onnx2tf's layout to the file's, inside the file
    change: list[int] | None = None  # permutation from the contract's layout to the file's (nhwc only)
    layout: str = ""
    lift: bool = False  # a rank-0 input that onnx2tf's model takes as shape [1]: reshaped inside the file



def input_layouts(ir: IRModel, layout: str) -> tuple[list[str], list[str], dict[str, list[int]], dict[str, str]]:
    """(keep-channels-first names, keep-channels-last names, layout changes, layout per input)."""
    if layout not in LAYOUTS:
        raise BadInputError(f"unknown layout '{layout}'; known: {', '.join(LAYOUTS)}")
    keep_first, keep_last, transpose, described = [], [], {}, {}
    for spec in ir.inputs:
        rank = len(spec.shape)
        if rank < 3:
            described[spec.name] = spec.layout or f"rank {rank} (no channel axis)"
            continue
        src = spec.layout or ("channels-first" if rank in (3, 4, 5) else None)
        channels_last = src in CHANNELS_LAST
        if channels_last:
            keep_last.append(spec.name)
            described[spec.name] = f"{src} (as source)"
        elif layout == "source":
            keep_first.append(spec.name)
            described[spec.name] = f"{spec.layout or 'channels-first'} (as source)"
        else:
            transpose[spec.name] = to_last(rank)
            described[spec.name] = f"{LAST_NAMES[rank]} (transposed from the source's channels-first)"
    return keep_first, keep_last, transpose, described



def onnx2tf_model(ir: IRModel, work: Path, keep_first, keep_last, log: Path):
    """onnx2tf's TensorFlow (tf_keras) model of the IR. onnx2tf gets the graph in memory (it
    simplifies and saves back a file it is handed); nothing is saved."""

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with captured_output(log, "onnx2tf"):
        onnx2tf = require("onnx2tf", purpose="converting ONNX to TensorFlow")
        fresh_keras_names()
        kwargs = dict(
            onnx_graph=reshapes_as_transposes(ir.clone().model), output_folder_path=str(work / "tf"), non_verbose=True, verbosity="error",
            keep_ncw_or_nchw_or_ncdhw_input_names=keep_first or None,
            keep_nwc_or_nhwc_or_ndhwc_input_names=keep_last or None, disable_model_save=True,
        )
        try:
            with local_sample_images():
                return onnx2tf.convert(**kwargs)
        except SystemExit as e:  # onnx2tf exits on conversion errors, having printed why
            reason = converter_error(log) or "see the stage's log in report.json"
            raise UnsupportedError(f"onnx2tf could not convert the model (exit {e.code}): {reason}") from None
        except ModelportError:
            raise
        except Exception as e:
            raise UnsupportedError(f"onnx2tf could not convert the model: "
                                   f"{one_line(e, typed=True)}", detail=str(e)[:4000]) from None


@contextlib.contextmanager
def local_sample_images():
    """onnx2tf fetches sample images from github.com for its own check run whenever every input is
    a small-batch NHWC image with 3 channels (`download_test_image_data`); it gets local ones
    instead (seeded uniform noise in [0, 1), the shape it expects), so no conversion reaches the network."""
    import onnx2tf.onnx2tf as entry

    def sample_images() -> np.ndarray:
        return np.random.default_rng(0).random((20, 128, 128, 3), dtype=np.float32)

    saved = entry.download_test_image_data
    entry.download_test_image_data = sample_images
    try:
        yield
    finally:
        entry.download_test_image_data = saved


def _transpose_perm(shape_in: list, shape_out: list[int]) -> list[int] | None:
    """The permutation a Reshape from `shape_in` to `shape_out` amounts to, if it only moves size-1
    axes (dims: ints, or None for unknown; axis 0 may be unknown only where `shape_out` says -1 or 0)."""
    if len(shape_in) != len(shape_out) or len(shape_in) < 3 or any(d is None for d in shape_in[1:]):
        return None
    if shape_in[0] is None and shape_out[0] not in (-1, 0):
        return None
    sizes_out = [shape_in[0] if k == 0 and d in (-1, 0) else d for k, d in enumerate(shape_out)]
    big_in = [k for k, d in enumerate(shape_in) if d != 1]
    ones_in = [k for k, d in enumerate(shape_in) if d == 1]
    big_out = [k for k, d in enumerate(sizes_out) if d != 1]
    if len(big_in) != len(big_out) or any(shape_in[a] != sizes_out[b] for a, b in zip(big_in, big_out, strict=True)):
        return None
    perm, big, ones = [], iter(big_in), iter(ones_in)
    for d in sizes_out:
        perm.append(next(big) if d != 1 else next(ones))
    return perm


def reshapes_as_transposes(model):
    """The model with each Reshape that only moves size-1 axes written as the Transpose it is
    (an Identity where it moves none).

    tf2onnx writes the NHWC->NCHW transpose of a tensor whose H and W are 1 as a Reshape
    ([N,1,1,C] -> [N,C,1,1]) and, once its optimiser has cancelled the transposes around it, leaves
    it as a no-op Reshape ([N,C,1,1] -> [-1,C,1,1]: Keras InceptionV3 at 75x75, its last blocks).
    onnx2tf tracks channels-first/last through a Transpose or an Identity but not through such a
    Reshape: it takes the 1x1 tensor for channels-last and concatenates it along the wrong axis.
    """
    import onnx
    from onnx import helper, numpy_helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return model
    shapes = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        t = v.type.tensor_type
        if t.HasField("shape"):
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    consts = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            consts[node.output[0]] = node.attribute[0].t
    for k, node in enumerate(model.graph.node):
        if node.op_type != "Reshape" or len(node.input) != 2 or node.input[1] not in consts or node.input[0] not in shapes:
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        perm = _transpose_perm(shapes[node.input[0]], [int(d) for d in numpy_helper.to_array(consts[node.input[1]]).ravel()])
        if perm is None:
            continue
        if perm == sorted(perm):
            model.graph.node[k].CopyFrom(helper.make_node("Identity", [node.input[0]], list(node.output), name=node.name))
        else:
            model.graph.node[k].CopyFrom(helper.make_node("Transpose", [node.input[0]], list(node.output), name=node.name,
                                                          perm=perm))
    return model


def fresh_keras_names() -> None:
    """Restart tf_keras's layer-name counters, which onnx2tf's names (and so the .tflite bytes)
    carry: without this a second conversion in one process writes `model_35/tf.nn.relu_7`
    where the first wrote `model_17/tf.nn.relu`, and reruns are not byte-identical."""
    import tf_keras

    tf_keras.backend.clear_session()


def _fits(a, b) -> bool:
    """Same rank, and the same size wherever both shapes name one (None: dynamic)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))



def probe(ir: IRModel) -> Reference:
    """Inputs and outputs to place onnx2tf's outputs by: the IR's references, else onnxruntime's."""
    if ir.reference is not None:
        return ir.reference

    feeds = make_inputs(ir.inputs)
    return Reference(feeds, OnnxRuntimeRunner(ir.model).run(feeds))


def plan_ports(ir: IRModel, keras_model, changes: dict[str, list[int]], described: dict[str, str], nhwc: bool,
               log: Path, who: str = "onnx2tf") -> tuple[list[Port], list[Port]]:
    """The file's inputs and outputs, and the transposes that put onnx2tf's model behind them.

    Inputs: onnx2tf keeps each one as asked (`keep_*_input_names`); a shape that disagrees is an
    error. An output's layout in onnx2tf's model is read off its shape against the reference (as
    the source computes it, or channels-last); where both fit (square dims) the numbers decide.
    `who` names the converter: any other than onnx2tf keeps the source's layouts.
    """

    inputs = []
    if len(keras_model.inputs) != len(ir.inputs) or len(keras_model.outputs) != len(ir.outputs):
        raise UnsupportedError(f"{who}'s model has {len(keras_model.inputs)} inputs and {len(keras_model.outputs)} outputs; "
                               f"the contract has {len(ir.inputs)} and {len(ir.outputs)}")
    for i, (spec, kin) in enumerate(zip(ir.inputs, keras_model.inputs, strict=True)):
        change = changes.get(spec.name)
        shape = [d if isinstance(d, int) else None for d in spec.shape]
        if change:
            shape = [shape[k] for k in change]
        # onnx2tf turns a scalar input into a vector of one; the file keeps the scalar and reshapes it
        lift = not shape and list(kin.shape) in ([None], [1])
        if not lift and not _fits(list(kin.shape), shape):
            raise UnsupportedError(f"{who} gave input '{spec.name}' the shape {list(kin.shape)}; the file must take {shape}")
        inputs.append(Port(spec.name, f"in_{i}", spec.dtype, shape, change=change, layout=described[spec.name], lift=lift))
    ref = probe(ir)
    feeds = [np.transpose(ref.inputs[p.name], p.change) if p.change else ref.inputs[p.name] for p in inputs]
    feeds = [np.reshape(f, (1,)) if p.lift else f for f, p in zip(feeds, inputs, strict=True)]
    try:
        with captured_output(log, "TensorFlow"):
            got = keras_model([np.asarray(f, dtype=np.dtype(k.dtype.name)) for f, k in zip(feeds, keras_model.inputs, strict=True)],
                              training=False)
    except Exception as e:
        raise UnsupportedError(f"{who}'s TensorFlow model fails on the sample inputs: "
                               f"{one_line(e, 300, typed=True)}", detail=str(e)[:4000]) from None
    got = [np.asarray(g) for g in (got if isinstance(got, (list, tuple)) else [got])]
    outputs = []
    for j, (spec, y) in enumerate(zip(ir.outputs, got, strict=True)):
        want = np.asarray(ref.outputs[spec.name])
        rank = y.ndim
        # channels-last first: on a tie (a constant output) onnx2tf's own convention decides
        options = ([to_first(rank)] if rank >= 3 and who == "onnx2tf" else []) + [None]
        fits = [p for p in options if (y.transpose(p) if p else y).shape == want.shape]
        if not fits:
            raise UnsupportedError(f"{who}'s output '{spec.name}' has the shape {list(y.shape)}, the source's {list(want.shape)}, "
                                   f"and no layout change maps one onto the other")
        if len(fits) > 1:
            fits.sort(key=lambda p: _distance(y.transpose(p) if p else y, want))
        inner = fits[0]
        shape = [d if isinstance(d, int) else None for d in spec.shape]
        as_source = f"{spec.layout} (as source)" if spec.layout else "as source"
        if nhwc and inner is not None:
            change = to_last(rank)
            outputs.append(Port(spec.name, f"out_{j}", spec.dtype, [shape[k] for k in change], change=change,
                                 layout=f"{LAST_NAMES.get(rank, 'channels-last')} (transposed from the source's channels-first)"))
        else:
            outputs.append(Port(spec.name, f"out_{j}", spec.dtype, shape, inner=inner, layout=as_source))
    return inputs, outputs


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(np.nanmax(d)) if d.size and not np.all(np.isnan(d)) else float("inf")


def contract_module(tf, keras_model, inputs: list[Port], outputs: list[Port], *, by_name: bool = False):
    """A tf.Module whose one function (`serve`) takes the file's inputs and returns its outputs by
    key: the ports' TF-safe keys, or with `by_name` the contract's names (TF Serving's signature)."""
    graph_in = [k.dtype for k in keras_model.inputs]

    def serve(*args):
        args = [tf.reshape(a, [1]) if p.lift else a for a, p in zip(args, inputs, strict=True)]
        xs = [tf.cast(a, dt) if a.dtype != dt else a for a, dt in zip(args, graph_in, strict=True)]
        ys = keras_model(xs, training=False)
        ys = ys if isinstance(ys, (list, tuple)) else [ys]
        out = {}
        for port, y in zip(outputs, ys, strict=True):
            if port.inner:
                y = tf.transpose(y, port.inner)
            want = tf.as_dtype(port.dtype)
            out[port.name if by_name else port.key] = tf.cast(y, want) if y.dtype != want else tf.identity(y)
        return out

    module = tf.Module()
    module.model = keras_model
    module.serve = tf.function(serve, input_signature=[tf.TensorSpec(p.shape, tf.as_dtype(p.dtype), name=p.name if by_name else p.key)
                                                       for p in inputs])
    return module


def save_contract_model(tf, keras_model, inputs: list[Port], outputs: list[Port], dest: Path, signature: str, *,
                        by_name: bool = False) -> None:
    """`contract_module` saved as a SavedModel at `dest` with its one function as `signature`.

    Variables that onnx2tf's layers capture without tracking them are attached to the module so
    that they are saved too, and `fingerprint.pb` gets a uuid derived from its content, so the same
    model saved twice gives the same bytes.
    """
    module = contract_module(tf, keras_model, inputs, outputs, by_name=by_name)
    fn = module.serve.get_concrete_function()
    module.captured = list(fn.variables)
    tf.saved_model.save(module, str(dest), signatures={signature: fn})
    stable_saved_model(Path(dest))


def stable_saved_model(dest: Path) -> None:
    """The same model saved twice, in one process or two, gives the same bytes: TensorFlow names
    each traced function after a per-process counter (`__inference_serve_1204`), so the functions
    are renamed by their order in the library (`__inference_serve_0`) wherever the SavedModel names
    them, and the fingerprint is made again from the result (`_stable_fingerprint`)."""
    import re

    from tensorflow.core.protobuf import saved_model_pb2

    pb = dest / "saved_model.pb"
    model = saved_model_pb2.SavedModel()
    model.ParseFromString(pb.read_bytes())
    mapping: dict[str, str] = {}
    seen: dict[str, int] = {}
    names = [f.signature.name for meta in model.meta_graphs for f in meta.graph_def.library.function]
    for name in sorted(names, key=lambda n: (int(m.group(1)) if (m := re.search(r"_(\d+)$", n)) else -1, n)):
        base = re.sub(r"_\d+$", "", name)  # creation order: the counters' order is the same in every process
        mapping[name] = f"{base}_{seen.get(base, 0)}"
        seen[base] = seen.get(base, 0) + 1
    _rename_strings(model, mapping)
    # a captured tensor's argument is named after its per-process id: number those in creation order
    attrs = [a.attr["_user_specified_name"] for meta in model.meta_graphs for f in meta.graph_def.library.function
             for a in f.arg_attr.values() if "_user_specified_name" in a.attr and a.attr["_user_specified_name"].s.isdigit()]
    ids = {v: str(i).encode() for i, v in enumerate(sorted({a.s for a in attrs}, key=int))}
    for a in attrs:
        a.s = ids[a.s]
    for meta in model.meta_graphs:
        for f in meta.graph_def.library.function:
            _number_captures(f)
    for meta in model.meta_graphs:  # and the library in the order of the new names
        functions = sorted(meta.graph_def.library.function, key=lambda f: f.signature.name)
        copies = [type(f)() for f in functions]
        for c, f in zip(copies, functions, strict=True):
            c.CopyFrom(f)
        del meta.graph_def.library.function[:]
        meta.graph_def.library.function.extend(copies)
    pb.write_bytes(model.SerializeToString(deterministic=True))
    fingerprint = dest / "fingerprint.pb"
    if fingerprint.is_file():
        from tensorflow.core.protobuf import fingerprint_pb2
        from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

        fp = fingerprint_pb2.FingerprintDef()
        fp.ParseFromString(fingerprinting.CreateFingerprintDef(str(dest)))
        # TensorFlow's hash of the object graph varies between processes for the same bytes
        graphs = b"".join(m.object_graph_def.SerializeToString(deterministic=True) for m in model.meta_graphs)
        fp.saved_object_graph_hash = int.from_bytes(hashlib.sha256(graphs).digest()[:8], "big")
        fingerprint.write_bytes(fp.SerializeToString(deterministic=True))
    _stable_fingerprint(dest)


def _number_captures(function) -> None:
    """A function's arguments that stand for captured tensors are named after a per-process id
    (`model_17_4244`): renamed `model_17_c0`, `model_17_c1`… in the ids' order, wherever the
    function refers to them (the names are local to the function)."""
    import re

    found = [(m.group(1), int(m.group(2)), a.name) for a in function.signature.input_arg
             if (m := re.fullmatch(r"(.*)_(\d{3,})", a.name))]
    if not found:
        return
    mapping = {name: f"{base}_c{i}" for i, (base, _, name) in enumerate(sorted(found, key=lambda t: t[1]))}
    for a in function.signature.input_arg:
        a.name = mapping.get(a.name, a.name)
    for node in function.node_def:
        for i, ref in enumerate(node.input):
            name, sep, rest = ref.partition(":")
            if name in mapping:
                node.input[i] = mapping[name] + sep + rest
    for key in list(function.ret):
        name, sep, rest = function.ret[key].partition(":")
        if name in mapping:
            function.ret[key] = mapping[name] + sep + rest


def _rename_strings(message, mapping: dict[str, str]) -> None:
    """Every string field and string map key of a protobuf message equal to a key of `mapping`,
    replaced by its value (in place, recursively)."""
    for field, value in message.ListFields():
        if field.type == field.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                for key in list(value.keys()):
                    item = value[key]
                    if value_field.type == value_field.TYPE_MESSAGE:
                        _rename_strings(item, mapping)
                        if isinstance(key, str) and key in mapping:
                            kept = type(item)()
                            kept.CopyFrom(item)
                            del value[key]
                            value[mapping[key]].CopyFrom(kept)
                    else:
                        new_key = mapping.get(key, key) if isinstance(key, str) else key
                        new_item = mapping.get(item, item) if isinstance(item, str) else item
                        if new_key != key:
                            del value[key]
                        value[new_key] = new_item
            elif field.label == field.LABEL_REPEATED:
                for item in value:
                    _rename_strings(item, mapping)
            else:
                _rename_strings(value, mapping)
        elif field.type == field.TYPE_STRING:
            if field.label == field.LABEL_REPEATED:
                for i, item in enumerate(value):
                    if item in mapping:
                        value[i] = mapping[item]
            elif value in mapping:
                setattr(message, field.name, mapping[value])


def _stable_fingerprint(dest: Path) -> None:
    """TensorFlow stamps a random `uuid` into `fingerprint.pb` on every save; derive it from the
    fingerprint's content hashes instead."""
    path = dest / "fingerprint.pb"
    if not path.is_file():
        return
    from tensorflow.core.protobuf import fingerprint_pb2

    fp = fingerprint_pb2.FingerprintDef()
    fp.ParseFromString(path.read_bytes())
    fp.ClearField("uuid")
    fp.uuid = str(int.from_bytes(hashlib.sha256(fp.SerializeToString(deterministic=True)).digest()[:16], "big"))
    path.write_bytes(fp.SerializeToString(deterministic=True))


def build(ir: IRModel, work: Path, log: Path, *, layout: str = "source") -> tuple[object, list[Port], list[Port]]:
    """(the TensorFlow model, the file's input ports, its output ports) for `ir` in `layout`:
    onnx2tf's model, or where onnx2tf cannot convert the IR, modelport's lowering of it
    (`emitters/onnx_tf.py`; its `converter_name` says which, and why)."""
    keep_first, keep_last, changes, described = input_layouts(ir, layout)
    try:
        keras_model = onnx2tf_model(ir, work, keep_first, keep_last, log)
        inputs, outputs = plan_ports(ir, keras_model, changes, described, layout == "nhwc", log)
    except UnsupportedError as e:
        lowered = _lowered(ir, changes, described, layout, log, e)
        if not isinstance(lowered, UnsupportedError):
            return lowered
        also = f"modelport's ONNX lowering could not either: {one_line(lowered.reason)}"
        failed = e.with_hint(f"{e.hint}; {also}" if e.hint else also)
        dims = dynamic_dims(ir)
        # --dim helps only where the converter's trouble is a shape (said in its first line or further down)
        if not dims or not (SHAPE_WORDS.search(e.reason) or SHAPE_WORDS.search(e.detail or "")):
            raise failed from e
        # in the hint: a converter's reason is cut to one short line, the dims and the fix must stay whole
        hint = (f"dynamic dims onnx2tf may not convert: {dims}; give each a size the model takes with "
                f"--dim NAME=N (an image size the network divides evenly)")
        raise failed.with_hint(f"{failed.hint}; {hint}") from e
    return keras_model, inputs, outputs


def _lowered(ir: IRModel, changes: dict[str, list[int]], described: dict[str, str], layout: str, log: Path,
             failed: UnsupportedError) -> tuple[object, list[Port], list[Port]] | UnsupportedError:
    """modelport's lowering of `ir` behind the same ports, when onnx2tf failed with `failed`; or
    why the lowering cannot either."""

    tf = import_tf("lowering ONNX to TensorFlow")
    try:
        with captured_output(log, "ONNX lowering"):
            model = lowered_model(tf, ir, changes)
            model.onnx2tf_failure = failed.reason
            inputs, outputs = plan_ports(ir, model, changes, described, layout == "nhwc", log, who="the ONNX lowering")
    except UnsupportedError as e:
        return e
    return model, inputs, outputs


def dynamic_dims(ir: IRModel) -> str:
    """'input x axis 2 'h' (sampled at 2), …' for every named dim past axis 0 (a batch is no trouble)."""
    sizes = {s.name: np.shape(ir.reference.inputs[s.name]) for s in ir.inputs} if ir.reference is not None else {}
    found = []
    for spec in ir.inputs:
        for axis, d in enumerate(spec.shape):
            if axis and isinstance(d, str):
                at = sizes.get(spec.name)
                found.append(f"input '{spec.name}' axis {axis} '{d}'" + (f" (sampled at {at[axis]})" if at and len(at) > axis else ""))
    return ", ".join(found)
