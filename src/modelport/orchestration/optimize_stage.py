"""The optimisation stage of `convert`: the IR after `validate:ir`, before the emitters.

The stage runs when `--optimize LEVEL` (or `--passes`) is given, or when a non-FP32 precision is
asked for and every target is `onnx`. Each pass becomes one `optimize:<pass>` entry in the
report's stages; `auto` adds the table it chose from as `report["optimize"]`. The returned
options carry the precision of the model that came out, so the emitted artifact is validated
with the right tolerance.

The precision passes write onnxruntime models (QDQ, FP16 with casts) that other converters do
not take (onnx2tf fails on QDQ graphs, TensorRT and the PyTorch code emitter want FP32). So when
a target outside the ONNX family is asked for too, the stage runs the FP32 passes only and each
emitter applies `--precision` itself (the ONNX and ORT emitters through the same precision
passes, TFLite through its converter); `auto`, whose variants are onnxruntime models, is refused
in that case.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from modelport.ir import IRModel

ONNX_FAMILY = ("onnx", "ort")


def wanted(options) -> bool:
    asked = options.optimize
    if asked is not None and (asked.level is not None or asked.passes):
        return True
    return options.precision not in ("fp32", None) and all(t == "onnx" for t in options.targets)


# what `--optimize auto` holds every variant to when no --accuracy-budget is given (printed, and
# recorded in the report's `optimize.budget` with `budget_default: true`)
DEFAULT_AUTO_BUDGET = "cosine>=0.999"


def asked_budget_text(opts) -> str | None:
    """The user's --accuracy-budget as they wrote it, or as the budget it parsed to."""
    b = opts.budget
    if b is None or isinstance(b, str):
        return b
    parts = [f"cosine>={b.min_cosine:g}"] if b.min_cosine > 0 else []
    if b.atol != float("inf"):
        parts.append(f"max_abs<={b.atol:g}")
    return ",".join(parts) or None


def with_auto_budget(opts):
    """(options, whether the budget is the default): `auto` always judges its variants against a
    stated budget, DEFAULT_AUTO_BUDGET when the user gave none."""
    default = opts.level == "auto" and not opts.passes and opts.budget is None
    if default:
        from modelport.optimize.pipeline import parse_budget

        opts = replace(opts, budget=parse_budget(DEFAULT_AUTO_BUDGET))
    return opts, default


def stated_budget(selection: dict, opts, asked, default: bool) -> dict:
    """The auto selection with the budget it was judged by (`budget`, `budget_default`) for the report."""
    if opts.budget is None:
        return selection
    return {**selection, "budget": DEFAULT_AUTO_BUDGET if default else asked_budget_text(asked), "budget_default": default}


def optimize_stage(ir: IRModel, options, report, zoo_tol=None, *, on_stage=None, release_input: bool = False):
    """(optimised IR, options with the resulting precision and tolerances). `release_input`: the
    caller goes on with the optimised IR alone (`run_passes`)."""
    from modelport.errors import BadInputError
    from modelport.optimize.pipeline import OptimizeOptions, optimize_ir

    others = [t for t in options.targets if t not in ONNX_FAMILY]
    asked = options.optimize or OptimizeOptions(level=None)
    if asked.level == "auto" and not asked.passes:
        return _auto_stage(ir, options, asked, report, zoo_tol, on_stage=on_stage)
    if asked.runtimes:
        raise BadInputError("--runtimes names the runtimes --optimize auto compares", hint="add --optimize auto")
    # the run's own options apply to this stage too; without a level or passes only the precision passes run
    opts = replace(asked, level=asked.level or (None if asked.passes else "none"),
                   precision="fp32" if others else (options.precision or "fp32"), calibration=options.calibration,
                   strict=options.strict, allow_fallback=options.allow_precision_fallback)
    opts, default_budget = with_auto_budget(opts)
    run = functools.partial(optimize_ir, release_input=release_input)
    out, rows, selection = _run_recorded(run, ir, opts, options, zoo_tol, report, on_stage)
    if selection:
        report.set_optimize(stated_budget(selection, opts, asked, default_budget))
    if others:
        return out, options  # the emitters apply the precision
    precision = out.provenance.get("precision", "fp32")
    changes = {"precision": precision}
    fallback = out.provenance.get("precision_fallback")
    if fallback and precision != fallback["requested"]:
        changes["fallback_reason"] = fallback["reason"]
        report.warn(f"--precision {fallback['requested']} could not be delivered ({fallback['reason']}); the model is {precision}")
    if opts.budget is not None and precision != "fp32":
        changes.update(atol=opts.budget.atol, rtol=opts.budget.rtol, min_cosine=opts.budget.min_cosine,
                       scaled_atol=opts.budget.scaled)
    return out, replace(options, **changes)


