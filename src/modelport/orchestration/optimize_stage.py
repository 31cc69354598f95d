"""The optimisation stage of the forward pipeline: the IR after `validate:ir`, before the emitters.

It runs when `--optimize LEVEL` (or `--passes`) is given, or when a target whose precision the
optimisation stage applies (modelport.resolve.precisions: `stage == "optimize"`, onnx and ort) is asked
for at a precision other than fp32. Each pass becomes one `optimize:<pass>` row in the report's
stages; `auto` adds the table it chose from as `report["optimize"]`.

The FP32 passes run once; then the precision passes run once per precision those targets need,
on the FP32 result, each checked for parity with the FP16 block-list and the user's fallback,
and every target at that precision shares the IR that comes out. Targets whose own converter
applies their precision (TFLite, OpenVINO, …) take the FP32 IR: the precision passes write
onnxruntime models (QDQ, FP16 with casts) that other converters do not take. When only one
precision is needed and no target takes the FP32 IR, the passes run in one go, as before.
`auto`, whose variants are onnxruntime or OpenVINO models, picks one runtime's targets.

A quantised IR (a dynamic-range TFLite source's int8 weights behind DequantizeLinear) is kept as
it is for the targets that take it (an ONNX artifact at fp32 keeps its int8 weights); the targets
that take float weights (`Target.float_weights`: PyTorch code and what is reached through it) take
it with those weights dequantised (the `dequantize` pass, optimize/dequantize.py), which the stage
then runs even when nothing else is asked of it, and the precision passes start from that too.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from modelport.errors import ValidationError
from modelport.ir import IRModel
from modelport.optimize.auto import auto_select
from modelport.optimize.dequantize import quantised
from modelport.optimize.pipeline import OptimizeOptions, optimize_ir, parse_budget
from modelport.orchestration.jobs import Prepared
from modelport.resolve.precisions import FP32, Resolved
from modelport.runtimes import CPU_RUNTIMES, default_runtimes
from modelport.targets import TARGETS
from modelport.validation.report import Findings

# what `--optimize auto` holds every variant to when no --accuracy-budget is given (printed, and
# recorded in the report's `optimize.budget` with `budget_default: true`)
DEFAULT_AUTO_BUDGET = "cosine>=0.999"


def needed(resolved: dict[str, Resolved]) -> list[str]:
    """The precisions the stage must apply: those of the targets whose precision it applies."""
    out: list[str] = []
    for r in resolved.values():
        if r.stage == "optimize" and r.precision not in out:
            out.append(r.precision)
    return out


def takes_float_weights(request) -> bool:
    """Whether a requested target's ONNX route takes float weights (`Target.float_weights`): a quantised
    IR's weights are then dequantised for it (optimize/dequantize.py)."""
    return any(TARGETS[t].float_weights for t in request.precisions)


def runs(request) -> bool:
    """Whether the stage runs for this request."""
    asked = request.options.optimize
    return (asked is not None and (asked.level is not None or bool(asked.passes))) or bool(needed(request.precisions))


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

        opts = replace(opts, budget=parse_budget(DEFAULT_AUTO_BUDGET))
    return opts, default


def stated_budget(selection: dict, opts, asked, default: bool) -> dict:
    """The auto selection with the budget it was judged by (`budget`, `budget_default`) for the report."""
    if opts.budget is None:
        return selection
    return {**selection, "budget": DEFAULT_AUTO_BUDGET if default else asked_budget_text(asked), "budget_default": default}


def optimise(ir: IRModel, ctx, zoo_tol, found: Findings) -> Prepared:
    """The stage on one part's IR (released: the caller goes on with what comes out); what it finds
    for the report (warnings, the auto selection) goes in `found`."""

    request = ctx.request
    options = request.options
    asked = replace(options.optimize or OptimizeOptions(level=None), budget=request.budget)
    floats = takes_float_weights(request) and quantised(ir.model)
    if not runs(request) and not floats:
        return Prepared({FP32: ir}, dict(request.precisions))
    if asked.level == "auto" and not asked.passes:
        return _auto_stage(ir, ctx, asked, zoo_tol, found)
    # the run's own options apply to this stage too; without a level or passes only the precision passes run
    base = replace(asked, level=asked.level or (None if asked.passes else "none"), calibration=options.calibration,
                   strict=options.strict, allow_fallback=options.allow_precision_fallback)
    base, default_budget = with_auto_budget(base)
    precisions = [p for p in needed(request.precisions) if p != FP32]
    takes_fp32 = any(r.stage != "optimize" or r.precision == FP32 for r in request.precisions.values())
    out = Prepared({}, dict(request.precisions), budget=base.budget)
    run = functools.partial(_run_recorded, ctx=ctx, zoo_tol=zoo_tol, found=found)
    if len(precisions) == 1 and not takes_fp32:  # one precision, every target at it: the passes in one go
        out.irs[precisions[0]] = run(ir, replace(base, precision=precisions[0]), release_input=True)
    else:
        level_given = asked.level is not None or bool(asked.passes)
        fp32 = run(ir, replace(base, precision=FP32), release_input=True) if level_given else ir
        out.irs[FP32] = fp32
        if floats and quantised(fp32.model):  # the precision passes start from it too (they take float weights)
            out.float_weights = run(fp32, replace(base, level="none", passes=["dequantize"], precision=FP32), release_input=False)
            if all(TARGETS[t].float_weights for t in request.precisions):
                out.irs[FP32] = out.float_weights  # no target takes the quantised IR: it is let go
        for p in precisions:
            out.irs[p] = run(out.float_weights or fp32, replace(base, level="none", passes=None, precision=p), release_input=False)
    for p, variant in list(out.irs.items()):
        fallback = variant.provenance.get("precision_fallback")
        delivered = variant.provenance.get("precision", FP32)
        if fallback and delivered != fallback["requested"]:
            out.fallback[p] = fallback["reason"]
            found.warn(f"--precision {fallback['requested']} could not be delivered ({fallback['reason']}); "
                       f"the model is {delivered}")
    out.irs.setdefault(FP32, next(iter(out.irs.values())))
    return out


