"""TFLite flatbuffers (`.tflite`) as sources, converted with tf2onnx, referenced by the LiteRT interpreter.

FlatBuffers have no bounds checks of their own and the interpreter may abort on a hostile file
(TFSA-2018-003, CVE-2020-15211), so everything that reads the flatbuffer happens in one child
process with a timeout (`runtimes.isolated`): the interpreter's load, tensor details and
reference run, tf2onnx's own reading of the file and the conversion, and the IR assembly. The
child writes the IR (ONNX file, contract, reference arrays) into a temporary folder and the parent
reads that back; the parent itself checks only the size and the 'TFL3' identifier. A child killed
by a signal, or one that overruns, is reported as a bad input (exit 2) naming the signal, and
nothing is written. Names: a signature's keys when the file has one (`--signature` picks among
several), else the tensor names without `serving_default_` and `:0`.
"""

from __future__ import annotations

from pathlib import Path

from modelport.errors import BadInputError, UnsupportedError, one_line
from modelport.ir import IRModel, TensorSpec
from modelport.parsers import SourceSpec, tf_common, tflite_ops
from modelport.parsers.tf_common import merge_inputs, spec_from_dict, spec_from_tf, spec_to_dict
from modelport.reference.sample_sets import reference_samples
from modelport.reference.samples import make_inputs, run_reference
from modelport.runtimes.isolated import (
    CONVERT_TIMEOUT_S,
    RUN_TIMEOUT_S,
    call_in_child,
    read_arrays,
    run_isolated,
    timeout_for,
    write_arrays,
)
from modelport.runtimes.tflite import IDENTIFIER, TFLiteRunner, check_header, load_interpreter, tflite_name

__all__ = ["check_header", "inspect", "parse", "probe", "run_isolated", "sniff"]

NAME = "tflite"
DESCRIPTION = "TFLite flatbuffer (.tflite), read and converted in a crash-isolated child process"
PROBE_TIMEOUT_S = RUN_TIMEOUT_S
WHAT = "the TFLite loader"


def sniff(path: Path) -> bool:
    if not path.is_file():
        return False
    if path.suffix.lower() == ".tflite":
        return True
    with open(path, "rb") as f:
        return f.read(8)[4:8] == IDENTIFIER


def _request(path: Path, spec, *, convert: bool) -> dict:

    return {"path": str(Path(path).resolve()), "spec": spec_to_dict(spec), "convert": convert}


def probe(path: Path, spec, *, timeout: float | None = None) -> dict:
    """Input contract, names, op histogram and the reference run, computed in the child."""

    def collect(work: Path, response: dict) -> dict:
        response["sample"] = read_arrays(work, "sample")
        response["reference"] = read_arrays(work, "reference")
        return response

    return call_in_child("modelport.parsers.tflite:probe_in_child", _request(path, spec, convert=False), path=path,
                         timeout=timeout or timeout_for(PROBE_TIMEOUT_S), what=WHAT, collect=collect,
                         unexpected=BadInputError)


def _names(interp, details, wanted_signature: str | None, kind: str) -> list[str]:
    """Signature keys for the tensors when a signature covers them, else cleaned tensor names."""

    try:
        full = interp._get_full_signature_list() or {}
    except Exception:
        full = {}
    if wanted_signature and wanted_signature not in full:
        raise BadInputError(f"no signature '{wanted_signature}'; the TFLite model has {sorted(full)}")
    key = wanted_signature or (next(iter(full)) if len(full) == 1 else None)
    by_index = {idx: name for name, idx in full.get(key, {}).get(kind, {}).items()} if key else {}
    names = [by_index.get(d["index"]) or tflite_name(d["name"]) for d in details]
    if len(set(names)) != len(names):
        names = [f"{kind[:-1]}_{i}" for i in range(len(names))]
    return names


def _signature_shapes(interp, kind: str) -> dict:
    """{signature: {input or output: shape}} of a file with more than one signature, else {}."""
    keys = list(interp.get_signature_list() or {})
    if len(keys) < 2:
        return {}
    runners = {k: interp.get_signature_runner(k) for k in keys}
    return {k: {n: [int(x) for x in d["shape_signature"]]
                for n, d in (r.get_input_details() if kind == "inputs" else r.get_output_details()).items()}
            for k, r in runners.items()}


def listed_sizes(signature_inputs: dict) -> dict:
    """{input: {axis: (dim name, sizes)}} for the axes whose size differs between the signatures of a
    file with one signature per size (`emitters/tflite_sizes.py`: keys such as `batch_2_seq_128`
    name the dims; an axis no key names is `dimK`)."""
    import re

    pairs = {k: dict(re.findall(r"(.+?)_(\d+)(?:_|$)", k)) for k in signature_inputs}
    out: dict = {}
    names = set.intersection(*(set(v) for v in signature_inputs.values())) if signature_inputs else set()
    for name in sorted(names):
        shapes = {k: v[name] for k, v in signature_inputs.items()}
        if len({len(x) for x in shapes.values()}) != 1:
            continue
        for axis in range(len(next(iter(shapes.values())))):
            at = {k: x[axis] for k, x in shapes.items()}
            if len(set(at.values())) < 2:
                continue
            first = next((k for k in at if k != "serving_default"), next(iter(at)))
            dim = next((d for d in pairs[first] if all(pairs[k].get(d) == str(n) for k, n in at.items()
                                                                  if k != "serving_default")), f"dim{axis}")
            out.setdefault(name, {})[axis] = (dim, sorted(set(at.values())))
    return out


