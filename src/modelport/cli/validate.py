"""`modelport validate A B [--localize]`: compare two models on the same inputs; exit 4 on a mismatch."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from modelport.cli import options as flags
from modelport.cli._common import choice, console, run, stage_status


def render_validate(report: dict) -> None:
    from modelport.cli.render import parity_table

    idle = next((report[k] for k in ("a", "b") if (report.get(k) or {}).get("validated") is False), None)
    if idle is not None:  # a model whose runtime cannot run here: checked, not compared (the warning says why)
        console.print(f"[yellow]not run here[/]: {escape(idle['path'])}'s inputs and outputs match the other model's")
        return
    console.print(parity_table(report))
    where = report.get("localize")
    if where:
        if where.get("node"):
            console.print(f"first diverging node: [bold]{where['node']}[/] ({where['op_type']}), tensor '{where['tensor']}'")
        else:
            console.print(where.get("note", ""))
    console.print("[green]models match[/]" if report["status"] == "ok" else "[red]models differ[/]")


def register(app: typer.Typer) -> None:
    @app.command("validate")
    @flags.taking(flags.SAMPLES, flags.SAMPLE_SETS, flags.TOLERANCES, flags.RESULT)
    def validate_cmd(
        a: str = typer.Argument(..., help="Reference model: .onnx, .ort, .tflite, .plan, .mlpackage, an emitted pytorch/ folder, or a source "
                                          "(.pt2, .keras, .h5, SavedModel folder, .pb)."),
        b: str = typer.Argument(..., help="Candidate model (any of the same)."),
        localize: bool = typer.Option(False, "--localize", help="Name the first diverging node (ONNX vs ONNX)."),
        precision: str = typer.Option("fp32", "--precision", help="Default tolerances for this precision of B."),
        by_position: bool = typer.Option(False, "--match-by-position", help="Pair outputs in order instead of by name (two models whose outputs are named differently)."),
        trust: flags.Trust = False,
        strict: flags.Strict = False,
        legacy_inputs: list[str] = typer.Option([], "--inputs", hidden=True, help="Deprecated: --data FILE.npz (a file) or "
                                                                                  "--input NAME:SHAPE (a spec)."),
        **shared,
    ):
        """Compare two models on the same inputs (exit 4 when they differ: a CI gate)."""

        def body():
            from modelport.orchestration.validate import validate_models
            from modelport.resolve.specs import parse_dims, parse_input_spec

            data, specs = shared["data"], list(shared["inputs"])
            for value in legacy_inputs:  # validate's old spelling of --data; convert's --inputs is --input
                if value.lower().endswith(".npz") or Path(value).is_file():
                    console.print(f"[bold yellow]warning:[/] --inputs {escape(value)} is deprecated here; use --data {escape(value)}",
                                  soft_wrap=True)
                    data = data or value
                else:
                    specs.append(value)
            tols, per_output = flags.tolerances(shared)
            tol = tolerance_for(choice(precision, DEFAULT_TOLERANCES, "precision"), user=tols, overrides=per_output)
            with stage_status(shared["quiet"] or shared["json_out"]) as on_stage:
                return validate_models(a, b, data=data, values=shared["values"], dims=parse_dims(shared["dim"]), seed=shared["seed"],
                                       tolerance=tol, localize=localize, by_position=by_position, trust=trust,
                                       inputs=[parse_input_spec(t) for t in specs], on_stage=on_stage, strict=strict,
                                       sampling={"randoms": shared["samples"], "structured": not shared["no_structured"]})

        from modelport.validation import DEFAULT_TOLERANCES, tolerance_for

        run(body, command="validate", json_out=shared["json_out"], quiet=shared["quiet"], junit=shared["junit"], render=render_validate,
            render_failed=True)
