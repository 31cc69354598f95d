"""`modelport batch MANIFEST -o OUT`: many models per run, resumable, with reports CI systems read."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import console, run


def register(app: typer.Typer) -> None:
    @app.command("batch")
    def batch_cmd(
        manifest: str = typer.Argument(..., help="YAML manifest: `models:` (source, name, to, input, ...) and `defaults:`."),
        output: str = typer.Option(..., "-o", "--output-dir", help="Batch folder: OUT/<model>/ per model and OUT/summary.json."),
        jobs: int = typer.Option(1, "--jobs", "-j", help="Models converted at once on this machine (local executor)."),
        executor: str = typer.Option("local", "--executor", help="local (child processes here) or ray (Ray tasks)."),
        address: str | None = typer.Option(None, "--address", help="Ray cluster address (default: start a local one)."),
        rerun_failed: bool = typer.Option(False, "--rerun-failed", help="Run only the models whose last run failed."),
        only: list[str] = typer.Option([], "--only", help="Run only these models (comma-separated or repeated)."),
        keep_failed: flags.KeepFailed = False,
        junit: flags.Junit = None,
        json_out: flags.JsonOut = False,
        quiet: flags.Quiet = False,
    ):
        """Convert every model of a manifest, each in its own process; unchanged models are skipped.

        Exit 4 when any model failed (its entry in summary.json says why); a failure never stops the others.
        """
        from pathlib import Path

        from modelport.cli._common import split_list

        def body():
            from modelport.errors import ValidationError
            from modelport.orchestration.batch import BatchOptions, run_batch
            from modelport.validation.ci_reports import junit_for_batch, publish_to_github

            def progress(entry):
                if not quiet and not json_out:
                    mark = "[green]ok[/]" if entry["status"] == "ok" else f"[red]{entry['status']}[/]"
                    console.print(f"{mark} {entry['name']} ({entry.get('seconds', 0):.1f} s)"
                                  + (f": {entry['error']}" if entry.get("error") else ""), soft_wrap=True, highlight=False)

            from modelport.orchestration.batch import EXECUTORS
            from modelport.registry import choice

            options = BatchOptions(jobs=jobs, rerun_failed=rerun_failed, keep_failed=keep_failed, only=split_list(only),
                                   executor=choice(executor, EXECUTORS, "executor"), address=address)
            summary = run_batch(manifest, output, options, on_result=progress)
            if junit:
                junit_for_batch(summary, Path(output), junit)
            publish_to_github(summary["models"], f"modelport batch {Path(manifest).name}", lambda line: console.print(
                line, markup=False, highlight=False, soft_wrap=True))
            if summary["counts"]["failed"]:
                if not quiet and not json_out:
                    render(summary)
                failed = [m["name"] for m in summary["models"] if m.get("status") not in ("ok", "not-run")]
                raise ValidationError(f"{len(failed)} of {len(summary['models'])} model(s) failed: {', '.join(failed)}",
                                      path=Path(output) / "summary.json").with_report(summary)
            return summary

        def render(summary):
            from rich.table import Table

            t = Table(title="batch", title_justify="left")
            for col in ("model", "status", "seconds", "targets", "note"):
                t.add_column(col, overflow="fold")
            for m in summary["models"]:
                note = "unchanged, skipped" if m.get("skipped") else (m.get("error") or "")
                t.add_row(m["name"], m["status"], f"{m.get('seconds') or 0:.1f}", ",".join(m.get("targets") or []), note)
            console.print(t)
            c = summary["counts"]
            console.print(f"{c['ok']} ok, {c['failed']} failed, {c['skipped']} skipped; summary: {Path(output) / 'summary.json'}")

        run(body, command="batch", json_out=json_out, quiet=quiet, render=render)
