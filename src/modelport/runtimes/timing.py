"""The one timing engine: latency percentiles and throughput of calls, measured interleaved.

`bench` and `--optimize auto` time through here. Several subjects (one loaded model each) are
measured round-robin, one round of each in turn, so a slow minute of a noisy machine slows every
subject alike and the ratios between them hold. A round is one call, or with `concurrency` N one
burst of N calls issued together from a thread pool against the same loaded model (onnxruntime and
torch release the GIL while they compute); a runner that is not safe to call from several threads
at once is called under a lock, and its result says so.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from modelport.run.memory import own_peak

DEFAULT_RUNS = 50
DEFAULT_WARMUP = 5


@dataclass
class Subject:
    """One thing to time: `call()` does one request of `items` samples (the batch size)."""

    label: str
    call: Callable[[], object]
    items: int = 1
    thread_safe: bool = True
    latencies: list[float] = field(default_factory=list)  # seconds, one per call
    busy: float = 0.0  # wall seconds spent in this subject's rounds


def stats(latencies: list[float], items: int = 1, busy: float | None = None) -> dict:
    """Latency percentiles (ms) and throughput (items per second) of one subject's calls.

    Percentiles interpolate linearly between the sorted samples (numpy's default). Throughput is
    the samples processed over the wall time of the rounds that processed them, so under
    concurrency it exceeds `items / mean latency`.
    """
    if not latencies:
        return {"runs": 0, "latency_ms": None, "throughput": None}
    ms = np.asarray(latencies, dtype=np.float64) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    wall = busy if busy else float(np.sum(latencies))
    return {
        "runs": int(ms.size),
        "latency_ms": {"p50": round(float(p50), 4), "p90": round(float(p90), 4), "p99": round(float(p99), 4),
                       "mean": round(float(ms.mean()), 4), "min": round(float(ms.min()), 4), "max": round(float(ms.max()), 4)},
        "throughput": round(items * ms.size / wall, 3) if wall > 0 else None,
    }


def _round(subject: Subject, pool: ThreadPoolExecutor | None, concurrency: int, lock: threading.Lock) -> None:
    def one() -> float:
        if subject.thread_safe:
            t = time.perf_counter()
            subject.call()
            return time.perf_counter() - t
        with lock:
            t = time.perf_counter()
            subject.call()
            return time.perf_counter() - t

    start = time.perf_counter()
    if pool is None:
        subject.latencies.append(one())
    else:
        subject.latencies.extend(pool.map(lambda _: one(), range(concurrency)))
    subject.busy += time.perf_counter() - start


def measure(subjects: list[Subject], *, runs: int | None = None, duration: float | None = None,
            warmup: int = DEFAULT_WARMUP, concurrency: int = 1) -> list[Subject]:
    """Time every subject, interleaved; returns them with their latencies filled in.

    `runs` is the number of timed calls per subject (rounded up to a whole number of rounds, so
    with `concurrency` N a multiple of N: every timed call counts in the throughput); `duration` (seconds, for all subjects
    together) stops after the round in progress once it has passed, every subject having had at
    least one round. With neither, DEFAULT_RUNS calls each. Warm-up calls are not timed.
    """
    if runs is None and duration is None:
        runs = DEFAULT_RUNS
    concurrency = max(1, int(concurrency))
    locks = {id(s): threading.Lock() for s in subjects}
    pool = ThreadPoolExecutor(max_workers=concurrency) if concurrency > 1 else None
    try:
        for s in subjects:
            for _ in range(warmup):
                s.call()
        rounds = -(-runs // concurrency) if runs is not None else None
        start = time.perf_counter()
        done = 0
        while True:
            for s in subjects:
                _round(s, pool, concurrency, locks[id(s)])
            done += 1
            if rounds is not None and done >= rounds:
                break
            if duration is not None and time.perf_counter() - start >= duration:
                break
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return subjects


def median_ms(call: Callable[[], object], *, runs: int = 20, warmup: int = 3) -> float:
    """Median wall time of `call()` in milliseconds (one subject, one call at a time)."""
    (subject,) = measure([Subject("call", call)], runs=runs, warmup=warmup)
    return stats(subject.latencies)["latency_ms"]["p50"]


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux /proc), or None where that cannot be read."""
    return _status_field("VmRSS")


def peak_rss_bytes() -> int | None:
    """The highest resident memory this process has had (`memory.own_peak`), or None where unknown."""

    return own_peak() or None


def _status_field(key: str) -> int | None:
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