def _auto_stage(ir: IRModel, ctx, asked, zoo_tol, found: Findings) -> Prepared:
    """`--optimize auto`: candidates of every runtime asked for compete; the winner's runtime decides
    what is written. An onnxruntime winner feeds its targets (`onnx` when none was asked), an
    OpenVINO winner its targets at the precision and with the options it won with; targets of the
    losing runtime are not written (the report's `optimize.targets` and a warning say so)."""
    from modelport.resolve.precisions import resolve
    from modelport.targets import get, load

    request, options = ctx.request, ctx.request.options
    runtimes = asked.runtimes or default_runtimes(request.targets)
    opts = replace(asked, precision=FP32, calibration=options.calibration, strict=options.strict,
                   allow_fallback=options.allow_precision_fallback, runtimes=runtimes)
    opts, default_budget = with_auto_budget(opts)
    selection: dict = {}
    out = _run_recorded(ir, opts, ctx=ctx, zoo_tol=zoo_tol, found=found, select=selection)
    runtime = selection["runtime"]
    kept = [t for t in request.targets if t in CPU_RUNTIMES[runtime]] or [CPU_RUNTIMES[runtime][0]]
    dropped = [t for t in request.targets if t not in kept]
    selection["targets"] = kept
    found.optimize = stated_budget(selection, opts, asked, default_budget)
    if dropped:
        found.warn(f"--optimize auto chose {selection['chosen']} ({runtime}): {', '.join(dropped)} not written")
    precision = out.provenance.get("precision", FP32) if runtime == "onnxruntime" else selection["precision"]
    # the winner's precision for its targets: the optimisation stage applied it (onnxruntime) or their converter does
    chosen = {t: replace(r, precision=precision, asked=False, judged_as=precision) for t, r in resolve(kept, FP32).items()}
    written = selection.get("written_with") or {}  # what the winner was built with, for its targets' options
    target_options = {t: load(get(t).options)(**written) for t in kept if written and get(t).options}
    return Prepared({FP32: out, precision: out}, chosen, budget=opts.budget if precision != FP32 else None,
                    target_options=target_options)


def warn_round_limits(found: Findings, rows: list[dict]) -> None:
    """A warning for each pass whose rewrite rules still matched when its round limit stopped it."""
    for row in rows:
        limit = (row.get("details") or {}).get("round_limit_reached")
        if limit:
            found.warn(f"pass '{row['pass']}' still rewrote the model in its last round: it stopped at its round limit "
                       f"({limit}), short of a fixed point")


def warn_kept_float(found: Findings, rows: list[dict]) -> None:
    """A warning for each applied INT8 pass that kept nodes in float to hold parity, naming them."""
    for row in rows:
        details = row.get("details") or {}
        kept = details.get("kept_float")
        if row.get("status") != "applied" or not kept:
            continue
        fallback = details.get("fallback") or {}
        missed = fallback.get("missed_on") or []
        where = f" on the {', '.join(repr(k) for k in missed)} sample{'s' if len(missed) > 1 else ''}" if missed else ""
        of = f" of {fallback['quantised']} quantised" if fallback.get("quantised") else ""
        nodes = ", ".join(f"{k['node']} ({k['op']}, {k['error']:.0%} of the error)" for k in kept[:10])
        more = f" (+{len(kept) - 10} more)" if len(kept) > 10 else ""
        found.warn(f"pass '{row['pass']}': INT8 missed its tolerance{where}; {len(kept)}{of} node{'s' if len(kept) != 1 or of else ''} "
                   f"kept in float to hold it: {nodes}{more}")


def _run_recorded(ir, opts, *, ctx, zoo_tol, found: Findings, release_input: bool = True, select: dict | None = None) -> IRModel:
    """The passes of `opts` (`optimize_ir`, or `auto_select` when `select` is given: its selection
    goes there), their stage rows in the report also when they fail; what they found goes in `found`."""

    options = ctx.request.options
    run = auto_select if select is not None else functools.partial(optimize_ir, release_input=release_input)
    try:
        out, rows, selection = run(ir, opts, on_pass=ctx.on_stage,
                                   tolerance=lambda p: options.tolerance(p, zoo_tol, source=ir.provenance.get("source_precision")))
        failed = None
    except ValidationError as e:
        rows, failed = e.rows, e
    ctx.report.add_stage_rows(rows)  # the passes' rows, as they ran, also when one failed
    if failed is not None:
        raise failed
    warn_round_limits(found, rows)
    warn_kept_float(found, rows)
    if select is not None:
        select.update(selection)
    elif selection:
        found.optimize = stated_budget(selection, opts, opts, False)
    return out
