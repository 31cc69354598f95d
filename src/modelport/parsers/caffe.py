"""Caffe sources: a `.prototxt` network (text NetParameter) and its `.caffemodel` weights (binary
NetParameter), read with modelport's own schema (`caffe_schema.py`) and translated layer by layer
into ONNX (opset 17, NCHW as in Caffe); the reference outputs come from OpenCV DNN, which reads
both files itself.

Both files are data: no field that names a file (a data layer's `source`, `mean_file`, an HDF5
output's `file_name`...) is accepted and a `Python` layer is refused (it would run Python code),
each a refusal of an unsafe input (exit 3); both files are size-capped before they are read. The
weights are matched to the layers by name, as Caffe and OpenCV match them; a blob whose values do
not fill its shape, a missing blob or one of the wrong size is an exit-2 error naming the layer
and the blob, as is a caffemodel cut short (the layer and the blob where it ends).

The batch dim stays dynamic (`batch`) unless a layer works across it (a Reshape, Flatten,
Concat, Softmax... on axis 0), in which case it is the declared size. In a net with a PriorBox
layer (SSD's default boxes, a constant of the sizes of its bottoms) the inputs' height and width
are fixed: the declared sizes where --input leaves them dynamic. The outputs are the tops no layer
consumes, named as the tops; OpenCV names them by the layers that produce them.

Here: finding the two files, the net's inputs and the whole translation. Reading the files is in
`caffe_files.py`, the graph being built in `caffe_graph.py`, the layers' translations in
`caffe_layers.py`, `caffe_ops.py` and `caffe_ssd.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError, UnsafeInputError, one_line
from modelport.ir import IRModel, Reference, TensorSpec
from modelport.parsers.caffe_files import Blob, inference_layers, read_network, read_weights
from modelport.parsers.caffe_graph import FixBatch, Graph, Layer
from modelport.parsers.caffe_layers import BOTTOMS, CONVERTERS
from modelport.parsers.caffe_ssd import FIXED_SIZES
from modelport.parsers.contract import merge_specs
from modelport.parsers.onnx import infer_and_check
from modelport.reference.sample_sets import reference_samples
from modelport.reference.samples import sample_reference
from modelport.resolve.specs import positional_index
from modelport.run.file_checks import companion_file
from modelport.runtimes.opencv_dnn import OpenCVRunner, load_net

NAME = "caffe"
DESCRIPTION = "Caffe network (.prototxt) and weights (.caffemodel); reference from OpenCV DNN"
NETWORK_SUFFIX = ".prototxt"
WEIGHTS_SUFFIX = ".caffemodel"
OPSET = 17
BATCH = "batch"

DATA_TYPES = {"Data", "ImageData", "HDF5Data", "HDF5Output", "WindowData", "AnnotatedData", "VideoData", "MemoryData",
              "DummyData"}


def sniff(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in (NETWORK_SUFFIX, WEIGHTS_SUFFIX)


def locate(path: Path, spec) -> tuple[Path, Path]:
    """(prototxt, caffemodel) for a source path and MMdnn's -iw (spec.options['weights'])."""
    weights = spec.options.get("weights")
    if path.suffix.lower() == WEIGHTS_SUFFIX and not weights:
        return companion_file(path, NETWORK_SUFFIX, what="Caffe network (.prototxt)",
                              hint="give it with -in NET.prototxt -iw WEIGHTS.caffemodel"), path
    return path, companion_file(path, WEIGHTS_SUFFIX, what="Caffe weights (.caffemodel)",
                                hint="give it with -iw WEIGHTS.caffemodel", given=weights)


# --- the whole net -----------------------------------------------------------------------------

@dataclass
class Translation:
    model: object  # onnx.ModelProto
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opencv_names: dict[str, str]  # output (top) name -> the OpenCV layer name that gives it
    dynamic: bool
    fixed_sizes: list[str]  # the inputs whose dynamic height and width took their declared sizes


