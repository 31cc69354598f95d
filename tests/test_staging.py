from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from modelport.errors import BadInputError
from modelport.run.staging import check_output, staged_dir, written_by_modelport


def ours(folder: Path) -> Path:
    """A folder as a modelport command leaves it: its report.json carries our schema."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps({"schema": "modelport.report/1", "command": "convert"}))
    return folder


def test_failure_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with staged_dir(out) as stage:
            (stage / "model.onnx").write_bytes(b"half")
            raise RuntimeError("killed mid-write")
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(tmp_path):
    out = ours(tmp_path / "out")
    (out / "old").write_text("keep")
    with pytest.raises(BadInputError, match="--force"):
        check_output(out)
    with staged_dir(out, force=True) as stage:
        (stage / "new").write_text("x")
    assert sorted(p.name for p in out.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("relation", ["same", "inside-input-dir", "contains-input"])
def test_output_must_not_touch_inputs(tmp_path, relation):
    src = tmp_path / "src"
    src.mkdir()
    model = src / "m.onnx"
    model.write_bytes(b"x")
    out = {"same": model, "inside-input-dir": src / "out", "contains-input": src}[relation]
    inputs = [src] if relation == "inside-input-dir" else [model]
    with pytest.raises(BadInputError, match="overwrite or contain"):
        check_output(out, inputs, force=True)


@pytest.mark.parametrize("content", ["foreign-file", "empty", "other-schema", "not-json", "report-symlink", "report-folder"])
def test_force_replaces_only_a_folder_modelport_wrote(tmp_path, content):
    out = tmp_path / "out"
    out.mkdir()
    if content == "foreign-file":
        (out / "thesis.tex").write_text("years of work")
    elif content == "other-schema":
        (out / "report.json").write_text(json.dumps({"schema": "someone.else/1"}))
    elif content == "not-json":
        (out / "report.json").write_text("{")
    elif content == "report-symlink":  # a link to a real report elsewhere does not make the folder ours
        (out / "report.json").symlink_to(ours(tmp_path / "real") / "report.json")
    elif content == "report-folder":
        (out / "report.json").mkdir()
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(BadInputError, match="refusing to replace a folder modelport did not write") as e:
        with staged_dir(out, force=True) as stage:
            (stage / "new").write_text("x")
    assert e.value.exit_code == 2 and "\n" not in e.value.message
    assert sorted(p.name for p in out.iterdir()) == before
    assert not written_by_modelport(out)


def test_protected_folders_are_never_replaced(tmp_path, monkeypatch):
    work = ours(tmp_path / "parent" / "work")
    ours(tmp_path / "parent")
    monkeypatch.chdir(work)
    with pytest.raises(BadInputError, match="refusing to replace the working directory"):
        check_output(".", force=True)
    with pytest.raises(BadInputError, match="refusing to replace a folder that holds the working directory"):
        check_output(tmp_path / "parent", force=True)
    home = ours(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInputError, match="refusing to replace the home folder"):
        check_output(home, force=True)
    with pytest.raises(BadInputError, match="refusing to replace a filesystem root"):
        check_output("/", force=True)
    assert (work / "report.json").is_file() and (home / "report.json").is_file()


def test_a_modelport_folder_holding_an_input_is_not_replaced(tmp_path):
    out = ours(tmp_path / "out")
    model = out / "model.onnx"
    model.write_bytes(b"x")
    with pytest.raises(BadInputError, match="overwrite or contain"):
        check_output(out, [model], force=True)
    assert model.read_bytes() == b"x"


@pytest.fixture(params=[0o022, 0o027, 0o002], ids=lambda m: f"umask{m:03o}")
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root.parent)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def expected_mode(p: Path, umask: int) -> int:
    return (0o777 if p.is_dir() or p.suffix == ".sh" else 0o666) & ~umask


def test_staged_output_follows_the_umask(tmp_path, umask):
    out = tmp_path / "out"
    with staged_dir(out) as stage:
        (stage / "sub").mkdir(mode=0o700)
        (stage / "sub" / "private").write_bytes(b"x")
        os.chmod(stage / "sub" / "private", 0o600)  # as mkstemp and safetensors leave a file
        (stage / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(stage / "run.sh", 0o700)
    got = modes(out)
    assert got == {k: expected_mode(tmp_path / k, umask) for k in got}, {k: oct(v) for k, v in got.items()}


def test_every_command_output_follows_the_umask(cli, tiny_onnx, tmp_path, umask):
    """Real runs of each command that writes a folder; every file and folder in it has the umask's mode."""
    runs = {
        "zoo": ("zoo", "build", "mlp"),
        "conv": ("convert", tmp_path / "zoo" / "model.pt2", "--input", "x:batch,32", "--to", "onnx,ort,pytorch"),
        "emit": ("emit", tiny_onnx, "--to", "ort,tensorrt", "--plan-only"),
        "opt": ("optimize", tiny_onnx, "--level", "basic"),
        "pkg": ("package", tmp_path / "conv", "--for", "triton,torchserve"),
    }
    for name, args in runs.items():
        r = cli(*args, "-o", tmp_path / name, "-q")
        assert r.exit_code == 0, (name, r)
    got = {}
    for name in runs:
        got.update(modes(tmp_path / name))
    wrong = {k: oct(v) for k, v in got.items() if v != expected_mode(tmp_path / k, umask)}
    assert not wrong, f"umask {umask:03o}: {wrong}"
    assert "conv/pytorch/model.safetensors" in got and "zoo/model.safetensors" in got and "emit/tensorrt/trtexec.sh" in got