def _auto_stage(ir: IRModel, options, asked, report, zoo_tol, *, on_stage=None):
    """`--optimize auto`: candidates of every runtime asked for compete; the winner's runtime decides
    what is written. An onnxruntime winner feeds the ONNX-family targets (`onnx` when none was
    asked), an OpenVINO winner the `openvino` target at the precision it won with; targets of the
    losing runtime are not written (the report's `optimize.targets` and a warning say so)."""
    from modelport.emitters.openvino import OpenVINOOptions
    from modelport.errors import BadInputError
    from modelport.optimize.auto import auto_select
    from modelport.runtimes import CPU_RUNTIMES, default_runtimes

    allowed = {t for targets in CPU_RUNTIMES.values() for t in targets}
    others = [t for t in options.targets if t not in allowed]
    if others:
        raise BadInputError(f"--optimize auto picks an onnxruntime variant or an OpenVINO one; it cannot feed {', '.join(others)}",
                            hint="use a named level (e.g. --optimize all) with those targets, or convert to onnx/ort/openvino only")
    runtimes = asked.runtimes or default_runtimes(options.targets)
    opts = replace(asked, precision="fp32", calibration=options.calibration, strict=options.strict,
                   allow_fallback=options.allow_precision_fallback, runtimes=runtimes)
    opts, default_budget = with_auto_budget(opts)
    out, rows, selection = _run_recorded(auto_select, ir, opts, options, zoo_tol, report, on_stage)
    runtime = selection["runtime"]
    targets = [t for t in options.targets if t in CPU_RUNTIMES[runtime]] or [CPU_RUNTIMES[runtime][0]]
    dropped = [t for t in options.targets if t not in targets]
    selection["targets"] = targets
    report.set_optimize(stated_budget(selection, opts, asked, default_budget))
    if dropped:
        report.warn(f"--optimize auto chose {selection['chosen']} ({runtime}): {', '.join(dropped)} not written")
    precision = out.provenance.get("precision", "fp32") if runtime == "onnxruntime" else selection["precision"]
    changes = {"precision": precision, "targets": targets}
    if runtime == "openvino":
        changes["target_options"] = {**options.target_options, "openvino": OpenVINOOptions(int8_mode=selection.get("int8_mode"))}
    if opts.budget is not None and precision != "fp32":
        changes.update(atol=opts.budget.atol, rtol=opts.budget.rtol, min_cosine=opts.budget.min_cosine,
                       scaled_atol=opts.budget.scaled)
    return out, replace(options, **changes)


def warn_round_limits(report, rows: list[dict]) -> None:
    """A warning for each pass whose rewrite rules still matched when its round limit stopped it."""
    for row in rows:
        limit = (row.get("details") or {}).get("round_limit_reached")
        if limit:
            report.warn(f"pass '{row['pass']}' still rewrote the model in its last round: it stopped at its round limit "
                        f"({limit}), short of a fixed point")


def _run_recorded(run, ir, opts, options, zoo_tol, report, on_stage):
    """`run` (optimize_ir or auto_select) with its stage rows in the report, also when it fails."""
    from modelport.errors import ValidationError

    try:
        out, rows, selection = run(ir, opts, tolerance=lambda p: options.tolerance(p, zoo_tol), on_pass=on_stage)
    except ValidationError as e:
        report.add_stage_rows(e.rows)
        raise
    report.add_stage_rows(rows)
    warn_round_limits(report, rows)
    return out, rows, selection
