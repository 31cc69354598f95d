"""`modelport optimize MODEL -o OUT`: graph passes, FP16/INT8, `auto` selection; validated per pass."""

from __future__ import annotations

from dataclasses import replace

import typer

from modelport.cli import options as flags
from modelport.cli._common import choice, console, fmt_num, fmt_size, run, split_list, stage_status
from modelport.errors import BadInputError


def optimize_table(report: dict):
    from rich.table import Table

    t = Table(title="optimisation passes", title_justify="left")
    for col in ("pass", "status", "nodes", "size", "seconds", "max abs", "cosine", "note"):
        t.add_column(col)
    for s in report.get("stages", []):
        if "pass" not in s:
            continue
        outs = (s.get("parity") or {}).get("outputs") or []
        max_abs = max((o["max_abs"] for o in outs if o.get("max_abs") is not None), default=None)
        cos = min((o["cosine"] for o in outs if o.get("cosine") is not None), default=None)
        details = s.get("details") or {}
        kept = details.get("kept_fp32")
        note = s.get("reason") or (f"kept in FP32: {', '.join(kept)}" if kept else "")
        if details.get("fusions"):
            note = note or ", ".join(f"{k}={v}" for k, v in details["fusions"].items())
        color = {"applied": "green", "rolled_back": "red"}.get(s["status"], "dim")
        t.add_row(s["pass"], f"[{color}]{s['status']}[/]", f"{s['nodes_before']} → {s['nodes_after']}",
                  f"{fmt_size(s['size_before'])} → {fmt_size(s['size_after'])}", f"{s['seconds']:.2f}",
                  "-" if max_abs is None else fmt_num(max_abs), "-" if cos is None else f"{cos:.6f}", note)
    return t


def auto_table(selection: dict):
    from rich.table import Table

    budget = selection.get("budget")
    note = f" within {budget}" + (" (the default budget; set --accuracy-budget)" if selection.get("budget_default") else "") if budget else ""
    runtime = f" ({selection['runtime']})" if selection.get("runtime") else ""
    t = Table(title=f"auto: chose {selection['chosen']}{runtime}{note}", title_justify="left")
    for col in ("variant", "runtime", "precision", "nodes", "size", "latency ms", "speed-up", "max abs", "cosine", "in budget"):
        t.add_column(col)
    for r in selection["variants"]:
        mark = "[bold green]✓ chosen[/]" if r["chosen"] else ("yes" if r["within_budget"] else "[red]no[/]")
        run_at = f" (runs {r['inference_precision']})" if r.get("inference_precision") not in (None, r["precision"]) else ""
        t.add_row(r["variant"], r.get("runtime", "onnxruntime"), r["precision"] + run_at, str(r["nodes"]), fmt_size(r["size"]),
                  f"{r['latency_ms']:.3f}",
                  f"{r['speedup']:.2f}x" if r.get("speedup") else "-", fmt_num(r["max_abs"]), f"{r['cosine']:.6f}", mark)
    notes = []
    timing = selection.get("timing")
    if timing and timing.get("method") == "interleaved":
        notes.append(f"latency: median of {timing['rounds']} interleaved rounds, threads: {timing['threads']}")
    notes += [f"not built: {n['variant']} ({n['reason']})" for n in selection.get("not_built") or []]
    if notes:
        t.caption, t.caption_justify = "\n".join(notes), "left"
    return t


