"""OpenVINO models at a precision: the IR's ONNX model through OpenVINO's ONNX front end, with the
inference precision it will run at recorded in its rt_info (`runtime_options`
INFERENCE_PRECISION_HINT; OpenVINO 2026.4's CPU plugin does not apply that entry itself, see
`runtimes/openvino.py`), and INT8 through NNCF.

Shared by the OpenVINO target (`emitters/openvino.py`) and `--optimize auto`'s OpenVINO candidates,
so a candidate that wins is written exactly as it was measured.

- `fp32`: inference precision f32 (OpenVINO's CPU default on BF16 hardware would be bf16).
- `fp16`: inference in f16 where the CPU has native FP16, else f32 (the FP16 weights are a matter
  of saving: `save(compress_to_fp16=True)`).
- `bf16`: inference precision bf16; exit 5 on a CPU without BF16.
- `int8`: `nncf.quantize` on calibration data (`quantize_with_accuracy_control` under an accuracy
  budget, which keeps the layers that cost the most accuracy in floating point), or INT8 weights
  (`nncf.compress_weights`, data-free). Non-quantised ops run in f32.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, ValidationError, one_line
from modelport.ir import IRModel
from modelport.run.quiet_call import silenced_output
from modelport.runtimes import openvino as ovr
from modelport.runtimes.openvino import OpenVINORunner, no_telemetry, require_openvino
from modelport.targets import TARGETS

PRECISIONS = TARGETS["openvino"].precisions  # its descriptor's (modelport.targets)


def to_openvino(ir: IRModel):
    """The OpenVINO model of the IR, with the contract's tensor names on its ports and the contract in its rt_info."""

    model = ovr.from_onnx(ir.model)
    for ports, specs in ((model.inputs, ir.inputs), (model.outputs, ir.outputs)):
        if len(ports) != len(specs):
            raise BadInputError(f"OpenVINO's model has {len(ports)} ports where the contract has {len(specs)}")
        for port, spec in zip(ports, specs, strict=True):
            if spec.name not in port.get_names():
                port.get_tensor().add_names({spec.name})
    ovr.write_rt(model, "contract", ir.contract())
    return model


def inference_precision(precision: str) -> str:
    """The inference precision an artifact of `precision` runs at on this CPU."""

    if precision == "bf16":
        ovr.require_precision("bf16")
        return "bf16"
    if precision == "fp16":
        return "fp16" if ovr.supports("fp16") else "fp32"
    return "fp32"


def build(ir: IRModel, precision: str, *, calibration: list[dict] | None = None, int8_mode: str | None = None,
          budget=None) -> tuple[object, dict]:
    """(OpenVINO model at `precision`, details). The weights are compressed to FP16 only when saved."""

    if precision not in PRECISIONS:
        raise BadInputError(f"OpenVINO precision '{precision}' is not one of {', '.join(PRECISIONS)}")
    run_at = inference_precision(precision)
    model = to_openvino(ir)
    details: dict = {"inference_precision": run_at}
    if precision == "int8":
        mode = int8_mode or ("static" if calibration else "weights")
        if mode == "static" and not calibration:
            raise BadInputError("static INT8 quantisation needs calibration data", hint="pass --calibration DATA.npz or an image folder")
        model, info = quantize(model, mode, calibration, budget=budget)
        details.update(info)
    ovr.record_precision(model, run_at)
    return model, details


