"""Run a chatty converter with its stdout/stderr (Python and C level) captured into a log file.

onnx2tf and TensorFlow print progress tables and C++ log lines straight to file descriptors 1
and 2; `--json` output on stdout must stay clean, so both descriptors are pointed at a log file
for the duration of the call. The log's tail is what an error message quotes.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path


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
    text = io.TextIOWrapper(open(fileno, "ab", closefd=False), write_through=True)
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            yield
    finally:
        with contextlib.suppress(Exception):
            text.flush()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


@contextlib.contextmanager
def captured_output(log_path: Path, tool: str | None = None):
    """Both descriptors into `log_path` for the block; the live display names `tool` (else the log's stem)."""
    from modelport.progress import doing

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log, doing(tool or log_path.stem.lstrip(".")), _both_streams_into(log.fileno()):
        yield


@contextlib.contextmanager
def silenced_output():
    """Both descriptors (and Python's streams) into /dev/null for the block: for a library that logs
    what it does at INFO level to stderr on every load (LiteRT's "Created TensorFlow Lite XNNPACK
    delegate"). Its errors still reach the caller as exceptions."""
    with open(os.devnull, "wb") as null, _both_streams_into(null.fileno()):
        yield


def log_tail(log_path: Path, lines: int = 3) -> str:
    """The last meaningful lines of a log (ANSI colour codes stripped), for an error message."""
    import re

    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    keep = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("I0000", "W0000"))]
    return " | ".join(keep[-lines:])
