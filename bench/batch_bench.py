"""Batch benchmark: the same manifest of zoo models with --jobs 1, --jobs 2 and the Ray executor.

Prints, per executor: wall time of the first run, the rerun time when nothing changed (target:
under 5 % of the first run) and the batch's overhead per model against plain `convert` runs of
the same models measured in the same session (the sum of their wall times).

Run with `make bench` or `.venv/bin/python bench/batch_bench.py [--models a,b] [--no-ray]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = ["cnn_small", "mlp", "lstm_small", "bert_tiny"]  # zoo models built locally; a zoo source carries its inputs


def run(cmd: list[str]) -> float:
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 4):
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=None, help=f"comma-separated zoo names (default: {','.join(MODELS)})")
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    models = args.models.split(",") if args.models else MODELS
    py = [sys.executable, "-m", "modelport"]
    with tempfile.TemporaryDirectory(prefix="modelport-batch-bench-") as tmp:
        tmp = Path(tmp)
        manifest = tmp / "models.yaml"
        lines = ["defaults: {to: [onnx]}", "models:"]
        lines += [f"  - {{source: 'zoo:{name}', name: {name}}}" for name in models]
        manifest.write_text("\n".join(lines) + "\n")

        run([*py, "convert", f"zoo:{models[0]}", "--to", "onnx", "-o", str(tmp / "warm-up"), "-q"])  # caches warm for everyone
        plain = 0.0
        for name in models:
            plain += run([*py, "convert", f"zoo:{name}", "--to", "onnx", "-o", str(tmp / "plain" / name), "-q"])
        rows = [("plain convert, one by one", plain, None, None)]
        executors = [("--jobs 1", ["--jobs", "1"]), ("--jobs 2", ["--jobs", "2"])]
        if not args.no_ray:
            executors.append(("ray (local cluster)", ["--executor", "ray"]))
        for label, extra in executors:
            out = tmp / label.replace(" ", "_").replace("(", "").replace(")", "")
            first = run([*py, "batch", str(manifest), "-o", str(out), "-q", *extra])
            rerun = run([*py, "batch", str(manifest), "-o", str(out), "-q", *extra])
            summary = json.loads((out / "summary.json").read_text())
            assert all(m["skipped"] for m in summary["models"]), "the rerun converted again"
            rows.append((label, first, rerun, (first - plain) / len(models)))

    print(f"{len(models)} zoo models ({', '.join(models)}) to ONNX")
    print(f"{'run':<28}{'first s':>10}{'rerun s':>10}{'rerun/first':>13}{'overhead/model s':>18}")
    for label, first, rerun, overhead in rows:
        ratio = f"{rerun / first:.1%}" if rerun is not None else "-"
        print(f"{label:<28}{first:>10.2f}{(rerun if rerun is not None else float('nan')):>10.2f}{ratio:>13}"
              f"{(overhead if overhead is not None else float('nan')):>18.2f}")


if __name__ == "__main__":
    main()
