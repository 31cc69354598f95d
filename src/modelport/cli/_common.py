"""What every command shares: the stderr console, error reporting, --json output, exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import contextmanager

import typer
from rich.console import Console

from modelport.errors import EXIT_UNEXPECTED, ModelportError

console = Console(stderr=True, highlight=False)


def emit_json(data) -> None:
    from modelport.convert.report import _json_default

    sys.stdout.write(json.dumps(data, indent=2, default=_json_default) + "\n")
    sys.stdout.flush()


def failed_report(command: str, exit_code: int, error: dict) -> dict:
    """A `modelport.report/1` document for a run that failed before its own report existed (bad options, unreadable input)."""
    from modelport.convert.report import Report

    return Report(command).finish(exit_code=exit_code, error=error)


def run(fn: Callable[[], dict | None], *, json_out: bool, quiet: bool, render: Callable[[dict], None] | None = None,
        command: str = "modelport") -> None:
    """Run a command body; map errors to one stderr line plus the documented exit code.

    With --json a failed run prints its report; one that failed before its report existed gets a
    `modelport.report/1` document for `command` all the same.
    """
    try:
        result = fn()
    except ModelportError as e:
        from rich.markup import escape

        console.print(f"[bold red]error:[/] {escape(e.message)}", soft_wrap=True)  # hints hold "[tf]"
        if json_out:
            emit_json(getattr(e, "report", None) or failed_report(command, e.exit_code, e.to_dict()))
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        console.print("[bold red]error:[/] interrupted")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except Exception as e:  # a bug: one line, the trace only with MODELPORT_DEBUG
        import os

        if os.environ.get("MODELPORT_DEBUG"):
            raise
        console.print(f"[bold red]internal error:[/] {type(e).__name__}: {e} (set MODELPORT_DEBUG=1 for the traceback)", soft_wrap=True)
        if json_out:
            emit_json(failed_report(command, EXIT_UNEXPECTED, {"type": type(e).__name__, "exit_code": EXIT_UNEXPECTED, "message": str(e), "path": None}))
        raise typer.Exit(EXIT_UNEXPECTED) from None
    if isinstance(result, dict):
        from rich.markup import escape

        for text in result.get("warnings") or []:  # also with --quiet/--json: stderr, one line each
            console.print(f"[bold yellow]warning:[/] {escape(text)}", soft_wrap=True)
    if json_out:
        emit_json(result if result is not None else {})
    elif render and not quiet and result is not None:
        render(result)


@contextmanager
def stage_status(quiet: bool):
    """A spinner naming the current stage, on stderr and only on a terminal."""
    if quiet or not console.is_terminal:
        yield None
        return
    with console.status("starting") as status:
        yield lambda name: status.update(f"[bold]{name}[/]")


def fmt_num(v, digits: int = 3) -> str:
    if v is None:
        return "inf"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)