def declared_inputs(net, layers) -> list[tuple[str, list[int] | None]]:
    """(name, declared shape or None) of the net's inputs: the net-level `input` with `input_shape`
    or `input_dim` (4 per input), then each Input layer's tops."""
    found: list[tuple[str, list[int] | None]] = []
    names = list(net.input)
    if len(net.input_dim):
        if len(net.input_dim) != 4 * len(names):
            raise BadInputError(f"{len(net.input_dim)} input_dim values for {len(names)} inputs (4 each)")
        found += [(n, [int(d) for d in net.input_dim[4 * i:4 * i + 4]]) for i, n in enumerate(names)]
    elif len(net.input_shape):
        if len(net.input_shape) != len(names):
            raise BadInputError(f"{len(net.input_shape)} input_shape entries for {len(names)} inputs")
        found += [(n, [int(d) for d in sh.dim]) for n, sh in zip(names, net.input_shape, strict=True)]
    else:
        found += [(n, None) for n in names]
    for layer in layers:
        if layer.type != "Input":
            continue
        shapes = list(layer.input_param.shape)
        if len(shapes) not in (0, 1, len(layer.top)):
            raise BadInputError(f"Input layer '{layer.name}': {len(shapes)} shapes for {len(layer.top)} tops")
        for i, top in enumerate(layer.top):
            shape = shapes[i if len(shapes) > 1 else 0] if shapes else None
            found.append((top, [int(d) for d in shape.dim] if shape is not None else None))
    return found


def check_translatable(layers) -> None:
    """Every layer refused at once: those that read files, and those with no translation."""
    unsafe = []
    for layer in layers:
        for param in ("data_param", "image_data_param", "hdf5_data_param", "window_data_param"):
            if layer.HasField(param) and getattr(layer, param).source:
                unsafe.append(f"layer '{layer.name}' of type {layer.type} reads '{getattr(layer, param).source}'")
        if layer.HasField("transform_param") and layer.transform_param.mean_file:
            unsafe.append(f"layer '{layer.name}' reads its mean from '{layer.transform_param.mean_file}'")
    if unsafe:
        raise UnsafeInputError("; ".join(unsafe) + ": modelport never reads files a prototxt points to")
    missing = [f"layer '{layer.name}' of type {layer.type}"
               + (" (a data layer; a deploy prototxt declares its inputs with an Input layer)" if layer.type in DATA_TYPES else "")
               for layer in layers if layer.type not in CONVERTERS and layer.type != "Input"]
    if missing:
        raise BadInputError("; ".join(missing) + (" has" if len(missing) == 1 else " have") + " no translation "
                            f"(translated: Input, {', '.join(sorted(CONVERTERS))})")


def needed_layers(layers: list, tops: list[str]) -> list:
    """The layers that `tops` depend on, in their order (every layer that writes a needed top, in
    place included, and what it reads); the Input layers always."""
    needed, keep = set(tops), []
    for layer in reversed(layers):
        if layer.type == "Input" or needed & set(layer.top):
            keep.append(layer)
            needed |= set(layer.bottom)
    return keep[::-1]


def stop_tops(net, names: list[str] | None) -> list[str] | None:
    """`--output` names that are all tops of the net: where it ends (the layers after them, a
    DetectionOutput's post-processing say, are left out), as a frozen graph's `--outputs` name
    the tensors it ends at; else None (the names rename the net's own outputs)."""
    tops = {t for layer in inference_layers(net) if layer.type != "Input" for t in layer.top}
    return list(names) if names and all(n in tops for n in names) else None