def _op_histogram(interp) -> dict:
    from collections import Counter

    try:
        ops = Counter(o["op_name"] for o in interp._get_ops_details())
    except Exception:
        return {}
    return dict(ops.most_common())


DYNAMIC_RANGE = "int8-dynamic-range"
QUANTISED_WEIGHTS = ("int8", "uint8")


def _source_precision(interp) -> tuple[str | None, int]:
    """(the precision the file computes at where it is not its tensors' float one, how many ops show it).

    Dynamic-range quantisation (the converter's Optimize.DEFAULT without a representative dataset)
    stores weights in int8 and keeps float tensors between ops; LiteRT's hybrid kernels then
    quantise each op's float activations to int8 at run time and compute in int8, so its outputs
    carry int8 error against any float computation of the same weights, tf2onnx's IR included. Such
    an op takes a float tensor and an 8-bit one and returns float; a DEQUANTIZE op (weights widened
    to float before a float kernel) and the ops of a full-integer file (8-bit in and out) do not."""
    import numpy as np

    try:
        dtypes = {d["index"]: np.dtype(d["dtype"]).name for d in interp.get_tensor_details()}
        ops = interp._get_ops_details()
    except Exception:
        return None, 0
    hybrid = 0
    for op in ops:
        ins = {dtypes.get(i) for i in op["inputs"] if i >= 0}
        outs = {dtypes.get(i) for i in op["outputs"] if i >= 0}
        if op["op_name"] != "DEQUANTIZE" and "float32" in ins and ins & set(QUANTISED_WEIGHTS) and outs == {"float32"}:
            hybrid += 1
    return (DYNAMIC_RANGE, hybrid) if hybrid else (None, 0)


def _probe_here(path: Path, spec):
    """The probe, run inside the child: returns (response, interpreter-side arrays)."""
    import numpy as np


    interp = load_interpreter(path)
    ins, outs = interp.get_input_details(), interp.get_output_details()
    wanted = spec.options.get("signature")
    in_names = _names(interp, ins, wanted, "inputs")
    out_names = _names(interp, outs, wanted, "outputs")
    graph = [spec_from_tf(n, [None if s < 0 else int(s) for s in d.get("shape_signature", d["shape"])], np.dtype(d["dtype"]))
             for n, d in zip(in_names, ins, strict=True)]
    specs = merge_inputs(graph, spec, path)
    sample = make_inputs(specs, spec.sample_dims or {}, seed=spec.seed, given=spec.given, path=spec.path)
    # the ONNX graph keeps the file's I/O types: a quantised model's references stay integers too
    runner = TFLiteRunner(path, input_names=[s.name for s in specs], output_names=out_names, dequantize_outputs=False)
    reference = {k: np.asarray(v) for k, v in run_reference(runner.run, sample, specs, spec.given, spec.path).items()}
    varies, extra, skipped = reference_samples(runner.run, specs, sample, reference, spec.sample_dims or {}, seed=spec.seed,
                                               given=spec.given, path=spec.path, **spec.sampling)
    response = {
        "inputs": [s.to_dict() for s in specs],
        "tensor_inputs": [d["name"] for d in ins], "tensor_outputs": [d["name"] for d in outs],
        "outputs": out_names,
        "output_shapes": {n: [None if s < 0 else int(s) for s in d.get("shape_signature", d["shape"])]
                          for n, d in zip(out_names, outs, strict=True)},
        "signatures": sorted(interp.get_signature_list() or {}),
        "signature_inputs": _signature_shapes(interp, "inputs"),
        "signature_outputs": _signature_shapes(interp, "outputs"),
        "ops": _op_histogram(interp),
        "precision": _source_precision(interp),
        "reference_varies": varies,
        "samples_skipped": skipped or None,
    }
    return response, sample, reference, extra


def probe_in_child(work: Path, request: dict) -> dict:
    """Child side of `probe` and `parse`: every read of the flatbuffer happens here."""

    path = Path(request["path"])
    spec = spec_from_dict(request["spec"])
    try:
        probed, sample, reference, extra = _probe_here(path, spec)
    except (ValueError, RuntimeError) as e:
        text = one_line(e, 300)
        raise BadInputError(f"not a valid TFLite model: {text}", path=path) from None
    if not request.get("convert"):
        write_arrays(work, "sample", sample)
        write_arrays(work, "reference", reference)
        return probed
    ir = _convert_here(path, spec, probed, sample, reference, extra)
    ir.save(work / "ir")
    return {"producer": ir.reference.producer}


