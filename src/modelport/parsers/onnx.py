"""ONNX files as sources: safe load (external data checked), optional opset conversion, shape
inference, checker, and reference outputs from onnxruntime on the original file.

For an ONNX source the reference framework is onnxruntime running the model as given; the
parity of every later hop is measured against that.
"""

from __future__ import annotations

from pathlib import Path

from modelport.errors import BadInputError, one_line
from modelport.ir import IRModel, Reference, contract_from_onnx, specs_from_onnx
from modelport.onnxfile.ir_version_fit import fit_ir_version
from modelport.onnxfile.onnx_io import load_onnx
from modelport.onnxfile.weightless_copy import check_skeleton, weightless
from modelport.parsers.contract import follow_produced, merge_specs
from modelport.reference.input_roles import apply_roles, controls, guessed_inputs
from modelport.reference.sample_sets import reference_samples
from modelport.reference.samples import sample_reference
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

NAME = "onnx"
DESCRIPTION = "ONNX model (.onnx, external data allowed)"


def sniff(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".onnx"


def convert_opset(model, opset: int, path=None):
    from onnx import version_converter

    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if current == opset:
        return model
    try:
        return version_converter.convert_version(model, opset)
    except Exception as e:  # the converter raises bare RuntimeErrors / ValueErrors
        raise BadInputError(f"cannot convert opset {current} to {opset}: {one_line(e)}", path=path) from None


def infer_and_check(model, path=None):
    """`model` with the shapes onnx infers recorded in it (in place; best effort) and checked by
    onnx's checker (an invalid model is a BadInputError). Both run on the model without its large
    weights: each of them serialises the model it is given and returns or parses a copy, which on a
    model of a few GB held that many GB several times over (a 0.9 GB encoder: 6.4 GB at its peak),
    and past 2 GB the checker could not run at all. Shapes follow from the weights' dims and dtypes;
    the small tensors a shape computation reads (under 1 KB) keep their values. The checker reads
    the weightless model from a file whose large tensors refer to a sparse file of the right size
    (it checks that each tensor's bytes are there, not what they are)."""
    import onnx


    skeleton, size = weightless(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=False, data_prop=True)
    except Exception:
        inferred = skeleton  # shape inference is best effort; the checker below decides validity
    try:
        check_skeleton(inferred, size)
    except Exception as e:
        raise BadInputError(f"invalid ONNX model: {one_line(e)}", path=path) from None
    _take_types(inferred, model)
    return model


def _take_types(src, dst) -> None:
    """The value_info and the input/output types shape inference wrote into `src` (a `weightless`
    copy of `dst`), copied into `dst`'s graphs, which have the same structure."""
    def walk(a, b):
        for field in ("value_info", "input", "output"):
            del getattr(b, field)[:]
            getattr(b, field).extend(getattr(a, field))
        for na, nb in zip(a.node, b.node, strict=True):
            for aa, ab in zip(na.attribute, nb.attribute, strict=True):
                if aa.HasField("g"):
                    walk(aa.g, ab.g)
                for ga, gb in zip(aa.graphs, ab.graphs, strict=True):
                    walk(ga, gb)

    walk(src.graph, dst.graph)


def inferred_output_shapes(model, names: list[str]) -> dict[str, list]:
    """{name: shape} of these graph outputs as onnx's shape inference gives them with their declared
    shapes set aside (on the model without its large weights); anonymous dims are named
    `<output>_dim<i>`. Empty where inference fails."""
    import onnx


    skeleton, _ = weightless(model)
    for v in skeleton.graph.output:
        if v.name in names:
            v.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=False, data_prop=True)
    except Exception:
        return {}
    found = {v.name: v for v in inferred.graph.output if v.name in names and v.type.tensor_type.HasField("shape")}
    return {s.name: [f"{s.name}_dim{i}" if isinstance(d, str) and d.startswith("unk__") else d for i, d in enumerate(s.shape)]
            for s in specs_from_onnx(found.values())}


def write_output_shapes(model, outputs) -> None:
    """The specs' shapes written over the graph outputs' declared ones (symbolic dims by name)."""
    by_name = {s.name: s for s in outputs}
    for v in model.graph.output:
        s = by_name.get(v.name)
        if s is None:
            continue
        shape = v.type.tensor_type.shape
        del shape.dim[:]
        for d in s.shape:
            dim = shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = int(d)


