"""Code run in an interpreter of its own, for tests that measure memory.

A test worker's process tree may hold other tests' children (servers, a Ray cluster), and its own
high-water mark is that of every test it ran before. A fresh interpreter measures with
`memory.own_peak()` (VmHWM), never with `getrusage(RUSAGE_SELF).ru_maxrss`: on Linux a process
started by a worker inherits the worker's mark in the latter (a 200 MB quantisation measured 2.2 GB
from a 2.4 GB worker), which hides growth below it and adds the worker's size above it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_alone(code: str, *args: str, timeout: float = 300) -> str:
    """`code`'s stdout, run by a fresh interpreter with `args` as sys.argv[1:]; fails the test on a
    non-zero exit, showing the end of its stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def reset_peak() -> None:
    """Start this process's high-water mark (VmHWM) afresh from its resident memory now (Linux's
    /proc/self/clear_refs), so that a peak measured next is not one reached while a test built its model."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
