"""`modelport inspect MODEL`: format, I/O, opset, op histogram, parameters, size."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import fmt_size, print_rows, run

HEAD = ("format", "ir_version", "opsets", "producer", "model_type", "spec_version", "precision", "architectures", "task", "nodes",
        "parameters", "size", "signatures", "note")


def _dim(d, form: dict | None) -> str:
    """One dim as the shape column shows it: 3, batch, batch[1..8] or seq{128,256,512}."""
    kind = (form or {}).get("kind")
    if kind == "range":
        return f"{d}[{form['min']}..{form['max']}]"
    if kind == "sizes":
        return f"{d}{{{','.join(map(str, form['sizes']))}}}"
    return str(d)


def _shape(shape, forms=None) -> str:
    if not isinstance(shape, (list, tuple)):
        return str(shape)
    forms = forms if isinstance(forms, list) and len(forms) == len(shape) else [None] * len(shape)
    return ",".join(_dim(d, f) for d, f in zip(shape, forms, strict=True))


def _value(key: str, v) -> str:
    if key == "opsets" and isinstance(v, dict):
        return ", ".join(f"{d}={n}" for d, n in v.items())
    if key == "size":
        return f"{fmt_size(v)} ({v} bytes)"
    if key == "parameters" and isinstance(v, int):
        return f"{v:,}"
    return str(v)


def print_inspect(info: dict) -> None:
    """The model on stdout: tables on a terminal; otherwise one tab-separated row per fact, each
    starting with its kind (info, input, output, op), so `| grep -w op` or `| cut -f2` work."""
    import sys

    head = [(k, _value(k, info[k])) for k in HEAD if info.get(k) not in (None, "", {})]
    io = [(kind[:-1], s.get("name"), s.get("dtype", ""), _shape(s.get("shape", ""), s.get("dims"))) for kind in ("inputs", "outputs") for s in info.get(kind) or []]
    ops = list((info.get("ops") or {}).items())
    if not sys.stdout.isatty():
        rows = [("info", k, v, "") for k, v in head] + io + [("op", op, n, "") for op, n in ops]
        print_rows("", ["kind", "name", "value", "shape"], [list(r) for r in rows])
        return
    from rich.console import Console
    from rich.table import Table

    out = Console(highlight=False)
    t = Table(show_header=False, title=info.get("path"), title_justify="left")
    t.add_column(overflow="fold")
    t.add_column(overflow="fold")
    for k, v in head:
        t.add_row(k, v)
    out.print(t)
    for kind in ("input", "output"):
        rows = [r for r in io if r[0] == kind]
        if rows:
            t = Table(title=kind + "s", title_justify="left")
            t.add_column("name", no_wrap=True, min_width=max(len(str(r[1])) for r in rows))
            for col in ("dtype", "shape"):
                t.add_column(col, overflow="fold")
            for r in rows:
                t.add_row(*(str(c) for c in r[1:]))
            out.print(t)
    if ops:
        t = Table(title="ops", title_justify="left")
        t.add_column("op", no_wrap=True, min_width=max(len(op) for op, _ in ops))
        t.add_column("count", justify="right")
        for op, n in ops:
            t.add_row(op, str(n))
        out.print(t)


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

        run(body, command="inspect", json_out=json_out, quiet=quiet, print_result=print_inspect)
