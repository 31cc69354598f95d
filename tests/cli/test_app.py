"""CLI conventions: lazy imports, help, version, inspect, zoo commands, Python API parity."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from modelport.zoo_builders import save_source
from tests.conftest import tree


def test_cli_import_loads_no_framework():
    code = ("import sys, modelport.cli; heavy = [m for m in ('torch','tensorflow','onnx','onnxruntime','onnxsim','tf2onnx','transformers') if m in sys.modules]; print(json.dumps(heavy))")
    out = subprocess.run([sys.executable, "-c", "import json;" + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


# Not needed to build the command line or print its help: typer's markdown and traceback renderers
# (markdown-it, pygments, attrs via rich.pretty), the stages' packages and everything they import.
NOT_AT_START_UP = ("rich.markdown", "markdown_it", "rich.traceback", "rich.pretty", "rich.syntax", "pygments", "attr", "yaml",
                   "numpy", "modelport.emitters", "modelport.packaging", "modelport.serving", "modelport.run.staging", "modelport.validation",
                   "modelport.orchestration", "modelport.parsers", "modelport.zoo")


def imported_by(*argv: str) -> set[str]:
    """Every module a fresh `python -m modelport ARGV` imports (`-X importtime` names each one on stderr)."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "modelport", *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return {line.rpartition("|")[2].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("argv", [("--help",), ("convert", "--help"), ("--version",)])
def test_help_imports_nothing_it_does_not_need(argv):
    modules = imported_by(*argv)
    assert "typer" in modules and "modelport.cli.convert" in modules  # the listing is real
    assert sorted(m for m in modules if m.split(".")[0] in {n.split(".")[0] for n in NOT_AT_START_UP}
                  and any(m == n or m.startswith(n + ".") for n in NOT_AT_START_UP)) == []


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
    assert sorted(p.name for p in (tmp_path / "z").iterdir()) == ["model.pt2", "model.safetensors", "report.html", "report.json"]
    assert cli("zoo", "build", "lstm_small", "-o", tmp_path / "z").exit_code == 2  # exists, no --force


def test_zoo_build_report_marks_the_folder_and_fits_the_schema(tmp_path):
    import jsonschema

    save_source("mlp", tmp_path / "m")
    report = json.loads((tmp_path / "m" / "report.json").read_text())
    from modelport.validation.report import SCHEMA_FILE

    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.validate(report, schema)
    assert report["command"] == "zoo build" and report["status"] == "ok"
    assert report["source"]["path"] == "zoo:mlp" and report["files"] == ["model.pt2", "model.safetensors"]


# Every command that writes a folder, as (arguments, the option that lets it write over an existing folder).
WRITERS = {
    "convert": (("convert", "{model}", "--to", "onnx,ort", "--package", "triton"), "--force"),
    "emit": (("emit", "{model}", "--to", "ort"), "--force"),
    "optimize": (("optimize", "{model}", "--level", "basic"), "--force"),
    "package": (("package", "{model}", "--for", "triton,k8s"), "--force"),
    "package-add-version": (("package", "{model}", "--for", "triton"), "--add-version"),
    "zoo-build": (("zoo", "build", "mlp"), "--force"),
}


@pytest.mark.parametrize("command", list(WRITERS))
def test_force_replaces_only_what_modelport_wrote(cli, tiny_onnx, tmp_path, command):
    args, replace = WRITERS[command]
    args = [str(tiny_onnx) if a == "{model}" else a for a in args]
    out = tmp_path / "out"
    assert cli(*args, "-o", out, "-q").exit_code == 0
    r = cli(*args, "-o", out, replace, "-q")  # its own earlier output is recognised and replaced
    assert r.exit_code == 0, r
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    r = cli(*args, "-o", foreign, replace)
    assert r.exit_code == 2, r
    assert r.stderr.strip().splitlines() == [f"error: {foreign}: refusing to replace a folder modelport did not write "
                                             "(no modelport report.json in it) (choose a new output folder, or remove this one yourself)"]
    assert tree(foreign) == ["notes.txt"] and (foreign / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize("ours", [False, True], ids=["foreign-files", "holding-a-modelport-report"])
def test_force_never_replaces_the_working_directory(cli, tiny_onnx, tmp_path, monkeypatch, ours):
    work = tmp_path / "a" / "work"  # its parent does not hold the input either
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("keep")
    if ours:
        save_source("mlp", work / "old")
        (work / "report.json").write_bytes((work / "old" / "report.json").read_bytes())
    before = tree(work)
    monkeypatch.chdir(work)
    for target in (".", str(work), ".."):
        r = cli("convert", tiny_onnx, "-o", target, "--force")
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r
        assert "refusing to replace" in r.stderr and "working directory" in r.stderr
    assert tree(work) == before


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


def _on_a_terminal(args: list[str], columns: int = 100) -> str:
    """stdout of `modelport ARGS` written to a pseudo-terminal."""
    import os

    from tests.terminal import run_on_terminal

    return run_on_terminal(args, env={**os.environ, "COLUMNS": str(columns), "TERM": "xterm"})[1]


def test_listings_print_on_stdout_as_tab_separated_rows_through_a_pipe(cli_proc, tiny_onnx):
    from modelport import zoo
    r = cli_proc("zoo", "list")
    assert r.exit_code == 0 and r.stderr == "", r
    lines = r.stdout.splitlines()
    assert lines[0] == "name\tframework\tinputs\tsource\tdescription"
    assert [line.split("\t")[0] for line in lines[1:]] == list(zoo.load_zoo())  # every name whole, one row each
    assert all(len(line.split("\t")) == 5 for line in lines)
    keras = subprocess.run(f"{sys.executable} -m modelport zoo list | grep keras", shell=True, capture_output=True, text=True)
    assert keras.stdout.splitlines() and all(line.split("\t")[1] == "keras" for line in keras.stdout.splitlines())
    r = cli_proc("inspect", tiny_onnx)
    assert r.exit_code == 0, r
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert rows[0] == ["kind", "name", "value", "shape"]
    assert ["input", "x", "float32", "batch,8"] in rows and ["output", "y", "float32", "batch,4"] in rows
    assert ["op", "MatMul", "1", ""] in rows and ["info", "opsets", "ai.onnx=17", ""] in rows
    size = next(r[2] for r in rows if r[:2] == ["info", "size"])
    assert size.endswith(f"B ({tiny_onnx.stat().st_size} bytes)") and ("KiB" in size or size.split()[1] == "B")


def test_listings_are_tables_on_a_terminal_with_nothing_cut_short():
    out = _on_a_terminal(["zoo", "list"], columns=60)
    assert "model zoo" in out and "─" in out and "…" not in out
    assert "keras_mobilenet_v2" in out
