"""INT8 quantisation through onnxruntime's quantisation tools: dynamic, and static QDQ calibrated
from user data.

Exports keep stale intermediate `value_info` that make onnxruntime's quantiser fail ("Inferred
shape and existing shape differ"), so it is dropped first. Static calibration reads an `.npz` of
named inputs (each array is a batch along axis 0) or a folder of images (see
`calibration.py`). When the quantised model misses its tolerance on a sample set, the nodes whose
rounding causes it are kept in float, the worst first, until it holds on every set
(`int8_fallback.py`); they are reported with their share of the error. When it holds at once, the
model is the quantiser's output with nothing excluded, as before.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, one_line
from modelport.ir import IRModel, Reference
from modelport.onnxfile.external_data_files import attach_external
from modelport.onnxfile.weightless_copy import weightless
from modelport.optimize import Pass, PassResult
from modelport.optimize.int8_fallback import hold_parity
from modelport.optimize.model_tools import drop_value_info, name_nodes, opset_of, with_model
from modelport.reference.sample_sets import NOT_FOR_INT8, STRUCTURED_KINDS, SWEEP_KINDS
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import Tolerance, check, tolerance_for

CALIBRATION_METHODS = ("minmax", "entropy", "percentile", "distribution")


@dataclass
class Int8Info:
    mode: str
    excluded: list[str] = field(default_factory=list)  # every node left in float (asked for, or kept by the fallback)
    kept_float: list[dict] = field(default_factory=list)  # the fallback's: {"node", "op", "error": its share}
    rounds: int = 0
    parity_ok: bool | None = None
    calibration: dict | None = None
    per_channel: bool = False
    checked_on: str = "the reference inputs"
    fallback: dict | None = None  # when INT8 missed at once: missed_on, quantised, trials, seconds, error_left, tried, gave_up

    def to_dict(self) -> dict:
        return {"mode": self.mode, "kept_fp32": self.excluded, "kept_float": self.kept_float, "rounds": self.rounds,
                "parity_ok": self.parity_ok, "calibration": self.calibration, "per_channel": self.per_channel,
                "checked_on": self.checked_on, "fallback": self.fallback}


def _prepared(model):
    import onnx


    m = onnx.ModelProto()
    m.CopyFrom(model)
    drop_value_info(m)
    name_nodes(m)
    return m


def _run_quantizer(model, quantize, weights_dir: Path | None = None):
    """Write `model` to a temp folder, call `quantize(src, dst, large)`, load the result.
    `weights_dir`: where `model`'s external initializers are (a parked IR's), copied into the
    temp folder's data file a tensor at a time."""
    import logging

    from modelport.optimize.model_tools import is_large, load_model_file, temp_model_file

    large = is_large(model) or weights_dir is not None  # a model whose weights wait in files is written out with external data too
    root = logging.getLogger()
    level = root.level
    with temp_model_file(model, base_dir=weights_dir) as src:
        dst = src.with_name("quantized.onnx")
        try:
            root.setLevel(logging.ERROR)  # the quantiser logs advice on the root logger
            quantize(src, dst, large)
        except (ValueError, RuntimeError, KeyError, IndexError) as e:
            raise BadInputError(f"onnxruntime quantisation failed: {one_line(e, typed=True)}") from e
        finally:
            root.setLevel(level)
        return load_model_file(dst)


_QUANTISER = threading.Lock()  # one quantisation at a time replaces onnxruntime's functions (batch conversions run in threads)


@contextlib.contextmanager
def _replacing(module, replacements: dict):
    """`module`'s attributes named in `replacements` replaced by them for the length of the context,
    and put back however it ends; where the module lacks one of them, nothing is replaced. The
    caller holds `_QUANTISER`."""
    originals = {name: getattr(module, name, None) for name in replacements}
    if None in originals.values():
        yield
        return
    for name, value in replacements.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(module, name, value)


def _infer_in_place(model):
    """What onnxruntime's `save_and_reload_model_with_shape_infer` gives its dynamic quantiser (the
    model with onnx's inferred value_info and the quantiser's metadata mark), without its copies:
    onnx infers shapes on a `weightless` copy and the value_info is written into `model` itself."""
    import onnx
    from onnxruntime.quantization.quant_utils import add_infer_metadata


    inferred = onnx.shape_inference.infer_shapes(weightless(model)[0])
    for part in ("value_info", "input", "output"):
        ours, theirs = getattr(model.graph, part), getattr(inferred.graph, part)
        del ours[:]
        ours.extend(theirs)
    add_infer_metadata(model)
    return model


