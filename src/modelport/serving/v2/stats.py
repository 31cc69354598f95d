"""The statistics extension's counters and Prometheus histograms, in memory every worker shares.

Each worker process writes only its own row of a shared array (`numpy.memmap` over a file the
supervisor creates; a plain array for one process), so there is no lock on the request path; a
reader sums the rows. Per model version: success and failure counts and their time, and the time
in queue, compute_input (decode and contract check), compute_infer (the runtime) and
compute_output (encode), in nanoseconds as Triton reports them; inference and execution counts
(rows and runtime calls: batching runs several requests in one execution); the requests in
flight; and histograms of request, queue and compute_infer time.

`/v2/models/NAME[/versions/V]/stats` and gRPC `ModelStatistics` answer Triton's JSON and protobuf
shapes; `/metrics` uses Triton's metric names where Triton has one (`nv_inference_*`, time in µs)
and `modelport_inference_*_seconds` for the histograms.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BUCKETS_NS = [int(b * 1e9) for b in BUCKETS_S]
HISTOGRAMS = ("request", "queue", "compute_infer")
# field offsets in one row: (count, ns) per phase, then the counts, then each histogram's buckets (+Inf last)
_PHASE = {p: 2 * i for i, p in enumerate(PHASES)}
INFERENCES, EXECUTIONS, LAST_MS, PENDING = 12, 13, 14, 15
_HIST = {h: 16 + i * (len(BUCKETS_S) + 1) for i, h in enumerate(HISTOGRAMS)}
FIELDS = 16 + len(HISTOGRAMS) * (len(BUCKETS_S) + 1)
NAME_BYTES = 256  # a slot's "model\0version" in the shared name table


@dataclass(frozen=True)
class Layout:
    """Where the shared counters live: `path` (None: this process only), rows per worker, slots per row."""

    path: str | None = None
    workers: int = 1
    slots: int = 256

    def create(self) -> None:
        if self.path:
            Path(self.path).write_bytes(bytes(self.workers * self.slots * FIELDS * 8))
            Path(self.path + ".names").write_bytes(bytes(self.slots * NAME_BYTES))


class Stats:
    """This worker's view: `record_*` into its own row, `totals(slot)` summed over every worker."""

    def __init__(self, layout: Layout = Layout(), worker: int = 0):
        shape = (layout.workers, layout.slots, FIELDS)
        self.all = (np.memmap(layout.path, dtype=np.int64, mode="r+", shape=shape) if layout.path
                    else np.zeros(shape, dtype=np.int64))
        self.mine = self.all[worker]
        self.names = layout.path + ".names" if layout.path else None
        self.slots: dict[tuple[str, str], int] = {}

    def slot(self, model: str, version: str) -> int:
        """The slot of a model version: with several workers, the same in all of them (a shared
        table of names, written under a file lock), whatever order they load in."""
        key = (model, version)
        if key not in self.slots:
            self.slots[key] = self._shared_slot(key) if self.names else len(self.slots)
            if self.slots[key] >= self.all.shape[1]:
                raise RuntimeError(f"more than {self.all.shape[1]} model versions to keep statistics for")
        return self.slots[key]

    def _shared_slot(self, key: tuple[str, str]) -> int:
        import fcntl

        want = "\0".join(key).encode()[:NAME_BYTES - 1]
        with open(self.names, "r+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            table = f.read()
            for i in range(len(table) // NAME_BYTES):
                name = table[i * NAME_BYTES:(i + 1) * NAME_BYTES].rstrip(b"\0")
                if name == want:
                    return i
                if not name:
                    f.seek(i * NAME_BYTES)
                    f.write(want)
                    f.flush()
                    return i
        return len(table) // NAME_BYTES

    def restart(self, slot: int) -> None:
        """A version loaded (again): its counts start from zero in this worker, as Triton's do on a reload."""
        self.mine[slot, :] = 0

    def pending(self, slot: int, delta: int) -> None:
        self.mine[slot, PENDING] += delta

    def phase(self, slot: int, phase: str, ns: int) -> None:
        row, at = self.mine[slot], _PHASE[phase]
        row[at] += 1
        row[at + 1] += ns
        if phase in _HIST:
            self._observe(row, phase, ns)

    def request(self, slot: int, ok: bool, ns: int) -> None:
        row = self.mine[slot]
        at = _PHASE["success" if ok else "fail"]
        row[at] += 1
        row[at + 1] += ns
        if ok:
            self._observe(row, "request", ns)
            row[LAST_MS] = int(time.time() * 1000)

    def execution(self, slot: int, rows: int) -> None:
        """One runtime call of `rows` inferences (a batch of several requests counts once)."""
        row = self.mine[slot]
        row[EXECUTIONS] += 1
        row[INFERENCES] += rows

    @staticmethod
    def _observe(row, histogram: str, ns: int) -> None:
        row[_HIST[histogram] + bisect.bisect_left(_BUCKETS_NS, ns)] += 1

    def totals(self, slot: int) -> np.ndarray:
        return self.all[:, slot, :].sum(axis=0)

    # --- what clients read

    def model_stats(self, model: str, version: str) -> dict:
        """Triton's `model_stats` entry (the HTTP JSON; gRPC builds its protobuf from it)."""
        t = self.totals(self.slot(model, version))
        zero = {"count": 0, "ns": 0}
        return {
            "name": model, "version": version, "last_inference": int(t[LAST_MS]),
            "inference_count": int(t[INFERENCES]), "execution_count": int(t[EXECUTIONS]),
            "inference_stats": {**{p: {"count": int(t[_PHASE[p]]), "ns": int(t[_PHASE[p] + 1])} for p in PHASES},
                                "cache_hit": zero, "cache_miss": zero},
            "batch_stats": [], "memory_usage": [],
        }

    def prometheus(self) -> str:
        """The metrics page, every model version, in Prometheus' text format."""
        lines: list[str] = []
        counters = [("nv_inference_request_success", "counter", "successful inference requests", lambda t: t[_PHASE["success"]]),
                    ("nv_inference_request_failure", "counter", "failed inference requests", lambda t: t[_PHASE["fail"]]),
                    ("nv_inference_count", "counter", "inferences performed (a batch of n counts n)", lambda t: t[INFERENCES]),
                    ("nv_inference_exec_count", "counter", "model executions (a batch counts once)", lambda t: t[EXECUTIONS]),
                    ("nv_inference_pending_request_count", "gauge", "requests in the server, not yet answered", lambda t: t[PENDING])]
        counters += [(f"nv_inference_{'request' if p == 'success' else p}_duration_us", "counter",
                      f"cumulative {p if p != 'success' else 'request'} time (µs)", lambda t, p=p: t[_PHASE[p] + 1] // 1000)
                     for p in ("success", "queue", "compute_input", "compute_infer", "compute_output")]
        totals = {key: self.totals(slot) for key, slot in self.slots.items()}
        for name, kind, help_, value in counters:
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            lines += [f'{name}{{model="{m}",version="{v}"}} {int(value(t))}' for (m, v), t in totals.items()]
        for h in HISTOGRAMS:
            name = f"modelport_inference_{h}_duration_seconds"
            lines += [f"# HELP {name} {h} time per request", f"# TYPE {name} histogram"]
            for (m, v), t in totals.items():
                labels = f'model="{m}",version="{v}"'
                at, cumulative = _HIST[h], 0
                for i, le in enumerate([*map(str, BUCKETS_S), "+Inf"]):
                    cumulative += int(t[at + i])
                    lines.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
                phase = {"request": "success"}.get(h, h)
                lines.append(f"{name}_sum{{{labels}}} {t[_PHASE[phase] + 1] / 1e9:.9f}")
                lines.append(f"{name}_count{{{labels}}} {cumulative}")
        return "\n".join(lines) + "\n"