def quantize(model, mode: str, calibration: list[dict] | None, *, budget=None) -> tuple[object, dict]:
    """INT8 through NNCF: static quantisation (with accuracy control under a budget) or INT8 weights."""

    no_telemetry()
    nncf = require("nncf", purpose="INT8 quantisation for OpenVINO")
    import logging

    logging.getLogger("nncf").setLevel(logging.ERROR)  # its INFO tables would reach the terminal
    try:
        if mode == "weights":
            with silenced_output():  # NNCF draws progress bars on the terminal
                out = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
            return out, {"int8_mode": "weights", "quantizer": f"nncf {nncf.__version__} compress_weights INT8_ASYM"}
        names = [p.get_any_name() for p in model.inputs]
        items = [{n: np.asarray(sample[n]) for n in names} for sample in calibration]
        dataset = nncf.Dataset(items)
        subset = len(items)
        info = {"int8_mode": "static", "calibration_samples": subset}
        if budget is not None:
            metric, max_drop = accuracy_metric(model, items, budget)
            info["max_drop"] = max_drop
        # NNCF's default scheme fails on some transformer graphs (an embedding table that is both a
        # weight and an output); its transformer scheme, which also keeps softmax/layer norm in float, then runs
        error = None
        for model_type in (None, nncf.ModelType.TRANSFORMER):
            extra = {"model_type": model_type} if model_type else {}
            try:
                with silenced_output():
                    if budget is None:
                        out = nncf.quantize(model, dataset, subset_size=subset, **extra)
                    else:
                        out = nncf.quantize_with_accuracy_control(model, dataset, dataset, validation_fn=metric, max_drop=max_drop,
                                                                  drop_type=nncf.DropType.ABSOLUTE, subset_size=subset, **extra)
            except Exception as e:  # NNCF raises plain KeyError/RuntimeError from its graph passes
                error = error or e
                continue
            how = "quantize" if budget is None else "quantize_with_accuracy_control"
            return out, {**info, "quantizer": f"nncf {nncf.__version__} {how}" + (" (transformer scheme)" if model_type else "")}
        raise error
    except (BadInputError, ValidationError):
        raise
    except Exception as e:
        from modelport.deps import missing_dependency

        missing = missing_dependency(e)
        if missing is not None:
            raise missing from e
        raise ValidationError(f"--precision int8 cannot be delivered for openvino: NNCF failed: {one_line(e, typed=True)}") from e


def accuracy_metric(model, items: list[dict], budget) -> tuple[object, float]:
    """NNCF's validation function and max drop for an accuracy budget.

    The metric compares a candidate with the FP32 model's outputs on the same items (computed
    once, in f32): with `cosine>=c` it is the worst cosine similarity (FP32 scores 1, so the drop
    allowed is 1 - c); with `max_abs<=x` it is minus the largest absolute error (drop allowed x).
    """

    fp32 = OpenVINORunner(model.clone(), precision="fp32")
    refs = [fp32.run(item) for item in items]
    use_cosine = budget.min_cosine > 0 and not np.isfinite(budget.atol)

    def metric(compiled, data) -> float:
        request = compiled.create_infer_request()
        worst = 1.0 if use_cosine else 0.0
        for item, ref in zip(data, refs, strict=False):
            result = request.infer(item)
            for k, port in enumerate(compiled.outputs):
                r = np.asarray(list(ref.values())[k], dtype=np.float64).ravel()
                c = np.asarray(result[port], dtype=np.float64).ravel()
                if use_cosine:
                    den = float(np.linalg.norm(r) * np.linalg.norm(c))
                    cos = float(r @ c) / den if den else float(np.array_equal(r, c))
                    worst = min(worst, cos)
                else:
                    worst = min(worst, -float(np.max(np.abs(r - c))) if r.size else 0.0)
        return worst

    max_drop = (1.0 - budget.min_cosine) if use_cosine else float(budget.atol)
    return metric, max_drop


def save(model, path: Path, *, compress_to_fp16: bool) -> list[Path]:

    ov = require_openvino("writing OpenVINO IR")
    stable_names(model)
    ov.save_model(model, str(path), compress_to_fp16=compress_to_fp16)
    return [path, path.with_suffix(".bin")]


_GENERATED = re.compile(r"(.+)_(\d+)$")


def stable_names(model) -> None:
    """OpenVINO names the nodes it creates `<Type>_<N>` from a process-wide counter, so the same
    conversion done twice in one process writes different `model.xml` files. Those names are
    renumbered in graph order (names taken from the ONNX model are kept)."""
    seen = 0
    for op in model.get_ordered_ops():
        m = _GENERATED.match(op.get_friendly_name())
        if m and m.group(1) == op.get_type_name():
            op.set_friendly_name(f"{m.group(1)}_{seen}")
            seen += 1