def translate(net, weights: dict[str, list[Blob]], given_shapes: dict[str, list], *, dynamic: bool,
              stop_at: list[str] | None = None) -> Translation:
    """The ONNX model of the net's TEST-phase layers with these weights; `given_shapes` are the
    --input shapes by name (they replace the declared ones, batch dim included; a dynamic height or
    width takes the declared size where a layer needs fixed ones); `stop_at`: the tops the net ends
    at (only the layers they need are translated)."""
    from onnx import TensorProto, helper

    layers = inference_layers(net)
    if stop_at:
        layers = needed_layers(layers, stop_at)
    check_translatable(layers)
    g = Graph(dynamic=dynamic)
    specs: list[TensorSpec] = []
    fix_sizes = any(layer.type in FIXED_SIZES for layer in layers)
    fixed: list[str] = []
    for name, shape in declared_inputs(net, layers):
        if name in given_shapes:  # the user's shape, as given (its dynamic sizes fixed where a layer needs them)
            declared, shape = shape, list(given_shapes[name])
            if fix_sizes and declared and len(declared) == len(shape) > 2 \
                    and not all(isinstance(d, int) for d in shape[2:]):
                shape[2:] = [d if isinstance(d, int) else declared[i] for i, d in enumerate(shape[2:], 2)]
                fixed.append(name)
        elif not shape:
            raise BadInputError(f"the input '{name}' has no shape in the prototxt", hint=f"give one with --input {name}:1x3x224x224")
        else:
            shape = list(shape)
            if dynamic and len(shape) > 1:
                shape[0] = BATCH
        specs.append(TensorSpec(name=name, dtype="float32", shape=shape, layout="NCHW" if len(shape) == 4 else None))
        g.used.add(name)
        g.current[name] = name
        g.shapes[name] = shape
    g.used.update(t for layer in layers for t in [*layer.top, *layer.bottom])
    consumed: dict[str, bool] = {}  # a tensor -> whether a layer reads it
    producer: dict[str, tuple[str, int]] = {}  # a tensor -> (OpenCV's name of the layer, top index)
    seen: dict[str, int] = {}
    order: list[str] = []  # tops in the order they were last written
    for layer in layers:
        repeats = seen.get(layer.name, 0)
        seen[layer.name] = repeats + 1
        opencv_name = layer.name if not repeats else f"{layer.name}_{repeats}"
        if layer.type == "Input":
            continue
        for b in layer.bottom:
            if b not in g.current:
                raise BadInputError(f"layer '{layer.name}' reads '{b}', which no layer before it writes and no input is")
        ins = [g.current[b] for b in layer.bottom]
        expect = BOTTOMS.get(layer.type, 1)
        if expect is None and not ins or isinstance(expect, int) and len(ins) != expect \
                or isinstance(expect, tuple) and len(ins) not in expect:
            raise BadInputError(f"layer '{layer.name}' of type {layer.type} has {len(ins)} bottoms")
        for t in ins:
            consumed[t] = True
        L = Layer(layer, ins, [g.shapes[t] for t in ins], weights.get(layer.name))
        outs = CONVERTERS[layer.type](g, L)
        if len(outs) != len(layer.top):
            raise BadInputError(f"layer '{layer.name}' of type {layer.type} has {len(layer.top)} tops, it gives {len(outs)}")
        for i, (top, out) in enumerate(zip(layer.top, outs, strict=True)):
            g.current[top] = out
            producer[out] = (opencv_name, i)
            if top in order:
                order.remove(top)
            order.append(top)
    input_names = {s.name for s in specs}
    outputs = list(stop_at) if stop_at else [top for top in order if not consumed.get(g.current[top]) and top not in input_names]
    if not outputs:
        raise BadInputError("the net has no output: every top is read by a later layer")
    # each output tensor takes its top's name (no other tensor has it: made-up names avoid every blob's)
    renames = {g.current[top]: top for top in outputs}
    for node in g.nodes:
        node.input[:] = [renames.get(i, i) for i in node.input]
        node.output[:] = [renames.get(o, o) for o in node.output]
    shapes = {renames.get(t, t): s for t, s in g.shapes.items()}
    names = {}
    out_specs = []
    for top in outputs:
        layer_name, index = producer[g.current[top]]
        if index:
            raise BadInputError(f"the output '{top}' is top {index} of layer '{layer_name}'; only a layer's first top "
                                "can be an output here")
        names[top] = layer_name
        out_specs.append(TensorSpec(name=top, dtype="float32", shape=shapes[top]))

    def info(spec: TensorSpec):  # None: a dim of no known size
        return helper.make_tensor_value_info(spec.name, TensorProto.FLOAT, list(spec.shape))

    graph = helper.make_graph(g.nodes, net.name or "caffe", [info(s) for s in specs], [info(s) for s in out_specs],
                              initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelport",
                              ir_version=8)
    for s in out_specs:
        s.shape = [d if d is not None else f"{s.name}_dim{i}" for i, d in enumerate(s.shape)]
    return Translation(model, specs, out_specs, names, dynamic, fixed)