@contextlib.contextmanager
def _value_info_in_place():
    """onnxruntime's dynamic quantiser refreshes its value_info by deep-copying the model it loaded,
    saving the copy and loading it again while its caller still holds the first: the weights twice
    over, before any is quantised (a 201 MB model: 2.2x the weights at its peak). Within this
    context that step infers on a copy without the weights instead (`_infer_in_place`)."""
    from onnxruntime.quantization import onnx_quantizer

    with _QUANTISER, _replacing(onnx_quantizer, {"save_and_reload_model_with_shape_infer": _infer_in_place}):
        yield


@contextlib.contextmanager
def _weights_after_calibration(opset: int | None):
    """onnxruntime's static quantiser loads the model with its weights, then calibrates with a copy
    of its own loaded from the same file and run in a session, holding the first load all along
    (a 201 MB model: 2.3x the weights above the process). Within this context its first load leaves
    the weights in their file, and they are read in when its QDQ quantiser is built, after the
    calibration's session is gone. Not for a model below opset 11, which onnxruntime converts and
    saves again before calibrating (that needs the weights)."""
    import importlib


    # the package's `quantize` attribute is its function of that name, not the module
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")

    with _QUANTISER:
        build = getattr(ort_quantize, "QDQQuantizer", None)
        if build is None or (opset or 0) < 11:
            yield
            return
        folders = {}  # id -> (the model loaded without its weights, kept alive so the id stays its own; their folder)

        def load_graph(path):
            import onnx
            from onnxruntime.quantization.quant_utils import add_infer_metadata

            path = Path(path)
            inferred = path.with_name(path.stem + "-inferred" + path.suffix)
            onnx.shape_inference.infer_shapes_path(str(path), str(inferred))
            model = onnx.load(str(inferred), load_external_data=False)
            inferred.unlink()
            add_infer_metadata(model)
            folders[id(model)] = (model, path.parent)
            return model

        def build_with_weights(model, *args, **kwargs):
            if id(model) in folders:
                attach_external(model, folders.pop(id(model))[1])
            return build(model, *args, **kwargs)

        with _replacing(ort_quantize, {"load_model_with_shape_infer": load_graph, "QDQQuantizer": build_with_weights}):
            yield


def _dynamic(model, *, exclude: list[str], per_channel: bool, weights_dir: Path | None = None):

    q = require("onnxruntime.quantization", purpose="INT8 quantisation")

    def run(src, dst, large):
        with _value_info_in_place():
            q.quantize_dynamic(src, dst, weight_type=q.QuantType.QInt8, per_channel=per_channel,
                               nodes_to_exclude=exclude or None, use_external_data_format=large)

    return _run_quantizer(model, run, weights_dir)


