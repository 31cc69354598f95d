"""`modelport validate A B [--localize]`: compare two models on the same inputs; exit 4 on a mismatch."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import choice, console, run, stage_status


def render_validate(report: dict) -> None:
    from modelport.cli.render import parity_table

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
    @flags.taking(flags.SAMPLES, flags.TOLERANCES, flags.RESULT)
    def validate_cmd(
        a: str = typer.Argument(..., help="Reference model (.onnx, .ort, .tflite, .plan)."),
        b: str = typer.Argument(..., help="Candidate model."),
        localize: bool = typer.Option(False, "--localize", help="Name the first diverging node (ONNX vs ONNX)."),
        data: flags.aliased(flags.Data, "--inputs") = None,
        precision: str = typer.Option("fp32", "--precision", help="Default tolerances for this precision of B."),
        by_position: bool = typer.Option(False, "--match-by-position", help="Pair outputs in order instead of by name (two models whose outputs are named differently)."),
        **shared,
    ):
        """Compare two models on the same inputs (exit 4 when they differ: a CI gate)."""

        def body():
            from modelport.orchestration.validate import validate_models
            from modelport.specs import parse_dims
            from modelport.validation import DEFAULT_TOLERANCES, tolerance_for

            tols, per_output = flags.tolerances(shared)
            tol = tolerance_for(choice(precision, DEFAULT_TOLERANCES, "precision"), user=tols, overrides=per_output)
            with stage_status(shared["quiet"] or shared["json_out"]) as on_stage:
                return validate_models(a, b, data=data, values=shared["values"], dims=parse_dims(shared["dim"]), seed=shared["seed"], tolerance=tol,
                                       localize=localize, by_position=by_position, on_stage=on_stage)

        run(body, command="validate", json_out=shared["json_out"], quiet=shared["quiet"], junit=shared["junit"], render=render_validate)