def user_shapes(net, user_specs: list[TensorSpec]) -> dict[str, list]:
    """The --input shapes by input name (a positional spec resolved to the net's inputs)."""

    names = [n for n, _ in declared_inputs(net, inference_layers(net))]
    out = {}
    for u in user_specs:
        i = positional_index(u.name)
        name = names[i] if i is not None and i < len(names) else u.name
        if name not in names:
            raise BadInputError(f"unknown input '{u.name}'; the net's inputs are {names}")
        if u.shape:
            out[name] = list(u.shape)
    return out


def parse(source, spec) -> IRModel:

    path = Path(source)
    network, weights_path = locate(path, spec)
    net = read_network(network)
    try:
        weights = read_weights(weights_path)
        user = user_shapes(net, spec.inputs)
        stop_at = stop_tops(net, spec.output_names)
        try:
            t = translate(net, weights, user, dynamic=True, stop_at=stop_at)
        except FixBatch:
            t = translate(net, weights, user, dynamic=False, stop_at=stop_at)
    except (BadInputError, UnsafeInputError) as e:
        if e.path is None:
            raise type(e)(e.reason, path=network, hint=e.hint) from None
        raise
    model = infer_and_check(t.model, network)
    translated = {s.name: list(s.shape) for s in t.inputs}
    inputs = merge_specs(t.inputs, spec.inputs)
    for s in inputs:  # the fixed height and width bind over the user's dynamic ones
        if s.name in t.fixed_sizes:
            s.shape = translated[s.name]
    if spec.output_names and len(spec.output_names) != len(t.outputs):
        raise BadInputError(f"--output names {spec.output_names} do not match the net's {len(t.outputs)} outputs "
                            f"{[o.name for o in t.outputs]}", path=network)
    try:
        cv_net = load_net("caffe", network, weights_path)
    except BadInputError:
        raise
    except Exception as e:
        raise BadInputError(f"OpenCV cannot read the net: {one_line(str(e)) or type(e).__name__}", path=network) from None
    top_of = {layer: top for top, layer in t.opencv_names.items()}
    runner = OpenCVRunner(cv_net, inputs, [t.opencv_names[o.name] for o in t.outputs], rename=top_of.__getitem__)
    try:
        sampled = sample_reference(runner.run, inputs, spec.sample_dims, seed=spec.seed, given=spec.given, path=network)
    except BadInputError:
        raise
    except Exception as e:
        raise BadInputError(f"OpenCV cannot run the net: {one_line(str(e)) or type(e).__name__}", path=network) from None
    sample, ref_out, spec.sample_dims = sampled.feeds, sampled.outputs, sampled.dims
    varies, extra, skipped = reference_samples(runner.run, inputs, sample, ref_out, spec.sample_dims, seed=spec.seed,
                                               given=spec.given, path=network, **spec.sampling)
    import cv2

    notes = [n for n in (sampled.note,) if n]
    if not t.dynamic:
        notes.append("a layer works across the batch axis: the batch dim keeps its declared size")
    if t.fixed_sizes:
        notes.append(f"a PriorBox layer needs fixed sizes: the height and width of {', '.join(t.fixed_sizes)} keep "
                     "their declared sizes")
    return IRModel(
        model=model,
        inputs=inputs,
        outputs=t.outputs,
        provenance={"framework": "caffe", "format": "caffe prototxt + caffemodel", "path": str(network),
                    "weights": str(weights_path), "opset": OPSET, "net": net.name or None,
                    "reference_varies": varies, "samples_skipped": skipped or None,
                    "layers": len(inference_layers(net)), **({"warnings": notes} if notes else {})},
        reference=Reference(sample, ref_out, producer=f"opencv {cv2.__version__}", extra=extra),
        sample_dims=dict(spec.sample_dims),
    )
