"""`validate A B`: run two models on the same inputs and compare, optionally naming the first diverging node.

Any file a runner here can run is accepted: `.onnx`/`.ort` (onnxruntime), `.tflite` (LiteRT),
`.plan`/`.engine` (TensorRT, on a GPU). Inputs are generated from A's input specs (the same
deterministic samples `convert` uses) or read from an `.npz`. When one side is a TFLite model
whose inputs or outputs are the channels-last form of the other side's, they are transposed so
both see the same data. A mismatch is a ValidationError (exit 4): usable as a CI gate.

Localisation (`localize=True`) needs intermediate tensors from both sides under the same names:
that holds for two ONNX variants of one graph (optimised, FP16, quantised), not for TFLite files
written by onnx2tf, whose tensors carry TensorFlow names.

A `.tflite` given here is the user's file, not one this program just wrote: it is described and
run in a child process with a timeout (`runtimes.isolated`), so a flatbuffer that crashes the
interpreter ends the run with exit 2 naming the signal instead of killing it. Quantised
(int8/uint8) TFLite inputs are fed floats that the runner quantises; the report's `b.io` (or
`a.io`) says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.errors import BadInputError, ValidationError
from modelport.ir import TensorSpec
from modelport.validation import Tolerance, compare, tolerance_for

KINDS = {".onnx": "onnx", ".ort": "ort", ".tflite": "tflite", ".plan": "tensorrt", ".engine": "tensorrt"}


def kind_of(path: Path) -> str:
    kind = KINDS.get(path.suffix.lower())
    if kind is None:
        raise BadInputError(f"cannot run this kind of file; known: {', '.join(sorted(KINDS))}", path=path)
    return kind


def describe_tflite(path: Path) -> dict:
    """Input/output details of a user's `.tflite`, read in a child process."""
    from modelport.runtimes.isolated import IsolatedRunner

    return IsolatedRunner("tflite", path).describe()


def input_specs(path: Path, kind: str, details: dict | None = None) -> list[TensorSpec]:
    """The model's input specs (dynamic dims symbolic)."""
    if kind == "onnx":
        from modelport.ir import specs_from_onnx
        from modelport.onnx_io import _parse, read_contract

        model = _parse(path)
        init = {i.name for i in model.graph.initializer}
        specs = specs_from_onnx([v for v in model.graph.input if v.name not in init])
        contract = read_contract(model) or {}
        stored = {d.get("name"): d for d in contract.get("inputs", []) if isinstance(d, dict)}
        for s in specs:
            if s.name in stored and stored[s.name].get("value_range"):
                s.value_range = stored[s.name]["value_range"]
        return specs
    if kind == "ort":
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        types = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
                 "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(double)": "float64"}
        return [TensorSpec(i.name, types.get(i.type, "float32"),
                           [d if isinstance(d, int) else f"{i.name}_dim{k}" for k, d in enumerate(i.shape)])
                for i in sess.get_inputs()]
    if kind == "tflite":
        from modelport.runtimes.tflite import tflite_name

        details = details or describe_tflite(path)
        return [TensorSpec(tflite_name(d["name"]), d["dtype"],
                           [int(x) if x > 0 else f"dim{k}" for k, x in enumerate(d["shape_signature"])])
                for d in details["inputs"]]
    from modelport.runtimes import get_runner

    runner = get_runner("tensorrt", path, rebuild=False)
    return [TensorSpec(n, d.name, [x if x > 0 else f"dim{k}" for k, x in enumerate(s)]) for n, d, s in runner.io(True)]


def _runner(path: Path, kind: str, feeds: dict[str, np.ndarray], details: dict | None = None):
    from modelport.runtimes import get_runner

    if kind == "onnx":
        from modelport.onnx_io import fit_ir_version, load_onnx

        model = load_onnx(path)
        fit_ir_version(model)
        return get_runner("onnxruntime", model)
    if kind == "ort":
        return get_runner("onnxruntime", path)
    if kind == "tflite":
        from modelport.runtimes.isolated import IsolatedRunner
        from modelport.runtimes.tflite import tflite_name

        details = (details or describe_tflite(path))["inputs"]
        names, transpose = [], {}
        by_name = {tflite_name(d["name"]): d for d in details}
        ordered = [by_name[n] for n in feeds] if set(feeds) == set(by_name) else details
        for (name, arr), d in zip(feeds.items(), ordered, strict=False):
            names.append(name)
            sig = [int(x) for x in d["shape_signature"]]
            perm = [0, *range(2, arr.ndim), 1]
            if arr.ndim >= 3 and not _fits(sig, arr.shape) and _fits(sig, [arr.shape[i] for i in perm]):
                transpose[name] = perm
        order = {d["index"]: i for i, d in enumerate(details)}
        names_in_order = [None] * len(details)
        for name, d in zip(names, ordered, strict=False):
            names_in_order[order[d["index"]]] = name
        return IsolatedRunner("tflite", path, input_names=names_in_order, input_transpose=transpose)
    return get_runner("tensorrt", path, rebuild=False)


