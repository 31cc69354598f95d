"""What every command shares: the stderr console, error reporting, --json output, exit codes."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

import typer
from rich.console import Console

from modelport.errors import EXIT_UNEXPECTED, ModelportError
from modelport.registry import choice  # noqa: F401  (re-exported: the CLI's choice options)

console = Console(stderr=True, highlight=False)


def emit_json(data) -> None:
    import json

    from modelport.validation.report import json_default

    sys.stdout.write(json.dumps(data, indent=2, default=json_default) + "\n")
    sys.stdout.flush()


def run(fn: Callable[[], dict | None], *, json_out: bool, quiet: bool, render: Callable[[dict], None] | None = None,
        command: str = "modelport", print_result: Callable[[dict], None] | None = None, render_failed: bool = False,
        junit: str | None = None) -> None:
    """Run a command body; map errors to one stderr line plus the documented exit code.

    While the body runs, stdout carries nothing but the result: every write to it (Python or C
    level, child processes included) goes to stderr, and the JSON document is written after. The
    body runs inside a `Run` for `command`: with --json a failed run prints its report, the one
    the orchestration's own run ended with or, when the failure came before it (bad options,
    unreadable input), a `modelport.report/1` document for `command` all the same.

    With `render_failed`, a failed run's report is drawn too (validate's per-output table).
    `print_result` prints a command's result on stdout (a listing, a benchmark table; see `print_rows`)
    once the body is done, unless --json prints the document instead; `render` draws on stderr.
    """
    from modelport.validation.report import Run

    code, doc = 0, None
    record = Run(command)
    with _console_on_real_stderr(), _stdout_to_stderr():
        try:
            with record:
                result = fn()
        except ModelportError as e:
            from rich.markup import escape

            if render_failed and render and e.report and e.report.get("parity") and not (json_out or quiet):
                render(e.report)
            console.print(f"[bold red]error:[/] {escape(e.message)}", soft_wrap=True)  # hints hold "[tf]"
            code = e.exit_code
            doc = e.report
        except KeyboardInterrupt:
            console.print("[bold red]error:[/] interrupted")
            code = 130
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as e:  # a bug: one line, the trace only with MODELPORT_DEBUG
            if os.environ.get("MODELPORT_DEBUG"):
                raise
            console.print(f"[bold red]internal error:[/] {type(e).__name__}: {e} (set MODELPORT_DEBUG=1 for the traceback)", soft_wrap=True)
            code = EXIT_UNEXPECTED
            doc = record.document
        else:
            doc = result if result is not None else {}
            if isinstance(result, dict):
                from rich.markup import escape

                for text in result.get("warnings") or []:  # also with --quiet/--json: stderr, one line each
                    console.print(f"[bold yellow]warning:[/] {escape(text)}", soft_wrap=True)
            if not json_out and render and not quiet and result is not None:
                render(result)
    if doc and doc.get("schema") == "modelport.report/1":
        _publish(doc, junit)
    if json_out and doc is not None:
        emit_json(doc)
    elif print_result is not None and not code and doc is not None:
        print_result(doc)
        sys.stdout.flush()
    if code:
        raise typer.Exit(code)


def _publish(report: dict, junit: str | None) -> None:
    """The report as CI systems read it: JUnit XML (--junit) and, under GitHub Actions, annotations."""
    from modelport.validation.ci_reports import junit_for_report, on_github, publish_to_github, report_row

    if junit:
        try:
            junit_for_report(report, junit)
        except OSError as e:
            console.print(f"[bold red]error:[/] cannot write the JUnit file {junit}: {e.strerror}", soft_wrap=True)
    if on_github():
        publish_to_github([report_row(report)], f"modelport {report.get('command')}",
                          lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))


def _fd(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # an in-process runner's buffer


@contextmanager
def _stdout_to_stderr():
    """Point stdout (the Python object, and file descriptor 1 when it is the process's) at stderr."""
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    saved = None
    if _fd(sys.stdout) == 1 and _fd(sys.stderr) == 2:
        with contextlib.suppress(OSError):
            saved = os.dup(1)
            os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                s.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


@contextmanager
def _console_on_real_stderr():
    """Bind the console to a copy of the process's stderr for the command's duration.

    Converters point descriptor 2 (and sys.stderr) at a log file while they run; the progress
    display and the error line must still reach the terminal.
    """
    if _fd(sys.stderr) != 2:
        yield
        return
    try:
        sys.stderr.flush()
        stream = os.fdopen(os.dup(2), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                           errors="replace")
    except OSError:
        yield
        return
    console.file = stream
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            stream.flush()
        console.file = None
        stream.close()


class _StageLine:
    """The live line: the running stage, the tool working inside it, and the stage's elapsed time."""

    def __init__(self):
        self.stage, self.detail, self.started = "starting", None, time.monotonic()

    def __rich__(self):
        from rich.markup import escape
        from rich.text import Text

        detail = f" ({escape(self.detail)})" if self.detail else ""
        return Text.from_markup(f"[bold]{escape(self.stage)}[/]{detail} {time.monotonic() - self.started:.1f}s")


PROGRESS_ENV = "MODELPORT_PROGRESS"  # "lines": plain progress lines on stderr, for logs (CI steps, nohup)
PROGRESS_LINE_SECONDS = 1.0  # within a stage, a new activity is written at most this often


@contextmanager
def progress_lines():
    """`MODELPORT_PROGRESS=lines`: each stage and what runs inside it as a plain line on stderr
    ("[  41.2s] parse: writing layer 3 of 28"), a loop's position ("quantising NAME (41/290)") at most
    every PROGRESS_LINE_SECONDS; for logs, where the live line is not drawn. Yields the `on_stage` callback."""
    from modelport.run import progress
    started, state = time.monotonic(), {"stage": "starting", "last": 0.0, "detail": None}

    def write(text: str) -> None:
        sys.stderr.write(f"[{time.monotonic() - started:7.1f}s] {text}\n")
        sys.stderr.flush()

    def on_stage(name: str) -> None:
        state.update(stage=name, detail=None)
        write(name)

    def on_activity(detail: str | None) -> None:
        now = time.monotonic()
        looping = detail is not None and detail.endswith(")") and "/" in detail.rpartition("(")[2]  # a tick: "name (41/290)"
        if detail is None or detail == state["detail"] or (looping and now - state["last"] < PROGRESS_LINE_SECONDS):
            return
        state.update(last=now, detail=detail)
        write(f"{state['stage']}: {detail}")

    with progress.listening(on_activity):
        yield on_stage


@contextmanager
def stage_status(quiet: bool):
    """A live line naming the current stage and its elapsed time, on stderr and only on a terminal
    (`MODELPORT_PROGRESS=lines`: plain lines instead, anywhere; see `progress_lines`).

    Yields the `on_stage(name)` callback for the pipeline (None when nothing is shown).
    """
    if os.environ.get(PROGRESS_ENV) == "lines":  # asked for by name: written even with --json or --quiet
        with progress_lines() as on_stage:
            yield on_stage
        return
    if quiet or not console.is_terminal:
        yield None
        return
    from rich.live import Live
    from rich.spinner import Spinner

    from modelport.run import progress
    line = _StageLine()
    with Live(Spinner("dots", text=line, style="status.spinner"), console=console, transient=True,
              refresh_per_second=12.5, redirect_stdout=False, redirect_stderr=False) as live:
        def on_stage(name: str) -> None:
            line.stage, line.detail, line.started = name, None, time.monotonic()
            live.refresh()  # drawn at once: a short stage is still shown

        def on_activity(detail: str | None) -> None:
            line.detail = detail
            live.refresh()

        with progress.listening(on_activity):
            yield on_stage


def split_list(values: str | list[str] | None) -> list[str]:
    """A list option's values, in order: repeated flags accumulate and each may be comma-separated
    (`--to onnx --to ort` is `--to onnx,ort`)."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    return [v.strip() for item in items for v in item.split(",") if v.strip()]


def print_rows(title: str, columns: list[str], rows: list[list], *, right: tuple[str, ...] = ()) -> None:
    """A result on stdout: a rich table on a terminal, else one tab-separated line per row after a
    header line, so `modelport zoo list | grep keras` and `cut -f1` work. Cells are never cut short:
    the first column (the name) keeps its width, the others wrap."""
    cells = [["" if c is None else str(c) for c in row] for row in rows]
    if not sys.stdout.isatty():
        sys.stdout.write("\t".join(columns) + "\n")
        for row in cells:
            sys.stdout.write("\t".join(c.replace("\t", " ").replace("\n", " ") for c in row) + "\n")
        return
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for i, col in enumerate(columns):
        # the first column (a name) and every column of short values keep their full width; long text wraps
        widest = max((len(row[i]) for row in cells if i < len(row)), default=0)
        keep = i == 0 or widest <= 14
        t.add_column(col, overflow="fold", justify="right" if col in right else "left", no_wrap=keep,
                     min_width=max(widest, len(col)) if keep else None)
    for row in cells:
        t.add_row(*map(escape, row))
    Console(highlight=False).print(t)


def fmt_size(n: int | float | None) -> str:
    """Bytes in human units: 512 B, 336.0 KiB, 1.2 GiB."""
    if n is None:
        return "-"
    sign, n = ("-", -n) if n < 0 else ("", n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_num(v, digits: int = 3) -> str:
    if v is None:
        return "inf"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)
