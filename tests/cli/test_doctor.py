"""`modelport doctor` in real processes: versions, extras, hardware, and what each target needs."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_doctor_json_reports_the_installation(cli_proc):
    r = cli_proc("doctor", "--json")
    assert r.exit_code == 0, r
    d = r.json()
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [e["name"] for e in d["extras"]] == list(declared)
    assert {e["name"]: e["installed"] for e in d["extras"]}["torch"] is True
    assert d["packages"]["onnx"] == metadata.version("onnx") and d["packages"]["onnxruntime"] == metadata.version("onnxruntime")
    assert "CPUExecutionProvider" in d["onnxruntime_providers"]
    assert set(d["cpu"]["features"]) == {"avx2", "avx512", "vnni", "bf16", "amx"}
    assert all(isinstance(v, bool) for v in d["cpu"]["features"].values())
    from modelport.emitters import EMITTERS

    targets = {t["name"]: t for t in d["targets"]}
    assert list(targets) == list(EMITTERS) and targets["onnx"]["ready"] is True
    if not d["gpu"]["gpus"]:
        assert targets["tensorrt"]["ready"] is False and any("GPU" in m for m in targets["tensorrt"]["missing"])


def test_doctor_table_pipes_and_names_what_is_missing_when_an_extra_is_hidden():
    """TensorFlow made unimportable in the child: the tf extra and the TFLite target are missing, exit 0."""
    code = ("import sys; sys.modules['tensorflow'] = None; sys.argv = ['modelport', 'doctor', *sys.argv[1:]];"
            "from modelport.cli import main; main()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in p.stdout.splitlines()}
    assert rows["extra tf"][0] == "missing" and 'pip install "modelport[tf]"' in rows["extra tf"][1]
    assert rows["--to tflite"][0] == "missing tensorflow" and rows["--to tflite"][1] == 'pip install "modelport[tf]"'
    assert rows["--to onnx"][0] == "ready" and rows["extra torch"][0] == "installed"
    d = json.loads(subprocess.run([sys.executable, "-c", code, "--json"], capture_output=True, text=True, timeout=120).stdout)
    assert {e["name"]: e["missing"] for e in d["extras"]}["tf"] == [r for r in tomllib.loads(
        (REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tf"] if r.startswith("tensorflow")]


def test_doctor_imports_no_framework():
    code = ("import sys, io, contextlib; from modelport.orchestration.doctor import doctor; doctor();"
            "print([m for m in ('torch', 'tensorflow', 'keras', 'openvino', 'onnx', 'tensorrt') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_cpu_features_from_cpuinfo_flags():
    from modelport.orchestration.doctor import cpu_info

    amx = cpu_info("model name\t: Xeon\nflags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_int8\n")
    assert amx["model"] == "Xeon" and amx["features"] == {"avx2": True, "avx512": True, "vnni": True, "bf16": True, "amx": True}
    old = cpu_info("flags\t\t: fpu sse4_2 avx\n")
    assert old["features"] == {"avx2": False, "avx512": False, "vnni": False, "bf16": False, "amx": False}