class _Reader:
    """onnxruntime CalibrationDataReader over a list of feed dicts."""

    def __init__(self, feeds: list[dict]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # some onnxruntime versions call it
        pass


def _static(model, feeds: list[dict], *, exclude: list[str], per_channel: bool, method: str,
            weights_dir: Path | None = None, ranges: Path | None = None):
    """`ranges`: a file for the calibration's tensor ranges, written by the first run and read by
    the next instead of calibrating again (the ranges do not depend on what is excluded), where
    onnxruntime's `quantize_static` takes a `calibration_cache_path`."""
    import inspect


    q = require("onnxruntime.quantization", purpose="INT8 quantisation")
    methods = {"minmax": q.CalibrationMethod.MinMax, "entropy": q.CalibrationMethod.Entropy,
               "percentile": q.CalibrationMethod.Percentile, "distribution": q.CalibrationMethod.Distribution}
    cache = {"calibration_cache_path": str(ranges)} \
        if ranges is not None and "calibration_cache_path" in inspect.signature(q.quantize_static).parameters else {}

    def run(src, dst, large):
        with _weights_after_calibration(opset_of(model)):
            q.quantize_static(src, dst, _Reader(feeds), quant_format=q.QuantFormat.QDQ, per_channel=per_channel,
                              activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8,
                              nodes_to_exclude=exclude or None, use_external_data_format=large,
                              calibrate_method=methods[method], extra_options={"ActivationSymmetric": False}, **cache)

    return _run_quantizer(model, run, weights_dir)


def quantize_model(ir: IRModel, *, mode: str = "dynamic", calibration: list[dict] | None = None,
                   method: str = "minmax", per_channel: bool | None = None, exclude: list[str] | None = None,
                   fallback: bool = True, tol: Tolerance | None = None, max_rounds: int = 8,
                   max_trials: int = 64, check_on_calibration: bool = True) -> tuple[IRModel, Int8Info]:
    """(INT8 IRModel, report info). `mode` is "dynamic" or "static" (static needs `calibration`).

    A static model is judged on calibration samples (`calibration_reference`) unless
    `check_on_calibration` is False: then on the reference inputs, which must be held out of
    `calibration` (calibration drawn like the sample inputs, `calibration.sample_calibration`).
    With `fallback`, a model that misses `tol` (default: INT8's) on any sample set gets nodes kept
    in float until it holds (`int8_fallback.hold_parity`, at most `max_rounds` nodes or groups
    checked and `max_trials` quantiser runs); `exclude` names nodes to keep in float from the start.
    """

    if mode not in ("dynamic", "static"):
        raise BadInputError(f"unknown INT8 mode '{mode}': dynamic or static")
    if method not in CALIBRATION_METHODS:
        raise BadInputError(f"unknown calibration method '{method}'; known: {', '.join(CALIBRATION_METHODS)}")
    if mode == "static" and not calibration:
        raise BadInputError("static INT8 quantisation needs calibration data", hint="pass --calibration DATA.npz or an image folder")
    has_conv = any(n.op_type == "Conv" for n in ir.model.graph.node)
    # Per-channel weights help convolutions (one scale per output channel); default it on for them.
    per_channel = has_conv if per_channel is None else per_channel
    info = Int8Info(mode=mode, per_channel=per_channel)
    if mode == "static":
        info.calibration = {"samples": len(calibration), "method": method}
    asked = list(exclude or [])
    tol = tol or tolerance_for("int8")

    ref = ir.reference
    if mode == "static" and ref is not None and check_on_calibration:
        ref = calibration_reference(ir, calibration)
        rows = len(next(iter(ref.inputs.values())))
        info.checked_on = f"{rows} calibration row{'s' if rows != 1 else ''} against the FP32 model"
    elif mode == "static" and ref is not None:
        # a signal at 1/100 of the amplitude lies below the calibrated resolution by design, and the
        # calibration says which values are real where no range was declared (not the sweep's);
        # silence, constants, the range ends and a grey image are real inputs and stay
        ref = ref.without(*NOT_FOR_INT8, *SWEEP_KINDS)
    # The FP32 weights wait in a file while onnxruntime's quantiser reads them from its own copy of
    # that file: neither the IR nor the prepared model holds them (a 0.94 GB encoder: 5.48 GB at
    # this pass's peak with both in memory). The fallback's runs read them from there too: it
    # compares with the references, never runs the FP32 model.
    with ir.weights_parked() as parked, tempfile.TemporaryDirectory(prefix="modelport-int8-") as scratch:
        base = _prepared(ir.model)
        weights_dir = parked.parent if parked is not None else None

        def quantise(kept: list[str]):
            if mode == "dynamic":
                return _dynamic(base, exclude=asked + kept, per_channel=per_channel, weights_dir=weights_dir)
            return _static(base, calibration, exclude=asked + kept, per_channel=per_channel, method=method,
                           weights_dir=weights_dir, ranges=Path(scratch) / "ranges.json")

        qmodel = quantise([])
        kept: list[str] = []
        if fallback and ref is not None:
            parity = check(OnnxRuntimeRunner(qmodel), ref, tol, f"int8-{mode}")
            info.parity_ok = parity.ok
            if not parity.ok:
                t0 = time.perf_counter()
                held = hold_parity(quantise, base, qmodel, parity, ref, tol, f"int8-{mode}", max_rounds=max_rounds,
                                   max_trials=max_trials)
                qmodel, info.parity_ok, info.rounds, info.kept_float = held.model, held.parity.ok, held.rounds, held.kept
                kept = [k["node"] for k in held.kept]
                info.fallback = {"missed_on": held.missed_on, "quantised": held.quantised, "trials": held.trials,
                                 "seconds": round(time.perf_counter() - t0, 3), "error_left": held.error_left,
                                 "tried": held.tried, "gave_up": held.reason}
    info.excluded = sorted(asked + kept)
    out = with_model(ir, qmodel)
    if ref is not None:
        out.reference = ref
    out.provenance["precision"] = "int8"
    out.provenance["int8"] = info.to_dict()
    return out, info


CHECK_SAMPLES = 8


def calibration_reference(ir: IRModel, calibration: list[dict]):
    """The data a calibrated model is judged on: up to `CHECK_SAMPLES` calibration samples (stacked
    along the batch axis when it is dynamic, else the first sample) and the FP32 model's outputs.

    The parser's references are random sample inputs, which need not lie in the range the model was
    calibrated for (images scaled to [0, 1] against standard-normal samples): judged on those, a
    correct calibration looks broken and the fallback keeps every node in FP32. The FP32 model was
    itself checked against the source framework before this pass; the swap is recorded in the
    pass's `checked_on` and the returned IRModel carries it, so later checks (the emitted artifact's
    validation) use the same in-distribution data. The parser's structured sets (all-zeros, a
    constant, the ends of the input range: silence, a black or white frame) are kept beside it:
    real inputs the calibration data must cover, or the calibrated model fails on them.
    """

    dynamic_batch = all(s.shape and not isinstance(s.shape[0], int) for s in ir.inputs)
    samples = calibration[:CHECK_SAMPLES] if dynamic_batch else calibration[:1]
    feeds = {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}
    outputs = OnnxRuntimeRunner(ir.model).run(feeds)
    producer = f"{ir.reference.producer} (FP32 ONNX on calibration data)" if ir.reference else "FP32 ONNX"
    structured = [x for x in (ir.reference.extra if ir.reference else []) if x.kind in STRUCTURED_KINDS]
    return Reference(feeds, outputs, producer=producer, extra=structured, first_kind="calibration")


def quantize_dynamic(ir: IRModel, *, per_channel: bool = False, fallback: bool = True) -> IRModel:
    """INT8 weights with activations quantised at run time (no calibration data needed)."""
    return quantize_model(ir, mode="dynamic", per_channel=per_channel, fallback=fallback)[0]


def quantize_static(ir: IRModel, calibration: list[dict], *, method: str = "minmax",
                    per_channel: bool | None = None, fallback: bool = True) -> IRModel:
    """INT8 QDQ model calibrated on `calibration` (a list of feed dicts)."""
    return quantize_model(ir, mode="static", calibration=calibration, method=method,
                          per_channel=per_channel, fallback=fallback)[0]


def fallback_target(gate: Tolerance | None) -> Tolerance | None:
    """The tolerance the fallback aims at: the gate's, which a model must pass to be kept; INT8's
    default (None) under a gate nothing fails (`auto` judges its candidates against its budget after)."""
    if gate is None or (gate.min_cosine <= -1 and gate.atol == float("inf") and gate.rtol == float("inf")
                        and not gate.overrides):
        return None
    return gate


class DynamicQuantizationPass(Pass):
    name = "int8-dynamic"
    description = "INT8 weights, activations quantised at run time"
    precision = "int8"
    float_weights = True

    def __init__(self, *, per_channel: bool = False, fallback: bool = True):
        self.per_channel = per_channel
        self.fallback = fallback

    def apply(self, ir: IRModel) -> PassResult:
        out, info = quantize_model(ir, mode="dynamic", per_channel=self.per_channel, fallback=self.fallback,
                                   tol=fallback_target(self.gate_tolerance))
        return PassResult(out, True, info.to_dict())


class StaticQuantizationPass(Pass):
    name = "int8-static"
    description = "INT8 QDQ model calibrated from user data"
    precision = "int8"
    float_weights = True

    def __init__(self, *, calibration: list[dict] | None = None, method: str = "minmax",
                 per_channel: bool | None = None, fallback: bool = True, check_on_calibration: bool = True):
        self.calibration = calibration
        self.method = method
        self.per_channel = per_channel
        self.fallback = fallback
        self.check_on_calibration = check_on_calibration

    def apply(self, ir: IRModel) -> PassResult:
        out, info = quantize_model(ir, mode="static", calibration=self.calibration, method=self.method,
                                   per_channel=self.per_channel, fallback=self.fallback,
                                   check_on_calibration=self.check_on_calibration, tol=fallback_target(self.gate_tolerance))
        return PassResult(out, True, info.to_dict())
