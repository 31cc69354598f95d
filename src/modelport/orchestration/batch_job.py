"""One job of `modelport batch`: a `modelport convert` child process with a timeout and a memory limit.

Shared by the executors (orchestration.batch runs it in a local thread pool, orchestration.batch_ray
inside a Ray task); the result is the job's entry of the batch summary.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from modelport.errors import BadInputError

STATE_DIR = ".batch"  # OUT/.batch/<name>.json and .log: each job's last result and its stderr
DEFAULT_TIMEOUT = 1800.0


def parse_size(text, what: str) -> int | None:
    """Bytes from 8GiB / 512MiB / 2G / 1000000 (None stays None)."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return int(text)
    s = str(text).strip()
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "b": 1, "": 1}
    num = s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = s[len(num):].strip().lower()
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise BadInputError(f"bad {what} {text!r}: use a size such as 8GiB, 512MiB or 2G")
    return int(value * units[unit])


@dataclass
class Job:
    """One model of the manifest, resolved: the convert arguments and the limits it runs under."""

    name: str
    source: str
    argv: list[str]  # convert's arguments after SOURCE, without -o/--json
    timeout: float = DEFAULT_TIMEOUT
    memory: int | None = None
    resources: dict = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)  # files the job reads (source, data): hashed into its key
    targets: list[str] = field(default_factory=list)

    def command(self, out: Path, *, keep_failed: bool = False) -> list[str]:
        cmd = [sys.executable, "-m", "modelport", "convert", self.source, *self.argv, "-o", str(out), "--json", "--quiet",
               "--force"]
        return cmd + (["--keep-failed"] if keep_failed else [])


# --- running one job ---------------------------------------------------------------------------

def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants (0 once it is gone)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def run_job(job: Job, out: Path, *, keep_failed: bool = False, env: dict | None = None) -> dict:
    """Run one job as a child process group; the result entry of the summary (never raises for the job's own failure).

    status: ok, failed (convert's exit code and error), timeout, out-of-memory or crashed (killed by
    a signal). The child's stdout is its JSON report; its stderr tail is kept for the failure line.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log = out.parent / STATE_DIR / f"{job.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryFile() as stdout, open(log, "wb") as stderr:
        proc = subprocess.Popen(job.command(out, keep_failed=keep_failed), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                env=child_env, start_new_session=True)
        status, peak = None, 0
        while proc.poll() is None:
            elapsed = time.monotonic() - t0
            if job.memory:
                rss = _tree_rss(proc.pid)
                peak = max(peak, rss)
                if rss > job.memory:
                    status = "out-of-memory"
            if elapsed > job.timeout:
                status = "timeout"
            if status:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing the job started outlives it
        stdout.seek(0)
        text = stdout.read().decode("utf-8", "replace")
    seconds = round(time.monotonic() - t0, 3)
    report = None
    with contextlib.suppress(ValueError):
        report = json.loads(text) if text.strip() else None
    code = proc.returncode
    entry = {"name": job.name, "source": job.source, "targets": job.targets, "seconds": seconds, "exit_code": code,
             "output": job.name, "log": f"{STATE_DIR}/{job.name}.log"}
    if job.memory:
        entry["peak_rss"] = peak
    if status == "timeout":
        entry.update(status="timeout", error=f"no result after {job.timeout:g} s: killed")
    elif status == "out-of-memory":
        entry.update(status="out-of-memory", error=f"resident memory above the limit of {job.memory} bytes: killed")
    elif code is not None and code < 0:
        entry.update(status="crashed", error=f"killed by signal {signal.Signals(-code).name}")
    elif code == 0 and isinstance(report, dict) and report.get("status") == "ok":
        entry.update(status="ok", error=None)
    else:
        err = (report or {}).get("error") if isinstance(report, dict) else None
        message = err.get("message") if isinstance(err, dict) else None
        entry.update(status="failed", error=message or _last_line(log) or f"exit {code}")
    if isinstance(report, dict):
        entry["report"] = f"{job.name}/report.json" if entry["status"] == "ok" else None
        entry["parity"] = report.get("parity") or []
        entry["artifacts"] = [{k: a.get(k) for k in ("target", "runtime", "precision", "size", "nodes", "route") if k in a}
                              for a in report.get("artifacts") or []]
    failed_dir = out.parent / f"{job.name}.failed"
    if entry["status"] != "ok" and failed_dir.is_dir():
        entry["kept"] = failed_dir.name
    return entry


def _last_line(log: Path) -> str | None:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    errors = [ln for ln in lines if ln.startswith(("error:", "internal error:"))]
    return (errors or lines or [None])[-1]
