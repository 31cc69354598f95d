"""CLI conventions: lazy imports, help, version, inspect, zoo commands, Python API parity."""

from __future__ import annotations

import json
import subprocess
import sys

from modelport.zoo_builders import save_source


def test_cli_import_loads_no_framework():
    code = ("import sys, modelport.cli; heavy = [m for m in ('torch','tensorflow','onnx','onnxruntime','onnxsim','tf2onnx','transformers') if m in sys.modules]; print(json.dumps(heavy))")
    out = subprocess.run([sys.executable, "-c", "import json;" + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_help_and_version(cli_proc):
    r = cli_proc("--help")
    assert r.exit_code == 0 and "convert" in r.stdout and "inspect" in r.stdout and "zoo" in r.stdout
    assert cli_proc("--version").stdout.startswith("modelport ")


def test_inspect_onnx(cli, tiny_onnx):
    r = cli("inspect", tiny_onnx, "--json")
    assert r.exit_code == 0, r
    info = r.json()
    assert info["format"] == "onnx" and info["opsets"] == {"ai.onnx": 17}
    assert info["ops"] == {"MatMul": 1, "Add": 1, "Relu": 1} and info["parameters"] == 8 * 4 + 4
    assert info["inputs"][0]["shape"] == ["batch", 8]
    assert cli("inspect", tiny_onnx).exit_code == 0


def test_inspect_pytorch_files(cli, tmp_path):
    save_source("mlp", tmp_path / "m")
    info = cli("inspect", tmp_path / "m" / "model.safetensors", "--json").json()
    assert info["format"] == "safetensors" and info["parameters"] == 32 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4
    info = cli("inspect", tmp_path / "m" / "model.pt2", "--json").json()
    assert info["format"] == "exported_program" and info["inputs"]


def test_inspect_missing_file(cli, tmp_path):
    r = cli("inspect", tmp_path / "none.onnx")
    assert r.exit_code == 2 and "no such file" in r.stderr


def test_zoo_list_and_build(cli, tmp_path):
    models = {m["name"] for m in cli("zoo", "list", "--json").json()["models"]}
    assert {"cnn_small", "bert_tiny", "lstm_small", "mlp"} <= models
    r = cli("zoo", "build", "lstm_small", "-o", tmp_path / "z", "--json")
    assert r.exit_code == 0, r
    assert sorted(p.name for p in (tmp_path / "z").iterdir()) == ["model.pt2", "model.safetensors"]
    assert cli("zoo", "build", "lstm_small", "-o", tmp_path / "z").exit_code == 2  # exists, no --force


def test_python_api_matches_cli(tiny_onnx, tmp_path):
    import modelport

    report = modelport.convert(str(tiny_onnx), tmp_path / "o")
    assert report["status"] == "ok" and (tmp_path / "o" / "model.onnx").exists()
    assert modelport.inspect(tiny_onnx)["nodes"] == 3


def test_python_api_accepts_spec_strings_and_modules(tmp_path):
    import modelport
    from modelport.zoo_builders.pytorch import MLP

    report = modelport.convert(MLP(), tmp_path / "m", inputs=["x:batch,32"], targets="onnx")
    assert report["contract"]["inputs"][0]["shape"] == ["batch", 32]
    report = modelport.convert("zoo:mlp", tmp_path / "z", options=modelport.ConvertOptions(atol=1e-5))
    assert report["parity"][0]["tolerance"]["atol"] == 1e-5


def test_target_help_comes_from_the_registry(cli_proc):
    from modelport.emitters import EMITTERS

    for command in ("convert", "emit"):
        text = " ".join(cli_proc(command, "--help", env={"COLUMNS": "300"}).stdout.split())
        assert ", ".join(EMITTERS) in text, command