IMAGE_SIZE_KEYS = ("imgsz", "img_size", "image_size", "input_size", "imgsize")  # ultralytics writes imgsz: "[640, 640]"


def metadata_dims(model, inputs) -> tuple[dict[str, int], str]:
    """Sizes for symbolic dims that the model's `metadata_props` give, and where they came from:
    a key named as the dim (`height: 640`), or an image size (`imgsz: [640, 640]` or `640`) for
    the height and width of every 4-D input (NCHW, or NHWC when its layout says so)."""
    import ast

    props = {p.key: p.value for p in model.metadata_props}
    found: dict[str, int] = {}
    names = {d for s in inputs for d in s.shape if isinstance(d, str)}
    for name in names:
        if str(props.get(name, "")).strip().isdigit():
            found[name] = int(props[name])
    used = [n for n in names if n in found]
    for key in IMAGE_SIZE_KEYS:
        try:
            value = ast.literal_eval(str(props[key]).strip()) if key in props else None
        except (ValueError, SyntaxError):
            value = None
        sizes = [value, value] if isinstance(value, int) else list(value) if isinstance(value, (list, tuple)) else []
        if len(sizes) != 2 or not all(isinstance(v, int) and v > 0 for v in sizes):
            continue
        for spec in inputs:
            if len(spec.shape) == 4:
                axes = (1, 2) if spec.layout == "NHWC" else (2, 3)
                for axis, size in zip(axes, sizes, strict=True):
                    if isinstance(spec.shape[axis], str):
                        found.setdefault(spec.shape[axis], size)
        used.append(key)
        break
    return found, f"the model's metadata {', '.join(f'{k}={props[k]}' for k in used)}" if used else ""


def parse(source, spec) -> IRModel:

    path = Path(source)
    model = load_onnx(path)
    ir_note = fit_ir_version(model)
    original = model
    if spec.opset:
        model = convert_opset(model, spec.opset, path)
    model = infer_and_check(model, path)
    # a modelport-written file carries its contract: layouts, preprocessing, value ranges, sample dims
    inputs, outputs, stored_dims = contract_from_onnx(model)
    spec.sample_dims = {**stored_dims, **spec.sample_dims}
    inputs = merge_specs(inputs, spec.inputs, fixed=True)
    if spec.output_names:
        if len(spec.output_names) != len(outputs):
            raise BadInputError(f"--output names {spec.output_names} do not match the model's {len(outputs)} outputs", path=path)
    keep = controls(apply_roles(inputs, model, spec.given), inputs)  # token ids, masks, sizes: what the graph shows
    runner = OnnxRuntimeRunner(original)
    hints, hints_from = metadata_dims(model, inputs)
    sampled = sample_reference(runner.run, inputs, spec.sample_dims, seed=spec.seed, given=spec.given, path=path,
                               hints=hints, hints_from=hints_from)
    sample, ref_out, spec.sample_dims = sampled.feeds, sampled.outputs, sampled.dims
    varies, extra, skipped = reference_samples(runner.run, inputs, sample, ref_out, spec.sample_dims, seed=spec.seed,
                                               given=spec.given, path=spec.path, keep=keep, **spec.sampling)
    # the contract follows what onnxruntime returns where the file's declared output shapes contradict it
    declared = {v.name for v in model.graph.output if v.type.tensor_type.HasField("shape")}
    shape_notes = follow_produced(outputs, [ref_out, *(s.outputs for s in extra)], declared=declared,
                                  inferred=lambda names: inferred_output_shapes(model, names))
    if shape_notes:
        write_output_shapes(model, outputs)
    import onnxruntime

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return IRModel(
        model=model,
        inputs=inputs,
        outputs=outputs,
        provenance={"framework": "onnx", "format": "onnx", "path": str(path), "opset": opset,
                    "producer": f"{model.producer_name} {model.producer_version}".strip(), "ir_version_note": ir_note,
                    "reference_varies": varies, "samples_skipped": skipped or None,
                    **({"warnings": notes} if (notes := [n for n in (sampled.note, *shape_notes) if n]) else {})},
        reference=Reference(sample, ref_out, producer=f"onnxruntime {onnxruntime.__version__}", extra=extra,
                            guessed=guessed_inputs(inputs, spec.given)),
        sample_dims=dict(spec.sample_dims),
    )