def tflite_io_note(details: dict) -> str:
    """'float32', or which tensors are quantised and how the runner bridged them."""
    q_in = [d for d in details["inputs"] if d["quantization"]]
    q_out = [d for d in details["outputs"] if d["quantization"]]
    if not q_in and not q_out:
        return "float32 inputs and outputs"
    kinds = sorted({d["tensor_dtype"] for d in q_in + q_out})
    return (f"{'/'.join(kinds)} I/O ({len(q_in)} input(s) quantised from float, {len(q_out)} output(s) dequantised "
            f"with each tensor's scale and zero point)")


def _fits(sig, shape) -> bool:
    return len(sig) == len(shape) and all(s in (-1, x) for s, x in zip(sig, shape, strict=False))


def _align_outputs(a: dict, b: dict) -> dict:
    """B's outputs, transposed channels-last -> channels-first where that is what makes them match A's."""
    pairs = list(zip(a.items(), b.items(), strict=False)) if set(a) != set(b) else [((k, a[k]), (k, b[k])) for k in a]
    out = {}
    for (_, ra), (kb, vb) in pairs:
        if vb.ndim >= 3 and vb.shape != ra.shape:
            perm = [0, vb.ndim - 1, *range(1, vb.ndim - 1)]
            if tuple(vb.shape[i] for i in perm) == ra.shape:
                vb = np.transpose(vb, perm)
        out[kb] = vb
    return {**b, **out}


def load_inputs(path: str | Path, specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    from modelport.file_checks import check_model_file

    p = check_model_file(path, kind="input data file")
    try:
        with np.load(p, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (ValueError, OSError) as e:
        raise BadInputError(f"cannot read input data (an .npz keyed by input name): {e}", path=p) from None
    missing = [s.name for s in specs if s.name not in data]
    if missing:
        raise BadInputError(f"input data lacks {missing}; it has {sorted(data)}", path=p)
    return {s.name: data[s.name] for s in specs}


def validate_models(a: str | Path, b: str | Path, *, inputs: str | None = None, dims: dict[str, int] | None = None,
                    seed: int = 0, tolerance: Tolerance | None = None, precision: str = "fp32",
                    localize: bool = False, by_position: bool = False, on_stage=None) -> dict:
    """Compare B against A on the same inputs; returns the report, raises ValidationError on a mismatch."""
    from modelport.file_checks import check_model_file
    from modelport.samples import make_inputs

    def stage(name: str) -> None:
        if on_stage:
            on_stage(name)

    pa, pb = check_model_file(a), check_model_file(b)
    ka, kb = kind_of(pa), kind_of(pb)
    for p, k in ((pa, ka), (pb, kb)):
        if k == "tflite":
            from modelport.parsers.tflite import check_header

            check_header(p)
    da = describe_tflite(pa) if ka == "tflite" else None
    db = describe_tflite(pb) if kb == "tflite" else None
    specs = input_specs(pa, ka, da)
    feeds = load_inputs(inputs, specs) if inputs else make_inputs(specs, dims or {}, seed=seed)
    tol = tolerance or tolerance_for(precision)
    stage(f"run:{pa.name} ({ka})")
    out_a = _runner(pa, ka, feeds, da).run(feeds)
    stage(f"run:{pb.name} ({kb})")
    out_b = _align_outputs(out_a, _runner(pb, kb, feeds, db).run(feeds))
    if not by_position:
        from modelport.validation import check_override_names

        check_override_names(tol, list(out_a), path=pa)
    parity = compare(out_a, out_b, tol, hop=f"{pa.name} ({ka}) vs {pb.name} ({kb})", by_position=by_position)
    side_a, side_b = {"path": str(pa), "kind": ka}, {"path": str(pb), "kind": kb}
    for side, d in ((side_a, da), (side_b, db)):
        if d:
            side["io"] = tflite_io_note(d)
    from modelport.validation.report import Run

    with Run("validate") as report:  # modelport.report/1, with the two sides under `a` and `b`
        report.set_source({"path": str(pa), "framework": ka, "format": ka})
        report.set_sides(side_a, side_b, {k: list(v.shape) for k, v in feeds.items()})
        report.add_parity(parity)
        where = {}
        if localize:
            stage("localize")
            where = localize_divergence(pa, ka, pb, kb, feeds) if not parity.ok else {"node": None, "note": "outputs match"}
            report.set_localize(where)
        if not parity.ok:
            named = not by_position and any(o.name == "*" for o in parity.outputs)
            reason = f"models differ: {parity.summary()}"
            if where.get("node"):
                reason += f"; first diverging node: {where['node']} ({where['op_type']}, tensor '{where['tensor']}')"
            raise ValidationError(reason, path=pb, parity=parity.to_dict(),
                                  hint="--match-by-position pairs the outputs in order" if named else None)
    return report.to_dict()


def localize_divergence(pa: Path, ka: str, pb: Path, kb: str, feeds: dict) -> dict:
    if ka == kb == "onnx":
        from modelport.onnx_io import fit_ir_version, load_onnx
        from modelport.validation.localize import first_divergence

        ma, mb = load_onnx(pa), load_onnx(pb)
        fit_ir_version(ma)
        fit_ir_version(mb)
        div = first_divergence(ma, mb, feeds)
        if div is None:
            return {"node": None, "note": "no shared intermediate tensor diverges; the difference is in the outputs only"}
        return div.to_dict()
    return {"node": None, "note": f"localisation needs intermediate tensors under the same names on both sides; "
                                  f"{ka} vs {kb} does not provide that (supported: ONNX vs ONNX)"}
