"""Run a chatty converter with its stdout/stderr (Python and C level) captured into a log file.

onnx2tf and TensorFlow print progress tables and C++ log lines straight to file descriptors 1
and 2, and onnxruntime's C++ logger writes `[E:onnxruntime:...]` lines to descriptor 2 from the
sessions a converter creates for itself; `--json` output on stdout must stay clean and a failure
must stay one line on stderr, so both descriptors are pointed at a log file for the duration of
the call. What a block captured goes to the report instead (`collecting_logs`: the failed
stage's `log`); an error message quotes the converter's own reason (`converter_error`), never
library log lines.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import re
import sys
from pathlib import Path

from modelport.run.progress import doing

MAX_LOG_LINES = 200  # kept per stage in the report (the last ones)
MAX_LINE = 1000  # characters kept of one line
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_collected: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("modelport_captured_logs", default=None)


class _Borrowed(io.TextIOBase):
    """sys.stdout or sys.stderr while a block's output goes to a file; afterwards it writes to the
    stream it stood in for. A library that bound a log handler to it inside the block (a
    `logging.StreamHandler()` takes sys.stderr as it is then) keeps a working stream, never one on
    the block's file descriptor, which is closed after the block and may be reused by the next file
    opened (an artifact being written)."""

    def __init__(self, fileno: int, after):
        super().__init__()
        # unbuffered, so that what Python code printed is in the file when an error handler inside the block reads it
        self._inner = io.TextIOWrapper(open(fileno, "ab", buffering=0, closefd=False), write_through=True)
        self._after = after

    def _target(self):
        return self._inner if self._inner is not None else self._after

    def write(self, text):
        return self._target().write(text)

    def flush(self):
        with contextlib.suppress(Exception):
            self._target().flush()

    def fileno(self):
        return self._target().fileno()

    def isatty(self):
        return False

    def writable(self):
        return True

    @property
    def encoding(self):
        return getattr(self._target(), "encoding", "utf-8")

    def give_back(self):
        inner, self._inner = self._inner, None
        with contextlib.suppress(Exception):
            inner.flush()
            inner.detach()


@contextlib.contextmanager
def _both_streams_into(fileno: int):
    """File descriptors 1 and 2, and Python's sys.stdout/sys.stderr, point at `fileno` for the block."""
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    saved = []
    for fd in (1, 2):
        try:
            saved.append((fd, os.dup(fd)))
            os.dup2(fileno, fd)
        except OSError:
            pass
    out, err = _Borrowed(fileno, sys.stdout), _Borrowed(fileno, sys.stderr)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        out.give_back()
        err.give_back()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


@contextlib.contextmanager
def captured_output(log_path: Path, tool: str | None = None):
    """Both descriptors into `log_path` for the block; the live display names `tool` (else the log's
    stem). The lines the block added go to the enclosing `collecting_logs`, if any."""

    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = log_path.stat().st_size if log_path.exists() else 0
    try:
        with open(log_path, "ab") as log, doing(tool or log_path.stem.lstrip(".")), _both_streams_into(log.fileno()):
            yield
    finally:
        lines = _collected.get()
        if lines is not None:
            lines.extend(read_log(log_path, start))


@contextlib.contextmanager
def collecting_logs():
    """The lines every `captured_output` inside the block captured (colour codes stripped, blank
    lines dropped), in order; an inner `collecting_logs` keeps its own."""
    lines: list[str] = []
    token = _collected.set(lines)
    try:
        yield lines
    finally:
        _collected.reset(token)


def read_log(log_path: Path, start: int = 0) -> list[str]:
    """The log's lines from byte `start`, colour codes stripped, blank lines dropped."""
    try:
        with open(log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [ln.rstrip()[:MAX_LINE] for ln in _ANSI.sub("", text).splitlines() if ln.strip()]


def converter_error(log_path: Path, marker: str = "ERROR:") -> str:
    """The first line a converter itself marked as its error (onnx2tf's `ERROR: ...`, the text after
    the marker), or "". Library log lines captured beside it (onnxruntime's `[E:onnxruntime:...]`)
    are not a converter's reason and stay in the log."""
    for line in read_log(log_path):
        text = line.strip()
        if text.startswith(marker):
            reason = text[len(marker):].strip()
            if reason and not reason.endswith(":") and not reason.lower().startswith("the trace log is below"):
                return reason
    return ""


@contextlib.contextmanager
def silenced_output():
    """Both descriptors (and Python's streams) into /dev/null for the block: for a library that logs
    what it does at INFO level to stderr on every load (LiteRT's "Created TensorFlow Lite XNNPACK
    delegate"). Its errors still reach the caller as exceptions."""
    with open(os.devnull, "wb") as null, _both_streams_into(null.fileno()):
        yield
