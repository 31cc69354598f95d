"""`--optimize auto`: build the candidate variants, benchmark each on onnxruntime CPU with the same
inputs, and keep the fastest whose accuracy stays within the budget.

Candidates: the model as given (`raw`), FP32 `extended` and `all` (with onnxruntime contrib
fusions), FP16, INT8 dynamic, and INT8 static when calibration data is given; the precision
variants start from the `extended` model. Accuracy is judged against the reference outputs with
the user's budget (default: each precision's default tolerance). The table every choice was made
from is returned for the report.
"""

from __future__ import annotations

from dataclasses import replace

from modelport.errors import ValidationError
from modelport.ir import IRModel
from modelport.validation import Tolerance, check, tolerance_for


def latency_ms(model, feeds, *, runs: int = 20, warmup: int = 3) -> float:
    """Median wall time of one onnxruntime CPU run, in milliseconds (bench's timing engine)."""
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
    from modelport.runtimes.timing import median_ms

    runner = OnnxRuntimeRunner(model)
    return median_ms(lambda: runner.run(feeds), runs=runs, warmup=warmup)


def auto_select(ir: IRModel, opts, *, tolerance=None, on_pass=None):
    """(chosen IR, its pass rows, the selection table)."""
    from modelport.optimize.model_tools import model_size, node_count
    from modelport.optimize.pipeline import budgeted, optimize_ir
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    if opts.budget is not None:
        tolerance = budgeted(tolerance, opts.budget)
    feeds = ir.reference.inputs
    plans = [("raw", "none", "fp32"), ("fp32-extended", "extended", "fp32"), ("fp32-all", "all", "fp32")]
    variants: dict[str, tuple[IRModel, list[dict]]] = {}
    for label, level, _ in plans:
        sub = replace(opts, level=level, passes=None, precision="fp32", strict=False)
        variants[label] = optimize_ir(ir, sub, tolerance=tolerance, on_pass=on_pass)[:2]
    base, base_rows = variants["fp32-extended"]
    precisions = [("fp16", "fp16", None), ("int8-dynamic", "int8", "dynamic")]
    if opts.calibration:
        precisions.append(("int8-static", "int8", "static"))
    for label, precision, mode in precisions:
        sub = replace(opts, level="none", passes=None, precision=precision, int8_mode=mode, strict=False, budget=None)
        # Gate open: every variant is built and judged against the budget in the table below.
        try:
            out, rows, _ = optimize_ir(base, sub, tolerance=lambda p: _OPEN, on_pass=on_pass)
        except ValidationError:
            continue  # the precision could not be built on this model (NaN/Inf, or the converter failed): no candidate
        if out is not base:
            variants[label] = (out, base_rows + rows)
    table = []
    for label, (model_ir, _rows) in variants.items():
        if on_pass:
            on_pass(f"auto:bench:{label}")
        precision = model_ir.provenance.get("precision", "fp32")
        budget = opts.budget or tolerance_for(precision)
        # a calibrated variant carries its own in-distribution reference (see quantize.calibration_reference)
        ref = model_ir.reference or ir.reference
        parity = check(OnnxRuntimeRunner(model_ir.model), ref, budget, f"auto:{label}")
        worst = min(parity.outputs, key=lambda o: o.cosine) if parity.outputs else None
        table.append({
            "variant": label, "precision": precision, "nodes": node_count(model_ir.model),
            "size": model_size(model_ir.model), "latency_ms": round(latency_ms(model_ir.model, feeds, runs=opts.bench_runs), 3),
            "max_abs": max((o.max_abs for o in parity.outputs), default=0.0), "cosine": worst.cosine if worst else 1.0,
            "within_budget": parity.ok, "budget": _budget_text(budget),
        })
    ok = [r for r in table if r["within_budget"]]
    chosen = min(ok, key=lambda r: r["latency_ms"]) if ok else table[0]
    raw_ms = table[0]["latency_ms"]
    for r in table:
        r["speedup"] = round(raw_ms / r["latency_ms"], 3) if r["latency_ms"] else None
        r["chosen"] = r is chosen
    model_ir, rows = variants[chosen["variant"]]
    return model_ir, rows, {"chosen": chosen["variant"], "variants": table}


_OPEN = Tolerance(float("inf"), float("inf"), -1.0)


def _budget_text(t: Tolerance) -> str:
    parts = []
    if t.min_cosine > 0:
        parts.append(f"cosine>={t.min_cosine:g}")
    if t.atol != float("inf"):
        parts.append(f"|d|<={t.atol:g}+{t.rtol:g}|r|")
    return ", ".join(parts) or "none"
