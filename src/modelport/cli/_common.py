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


def run(fn: Callable[[], dict | None], *, json_out: bool, quiet: bool, render: Callable[[dict], None] | None = None) -> None:
    """Run a command body; map errors to one stderr line plus the documented exit code."""
    try:
        try:
            result = fn()
        except Exception as e:
            from modelport.deps import missing_dependency

            missing = missing_dependency(e)
            if missing is None or missing is e:
                raise
            missing.report = getattr(e, "report", None)
            if missing.report:
                missing.report.update(exit_code=missing.exit_code, error=missing.to_dict())
            raise missing from e
    except ModelportError as e:
        from rich.markup import escape

        console.print(f"[bold red]error:[/] {escape(e.message)}", soft_wrap=True)  # hints hold "[tf]"
        if json_out:
            emit_json(getattr(e, "report", None) or {"status": "failed", "exit_code": e.exit_code, "error": e.to_dict()})
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
            emit_json({"status": "failed", "exit_code": EXIT_UNEXPECTED, "error": {"type": type(e).__name__, "message": str(e)}})
        raise typer.Exit(EXIT_UNEXPECTED) from None
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
