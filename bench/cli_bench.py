"""Start-up and conversion benchmark.

1. Start-up: `modelport --help`, `modelport zoo list` and `modelport doctor` against
   `python -c "import typer, rich"` (the floor of any typer CLI), in paired, interleaved runs (the
   reference and the command alternate, median of N runs each), reported as ratios, which stay
   meaningful on a loaded machine where absolute times do not. `--help` must stay within 1.6x.
   Bytecode is written and used as an installed package's would be (PYTHONDONTWRITEBYTECODE unset).
2. Converts every buildable PyTorch zoo model to ONNX in-process and prints a table of parse,
   validation and total times, node counts, file size and worst parity figures.

Run with `make bench` or `.venv/bin/python bench/cli_bench.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REFERENCE = [sys.executable, "-c", "import typer, rich"]
STARTUP = {"modelport --help": ["--help"], "modelport zoo list": ["zoo", "list"], "modelport doctor": ["doctor"]}


def paired(cmd: list[str], reference: list[str], runs: int) -> tuple[float, float]:
    """Medians of `cmd` and `reference`, run alternately so that both see the same load."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for c in (reference, cmd):  # warm the file cache and write the bytecode
        subprocess.run(c, capture_output=True, env=env)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        for c, samples in zip((cmd, reference), times, strict=True):
            t = time.perf_counter()
            subprocess.run(c, capture_output=True, env=env)
            samples.append(time.perf_counter() - t)
    return statistics.median(times[0]), statistics.median(times[1])


def startup(runs: int) -> dict[str, tuple[float, float]]:
    rows = {name: paired([sys.executable, "-m", "modelport", *argv], REFERENCE, runs) for name, argv in STARTUP.items()}
    print(f"start-up (paired with `python -c \"import typer, rich\"`, median of {runs} runs each)")
    for name, (took, ref) in rows.items():
        print(f"  {name:<20} {took * 1000:7.1f} ms   reference {ref * 1000:7.1f} ms   {took / ref:.2f}x")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--startup-only", action="store_true", help="only the start-up rows")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    started = startup(args.runs)
    if args.startup_only:
        return

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
    if args.json:
        print(json.dumps({"startup": {name: {"seconds": took, "reference_seconds": ref, "ratio": took / ref}
                                      for name, (took, ref) in started.items()}, "models": rows}))


if __name__ == "__main__":
    main()
