"""`modelport report diff OLD NEW`: the regression gate between two reports or batch summaries."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import console, fmt_num, run


def register(app: typer.Typer) -> None:
    report_app = typer.Typer(help="Work with reports: compare two runs.", no_args_is_help=True)
    app.add_typer(report_app, name="report")

    @report_app.command("diff")
    def diff_cmd(
        old: str = typer.Argument(..., help="The earlier report.json or summary.json (or its folder)."),
        new: str = typer.Argument(..., help="The later one."),
        size_growth: float = typer.Option(0.10, "--max-size-growth", help="Largest allowed artifact size growth (0.10 = 10 %)."),
        nodes_growth: float = typer.Option(0.10, "--max-nodes-growth", help="Largest allowed node count growth."),
        error_growth: float = typer.Option(10.0, "--max-error-growth", help="Largest allowed factor on max abs/rel parity errors."),
        cosine_drop: float = typer.Option(1e-4, "--max-cosine-drop", help="Largest allowed drop of a parity cosine."),
        latency_growth: float = typer.Option(0.20, "--max-latency-growth", help="Largest allowed latency growth."),
        all_rows: bool = typer.Option(False, "--all", help="Show every compared metric, not only changes and regressions."),
        json_out: flags.JsonOut = False,
        quiet: flags.Quiet = False,
    ):
        """Compare two runs; exit 4 when a model newly fails or a metric regresses past its threshold."""

        def body():
            from modelport.errors import ValidationError
            from modelport.validation.report_diff import DiffThresholds, diff, load

            t = DiffThresholds(size_growth=size_growth, nodes_growth=nodes_growth, error_growth=error_growth,
                               cosine_drop=cosine_drop, latency_growth=latency_growth)
            doc = diff(load(old), load(new), t)
            if doc["regressions"]:
                if not quiet and not json_out:
                    render(doc)
                worst = [f"{r['model']} {r['metric']}" + (f" ({r['target']})" if r["target"] else "") for r in doc["rows"] if r["regression"]]
                raise ValidationError(f"{doc['regressions']} regression(s): {', '.join(worst[:5])}"
                                      + (" ..." if len(worst) > 5 else "")).with_report(doc)
            return doc

        def render(doc):
            from rich.table import Table

            t = Table(title=f"report diff ({doc['regressions']} regression(s))", title_justify="left")
            for col in ("model", "target / hop", "metric", "old", "new", "change", ""):
                t.add_column(col, overflow="fold")
            for r in doc["rows"]:
                if not (all_rows or r["regression"] or r["old"] != r["new"]):
                    continue
                change = f"{r['change']:+.1%}" if isinstance(r["change"], float) else ""
                t.add_row(r["model"], r["target"], r["metric"], fmt_num(r["old"]) if r["old"] is not None else "-",
                          fmt_num(r["new"]) if r["new"] is not None else "-", change,
                          "[red]regression[/]" if r["regression"] else (r["note"] or ""))
            console.print(t)

        run(body, command="report diff", json_out=json_out, quiet=quiet, render=render)