def decoder_auto_table(stage: dict):
    """The decoder variants of text generation's `--optimize auto` (its `optimize:auto` stage row)."""
    from rich.table import Table

    t = Table(title=f"auto: chose {stage['chosen']} (fastest decode within its check; median of {stage['rounds']} rounds)",
              title_justify="left")
    t.add_column("variant", no_wrap=True)
    for col in ("prefill ms", "decode tok/s", "speed-up", "tokens", "max abs", "kept"):
        t.add_column(col, justify="left" if col == "kept" else "right")
    num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731 (None: not timed or not judged)
    for r in stage["variants"]:
        if r["chosen"]:
            mark = "[bold green]✓ chosen[/]"
        elif r["within_budget"]:
            mark = "slower"
        else:
            mark = "[red]failed check[/]" if r.get("token_agreement") is not None else "[red]not built[/]"
        t.add_row(r["variant"], num(r.get("prefill_ms"), ".2f"), num(r.get("decode_tok_s"), ".1f"),
                  f"{r['decode_speedup']:.2f}x" if r.get("decode_speedup") else "-", num(r.get("token_agreement"), ".3f"),
                  num(r.get("max_abs"), ".3g"), mark)
    return t


def render_optimize(report: dict, out_dir: str | None) -> None:
    from modelport.cli.render import render_report

    if any("pass" in s for s in report.get("stages", [])):
        console.print(optimize_table(report))
    if report.get("optimize"):
        console.print(auto_table(report["optimize"]))
    render_report(report, out_dir, passes_shown=True)


def register(app: typer.Typer) -> None:
    @app.command("optimize")
    @flags.taking(flags.SAMPLES, flags.SAMPLE_SETS, flags.TOLERANCES, flags.PREPROCESSING, flags.PRECISION, flags.WRITES, flags.RESULT, flags.LIMITS)
    def optimize_cmd(
        model: str = typer.Argument(..., help="Model file (ONNX or any source `convert` reads) or zoo:NAME."),
        level: str = typer.Option("extended", "--level", "--optimize", "-O", help="none, basic, extended, all or auto."),
        passes: list[str] = typer.Option([], "--passes", help="Passes instead of a level, comma-separated or repeated, e.g. fold,dce,fuse."),
        precision: flags.Precision = "fp32",
        int8_mode: str | None = typer.Option(None, "--int8-mode", help="dynamic or static (default: static with --calibration)."),
        calibration_method: str = typer.Option("minmax", "--calibration-method", help="minmax, entropy, percentile or distribution."),
        per_channel: bool | None = typer.Option(None, "--per-channel/--per-tensor", help="INT8 weight scales per channel (default: on for CNNs)."),
        keep_io_types: bool = typer.Option(True, "--keep-io-types/--fp16-io", help="FP16: keep FP32 inputs and outputs."),
        budget: flags.AccuracyBudget = None,
        **shared,
    ):
        """Optimise a model pass by pass, each pass checked for parity in onnxruntime."""
        output = shared["output"]

        def body():
            from modelport.optimize import parse_pass_list
            from modelport.optimize.pipeline import OptimizeOptions
            from modelport.orchestration import ConvertOptions, convert
            from modelport.resolve.specs import apply_options, parse_input_spec

            if not output:
                raise BadInputError("no output folder", hint="pass -o OUT_DIR")
            stage = OptimizeOptions(level=level, int8_mode=int8_mode, calibration_method=calibration_method,
                                    per_channel=per_channel, keep_io_types=keep_io_types, budget=budget)
            if split_list(passes):
                stage = replace(stage, level=None, passes=parse_pass_list(",".join(split_list(passes))))
            options = ConvertOptions(
                targets=["onnx"], **flags.parity_kwargs(shared), optimize=stage, force=shared["force"],
                inputs=apply_options([parse_input_spec(t) for t in shared["inputs"]], **flags.preprocessing_kwargs(shared)),
                precision=choice(precision, flags.PRECISIONS, "precision"), calibration=shared["calibration"],
                strict=shared["strict"], **flags.limit_kwargs(shared), allow_precision_fallback=shared["allow_fallback"],
            )
            with stage_status(shared["quiet"] or shared["json_out"]) as on_stage:
                return convert(model, output, options, command="optimize", on_stage=on_stage)

        run(body, command="optimize", json_out=shared["json_out"], quiet=shared["quiet"], junit=shared["junit"], render=lambda r: render_optimize(r, output))