def _convert_here(path: Path, spec, probed: dict, sample: dict, reference: dict, extra: list) -> IRModel:
    """tf2onnx on the flatbuffer (in the child), names mapped onto the probe's, IR assembled."""
    import tempfile
    import warnings

    from modelport.deps import version_of

    specs = [TensorSpec.from_dict(d) for d in probed["inputs"]]
    names = tf_common.rename_outputs(probed["outputs"], spec, path)
    ref = dict(zip(names, (reference[n] for n in probed["outputs"]), strict=True))
    for s in extra:
        s.outputs = dict(zip(names, (s.outputs[n] for n in probed["outputs"]), strict=True))
        if s.nudged:
            s.nudged = dict(zip(names, (s.nudged[n] for n in probed["outputs"]), strict=True))
    tf = tf_common.import_tf()
    tf2onnx = tf_common.import_tf2onnx()
    try:
        with (tf_common.stdout_to_stderr(), warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="modelport-tfl-") as tmp,
              tf_common.optimizers_collecting()):
            warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated.*")
            readable = tflite_ops.readable_copy(path, Path(tmp))
            model, _ = tf2onnx.convert.from_tflite(str(readable), opset=spec.opset, custom_op_handlers=tflite_ops.handlers(path))
    except Exception as e:
        raise UnsupportedError(f"tf2onnx failed on the TFLite model: {tf_common.tf_reason(e)}", path=path) from None
    tf_common.check_converted(model, path)
    mapping = dict(zip(probed["tensor_inputs"], [s.name for s in specs], strict=True))
    mapping.update(zip(probed["tensor_outputs"], names, strict=True))
    onnx_in = [v.name for v in model.graph.input]
    if not set(mapping).issuperset(onnx_in):
        mapping.update(zip(onnx_in, [s.name for s in specs], strict=True))
    tf_common.rename_values(model, mapping)
    out_shapes = {n: probed["output_shapes"].get(o) for n, o in zip(names, probed["outputs"], strict=True)}
    precision, hybrid = probed["precision"]
    litert = version_of("ai_edge_litert")
    producer = f"ai-edge-litert {litert} interpreter" if litert else f"tensorflow {tf.__version__} tf.lite interpreter"
    return tf_common.build_ir(
        model, specs, out_shapes, sample, ref, producer=producer,
        provenance={"framework": "tflite", "format": "tflite", "path": str(path), "signatures": probed["signatures"],
                    "tensorflow": tf.__version__,
                    "reference_varies": {n: probed["reference_varies"].get(o) for n, o in zip(names, probed["outputs"], strict=True)},
                    "samples_skipped": probed["samples_skipped"],
                    **({"source_precision": precision,
                        "warnings": [f"the TFLite file is dynamic-range quantised: {hybrid} op(s) hold int8 weights and "
                                     "quantise their float activations to int8 at run time, so its outputs (the "
                                     "references) carry int8 error"]} if precision else {})},
        spec=spec, path=path, extra=extra,
    )


def parse(source, spec) -> IRModel:
    path = Path(source)
    check_header(path)

    def collect(work: Path, response: dict) -> IRModel:
        ir = IRModel.load(work / "ir")
        ir.reference.producer = response.get("producer", "")
        return ir

    return call_in_child("modelport.parsers.tflite:probe_in_child", _request(path, spec, convert=True), path=path,
                         timeout=timeout_for(CONVERT_TIMEOUT_S), what="the TFLite conversion", collect=collect,
                         unexpected=BadInputError)


def inspect(path: Path) -> dict:
    """Inputs, outputs, signatures and op histogram, read in the crash-isolated child."""

    path = Path(path)
    check_header(path)
    probed = probe(path, SourceSpec(path=path))
    shapes = probed["output_shapes"]
    listed = listed_sizes(probed.get("signature_inputs") or {})
    listed_out = listed_sizes(probed.get("signature_outputs") or {})
    inputs = probed["inputs"]
    outputs = [{"name": n, "shape": shapes.get(n)} for n in probed["outputs"]]
    for tensors, per in ((inputs, listed), (outputs, listed_out)):
        for tensor in tensors:
            for axis, (dim, _) in per.get(tensor["name"], {}).items():
                tensor["shape"][axis] = dim
    return {
        "format": "tflite",
        "inputs": inputs,
        **({"dynamic_dims": {n: {dim: {"kind": "sizes", "sizes": sizes} for dim, sizes in per.values()}
                             for n, per in listed.items()}} if listed else {}),
        "outputs": [{"name": n, "shape": shapes.get(n)} for n in probed["outputs"]],
        "signatures": probed["signatures"],
        "ops": probed["ops"],
        **({"precision": probed["precision"][0]} if probed["precision"][0] else {}),
        "size": path.stat().st_size,
    }
