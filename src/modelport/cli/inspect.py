"""`modelport inspect MODEL`: format, I/O, opset, op histogram, parameters, size."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import console, run


def render_inspect(info: dict) -> None:
    from rich.table import Table

    head = Table(show_header=False, title=info.get("path"), title_justify="left")
    for key in ("format", "ir_version", "opsets", "producer", "model_type", "architectures", "task", "nodes", "parameters", "size",
                "signatures", "note"):
        if info.get(key) not in (None, "", {}):
            head.add_row(key, str(info[key]))
    console.print(head)
    for kind in ("inputs", "outputs"):
        if info.get(kind):
            t = Table(title=kind, title_justify="left")
            for col in ("name", "dtype", "shape"):
                t.add_column(col)
            for s in info[kind]:
                t.add_row(str(s.get("name")), str(s.get("dtype", "")), str(s.get("shape", "")))
            console.print(t)
    if info.get("ops"):
        t = Table(title="ops", title_justify="left")
        t.add_column("op")
        t.add_column("count", justify="right")
        for op, n in info["ops"].items():
            t.add_row(op, str(n))
        console.print(t)


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect_cmd(
        model: str = typer.Argument(..., help="Model file or folder."),
        json_out: flags.JsonOut = False,
        quiet: flags.Quiet = False,
    ):
        """Show a model's format, inputs/outputs, opset, op histogram, parameters and size."""

        def body():
            from modelport.orchestration.inspect import inspect

            return inspect(model)

        run(body, json_out=json_out, quiet=quiet, render=render_inspect)
