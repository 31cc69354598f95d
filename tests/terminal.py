"""Run the CLI with one of its output streams on a pseudo-terminal, as a user at a terminal sees it."""

from __future__ import annotations

import os
import subprocess
import sys


def run_on_terminal(args, *, stream: str = "stdout", env: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    """(exit code, everything `modelport ARGS` drew on `stream` ("stdout" or "stderr"), escapes included);
    the other stream is discarded. `env` is the whole environment of the child."""
    import pty

    main, child = pty.openpty()
    streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, stream: child}
    p = subprocess.Popen([sys.executable, "-m", "modelport", *map(str, args)], stdin=subprocess.DEVNULL, env=env, **streams)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    code = p.wait(timeout=timeout)
    os.close(main)
    return code, b"".join(chunks).decode(errors="replace")
