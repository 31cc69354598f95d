"""The optimisation stage of `convert`: the IR after `validate:ir`, before the emitters.

The stage runs when `--optimize LEVEL` (or `--passes`) is given, or when a non-FP32 precision is
asked for and every target is `onnx`. Each pass becomes one `optimize:<pass>` entry in the
report's stages; `auto` adds the table it chose from as `report["optimize"]`. The returned
options carry the precision of the model that came out, so the emitted artifact is validated
with the right tolerance.
"""

from __future__ import annotations

from dataclasses import replace

from modelport.ir import IRModel


def wanted(options) -> bool:
    if options.optimize or options.passes:
        return True
    return options.precision not in ("fp32", None) and all(t == "onnx" for t in options.targets)


def optimize_stage(ir: IRModel, options, report, zoo_tol=None, *, on_stage=None):
    """(optimised IR, options with the resulting precision and tolerances)."""
    from modelport.errors import ValidationError
    from modelport.optimize.pipeline import OptimizeOptions, optimize_ir

    opts = OptimizeOptions(
        level=options.optimize or ("none" if not options.passes else None), passes=options.passes,
        precision=options.precision or "fp32", int8_mode=options.int8_mode, calibration=options.calibration,
        calibration_method=options.calibration_method, per_channel=options.per_channel,
        keep_io_types=options.keep_io_types, budget=options.accuracy_budget, strict=options.strict,
    )
    try:
        out, rows, selection = optimize_ir(ir, opts, tolerance=lambda p: options.tolerance(p, zoo_tol), on_pass=on_stage)
    except ValidationError as e:
        report.data["stages"].extend(r.to_dict() for r in getattr(e, "rows", []))
        raise
    report.data["stages"].extend(rows)
    if selection:
        report.data["optimize"] = selection
    precision = out.provenance.get("precision", "fp32")
    changes = {"precision": precision}
    if opts.budget is not None and precision != "fp32":
        changes.update(atol=opts.budget.atol, rtol=opts.budget.rtol, min_cosine=opts.budget.min_cosine)
    return out, replace(options, **changes)
