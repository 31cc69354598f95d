"""Start-up and conversion benchmark.

1. `modelport --help` against a bare `python -c pass` in the same run (median of N runs each):
   the CLI must stay a thin layer that imports no framework at start-up.
2. Converts every buildable PyTorch zoo model to ONNX in-process and prints a table of parse,
   validation and total times, node counts, file size and worst parity figures.

Run with `make bench` or `.venv/bin/python bench/cli_bench.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def time_cmd(cmd: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--models", nargs="*", default=None)
    args = ap.parse_args()

    bare = time_cmd([sys.executable, "-c", "pass"], args.runs)
    helped = time_cmd([sys.executable, "-m", "modelport", "--help"], args.runs)
    print(f"start-up (median of {args.runs} runs)")
    print(f"  python -c pass     {bare * 1000:8.1f} ms")
    print(f"  modelport --help   {helped * 1000:8.1f} ms   ({helped / bare:.1f}x bare python, +{(helped - bare) * 1000:.0f} ms)")

    from modelport import convert, zoo

    names = args.models or [n for n, e in zoo.load_zoo().items() if e.framework == "pytorch" and e.builder and not e.disabled]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t = time.perf_counter()
            report = convert(f"zoo:{name}", Path(tmp) / name)
            total = time.perf_counter() - t
            stages = {s["name"]: s["seconds"] for s in report["stages"]}
            end = report["parity"][-1]["outputs"]
            rows.append((name, stages.get("parse", 0), stages.get("validate:ir", 0), total,
                         report["stages"][0].get("nodes"), report["artifacts"][0]["size"],
                         max(o["max_abs"] for o in end), min(o["cosine"] for o in end)))
    print()
    print(f"{'model':<12} {'parse s':>8} {'check s':>8} {'total s':>8} {'nodes':>6} {'size KiB':>9} {'max abs':>9} {'cosine':>9}")
    for r in rows:
        print(f"{r[0]:<12} {r[1]:>8.2f} {r[2]:>8.3f} {r[3]:>8.2f} {r[4]:>6} {r[5] / 1024:>9.1f} {r[6]:>9.2e} {r[7]:>9.6f}")
    if "--json" in sys.argv:
        print(json.dumps({"bare_s": bare, "help_s": helped, "models": rows}))


if __name__ == "__main__":
    main()
