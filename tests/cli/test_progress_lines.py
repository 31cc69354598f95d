"""MODELPORT_PROGRESS=lines: a long conversion says where it is on stderr, in plain lines, off a
terminal (a CI step's log): every stage, and every layer the decoder writer writes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.hf_folders import build


def test_each_stage_and_each_layer_is_a_line(tmp_path):
    src = build("llama", tmp_path / "src")
    env = {**os.environ, "MODELPORT_PROGRESS": "lines", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "modelport", "convert", str(src), "--task", "text-generation", "-o",
                        str(tmp_path / "out"), "--json", "--new-tokens", "2"], capture_output=True, text=True, env=env,
                       cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if re.match(r"^\[\s*\d+\.\ds\] ", ln)]
    text = [ln.split("] ", 1)[1] for ln in lines]
    for stage in ("preflight:memory", "parse", "reference:generate", "validate:ir", "emit:onnx", "validate:onnx"):
        assert stage in text, text
    assert [t for t in text if t.startswith("parse: writing layer")] == ["parse: writing layer 1 of 2", "parse: writing layer 2 of 2"]
    times = [float(ln[1:].split("s]")[0]) for ln in lines]
    assert times == sorted(times)
    assert r.stdout.lstrip().startswith("{")  # --json's stdout stays the report alone
