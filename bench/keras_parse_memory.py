"""Peak memory of a Keras conversion against tf2onnx alone on the same file.

A `keras.applications` model built with `weights=None` (no download) is saved as a `.keras` archive,
then, alternately so that both see the same load on the machine:

- `modelport convert MODEL.keras --to onnx` (the parse, the reference outputs on every sample set,
  validation and the written model), and
- tf2onnx alone: the archive loaded with `keras.saving.load_model` and converted with
  `tf2onnx.convert.from_keras`, the model written to a file.

Each command runs in its own process; this one samples the resident memory of that process and
its children every SAMPLE_S seconds with psutil and keeps the largest sum (the tree's peak RSS).
The modelport row also shows the parse stage's own peak from its report.json. The medians are
printed with their ratio; the run fails (exit 1) when modelport's peak exceeds tf2onnx's by more
than `--max-ratio`.

Run with `.venv/bin/python bench/keras_parse_memory.py [--model ResNet50] [--runs 3]`.
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

import psutil

SAMPLE_S = 0.02
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}

BUILD = """
import sys
import keras
keras.utils.set_random_seed(0)
getattr(keras.applications, sys.argv[1])(weights=None).save(sys.argv[2])
"""

TF2ONNX_ALONE = """
import sys
import keras, tensorflow as tf, tf2onnx
model = keras.saving.load_model(sys.argv[1], compile=False)
signature = [tf.TensorSpec([None, *t.shape[1:]], t.dtype, name=f"input_{i}") for i, t in enumerate(model.inputs)]
tf2onnx.convert.from_keras(model, input_signature=signature, output_path=sys.argv[2])
"""


def peak_of(cmd: list[str]) -> tuple[int, float, int]:
    """(the peak RSS of `cmd`'s process tree in bytes, its wall seconds, its exit status)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=QUIET, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        total = 0
        for p in tree:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        peak = max(peak, total)
        time.sleep(SAMPLE_S)
    err = proc.stderr.read()
    rc = proc.wait()
    if rc:
        print(f"  {' '.join(cmd[:6])} … failed ({rc}): {err.strip().splitlines()[-1:] or ''}", file=sys.stderr)
    return peak, time.perf_counter() - start, rc


def parse_row(out: Path) -> tuple[int, float]:
    """(peak RSS, seconds) of the parse stage, from modelport's report.json."""
    stages = json.loads((out / "report.json").read_text())["stages"]
    parse = next(s for s in stages if s["name"] == "parse")
    return int(parse["peak_rss"]), float(parse["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="ResNet50", help="a keras.applications constructor")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-ratio", type=float, default=1.0, help="fail when modelport's median peak exceeds tf2onnx's by more")
    ap.add_argument("--stage-memory", default=None, help="passed to modelport convert (default: its own bound)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="keras-parse-memory-") as tmp:
        work = Path(tmp)
        source = work / f"{args.model.lower()}.keras"
        subprocess.run([sys.executable, "-c", BUILD, args.model, str(source)], check=True, env=QUIET,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"{args.model} (weights=None): {source.stat().st_size / 1e6:.0f} MB .keras; "
              f"tree peak RSS sampled every {SAMPLE_S * 1000:.0f} ms, {args.runs} alternate runs each")
        mine: list[tuple[int, float]] = []
        theirs: list[tuple[int, float]] = []
        for i in range(args.runs):
            out = work / f"out{i}"
            cmd = [sys.executable, "-m", "modelport", "convert", str(source), "--to", "onnx", "-o", str(out)]
            if args.stage_memory:
                cmd += ["--stage-memory", args.stage_memory]
            peak, took, rc = peak_of(cmd)
            if rc:
                sys.exit(1)
            stage_peak, stage_s = parse_row(out)
            mine.append((peak, took))
            print(f"  run {i + 1}: modelport convert  {peak / 1e9:5.2f} GB  {took:5.1f} s"
                  f"   (parse stage {stage_peak / 1e9:.2f} GB, {stage_s:.1f} s)")
            peak, took, rc = peak_of([sys.executable, "-c", TF2ONNX_ALONE, str(source), str(work / f"tf2onnx{i}.onnx")])
            if rc:
                sys.exit(1)
            theirs.append((peak, took))
            print(f"  run {i + 1}: tf2onnx alone      {peak / 1e9:5.2f} GB  {took:5.1f} s")
    m_peak, m_s = (statistics.median(x) for x in zip(*mine, strict=True))
    t_peak, t_s = (statistics.median(x) for x in zip(*theirs, strict=True))
    ratio = m_peak / t_peak
    print(f"median peak: modelport {m_peak / 1e9:.2f} GB, tf2onnx alone {t_peak / 1e9:.2f} GB, ratio {ratio:.2f}")
    print(f"median wall: modelport {m_s:.1f} s, tf2onnx alone {t_s:.1f} s, ratio {m_s / t_s:.2f}")
    if ratio > args.max_ratio:
        print(f"modelport's peak is {ratio:.2f}x tf2onnx's, above --max-ratio {args.max_ratio:g}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
