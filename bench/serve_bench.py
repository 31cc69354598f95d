"""`modelport serve` against the same artifact in-process: latency and throughput, interleaved.

The zoo CNN (`cnn_small`, 1×3×64×64) converted to ONNX, then, in rounds that alternate the
contenders: the artifact's runner in this process (one sample per call for latency; calls of
`--batch` samples for throughput) and two `modelport serve` processes on 127.0.0.1, one without
and one with dynamic batching (`--max-batch-size --batch`, `--max-queue-delay-ms`), loaded by
Triton's gRPC client (`tritonclient.grpc`, binary tensors) from `--concurrency` threads, one
sample per request. Rows: p50/p99 latency (ms) and throughput (samples/s), each the median over the
rounds. The targets it prints (not a test): at concurrency 1, served p50 ≤ in-process p50 + 2 ms;
at the highest concurrency with batching, served throughput ≥ 70 % of the in-process session's at
the same batch size and ≥ 2× the unbatched server's.

    python bench/serve_bench.py [--rounds 3] [--seconds 4] [--concurrency 1,8,32] [--batch 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MODELPORT = [sys.executable, "-m", "modelport"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(work: Path) -> Path:
    subprocess.run([*MODELPORT, "zoo", "build", "cnn_small", "-o", str(work / "src"), "-q"], check=True)
    out = work / "cnn"
    subprocess.run([*MODELPORT, "convert", str(work / "src" / "model.pt2"), "--input", "input:batch,3,64,64", "--to", "onnx",
                    "-o", str(out), "-q"], check=True)
    return out


class Served:
    def __init__(self, folder: Path, *extra: str, log: Path):
        self.http, self.grpc = _port(), _port()
        self.proc = subprocess.Popen([*MODELPORT, "serve", str(folder), "--http-port", str(self.http), "--grpc-port",
                                      str(self.grpc), *extra], stdout=open(log, "w"), stderr=subprocess.STDOUT)
        import tritonclient.grpc as grpc

        client = grpc.InferenceServerClient(f"127.0.0.1:{self.grpc}")
        end = time.monotonic() + 120
        while time.monotonic() < end:
            try:
                if client.is_server_ready():
                    return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError(f"server not ready: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def served_load(port: int, concurrency: int, seconds: float, x: np.ndarray) -> dict:
    import tritonclient.grpc as grpc

    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def worker():
        client = grpc.InferenceServerClient(f"127.0.0.1:{port}")
        i = grpc.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        mine = []
        while time.perf_counter() < stop:
            t = time.perf_counter()
            client.infer("cnn", [i])
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return _row(latencies, len(latencies) * x.shape[0] / wall)


def inprocess(runner, x: np.ndarray, seconds: float) -> dict:
    latencies = []
    stop = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < stop:
        t = time.perf_counter()
        runner.run({"input": x})
        latencies.append(time.perf_counter() - t)
    return _row(latencies, len(latencies) * x.shape[0] / (time.perf_counter() - start))


def _row(latencies: list[float], throughput: float) -> dict:
    ms = np.asarray(latencies) * 1000
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "throughput": throughput, "n": len(ms)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--delay-ms", type=float, default=2.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    levels = [int(c) for c in a.concurrency.split(",")]
    from modelport.orchestration.bench import open_artifact

    with tempfile.TemporaryDirectory(prefix="modelport-serve-bench-") as tmp:
        work = Path(tmp)
        folder = prepare(work)
        runner, _ = open_artifact(folder / "model.onnx")
        rng = np.random.default_rng(0)
        one = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
        many = rng.standard_normal((a.batch, 3, 64, 64)).astype(np.float32)
        plain = Served(folder, log=work / "plain.log")
        batched = Served(folder, "--max-batch-size", str(a.batch), "--max-queue-delay-ms", str(a.delay_ms), log=work / "batched.log")
        rows: dict[str, list[dict]] = {}
        try:
            for _ in range(a.rounds):  # interleaved: every contender once per round
                rows.setdefault("in-process, batch 1", []).append(inprocess(runner, one, a.seconds))
                rows.setdefault(f"in-process, batch {a.batch}", []).append(inprocess(runner, many, a.seconds))
                for c in levels:
                    rows.setdefault(f"served, concurrency {c}", []).append(served_load(plain.grpc, c, a.seconds, one))
                    rows.setdefault(f"served + batching, concurrency {c}", []).append(served_load(batched.grpc, c, a.seconds, one))
        finally:
            plain.stop()
            batched.stop()
    table = {name: {k: statistics.median(r[k] for r in rs) for k in ("p50", "p99", "throughput")} for name, rs in rows.items()}
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"# modelport serve vs in-process (cnn_small, ONNX Runtime; {machine}; median of {a.rounds} interleaved rounds)")
    print("| contender | p50 ms | p99 ms | samples/s |\n| --- | ---: | ---: | ---: |")
    for name, r in table.items():
        print(f"| {name} | {r['p50']:.2f} | {r['p99']:.2f} | {r['throughput']:.0f} |")
    top = max(levels)
    base, served1 = table["in-process, batch 1"]["p50"], table[f"served, concurrency {levels[0]}"]["p50"]
    batch_tp = table[f"served + batching, concurrency {top}"]["throughput"]
    checks = {
        f"served p50 at concurrency {levels[0]} <= in-process p50 + 2 ms": (served1, base + 2.0, served1 <= base + 2.0),
        f"batched throughput at {top} >= 70% of in-process batch {a.batch}":
            (batch_tp, 0.7 * table[f"in-process, batch {a.batch}"]["throughput"], batch_tp >= 0.7 * table[f"in-process, batch {a.batch}"]["throughput"]),
        f"batched throughput at {top} >= 2x unbatched": (batch_tp, 2 * table[f"served, concurrency {top}"]["throughput"],
                                                          batch_tp >= 2 * table[f"served, concurrency {top}"]["throughput"]),
    }
    for what, (got, bound, ok) in checks.items():
        print(f"{'met' if ok else 'MISSED'}: {what} ({got:.2f} against {bound:.2f})")
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": machine, "rows": table, "rounds": rows,
                                            "targets": {k: {"value": v[0], "bound": v[1], "met": v[2]} for k, v in checks.items()}},
                                           indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
